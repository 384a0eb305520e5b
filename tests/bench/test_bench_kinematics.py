"""The kinematics bench suite through the real CLI: physical sense on the demo clip, real speech."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.audio.io import load_audio
from studio.cli import main as cli_main
from studio.engines.demo.engine import demo_audio_path

FIXTURES = [
    Path(__file__).resolve().parents[3] / "shared" / "fixtures",
    Path("/work/shared/fixtures"),
]


def _speech() -> Path | None:
    for folder in FIXTURES:
        found = sorted(folder.glob("*.wav")) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def _run(tmp: Path, *extra: str) -> tuple[int, dict | None, str | None]:
    js, md = tmp / "k.json", tmp / "k.md"
    argv = ["bench", "--suite", "kinematics", "--repeats", "1", "--warmup", "0", *extra]
    rc = cli_main([*argv, "--json", str(js), "--markdown", str(md), "--plots", str(tmp)])
    if not js.exists():
        return rc, None, None
    return rc, json.loads(js.read_text()), md.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    rc, data, md = _run(tmp_path_factory.mktemp("kin"))
    assert rc == 0
    return data, md


def test_demo_clip_keys_and_frames(demo):
    data, _ = demo
    assert data["suite"] == "kinematics" and list(data["clips"]) == ["demo"]
    clip = data["clips"]["demo"]
    assert clip["frames"] == load_audio(demo_audio_path()).num_frames
    assert list(clip["runs"]) == ["auto", "1"]
    assert data["config"]["smoothing"]["window"] == 5
    assert "studio bench --suite kinematics" in data["facts"]["command"]
    assert "_series" not in data
    for run in clip["runs"].values():
        assert sum(run["stride_histogram"].values()) == clip["frames"]
        for stage in ("cadence", "smoothing"):
            assert run["timings"][stage]["median_ms"] > 0


def test_smoothing_makes_physical_sense_on_the_demo_clip(demo):
    data, _ = demo
    for stride, run in data["clips"]["demo"]["runs"].items():
        assert 0 < run["pose_jerk_mean_smoothed"] < run["pose_jerk_mean_raw"], stride
        assert run["pose_jerk_p95_smoothed"] < run["pose_jerk_p95_raw"]
        assert run["pose_jerk_change_pct"] == pytest.approx(
            100 * (run["pose_jerk_mean_smoothed"] / run["pose_jerk_mean_raw"] - 1)
        )
        # smoothing never touches exp (nor scale): bit-identical, MAE 0, velocity corr 1
        assert run["exp_bit_identical"] and run["scale_bit_identical"]
        assert run["exp_mae"] == 0.0 and run["exp_velocity_corr"] == 1.0
        assert run["accel_max_smoothed"] <= run["accel_limit"] == 0.5
    auto, one = data["clips"]["demo"]["runs"]["auto"], data["clips"]["demo"]["runs"]["1"]
    assert auto["transitions"] > 0
    assert 0 < auto["transition_jerk_peak_smoothed"] < auto["transition_jerk_peak_raw"]
    assert one["transitions"] == 0 and one["transition_jerk_peak_raw"] == 0.0
    # stride 1 samples nothing away: its raw motion is the generated motion
    assert one["pose_jerk_mean_raw"] == pytest.approx(
        data["clips"]["demo"]["pose_jerk_mean_generated"]
    )
    summary = data["summary"]
    assert summary["exp_untouched_everywhere"] and summary["jerk_reduced_everywhere"]
    assert summary["within_accel_limit_everywhere"]


def test_markdown_beside_the_published_figures(demo):
    _, md = demo
    for text in (
        "## Kinematics: pose jerk before and after smoothing",
        "DemoEngine",
        "not available here",
        "| published | – | 165 |",
        "23.31",
        "19.76",
        "-15.2%",
        "untouched",
        "| demo | auto |",
        "### Stage timings",
    ):
        assert text in md
    # every table row has as many cells as its header (a dropped cell shifts the columns)
    for block in md.split("\n\n"):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            assert len({row.count("|") for row in rows}) == 1, block


def test_plots_written_or_skipped(demo, tmp_path):
    rc, _, md = _run(tmp_path, "--strides", "1")
    assert rc == 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib" in md and not list(tmp_path.glob("*.png"))
    else:
        assert (tmp_path / "kinematics_demo.png").is_file()


def test_no_smoothing_changes_nothing(tmp_path):
    rc, data, _ = _run(tmp_path, "--no-smooth", "--strides", "auto")
    assert rc == 0
    run = data["clips"]["demo"]["runs"]["auto"]
    assert run["pose_jerk_mean_smoothed"] == run["pose_jerk_mean_raw"]
    assert run["pose_jerk_change_pct"] == 0.0 and data["config"]["smoothing"]["enabled"] is False


def test_real_speech(tmp_path):
    speech = _speech()
    if speech is None:
        pytest.skip("no real speech in ../shared/fixtures")
    rc, data, md = _run(tmp_path, "--no-demo", "--strides", "auto", "--audio", str(speech))
    assert rc == 0 and list(data["clips"]) == [speech.stem]
    clip = data["clips"][speech.stem]
    assert clip["sample_rate"] == load_audio(speech).original_rate and clip["frames"] > 100
    run = clip["runs"]["auto"]
    assert run["pose_jerk_mean_smoothed"] < run["pose_jerk_mean_raw"] and run["exp_mae"] == 0.0
    assert f"| {speech.stem} | auto |" in md


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    rc, data, _ = _run(tmp_path, "--audio", str(tmp_path / "missing.wav"))
    assert rc == 2 and data is None
    assert "missing.wav" in capsys.readouterr().err
    rc, data, _ = _run(tmp_path, "--smooth-window", "4")
    assert rc == 2 and data is None
    assert "--smooth-window" in capsys.readouterr().err
