"""The render bench suite on the CPU through the real CLI, its graph path, and `--suite all`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from studio.bench import SUITES
from studio.bench import render as R
from studio.cli import main as cli_main
from studio.fixtures.random_tree import random_network
from studio.models.channel_pad import PaddedConv
from studio.models.decoder import Decoder
from studio.models.warp_network import WarpNetwork

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMOKE = ["--device", "cpu", "--reduced", "--feature-size", "32", "--batches", "1,2"]
SMOKE += ["--repeats", "1", "--warmup", "0", "--input-sets", "1"]
RELEASED_FLOPS = 342_071_443_456 + 891_574_812_672  # the manifest's warp + decoder


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("render")
    argv = ["bench", "--suite", "render", *SMOKE]
    argv += ["--json", str(out / "r.json"), "--markdown", str(out / "r.md"), "--plots", str(out)]
    rc = cli_main(argv)
    return {
        "rc": rc,
        "data": json.loads((out / "r.json").read_text()),
        "md": (out / "r.md").read_text(),
        "dir": out,
    }


def test_cli_smoke_writes_sane_json(run):
    assert run["rc"] == 0
    data = run["data"]
    for key in ("suite", "facts", "config", "flops", "matmul", "published", "paths", "summary"):
        assert key in data
    assert data["suite"] == "render" and data["config"]["batches"] == [1, 2]
    assert data["config"]["output"] == [3, 256, 256]  # 32² maps -> 256² images
    assert "studio bench --suite render" in data["facts"]["command"]
    assert math.isfinite(data["matmul"]["fp32"]["tflops"]) and data["matmul"]["fp32"]["tflops"] > 0
    assert set(data["paths"]) == {"eager_fp32", "channels_last_fp32"}
    for name, rec in data["paths"].items():
        assert rec["status"] == "ok", (name, rec)
        assert set(rec["batches"]) == {"1", "2"}
        for b, r in rec["batches"].items():
            assert r["status"] == "ok" and r["repeats"] == 1
            # Measured figures: present, finite and positive; never compared with a bound or
            # with each other (a busy machine shifts them). The floor fraction divides two
            # separately measured rates, so on a noisy CPU it may exceed 1.
            for key in ("median_ms", "fps", "ms_per_frame", "tflops", "floor_fraction"):
                assert math.isfinite(r[key]) and r[key] > 0, (name, b, key, r[key])
            # ...and derived from the median as documented (arithmetic, not timing)
            assert r["fps"] == pytest.approx(int(b) / (r["median_ms"] / 1e3))
            assert r["ms_per_frame"] == pytest.approx(r["median_ms"] / int(b))
            assert r["tflops"] == pytest.approx(data["flops"]["per_frame"] * r["fps"] / 1e12)
            rate = data["matmul"]["fp32"]["tflops"]
            assert r["matmul_tflops"] == rate
            assert r["floor_fraction"] == pytest.approx(r["tflops"] / rate)


def test_fp32_eager_against_itself_is_exact_and_channels_last_is_close(run):
    paths = run["data"]["paths"]
    for r in paths["eager_fp32"]["batches"].values():
        assert r["cosine"] == pytest.approx(1.0, abs=1e-12) and r["rel_l2"] == 0.0
    for r in paths["channels_last_fp32"]["batches"].values():
        assert r["cosine"] > 0.99999 and r["rel_l2"] < 1e-3


def test_flops_counted_and_manifest_cited(run):
    fl = run["data"]["flops"]
    assert fl["per_frame"] == fl["counted"]["warp_network"] + fl["counted"]["decoder"] > 0
    assert fl["released_sizes"] is False and fl["matches_manifest"] is None
    man = fl["manifest"]
    assert man["per_frame"] == RELEASED_FLOPS
    assert man["keys"]["warp_network"] == "networks.warp_network.flops.forward_total"


def test_markdown_tables_and_published_figures(run):
    md = run["md"]
    for header in (
        "## Render: warp network + decoder, batched",
        "### Matrix rate of the same run",
        "### Frames per second (median)",
        "### ms per frame",
        "### Fraction of the FLOP floor",
        "### Speed-up over our fp32 eager",
        "### Images vs fp32 eager",
        "### Beside the published figures",
        "| path | B=1 | B=2 |",
        "networks.decoder.flops.forward_total",
    ):
        assert header in md
    for figure in ("2,180", "75.7", "71.1", ">= 300 FPS"):
        assert figure in md


def test_plots_written_or_skipped_with_note(run):
    files = sorted(p.name for p in Path(run["dir"]).glob("render_*.png"))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert files == [] and "matplotlib" in run["md"]
    else:
        assert files == ["render_floor_fraction.png", "render_fps.png"]


def test_released_sizes_count_the_manifest_flops():
    """1.234 TFLOP per frame: our modules at the released sizes, counted on meta tensors."""
    with torch.device("meta"):
        warp, decoder = WarpNetwork(), Decoder()
    counted = R.count_flops(warp, decoder)
    assert counted["per_frame"] == RELEASED_FLOPS == R.manifest_flops()["per_frame"]
    assert counted["output"] == [3, 512, 512]


def test_plan_paths_per_device():
    cpu = [p.name for p in R.plan_paths(["fp32", "bf16-autocast"], "cpu")]
    assert cpu == ["eager_fp32", "channels_last_fp32", "eager_bf16_autocast",
                   "channels_last_bf16_autocast", "padded_bf16_autocast"]  # fmt: skip
    cuda = [p.name for p in R.plan_paths(["fp32", "fp16"], "cuda", compile=True)]
    assert cuda == ["eager_fp32", "eager_fp16", "channels_last_fp16", "graph_fp16",
                    "compiled_graph_fp16", "compiled_graph_channels_last_fp16",
                    "compiled_graph_split_fp16", "compiled_graph_split_padded_fp16",
                    "compiled_graph_padded_fp16", "compiled_graph_padded_cl3d_fp16",
                    "padded_fp16"]  # fmt: skip
    with pytest.raises(ValueError):
        R.plan_paths(["fp64"], "cpu")


class _FakeGraph:
    """Stands in for a CUDA graph on the CPU: replay() recomputes into the static output."""

    def __init__(self, fn):
        self.fn, self.out, self.replays = fn, fn(), 0

    def replay(self):
        self.replays += 1
        self.out.copy_(self.fn())


def test_graph_path_rotates_static_buffers(monkeypatch):
    """The graph runner copies each input set into its static buffers before a replay, and its
    images match the eager reference set by set."""
    graphs: list[_FakeGraph] = []

    def fake_capture(fn, warmup=2):
        graphs.append(_FakeGraph(fn))
        return graphs[-1], graphs[-1].out

    monkeypatch.setattr(R, "capture_graph", fake_capture)
    cpu = torch.device("cpu")
    warp = random_network("warp_network", reduced=True)
    decoder = random_network("decoder", reduced=True)
    inputs = R._make_inputs(warp, [1], 2, 32, 0, cpu)
    fp32 = R.PRECISIONS["fp32"]
    ref_wd = R.WarpDecode(warp, decoder, fp32, cpu, reference=True)
    refs = {1: [ref_wd(*s).clone() for s in inputs.batch(1)]}
    assert not torch.equal(refs[1][0], refs[1][1])  # the two input sets differ
    spec = R.RenderPath("graph_fp32", "fp32", graph=True)
    wd = R.WarpDecode(warp, decoder, fp32, cpu)
    flush = R._CacheFlush(cpu, True)
    rec, _ = R._run_path(spec, wd, inputs, [1], refs, 10**9, None, flush, cpu, 1, 0, 1.0)
    point = rec["batches"]["1"]
    assert point["status"] == "ok" and point["cosine"] > 0.99999, point
    assert point["floor_fraction"] is None  # no matmul rate given
    assert len(graphs) == 1 and graphs[0].replays == 3  # the timed run + one per input set


def test_bad_options_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["bench", "--suite", "render", "--precisions", "fp64"])
    assert e.value.code == 2
    assert cli_main(["bench", "--suite", "render", "--device", "cpu", "--paths", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert cli_main(["bench", "--suite", "nope"]) == 2
    assert "render" in capsys.readouterr().err


def test_cli_lmdm_smoke(tmp_path):
    """The CI smoke of `studio bench --suite lmdm` through the CLI entry."""
    js = tmp_path / "lmdm.json"
    argv = ["bench", "--suite", "lmdm", "--device", "cpu", "--reduced", "--steps", "1"]
    argv += ["--repeats", "1", "--no-onnx", "--input-sets", "1", "--json", str(js)]
    assert cli_main(argv) == 0
    data = json.loads(js.read_text())
    assert data["suite"] == "lmdm" and data["paths"]["eager_fp32"]["ddim"]["1"]["median_ms"] > 0


def test_suite_all_writes_one_json_and_one_markdown(tmp_path):
    """Dispatch by table; the render suite's own CLI run is the module fixture above."""
    assert list(SUITES) == ["lmdm", "render", "pipeline", "kinematics"]
    js, md = tmp_path / "all.json", tmp_path / "all.md"
    argv = ["bench", "--suite", "all", "--suites", "lmdm,kinematics", "--device", "cpu"]
    argv += ["--repeats", "1", "--warmup", "0", "--reduced"]
    argv += ["--lmdm-args=--steps 1 --no-onnx --input-sets 1", "--kinematics-args=--strides 1"]
    argv += ["--json", str(js), "--markdown", str(md)]
    assert cli_main(argv) == 0
    data = json.loads(js.read_text())
    assert data["suite"] == "all"
    assert list(data["suites"]) == ["lmdm", "kinematics"]
    for name, result in data["suites"].items():
        assert result["suite"] == name and data["runs"][name]["rc"] == 0
    assert "--reduced" in data["runs"]["lmdm"]["argv"]
    assert "--reduced" not in data["runs"]["kinematics"]["argv"]  # it has no such option
    assert data["suites"]["kinematics"]["config"]["strides"] == ["1"]
    for name in ("lmdm", "kinematics"):  # each suite's own files, kept as it ends
        assert json.loads((tmp_path / f"bench_{name}.json").read_text())["suite"] == name
    text = md.read_text()
    assert text.startswith("# studio bench --suite all")
    assert "## LMDM" in text and "## Kinematics" in text


def test_suite_all_keeps_going_after_a_failing_suite(tmp_path):
    js = tmp_path / "all.json"
    argv = ["bench", "--suite", "all", "--suites", "render,kinematics", "--device", "cpu"]
    argv += ["--repeats", "1", "--render-args=--batches 0", "--json", str(js)]
    assert cli_main(argv) == 2
    data = json.loads(js.read_text())
    assert data["suites"]["render"]["status"] == "error"
    assert data["suites"]["kinematics"]["suite"] == "kinematics"


def test_profile_section_splits_the_networks_by_kernel_kind(run):
    from studio.bench.render import RENDER_KERNELS, to_markdown
    from studio.bench.timing import kernel_category

    assert "profile" not in run["data"]  # CUDA only
    assert kernel_category("grid_sampler_3d_kernel<float>", RENDER_KERNELS) == "grid sampling"
    name = "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_nhwckrsc_nchw"
    assert kernel_category(name, RENDER_KERNELS) == "convolution / GEMM"
    net = {
        "kernels": 3,
        "kernel_ms": 8.0,
        "by_category": {"convolution / GEMM": {"kernels": 2, "ms": 6.0}},
        "top_kernels": [{"name": name, "count": 2, "ms": 6.0}],
    }
    fake = dict(run["data"])
    fake["profile"] = {
        "precision": "fp16",
        "batch": 2,
        "networks": {"warp_network": net, "decoder": net},
        "ms_per_frame": {"warp_network": 4.0, "decoder": 4.0},
    }
    md = to_markdown(fake)
    assert "### Where the time goes: eager fp16, B=2" in md
    assert "warp_network 4.000 ms, decoder 4.000 ms (total 8.000 ms)" in md
    assert "| convolution / GEMM | 2 | 6.000 | 75% |" in md
    fake["profile"] = {"error": "OutOfMemoryError: boom"}
    assert "Profile failed: OutOfMemoryError: boom" in to_markdown(fake)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last_3d"])
def test_padded_warp_decode_matches_the_reference(layout, one_torch_thread):
    """Padded channels (and the 3-D weights in channels-last-3d) render the same images."""
    cpu = torch.device("cpu")
    warp = random_network("warp_network", reduced=True)
    decoder = random_network("decoder", reduced=True)
    inputs = R._make_inputs(warp, [2], 1, 32, 0, cpu)
    fp32 = R.PRECISIONS["fp32"]
    ref = R.WarpDecode(warp, decoder, fp32, cpu, reference=True)(*inputs.batch(2)[0])
    wd = R.WarpDecode(warp, decoder, fp32, cpu, layout=layout, pad=R.PAD_MULTIPLE, split=True)
    assert any(isinstance(m, PaddedConv) for m in wd.warp.modules())
    if layout == "channels_last_3d":
        w5 = next(p for p in wd.warp.parameters() if p.dim() == 5 and p.shape[1] > 1)
        assert w5.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(wd(*inputs.batch(2)[0]), ref, rtol=1e-4, atol=1e-5)
