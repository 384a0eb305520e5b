"""Compiled torch engines kept on disk (AOTInductor packages): built once, loaded by a new
process, verified, rebuilt when corrupt or stale (CPU, a reduced stitch network)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import compiled_stitch, stitch_net

from studio.runtime import aot_cache
from studio.runtime.torch_backend import TorchEngine, _differs

pytestmark = pytest.mark.slow  # an AOTInductor build is a C++ compile: ~10-40 s here

LOAD = """
import sys, torch
from studio.fixtures.random_tree import random_network
from studio.runtime.torch_backend import TorchEngine
torch.manual_seed(0)
net = random_network("stitch_network", reduced=True).eval()
e = TorchEngine("stitch_network", net, "fp32", "cpu", batch=2, compile=True,
                aot_dir=sys.argv[1], aot_build=False)
print(e.aot)
"""


def test_built_once_loaded_by_a_new_process_and_rebuilt_when_corrupt(
    tmp_path: Path, caplog
) -> None:
    net = stitch_net()
    built = compiled_stitch(net, tmp_path)
    assert built.aot == "built"
    (package,) = tmp_path.glob("stitch_network-fp32-b2-*.pt2")
    meta = json.loads(package.with_name(package.name + ".json").read_text())
    assert meta["key"]["batch"] == 2 and meta["sha256"] == aot_cache.file_sha256(package)
    eager = TorchEngine("stitch_network", net, "fp32", "cpu", batch=2)
    feed = {s.name: torch.randn(s.shape) for s in eager.inputs}
    want = eager.run(feed)
    got = built.run(feed)
    assert all(torch.allclose(want[k], got[k], atol=1e-5) for k in want)

    # a new process finds it: loaded, not compiled
    r = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "loaded"

    # corrupted on disk: detected by its checksum, compiled again with a message
    data = bytearray(package.read_bytes())
    data[len(data) // 2] ^= 0xFF
    package.write_bytes(bytes(data))
    key = aot_cache.AotKey(**meta["key"])
    assert aot_cache.load(tmp_path, key)[1].endswith(
        "is corrupt (its SHA-256 is not the one recorded)"
    )
    with caplog.at_level("WARNING"):
        again = compiled_stitch(net, tmp_path)
    assert (
        again.aot == "built" and "is corrupt" in caplog.text and "compiling it again" in caplog.text
    )
    assert aot_cache.load(tmp_path, key)[1] == "loaded"

    # recorded for another torch: stale, with the reason
    meta_file = package.with_name(package.name + ".json")
    meta = json.loads(meta_file.read_text())
    meta["key"]["torch_version"] = "0.0.1"
    meta_file.write_text(json.dumps(meta))
    runner, why = aot_cache.load(tmp_path, key)
    assert runner is None and "stale" in why and "torch_version '0.0.1'" in why
    caplog.clear()
    with caplog.at_level("WARNING"):  # the next compiled engine builds it again, saying why
        assert compiled_stitch(net, tmp_path).aot == "built"
    assert "is stale (torch_version '0.0.1'" in caplog.text and "compiling it again" in caplog.text
    assert aot_cache.load(tmp_path, key)[1] == "loaded"


def test_other_weights_or_batch_make_another_package(tmp_path: Path) -> None:
    net = stitch_net()
    a = aot_cache.AotKey.of("stitch_network", net, "fp32", "p", 2, torch.device("cpu"))
    b = aot_cache.AotKey.of("stitch_network", net, "fp32", "p", 4, torch.device("cpu"))
    other = stitch_net()  # other weights: new checkpoints load into a new module
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    c = aot_cache.AotKey.of("stitch_network", other, "fp32", "p", 2, torch.device("cpu"))
    files = {aot_cache.package_file(tmp_path, k) for k in (a, b, c)}
    assert len(files) == 3 and a.weights_sha256 != c.weights_sha256


def test_a_package_that_computes_something_else_is_refused() -> None:
    eng = TorchEngine("stitch_network", stitch_net(), "fp32", "cpu", batch=2)
    example = eng.adapter.example_inputs(2)
    assert _differs(eng.adapter, lambda *a: eng.adapter(*a), example, "fp32") is None
    wrong = _differs(
        eng.adapter, lambda *a: tuple(o + 1.0 for o in eng.adapter(*a)), example, "fp32"
    )
    assert wrong is not None and "differs by" in wrong


def test_a_network_that_does_not_export_is_tried_once(tmp_path: Path) -> None:
    class Branchy(torch.nn.Module):  # data-dependent Python control flow: export refuses it
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if float(x.sum()) > 0 else x

    key = aot_cache.AotKey.of("branchy", Branchy(), "fp32", "p", 1, torch.device("cpu"))
    example = (torch.ones(1, 3),)
    with pytest.raises(Exception):  # noqa: B017 - whatever torch.export raises
        aot_cache.load_or_build(tmp_path, key, Branchy(), example)
    runner, why = aot_cache.load_or_build(tmp_path, key, Branchy(), example)
    assert runner is None and "failed to compile ahead of time before" in why


class _Median(torch.nn.Module):
    """aten.median.dim has no AOTInductor C shim on the CPU: the proxy executor would run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.median(x, dim=1).values * 2.0


def test_a_network_that_needs_the_proxy_executor_is_not_packaged(tmp_path: Path) -> None:
    net, example = _Median(), (torch.randn(3, 5),)
    key = aot_cache.AotKey.of("median_net", net, "fp32", "fp32", 3, torch.device("cpu"))
    with pytest.raises(aot_cache.NotPackageable, match=r"aten\.median\.dim .*proxy executor"):
        aot_cache.load_or_build(tmp_path, key, net, example)
    assert not list(tmp_path.glob("*.pt2"))  # nothing kept, not even the partial file
    runner, why = aot_cache.load_or_build(tmp_path, key, net, example)  # not tried again
    assert runner is None and "failed to compile ahead of time before" in why


class _Sampler(torch.nn.Module):
    """The warp network's operation: a 3-D convolution, then trilinear grid sampling."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv3d(3, 3, 3, padding=1)

    def forward(self, volume: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        features = self.conv(volume)
        return torch.nn.functional.grid_sample(features, grid, align_corners=False)


def test_3d_grid_sampling_goes_to_the_compiler_as_gathers(tmp_path: Path, monkeypatch) -> None:
    """What build hands AOTInductor holds no grid_sampler_3d, which would need the proxy
    executor on CUDA (the compile itself is stopped there: it is the C++ build's to test)."""
    handed = []

    def stop(exported, package_path):  # noqa: ANN001
        handed.append({str(n.target) for n in exported.graph.nodes if n.op == "call_function"})
        raise RuntimeError("stopped before the C++ compile")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", stop)
    torch.manual_seed(0)
    net = _Sampler().eval()
    example = (torch.randn(1, 3, 4, 6, 8), torch.rand(1, 4, 6, 8, 3) * 2.2 - 1.1)
    key = aot_cache.AotKey.of("sampler", net, "fp32", "fp32", 1, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="stopped before"):
        aot_cache.build(tmp_path, key, net, example)
    (ops,) = handed
    assert "aten.gather.default" in ops and not any("grid_sampler" in op for op in ops)


def test_a_package_that_a_new_process_cannot_load_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a package")
    with pytest.raises(RuntimeError, match="fails when a new process loads and runs it"):
        aot_cache.verify_elsewhere(bad, (torch.randn(2),), "stitch_network")
    assert not list(tmp_path.glob("*.inputs.pt"))


def test_a_crash_in_the_verifying_process_names_where_it_crashed() -> None:
    stderr = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):"
        '\n  File "<string>", line 5 in <module>\n\nExtension modules: torch\n'
    )
    said = aot_cache._last_words(stderr)
    assert said == 'Fatal Python error: Segmentation fault at File "<string>", line 5 in <module>'
    assert aot_cache._last_words("Traceback\nValueError: bad\n") == "ValueError: bad"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_package_engine_is_ready_without_a_graph_on_cuda(tmp_path: Path) -> None:
    net = stitch_net().cuda()
    loads, _ = aot_cache.packages_load_here(tmp_path, torch.device("cuda"))
    e = TorchEngine(
        "stitch_network",
        net,
        "fp32",
        "cuda",
        batch=2,
        compile=True,
        aot_dir=tmp_path,
        aot_build=True,
    )
    if loads:
        assert e.aot == "built" and e.capture() and not e.captured  # run as it is, not captured
    else:  # this torch crashes loading packages: an Inductor artifact, captured
        assert e.aot == "artifact built"
        assert e.capture() and e.captured
    feed = {s.name: torch.randn(s.shape, device="cuda") for s in e.inputs}
    want = TorchEngine("stitch_network", net, "fp32", "cuda", batch=2).run(feed)
    got = e.run(feed)
    assert all(torch.allclose(want[k], got[k], atol=1e-4) for k in want)


def test_whether_packages_load_here_is_found_once(tmp_path: Path, monkeypatch) -> None:
    cpu = torch.device("cpu")
    state = torch.random.get_rng_state()
    assert aot_cache.packages_load_here(tmp_path, cpu) == (
        True,
        "a probe package loads in a new process",
    )
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's numbers untouched
    (answer,) = tmp_path.glob("probe-*.json")
    assert json.loads(answer.read_text())["ok"] is True and not list(tmp_path.glob("*.pt2"))

    def no_build(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("probed again")

    monkeypatch.setattr(aot_cache, "_compile_package", no_build)
    assert aot_cache.packages_load_here(tmp_path, cpu)[0] is True  # the kept answer

    # where the probe failed, a GPU network is not compiled for minutes to crash the same way
    answer.write_text(json.dumps({"ok": False, "why": "RuntimeError: exit -11"}))
    net = stitch_net()
    example = net.example_inputs(2)
    key = aot_cache.AotKey.of("stitch_network", net, "fp32", "fp32", 2, cpu)
    gpu_key = dataclasses.replace(key, capability="9.0")
    runner, why = aot_cache.load_or_build(tmp_path, gpu_key, net, example)
    assert runner is None and why == (
        "this torch cannot load compiled packages here (RuntimeError: exit -11)"
    )
    assert not list(tmp_path.glob("*.failed.json"))  # the network itself is not marked


def test_half_precision_rounding_in_one_pixel_is_not_a_wrong_engine() -> None:
    want = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    moved = want.clone()
    moved[0, 0, 0, 0] += 0.05  # 5 % of the range in one element: two fp16 kernels can do it
    reference = lambda *a: (want,)  # noqa: E731
    assert _differs(reference, lambda *a: (moved,), (), "fp16") is None
    mirrored = _differs(reference, lambda *a: (want.flip(-1),), (), "fp16")
    assert mirrored is not None and "relative L2" in mirrored


def test_a_file_another_process_finished_meanwhile_is_said_loaded_not_built(
    tmp_path: Path,
) -> None:
    key = aot_cache.AotKey("stitch_network", "0" * 64, "fp32", "", 2, "cpu", "cpu", "t", None)
    path = tmp_path / "stitch.art"

    def make(partial: Path) -> tuple[dict, object]:
        raise AssertionError("built again")

    def runner() -> None:
        return None

    def build() -> tuple[object, bool]:  # the other process's file is there once ours locks
        return aot_cache.build_file(path, key, lambda: runner, make)

    assert build() == (runner, False) and not path.exists()
    assert aot_cache.build_then_load(path, key, "absent", "absent", build) == (
        runner,
        "loaded",
    )
    made_here = aot_cache.build_then_load(path, key, "absent", "absent", lambda: (runner, True))
    assert made_here == (runner, "built")
