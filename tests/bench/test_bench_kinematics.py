"""The kinematics bench suite through the real CLI: physical sense on the demo clip, real speech."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studio.audio.io import load_audio
from studio.cli import main as cli_main
from studio.engines.demo import demo_audio_path

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


NO_CADENCE = ("--no-cadence",)
TINY_CADENCE = ("--cadence-size", "64", "--cadence-max-frames", "12", "--no-cadence-speech")


def _run(
    tmp: Path, *extra: str, cadence: tuple[str, ...] = NO_CADENCE
) -> tuple[int, dict | None, str | None]:
    js, md = tmp / "k.json", tmp / "k.md"
    argv = ["bench", "--suite", "kinematics", "--repeats", "1", "--warmup", "0", *cadence, *extra]
    rc = cli_main([*argv, "--json", str(js), "--markdown", str(md), "--plots", str(tmp)])
    if not js.exists():
        return rc, None, None
    return rc, json.loads(js.read_text()), md.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    rc, data, md = _run(tmp_path_factory.mktemp("kin"), cadence=TINY_CADENCE)
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


# --- the cadence section -------------------------------------------------------------------


def _check_cadence_clip(c: dict, most: int | None = None) -> None:
    assert c["inbetweens"] == c["frames"] - c["keyframes"] > 0
    assert c["measured"] == (c["inbetweens"] if most is None else min(most, c["inbetweens"]))
    assert c["frames_saved"] == pytest.approx(c["inbetweens"] / c["frames"])
    for key in ("psnr_db", "ssim"):
        s = c[key]
        assert s["worst"] <= s["p5"] <= s["mean"] and s["worst"] is not None
    assert c["ssim"]["mean"] <= 1.0
    assert c["timing"]["cost_fraction"] > 0 and sum(c["stride_histogram"].values()) == c["frames"]


def test_cadence_section_on_the_demo_clip(demo):
    data, md = demo
    section = data["cadence"]
    assert section["config"]["engines"] == ["demo"] and section["config"]["size"] == 64
    clip = section["engines"]["demo"]["clips"]["demo"]
    assert clip["frame_size"] == [64, 64]
    _check_cadence_clip(clip, most=12)
    summary = data["summary"]["cadence"]["demo/demo"]
    assert summary["psnr_mean_db"] == clip["psnr_db"]["mean"]
    assert "### Cadence: in-between frames against full renders" in md
    assert "| target (issue 19) |" in md and "| demo | demo | " in md


def _tiny_wav(folder: Path, seconds: float = 2.0) -> Path:
    import soundfile as sf

    audio = load_audio(demo_audio_path())
    path = folder / "tiny.wav"
    sf.write(path, audio.samples[: int(seconds * 16000)], 16000)
    return path


def test_cadence_section_on_a_tiny_input(tmp_path):
    tiny = _tiny_wav(tmp_path)
    missing = tmp_path / "no_such_speech.wav"
    cadence = ("--cadence-size", "64", "--cadence-speech", str(missing))
    rc, data, md = _run(
        tmp_path, "--no-demo", "--strides", "auto", "--audio", str(tiny), cadence=cadence
    )
    assert rc == 0
    clips = data["cadence"]["engines"]["demo"]["clips"]
    assert list(clips) == ["tiny"]
    _check_cadence_clip(clips["tiny"])
    assert any("no_such_speech.wav" in n and "absent" in n for n in data["notes"])
    assert "| demo | tiny | " in md


def test_cadence_off_and_bad_engines(tmp_path, capsys):
    rc, data, md = _run(tmp_path, "--strides", "1")
    assert rc == 0 and "cadence" not in data and "cadence" not in data["summary"]
    assert "### Cadence" not in md
    with pytest.raises(SystemExit) as exited:  # argparse rejects it before any work
        _run(tmp_path / "bad", "--cadence-engines", "nope", cadence=())
    assert exited.value.code == 2 and not (tmp_path / "bad" / "k.json").exists()
    assert "--cadence-engines" in capsys.readouterr().err


def test_cadence_adds_the_real_speech_once(tmp_path):
    speech = _speech()
    if speech is None:
        pytest.skip("no real speech in ../shared/fixtures")
    tiny = _tiny_wav(tmp_path, 1.5)
    cadence = ("--cadence-size", "64", "--cadence-max-frames", "4", "--cadence-speech", str(speech))
    argv = ("--no-demo", "--strides", "1", "--audio", str(tiny), "--audio", str(speech))
    rc, data, _ = _run(tmp_path, *argv, cadence=cadence)
    assert rc == 0
    assert list(data["cadence"]["engines"]["demo"]["clips"]) == ["tiny", speech.stem]
