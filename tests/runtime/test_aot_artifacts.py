"""Compiled torch engines kept as Inductor's standalone artifacts where packages do not load
(studio.runtime.aot_artifacts): built once, loaded by a new process without compiling,
computing what the network does, rebuilt when corrupt (CPU, a reduced stitch network)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import compiled_stitch, stitch_net

from studio.runtime import aot_artifacts, aot_cache
from studio.runtime.torch_backend import TorchEngine

pytestmark = pytest.mark.slow  # a standalone compile is a C++ compile on the CPU: ~10 s here

LOAD = """
import sys, torch
from studio.fixtures.random_tree import random_network
from studio.runtime.torch_backend import TorchEngine
torch.manual_seed(0)
net = random_network("stitch_network", reduced=True).eval()
e = TorchEngine("stitch_network", net, "fp32", "cpu", batch=2, compile=True,
                aot_dir=sys.argv[1], aot_build=False)
feed = torch.load(sys.argv[2])
out = e.run(feed)
torch.save(out, sys.argv[3])
print(e.aot)
"""


def test_an_artifact_is_built_once_then_loaded_by_a_new_process_and_rebuilt_when_corrupt(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")  # as where packages do not load
    net = stitch_net()
    loads, real_load = [], torch._inductor.CompiledArtifact.load
    # each load with one compile thread: no pool of compile workers to start and wait for
    threads = lambda: torch._inductor.config.compile_threads  # noqa: E731
    counted = lambda **kw: loads.append(threads()) or real_load(**kw)  # noqa: E731
    monkeypatch.setattr(torch._inductor.CompiledArtifact, "load", counted)
    built = compiled_stitch(net, tmp_path)
    assert built.aot == "artifact built"
    assert loads == [1]  # by its builder, to check it, and that one serves (no reload)
    assert not list(tmp_path.glob("*.pt2"))  # no package was tried
    # a GPU captures an artifact's engine of a small batch; a large batch's runs as it is
    assert not built.runs_uncaptured
    monkeypatch.setattr("studio.runtime.torch_backend.UNCAPTURED_BATCH", 2)
    assert built.runs_uncaptured
    (art,) = tmp_path.glob("stitch_network-fp32-b2-*.art")
    meta = json.loads(art.with_name(art.name + ".json").read_text())
    assert meta["sha256"] == aot_cache.file_sha256(art)
    assert None in meta["inputs"] and "weight" in " ".join(n for n in meta["inputs"] if n)
    eager = TorchEngine("stitch_network", net, "fp32", "cpu", batch=2)
    feed = {s.name: torch.randn(s.shape) for s in eager.inputs}
    want = eager.run(feed)
    assert all(torch.allclose(want[k], v, atol=1e-5) for k, v in built.run(feed).items())

    # a new process loads it (the weights are its own network's, passed in) and computes
    # the same
    torch.save(feed, tmp_path / "feed.pt")
    argv = [str(tmp_path), str(tmp_path / "feed.pt"), str(tmp_path / "out.pt")]
    r = subprocess.run(
        [sys.executable, "-c", LOAD, *argv],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("artifact loaded")
    got = torch.load(tmp_path / "out.pt")
    assert all(torch.allclose(want[k], got[k], atol=1e-5) for k in want)

    # corrupted on disk: found by its checksum and built again, with a message
    data = bytearray(art.read_bytes())
    data[len(data) // 2] ^= 0xFF
    art.write_bytes(bytes(data))
    key = aot_cache.AotKey(**meta["key"])
    why = aot_artifacts.load(tmp_path, key, built.adapter)[1]
    assert why.endswith("is corrupt (its SHA-256 is not the one recorded)")
    with caplog.at_level("WARNING"):
        again = compiled_stitch(net, tmp_path)
    assert again.aot == "artifact built" and "is corrupt" in caplog.text
    assert aot_artifacts.load(tmp_path, key, again.adapter)[1] == "loaded"


def test_an_artifact_computing_something_else_is_not_kept_and_a_kept_one_is_not_rechecked(
    tmp_path: Path, monkeypatch
) -> None:
    """A new artifact's outputs are checked against the network once, when it is built: one
    that differs is not kept (remembered as failed) and the engine compiles in process; a
    kept one (key and SHA-256 matching) is loaded without running the network eagerly."""
    from studio.runtime import torch_backend

    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")
    bound = aot_artifacts._bound
    off_by_one = lambda *a: (lambda *x: [o + 1.0 for o in bound(*a)(*x)])  # noqa: E731
    monkeypatch.setattr(aot_artifacts, "_bound", off_by_one)
    net = stitch_net()
    wrong = tmp_path / "wrong"
    assert compiled_stitch(net, wrong).aot == "failed: RuntimeError"
    assert not list(wrong.glob("*.art"))
    (failed,) = wrong.glob("*.art.failed.json")
    assert "differs by" in json.loads(failed.read_text())["error"]

    monkeypatch.setattr(aot_artifacts, "_bound", bound)
    assert compiled_stitch(net, tmp_path).aot == "artifact built"
    checked = []
    monkeypatch.setattr(torch_backend, "_differs", lambda *a: checked.append(a))
    assert compiled_stitch(net, tmp_path).aot == "artifact loaded" and not checked


def test_an_artifact_for_other_weights_does_not_load_into_this_network(tmp_path: Path) -> None:
    """The key holds the weights' hash: another network's artifact is stale here, and one
    whose recorded inputs name weights this module lacks is refused, not run."""
    net = stitch_net()
    key = aot_cache.AotKey.of("stitch_network", net, "fp32", "p", 2, torch.device("cpu"))
    example = tuple(net.example_inputs(2)) if hasattr(net, "example_inputs") else None
    assert example is not None
    aot_artifacts.build(tmp_path, key, net, example)
    other = stitch_net()
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    other_key = aot_cache.AotKey.of("stitch_network", other, "fp32", "p", 2, torch.device("cpu"))
    assert aot_artifacts.load(tmp_path, other_key, other) == (None, "no compiled artifact yet")
    path = aot_artifacts.artifact_file(tmp_path, key)
    meta_file = path.with_name(path.name + ".json")
    meta = json.loads(meta_file.read_text())
    meta["inputs"] = ["no.such.weight" if n else n for n in meta["inputs"]]
    meta_file.write_text(json.dumps(meta))
    runner, why = aot_artifacts.load(tmp_path, key, net)
    assert runner is None and "does not fit this network" in why


def test_an_artifact_that_crashes_a_new_process_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Each new artifact is loaded and run in another process first: one that kills it is
    not kept (remembered as failed), and the engine compiles in process instead."""
    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")
    monkeypatch.setattr(aot_artifacts, "_VERIFY", "import os; os.abort()")
    e = compiled_stitch(stitch_net(), tmp_path)
    assert e.aot == "failed: RuntimeError"
    assert not list(tmp_path.glob("*.art")) and not list(tmp_path.glob(".*partial*"))
    (failed,) = tmp_path.glob("*.art.failed.json")
    assert "fails when a new process loads and runs it" in json.loads(failed.read_text())["error"]


def test_an_artifact_out_of_memory_is_tried_again_next_time(tmp_path: Path, monkeypatch) -> None:
    """Out of memory (or time) is for now, not for ever: nothing is remembered as failed,
    and the next engine builds the artifact."""
    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")
    oom = "import sys; sys.stderr.write('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)"
    monkeypatch.setattr(aot_artifacts, "_VERIFY", oom)
    net = stitch_net()
    assert compiled_stitch(net, tmp_path).aot == "failed: TransientFailure"
    assert not list(tmp_path.glob("*.failed.json"))
    monkeypatch.undo()
    monkeypatch.setenv(aot_cache.FORMAT_ENV, "artifact")
    assert compiled_stitch(net, tmp_path).aot == "artifact built"
