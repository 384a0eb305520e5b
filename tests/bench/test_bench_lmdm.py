"""The lmdm bench suite on the CPU: result layout, reference accuracy, Markdown, JSON, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.bench import lmdm as B
from studio.bench import timing as BT

CUDA_PATHS = [s.name for s in B.FAST_PATHS]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def result() -> dict:
    return B.run_lmdm_suite(device="cpu", reduced=True, steps=(1, 2), repeats=2, warmup=1)


def test_documented_keys(result):
    for key in ("suite", "facts", "config", "published", "targets", "paths", "summary", "notes"):
        assert key in result
    assert result["suite"] == "lmdm"
    assert set(B.ALL_PATHS) - {p.name for p in B.COMPILED_PATHS} <= set(result["paths"])
    for key in ("name", "capability", "torch", "cuda_runtime", "date"):
        assert key in result["facts"]
    eager = result["paths"]["eager_fp32"]
    assert eager["status"] == "ok" and eager["settings"]["dtype"] == "float32"
    assert eager["step"]["median_ms"] > 0 and eager["step"]["repeats"] == 2
    assert set(eager["ddim"]) == {"1", "2"}
    for rec in eager["ddim"].values():
        for key in (
            "median_ms",
            "min_ms",
            "max_ms",
            "samples_ms",
            "motion_fps",
            "cosine",
            "rel_l2",
        ):
            assert key in rec
        assert rec["motion_fps"] == pytest.approx(80 / (rec["median_ms"] / 1e3))


def test_eager_against_itself_is_exact(result):
    for rec in result["paths"]["eager_fp32"]["ddim"].values():
        assert rec["cosine"] == pytest.approx(1.0, abs=1e-12)
        assert rec["rel_l2"] == 0.0


def test_cuda_paths_skipped_with_reason_on_cpu(result):
    for name in CUDA_PATHS:
        rec = result["paths"][name]
        assert rec["status"] == "skipped"
        assert "cuda" in rec["reason"]
    trt = result["paths"]["tensorrt"]
    assert trt["status"] in ("unavailable", "skipped") and trt["reason"]
    if trt["status"] == "unavailable":
        assert trt["reason"].startswith("unavailable: ")


def test_onnxruntime_cpu_matches_eager(result):
    rec = result["paths"]["onnxruntime_cpu"]
    if rec["status"] != "ok":
        pytest.skip(rec["reason"])
    for r in rec["ddim"].values():
        assert r["cosine"] > 0.99999 and r["rel_l2"] < 1e-4


def test_markdown_tables_and_published_figures(result):
    text = B.to_markdown(result)
    for header in (
        "### Single network step",
        "### DDIM latency, ms (median)",
        "### Effective motion FPS",
        "### Final x0 vs fp32 eager",
        "### Targets",
        "### Paths not measured",
        "| path | T=1 | T=2 |",
    ):
        assert header in text
    for figure in (
        "5.24",
        "5.05",
        "9.80",
        "19.65",
        "49.12",
        "249.04",
        "24.34",
        "1118.95",
        "0.9928",
    ):
        assert figure in text
    assert "eager_fp32" in text and "fast_bf16_window_graph" in text


def test_json_serialisable(result):
    text = json.dumps(result, allow_nan=False)
    assert json.loads(text)["paths"]["eager_fp32"]["ddim"]["1"]["median_ms"] > 0


def test_plots_written_or_skipped_with_note(result, tmp_path):
    info = B.save_plots(dict(result), tmp_path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert info["files"] == [] and "matplotlib" in info["skipped"]
    else:
        assert info["files"] and all(Path(f).is_file() for f in info["files"])


def test_main_writes_json_and_markdown(tmp_path, capsys):
    js, md = tmp_path / "o" / "lmdm.json", tmp_path / "o" / "lmdm.md"
    argv = ["--device", "cpu", "--reduced", "--steps", "1", "--repeats", "1", "--no-onnx"]
    argv += ["--json", str(js), "--markdown", str(md), "--input-sets", "1"]
    assert B.main(argv) == 0
    data = json.loads(js.read_text())
    assert data["config"]["steps"] == [1]
    assert data["paths"]["onnxruntime_cpu"]["status"] == "skipped"
    assert "### DDIM latency" in md.read_text()
    assert "studio bench --suite lmdm" in data["facts"]["command"]
    assert B.main(["--device", "cpu", "--paths", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_measure_runs_setup_before_each_run():
    seen: list[tuple[str, int]] = []
    t = BT.measure(
        lambda: seen.append(("run", -1)),
        device="cpu",
        repeats=3,
        warmup=2,
        setup=lambda i: seen.append(("setup", i)),
    )
    assert len(t.samples_ms) == 3 and t.method == "perf_counter"
    assert [s for s in seen if s[0] == "setup"] == [("setup", i) for i in (0, 1, 0, 1, 2)]
    d = t.to_dict()
    assert d["repeats"] == 3 and d["min_ms"] <= d["median_ms"] <= d["max_ms"]
    with pytest.raises(ValueError):
        BT.measure(lambda: None, device="cpu", repeats=0)


def test_markdown_profile_section_and_kernel_kinds(result):
    from studio.bench.timing import kernel_category

    cats = B._KERNEL_CATEGORIES
    assert kernel_category("elementwise_kernel<128, 4>", cats) == "elementwise / other"
    assert kernel_category("nvjet_sm90_tst_64x16_64x16_2x4_h_bz_bias_TNT", cats) == "matmul"
    assert kernel_category("pytorch_flash::flash_fwd_kernel", cats) == "attention"
    assert kernel_category("triton_poi_fused_gelu_view_8", cats) == "triton (fused)"
    fake = dict(result)
    fake["profile"] = {
        "path": "fast_fp16_graph",
        "steps": 4,
        "replay_ms": 4.9,
        "kernels_per_step": 450.0,
        "kernel_ms": 4.0,
        "busy_fraction": 0.82,
        "by_category": {"matmul": {"kernels_per_step": 103.0, "ms_per_step": 0.43}},
        "top_kernels": [{"name": "nvjet_sm90_x", "count": 224, "ms": 0.87}],
    }
    text = B.to_markdown(fake)
    assert "### Where the time goes: fast_fp16_graph, T=4" in text
    assert "| matmul | 103 | 0.4300 |" in text


def test_commit_of_a_checkout_and_of_an_archived_copy(tmp_path):
    """Bench headers name the commit: HEAD in a checkout; in a ``git archive`` copy (the GPU
    runs' tree, often inside another, stale repository) the archived commit itself."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / BT.ARCHIVE_COMMIT).read_text().startswith("$Format"):
        pytest.skip("this tree is itself a git archive copy: its stamp is the commit")
    found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip("not a git checkout")
    head = found.stdout.strip()
    assert BT.git_commit(root).removesuffix("-dirty") == head
    archive = subprocess.run(
        ["git", "archive", "HEAD", str(BT.ARCHIVE_COMMIT)],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    assert BT.git_commit(tmp_path) == f"{head} (git archive)"
    assert BT.git_commit(tmp_path / "nowhere") is None  # neither a stamp nor a repository


def test_the_fast_paths_are_the_window_paths_and_removed_ones_are_refused(capsys):
    """Only the product's window step is measured (the variants that lost were removed after
    measurement, docs/benchmarks.md); the GPU script's paths are all still known."""
    fast = B.FAST_PATHS + B.COMPILED_PATHS
    assert all("_window_" in p.name for p in fast)
    assert {p.precision for p in fast} == {"fp32", "tf32", "bf16", "fp16"}
    assert all(p.sdpa == "flash" for p in fast if "_flash_" in p.name)
    script = (Path(__file__).resolve().parents[2] / "scripts" / "bench_gpu.sh").read_text()
    wanted = script.split("--suite lmdm", 1)[1].split("--paths", 1)[1].split()[0].split(",")
    assert set(wanted) <= set(B.ALL_PATHS)
    for gone in ("fast_fp16_fold_graph", "fast_bf16_graph", "fast_fp16_perstep_graph"):
        assert B.main(["--device", "cpu", "--paths", gone]) == 2
        assert gone in capsys.readouterr().err
