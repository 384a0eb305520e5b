"""The pipeline bench suite: a CPU smoke run on a reduced tree through the real CLI, its error
for a bad checkpoint folder, its place in `--suite all`, and the cost-like HuBERT graph."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from studio.bench import SUITES, _accepts, build_all_parser
from studio.bench import pipeline as P
from studio.cli import main as cli_main

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("av")

# One torch thread: little slower on an idle CPU, far faster on a busy one (no OpenMP workers
# waiting for a sibling the scheduler has parked).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = 13  # the shortest clip load checks accept (0.5 s)
SMOKE = ["--device", "cpu", "--reduced", "--frames", str(FRAMES), "--warmup", "0"]
SMOKE += ["--repeats", "1"]
MUST_BE_POSITIVE = ("hubert", "lmdm", "smoothing", "stitching", "warp_decode", "putback")
MUST_BE_POSITIVE += ("encode", "total")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pipeline")
    argv = ["bench", "--suite", "pipeline", *SMOKE]
    argv += ["--json", str(out / "p.json"), "--markdown", str(out / "p.md"), "--plots", str(out)]
    rc = cli_main(argv)
    return {
        "rc": rc,
        "data": json.loads((out / "p.json").read_text()),
        "md": (out / "p.md").read_text(),
        "dir": out,
    }


@pytest.mark.slow  # the module's `run`: 2 x 13 frames end to end (about 10 s)
def test_smoke_json_has_every_stage_and_both_variants(run):
    assert run["rc"] == 0
    data = run["data"]
    assert data["suite"] == "pipeline"
    assert "studio bench --suite pipeline" in data["facts"]["command"]
    assert data["config"]["frames"] == FRAMES and data["config"]["steps"] == P.DEFAULT_STEPS
    assert set(data["variants"]) == {"crop", "full"}
    assert data["variants"]["crop"]["frame_size"] == [512, 512]
    assert data["variants"]["full"]["frame_size"] == list(P.DEFAULT_SOURCE)
    for name, rec in data["variants"].items():
        assert set(P.STAGES) <= set(rec["stages_ms"]), name
        for stage in MUST_BE_POSITIVE:
            assert rec["stages_ms"][stage] > 0, (name, stage)
        assert rec["frames"] == rec["rendered_frames"] == FRAMES  # stride 1
        assert rec["mp4_bytes"] > 0
        loop = sum(rec["stages_ms"][s] for s in P.RENDER_LOOP)
        assert rec["render_loop_fps"] == pytest.approx(FRAMES / (loop / 1e3))
        assert rec["overall_fps"] == pytest.approx(FRAMES / (rec["stages_ms"]["total"] / 1e3))
        assert rec["render_dtype"] == "float32" and rec["memory"]["batch"] >= 1
    inputs = data["inputs"]
    assert inputs["avatar_registration_ms"] > 0 and inputs["engine_load_ms"] > 0
    assert inputs["hubert"]["kind"] == "reduced" and not inputs["hubert"]["cost_is_real"]
    assert any("not the real network" in n for n in data["notes"])
    assert data["summary"]["measured_on"] == "crop"
    assert data["summary"]["hubert_cost_is_real"] is False


@pytest.mark.slow  # the module's `run`: 2 x 13 frames end to end (about 10 s)
def test_smoke_markdown_has_the_published_column(run):
    md = run["md"]
    assert f"## Pipeline: a {FRAMES}-frame clip end to end" in md
    assert "| published (165 frames) | crop 512x512 | full 1280x720 |" in md
    assert "2,180.0" in md and "71.1" in md  # published warp+decode and render loop
    assert "stand-in, not the real cost" in md  # the HuBERT row says what it is
    assert "avatar registration (first)" in md


@pytest.mark.slow  # the module's `run`: 2 x 13 frames end to end (about 10 s)
def test_smoke_plot_or_reason(run):
    plots = run["data"]["plots"]
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib" in plots["skipped"]
    else:
        assert [Path(f).name for f in plots["files"]] == ["pipeline_waterfall.png"]
        assert (run["dir"] / "pipeline_waterfall.png").is_file()


def test_bad_checkpoints_path_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "no_such_tree"
    rc = cli_main(
        ["bench", "--suite", "pipeline", "--device", "cpu", "--checkpoints", str(missing)]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err


def test_suite_all_includes_pipeline():
    assert "pipeline" in SUITES and _accepts("pipeline", "--reduced")
    args = build_all_parser().parse_args(["--pipeline-args=--frames 13"])
    assert args.pipeline_args == "--frames 13"
    assert "pipeline" in args.suites.split(",")


def test_speech_clip_is_deterministic_and_exact_length():
    a, b = P.speech_clip(6.6), P.speech_clip(6.6)
    assert a.num_frames == P.CLIP_FRAMES
    assert np.array_equal(a.samples, b.samples) and np.abs(a.samples).max() <= 1.0


def test_costlike_hubert_has_the_released_interface(tmp_path):
    from studio.audio.features import HubertFeatures
    from studio.fixtures.hubert_standin import HUBERT_LARGE, HUBERT_SMOKE, build_hubert_costlike

    path = build_hubert_costlike(tmp_path / "h.onnx", HUBERT_SMOKE)
    hub = HubertFeatures(path, ("CPUExecutionProvider",))  # checks the signature
    x = np.random.default_rng(0).normal(0, 0.1, 6480).astype(np.float32)
    enc = hub._session.run(["encoding_out"], {"input_values": x[None]})[0]
    assert enc.shape == (20, 1024) and np.isfinite(enc).all()
    assert hub.offline(x[:3200]).shape == (5, 1024)
    assert 310e6 < HUBERT_LARGE.params() < 320e6  # HuBERT-large: about 316 M weights
    assert HUBERT_LARGE.gflop(6480) > 10 * HUBERT_SMOKE.gflop(6480)
