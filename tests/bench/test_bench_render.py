"""The render bench suite on the CPU through the real CLI (timing the renderer's own engines),
its graph paths on a GPU, the suites' shared writer, and `--suite all`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from studio.bench import SUITES, report
from studio.bench import render as R
from studio.cli import main as cli_main
from studio.engines.ditto.warp_decode import WarpDecodeEngines
from studio.fixtures.random_tree import random_network
from studio.models.channel_pad import PaddedConv
from studio.models.decoder import Decoder
from studio.models.warp_network import WarpNetwork

pytestmark = pytest.mark.usefixtures("one_torch_thread")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)"
)

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
    assert (
        data["config"]["engine"] == R.ENGINE == "studio.engines.ditto.warp_decode.WarpDecodeEngines"
    )
    for name, rec in data["paths"].items():
        assert rec["status"] == "ok", (name, rec)
        s = rec["settings"]  # what ran: the renderer's engines with the path's knobs
        assert s["engine"] == R.ENGINE and s["runtime"] == "torch" and s["cuda_graphs"] is False
        assert s["layout"] == (
            "channels_last" if name.startswith("channels_last") else "contiguous"
        )
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
    cuda = R.plan_paths(["fp32", "fp16"], "cuda", compile=True)
    assert [p.name for p in cuda] == [
        "eager_fp32", "eager_fp16", "channels_last_fp16", "graph_fp16",
        "graph_split_padded_fp16", "compiled_graph_fp16", "compiled_graph_channels_last_fp16",
        "compiled_graph_split_fp16", "compiled_graph_padded_fp16",
        "compiled_graph_split_padded_fp16", "padded_fp16",
    ]  # fmt: skip
    by_name = {p.name: p for p in cuda}
    default = by_name["compiled_graph_split_padded_fp16"]  # the renderer's default, --compile
    assert (default.pad, default.split, default.graph, default.compile) == (8, True, True, True)
    assert by_name["compiled_graph_split_fp16"].pad == 0
    assert by_name["compiled_graph_padded_fp16"].split is False
    with pytest.raises(ValueError):
        R.plan_paths(["fp64"], "cpu")


def test_runner_rotates_input_sets_through_the_engines(monkeypatch):
    """Each run's set is loaded into the engines untimed (its avatar once, as in a clip), the
    timed call is one call of the renderer's engines, and the images match the reference set
    by set."""
    cpu = torch.device("cpu")
    warp = R.sized_warp(random_network("warp_network", reduced=True), 32)
    decoder = random_network("decoder", reduced=True)
    inputs = R._make_inputs(warp, [1], 2, 32, 0, cpu)
    ref_wd = R.build_engines(
        R.RenderPath("eager_fp32", "fp32"), warp, decoder, cpu, feature_size=32
    )
    refs = {1: [ref_wd(*s, 1).clone() for s in inputs.batch(1)]}
    assert not torch.equal(refs[1][0], refs[1][1])  # the two input sets differ
    spec = R.RenderPath("padded_fp32", "fp32", pad=R.PAD_MULTIPLE, split=True)
    wd = R.build_engines(spec, warp, decoder, cpu, feature_size=32)
    loaded, calls = [], []
    load, call = wd.load_avatar, WarpDecodeEngines.__call__
    monkeypatch.setattr(wd, "load_avatar", lambda f_s, b: (loaded.append(f_s), load(f_s, b)))
    monkeypatch.setattr(
        WarpDecodeEngines, "__call__", lambda self, *a: (calls.append(a[-1]), call(self, *a))[1]
    )
    flush = R._CacheFlush(cpu, True)
    rec, _ = R._run_path(wd, inputs, [1], refs, 10**9, None, flush, cpu, 1, 0, 1.0)
    point = rec["batches"]["1"]
    assert point["status"] == "ok" and point["cosine"] > 0.99999, point
    assert point["floor_fraction"] is None  # no matmul rate given
    assert calls == [1, 1, 1]  # the timed run + one per input set, at the path's batch
    sets = inputs.batch(1)
    assert [id(f) for f in loaded] == [id(sets[k][0]) for k in (0, 0, 0, 1)]  # built, run, sets


@needs_cuda
def test_cuda_graph_and_rewritten_paths_time_the_engines(tmp_path):
    """On a GPU: the graph paths run the renderer's captured engines (the rewrites on the
    default path), agree with the fp32 reference, and their outputs are rewritten each call."""
    js = tmp_path / "r.json"
    argv = ["bench", "--suite", "render", "--device", "cuda", "--reduced", "--feature-size", "32"]
    argv += ["--batches", "2,4", "--repeats", "2", "--warmup", "1", "--input-sets", "2"]
    argv += ["--precisions", "fp16,bf16-autocast", "--no-profile", "--json", str(js)]
    argv += ["--paths", "eager_fp16,graph_fp16,graph_split_padded_fp16,graph_bf16_autocast"]
    assert cli_main(argv) == 0
    paths = json.loads(js.read_text())["paths"]
    assert set(paths) == {
        "eager_fp32", "eager_fp16", "graph_fp16", "graph_split_padded_fp16", "graph_bf16_autocast"
    }  # fmt: skip
    for name, rec in paths.items():
        assert rec["status"] == "ok", (name, rec)
        graphs = rec["settings"]["cuda_graphs"]
        assert bool(graphs) is name.startswith("graph"), (name, graphs)
        for r in rec["batches"].values():
            assert r["cosine"] >= 0.999 and math.isfinite(r["fps"]) and r["fps"] > 0
    rewritten = paths["graph_split_padded_fp16"]["settings"]
    assert rewritten["channel_pad"] == 8 and rewritten["depth_split"] is True
    assert paths["graph_bf16_autocast"]["settings"]["mode"] == "autocast"


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
    assert list(SUITES) == ["lmdm", "render", "pipeline", "kinematics", "streaming", "warmstart"]
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
    argv += ["--kinematics-args=--no-cadence"]  # the suites' order is under test, not theirs
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


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_rewritten_engines_match_the_reference(layout, one_torch_thread):
    """Padded channels and the depth split (and the channels-last layout) render the same
    images through the renderer's engines."""
    cpu = torch.device("cpu")
    warp = R.sized_warp(random_network("warp_network", reduced=True), 32)
    decoder = random_network("decoder", reduced=True)
    inputs = R._make_inputs(warp, [2], 1, 32, 0, cpu)
    f_s, x_s, x_d = inputs.batch(2)[0]
    with torch.no_grad():
        eager = decoder(warp(f_s.expand(2, *f_s.shape[1:]), x_s, x_d))  # the modules as loaded
    reference = R.build_engines(
        R.RenderPath("eager_fp32", "fp32"), warp, decoder, cpu, feature_size=32
    )
    torch.testing.assert_close(reference(f_s, x_s, x_d, 2), eager, rtol=1e-4, atol=1e-5)
    spec = R.RenderPath("padded", "fp32", layout=layout, pad=R.PAD_MULTIPLE, split=True)
    wd = R.build_engines(spec, warp, decoder, cpu, layout == "channels_last", feature_size=32)
    engine = wd.engines(2)["warp_network"]
    assert any(isinstance(m, PaddedConv) for m in engine.adapter.inner.modules())
    if layout == "channels_last":
        w5 = next(p for p in engine.adapter.inner.parameters() if p.dim() == 5 and p.shape[1] > 1)
        assert w5.is_contiguous(memory_format=torch.channels_last_3d)
        assert not any(  # the caller's network is not re-laid-out
            p.is_contiguous(memory_format=torch.channels_last_3d) and not p.is_contiguous()
            for p in warp.parameters()
        )
    torch.testing.assert_close(wd(f_s, x_s, x_d, 2), eager, rtol=1e-4, atol=1e-5)


# --- the suites' shared writer (studio.bench.report) ---------------------------------------


def test_shared_writer_tail_and_finish(tmp_path, capsys):
    p = report.suite_parser("demo", "A demo suite.", {"repeats": "runs"}, warmup_default=1)
    assert p.prog == "studio bench --suite demo"
    assert p._option_string_actions["--repeats"].help == "runs"
    assert p._option_string_actions["--json"].help == report.COMMON_HELP["json"]
    args = p.parse_args(["--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")])
    assert (args.device, args.plots, args.repeats, args.warmup) == (None, None, None, 1)
    assert report.count_error(args) is None
    assert report.count_error(p.parse_args(["--repeats", "0"])) == "--repeats must be >= 1"
    assert report.count_error(p.parse_args(["--warmup", "-1"])) == "--warmup must be >= 0"
    facts = {"name": "GPU", "capability": "9.0", "torch": "2.x", "cuda_runtime": "13.0"}
    facts |= {"date": "today", "commit": "abc"}
    assert report.measured_on(facts) == (
        "Measured on **GPU** (capability 9.0), torch 2.x, CUDA 13.0, today, commit `abc`."
    )
    cpu = {**facts, "capability": None, "cuda_runtime": None, "command": "studio bench"}
    assert report.measured_on(cpu) == (
        "Measured on **GPU**, torch 2.x, today, commit `abc`, command `studio bench`."
    )
    lines = report.settings_markdown({"a": {"settings": {"name": "a", "x": "1|2"}}})
    assert lines[-1] == "| a | x=1/2 |" and "### Settings per path" in lines
    tail = report.markdown_tail({"plots": {"files": ["/d/p.png"]}, "notes": ["n1"]})
    assert tail == ["", "![p](p.png)", "", "- n1"]
    assert report.markdown_tail({"plots": {"files": [], "skipped": "why"}}, notes=[]) == [
        "",
        "Plots: why",
    ]

    drawn: list = []

    def draw(plots):
        fig = plots.figure((4, 3))
        fig.add_subplot().plot([0, 1], [1, 2])
        plots.save(fig, "x.png")
        drawn.append(fig)

    result = {"facts": {}, "notes": [], "_series": {"kept": "for the plots"}}
    info = report.write_plots(result, tmp_path / "plots", draw)
    assert result["plots"] is info
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert info["files"] == [] and "matplotlib" in info["skipped"] and not drawn
    else:
        assert info["files"] == [str(tmp_path / "plots" / "x.png")]
        assert (tmp_path / "plots" / "x.png").is_file()

    def save_plots(res, folder):
        assert "_series" in res  # the plots still see the private series
        return report.write_plots(res, folder, draw)

    given = ["--json", str(tmp_path / "x.json"), "--markdown", str(tmp_path / "x.md")]
    given += ["--plots", str(tmp_path / "plots")]

    def run(parsed, progress):
        assert parsed.plots == str(tmp_path / "plots")
        progress("[demo] ran")
        return result

    rc = report.run_main("demo", p, given, run, lambda r: "# md\n", save_plots)
    assert rc == 0 and "_series" not in result
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["facts"] == {
        "command": " ".join(["studio bench --suite demo", *given]),
        "argv": given,
    }
    assert (tmp_path / "x.md").read_text() == "# md\n"
    out = capsys.readouterr()
    assert "# md" in out.out and "[demo] ran" in out.err

    def fail(parsed, progress):
        raise ValueError("no such thing")

    assert report.run_main("demo", p, [], fail, str) == 2
    assert "studio bench demo: no such thing" in capsys.readouterr().err
    assert report.run_main("demo", p, ["--repeats", "0"], run, str) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
    assert report.name_list(" a, b,") == ["a", "b"] and report.name_list(None) is None
