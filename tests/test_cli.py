"""The `studio` command end to end: real audio files, real PyAV decoding."""

import json
import math
import subprocess
import sys

import av
import numpy as np
import pytest
import soundfile as sf

from studio.cli import main
from studio.render.demo import demo_audio_path


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors exit from parse_args
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def demo_render(tmp_path_factory):
    d = tmp_path_factory.mktemp("render")
    out, report = d / "demo.mp4", d / "report.json"
    assert (
        main(
            [
                "render",
                "--demo",
                "--out",
                str(out),
                "--report",
                str(report),
                "--size",
                "256",
                "--x264-preset",
                "veryfast",
            ]
        )
        == 0
    )
    return out, json.loads(report.read_text())


def test_demo_render_writes_valid_mp4_with_audio(demo_render):
    out, report = demo_render
    info = sf.info(str(demo_audio_path()))
    expected = math.ceil(info.frames * 25 / info.samplerate)
    with av.open(str(out)) as c:
        v = c.streams.video[0]
        assert v.codec_context.name == "h264" and v.codec_context.pix_fmt == "yuv420p"
        assert (v.width, v.height) == (256, 256) and v.average_rate == 25
        assert len(c.streams.audio) == 1 and c.streams.audio[0].codec_context.name == "aac"
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == expected == report["frames"]
    # The face changes while speaking, and the mouth region changes most.
    diffs = [
        np.abs(frames[i + 5].astype(int) - frames[i].astype(int)).mean()
        for i in range(0, len(frames) - 5, 5)
    ]
    assert np.median(diffs) > 0.5
    assert not (out.parent / f".{out.name}.partial").exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_report_has_every_key(demo_render):
    _, r = demo_render
    assert {
        "frames",
        "fps",
        "duration_s",
        "rendered_frames",
        "stride_histogram",
        "timings_ms",
        "kinematics",
    } <= set(r)
    assert set(r["stride_histogram"]) == {"1", "2", "3"}
    assert sum(r["stride_histogram"].values()) == r["frames"]
    assert 0 < r["rendered_frames"] < r["frames"]
    assert {"features", "motion", "cadence", "smoothing", "render", "encode", "total"} <= set(
        r["timings_ms"]
    )
    k = r["kinematics"]
    assert set(k) == {
        "pose_jerk_mean_raw",
        "pose_jerk_mean_smoothed",
        "transition_jerk_peak_raw",
        "transition_jerk_peak_smoothed",
        "exp_mae",
        "exp_velocity_corr",
        "accel_max_smoothed",
        "accel_limit",
    }
    assert k["pose_jerk_mean_smoothed"] < k["pose_jerk_mean_raw"]
    assert k["accel_max_smoothed"] <= k["accel_limit"]
    assert k["exp_mae"] == 0 and k["exp_velocity_corr"] == 1


def test_analyze_json_matches_render_keys_without_render_timings(tmp_path, capsys):
    out = tmp_path / "a.json"
    code, stdout, _ = _run(
        ["analyze", "--demo", "--json", str(out), "--smooth-window", "7"], capsys
    )
    assert code == 0 and "pose jerk" in stdout
    r = json.loads(out.read_text())
    assert "render" not in r["timings_ms"] and "encode" not in r["timings_ms"]
    assert len(r["strides"]) == r["frames"] and r["keyframes"][0] == 0
    assert r["settings"]["smooth_window"] == 7


def test_smoothing_options_change_the_analysis(tmp_path, capsys):
    def jerk(*opts):
        p = tmp_path / "x.json"
        assert main(["analyze", "--demo", "--json", str(p), *opts]) == 0
        return json.loads(p.read_text())["kinematics"]

    capsys.readouterr()
    off, on, wide = jerk("--no-smooth"), jerk(), jerk("--smooth-window", "15")
    assert off["pose_jerk_mean_smoothed"] == off["pose_jerk_mean_raw"]
    assert (
        wide["pose_jerk_mean_smoothed"]
        < on["pose_jerk_mean_smoothed"]
        < off["pose_jerk_mean_smoothed"]
    )
    tight = jerk("--accel-limit", "0.05")
    assert tight["accel_max_smoothed"] <= 0.05


@pytest.mark.parametrize(
    "fmt, subtype, rate, channels",
    [
        ("FLAC", "PCM_16", 44100, 2),
        ("OGG", "VORBIS", 48000, 1),
        ("MP3", "MPEG_LAYER_III", 22050, 1),
    ],
)
def test_render_other_formats_and_rates(tmp_path, capsys, fmt, subtype, rate, channels):
    speech, sr = sf.read(str(demo_audio_path()), dtype="float32")
    speech = speech[: sr * 2]
    from scipy.signal import resample_poly

    x = resample_poly(speech, rate, sr).astype(np.float32)
    if channels == 2:
        x = np.stack([x, 0.5 * x], axis=1)
    src = tmp_path / f"speech.{fmt.lower()}"
    sf.write(str(src), x, rate, format=fmt, subtype=subtype)
    out = tmp_path / "o.mp4"
    code, _, err = _run(
        [
            "render",
            "--audio",
            str(src),
            "--out",
            str(out),
            "--size",
            "128",
            "--x264-preset",
            "ultrafast",
        ],
        capsys,
    )
    assert code == 0, err
    with av.open(str(out)) as c:
        n = sum(1 for _ in c.decode(video=0))
    assert n == math.ceil(len(x) * 25 / rate)


def _bad_audio(tmp_path, kind):
    p = tmp_path / f"{kind}.wav"
    rate = 16000
    if kind == "missing":
        return p
    if kind == "empty":
        p.write_bytes(b"")
    elif kind == "corrupt":
        p.write_bytes(np.random.default_rng(0).bytes(5000))
    elif kind == "truncated":
        sf.write(
            str(p), np.sin(np.arange(rate * 2) / 5).astype(np.float32) * 0.5, rate, subtype="PCM_16"
        )
        p.write_bytes(p.read_bytes()[:20000])
    elif kind == "silent":
        sf.write(str(p), np.zeros(rate * 2, np.float32), rate)
    elif kind == "short":
        sf.write(str(p), np.sin(np.arange(rate // 5) / 5).astype(np.float32) * 0.5, rate)
    elif kind == "text":
        p = tmp_path / "notes.txt"
        p.write_text("this is not audio\n" * 50)
    elif kind == "image":
        p = tmp_path / "face.png"
        p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    elif kind == "fake mp3":
        p = tmp_path / "talk.mp3"
        p.write_text("this is not audio\n" * 50)
    return p


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing", "does not exist"),
        ("empty", "empty"),
        ("corrupt", "not recognised"),
        ("truncated", "truncated"),
        ("silent", "silent"),
        ("short", "too short"),
        ("text", ""),
        ("image", ""),
        ("fake mp3", "no decoder recognises"),  # libsndfile said the file did not exist
    ],
)
def test_bad_audio_is_one_clear_line_and_no_output(tmp_path, capsys, kind, words):
    src = _bad_audio(tmp_path, kind)
    out = tmp_path / "out.mp4"
    code, stdout, err = _run(["render", "--audio", str(src), "--out", str(out)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and src.name in lines[0] and words in lines[0].lower()
    assert "Traceback" not in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.suffix == ".mp4"] == []


@pytest.mark.parametrize(
    "opts, option",
    [
        (["--smooth-window", "4"], "--smooth-window"),
        (["--smooth-window", "1"], "--smooth-window"),
        (["--smooth-window", "x"], "--smooth-window"),
        (["--smooth-order", "5"], "--smooth-order"),
        (["--accel-limit", "-1"], "--accel-limit"),
        (["--accel-limit", "nan"], "--accel-limit"),
        (["--stride", "5"], "--stride"),
        (["--size", "511"], "--size"),
        (["--size", "8"], "--size"),
        (["--crf", "99"], "--crf"),
        (["--seed", "-3"], "--seed"),
        (["--x264-preset", "warp"], "--x264-preset"),
    ],
)
def test_invalid_options(tmp_path, capsys, opts, option):
    out = tmp_path / "out.mp4"
    code, _, err = _run(["render", "--demo", "--out", str(out), *opts], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "target, words", [("nodir/out.mp4", "does not exist"), ("out.mov", ".mp4"), (".", "directory")]
)
def test_unwritable_outputs(tmp_path, capsys, target, words):
    out = tmp_path / target
    code, _, err = _run(["render", "--demo", "--out", str(out)], capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1


def test_report_path_is_checked_before_rendering(tmp_path, capsys):
    out = tmp_path / "o.mp4"
    code, _, err = _run(
        ["render", "--demo", "--out", str(out), "--report", str(tmp_path / "missing" / "r.json")],
        capsys,
    )
    assert code == 2 and "--report" in err and not out.exists()


def test_preset_round_trip_and_bad_preset(tmp_path, capsys):
    from studio.settings import RenderSettings

    p = tmp_path / "p.json"
    RenderSettings(smooth_window=9, stride="2", seed=4).save(p)
    j = tmp_path / "a.json"
    assert main(["analyze", "--demo", "--preset", str(p), "--json", str(j)]) == 0
    s = json.loads(j.read_text())["settings"]
    assert (s["smooth_window"], s["stride"], s["seed"]) == (9, "2", 4)
    assert set(json.loads(j.read_text())["strides"]) == {2}
    bad = tmp_path / "bad.json"
    bad.write_text('{"smooth_window": 4}')
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad)], capsys)
    assert code == 2 and "bad.json" in err and "--smooth-window" in err
    bad.write_text("{not json")
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad)], capsys)
    assert code == 2 and "bad.json" in err
    bad.write_text('{"compile": "yes"}')
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad)], capsys)
    assert code == 2 and "--compile" in err and "must be true or false" in err


def test_doctor(capsys):
    code, out, _ = _run(["doctor", "--json"], capsys)
    info = json.loads(out)
    assert code == 0 and info["torch"]["available"] and info["pyav"]["encoders"]["libx264"]
    assert "offscreen" in info["qt"]["platform_plugins"]
    assert info["tensorrt"]["available"] in (True, False)
    code, out, _ = _run(["doctor"], capsys)
    assert code == 0 and "torch" in out and "PyAV" in out


def test_console_entry_and_help_on_every_subcommand():
    for sub in ([], ["render"], ["analyze"], ["doctor"], ["gui"]):
        r = subprocess.run(
            [sys.executable, "-m", "studio", *sub, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "usage:" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "studio", "render", "--demo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--out" in r.stderr and "Traceback" not in r.stderr


def test_gui_screenshot_smoke(tmp_path):
    shot = tmp_path / "shot.png"
    env = {
        **__import__("os").environ,
        "QT_QPA_PLATFORM": "offscreen",
        "STUDIO_CONFIG_DIR": str(tmp_path / "cfg"),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "studio",
            "gui",
            "--screenshot",
            str(shot),
            "--window-size",
            "1280x720",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    from PySide6.QtGui import QImage

    img = QImage(str(shot))
    assert (img.width(), img.height()) == (1280, 720)


def test_report_never_overwrites_an_input_or_the_video(tmp_path, capsys):
    wav = tmp_path / "speech.wav"
    wav.write_bytes(demo_audio_path().read_bytes())
    before = wav.read_bytes()
    out = tmp_path / "o.mp4"
    for report, other in ((wav, "--audio"), (out, "--out")):
        code, _, err = _run(
            ["render", "--demo", "--audio", str(wav), "--out", str(out), "--report", str(report)],
            capsys,
        )
        assert code == 2 and other in err and "overwritten" in err
        assert len(err.strip().splitlines()) == 1
    assert wav.read_bytes() == before and not out.exists()


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc (a folder no one writes)"
)
def test_report_and_bench_targets_in_a_folder_that_takes_no_files(tmp_path, capsys):
    """Checked before the work, one line, no traceback (root can write anywhere else here)."""
    out = tmp_path / "o.mp4"
    code, _, err = _run(["render", "--demo", "--out", str(out), "--report", "/proc/r.json"], capsys)
    assert code == 2 and "--report: cannot write in /proc" in err and "Traceback" not in err
    assert not out.exists()
    for target in ("/proc/studio/b.json", str(tmp_path)):
        code, _, err = _run(["bench", "--suite", "kinematics", "--json", target], capsys)
        assert code == 2 and "--json" in err and len(err.strip().splitlines()) == 1


def test_a_kill_removes_the_partial_video(tmp_path):
    """SIGTERM ends a render like Ctrl-C: exit 130, no partial MP4 left behind."""
    import os
    import signal
    import time

    rate = 16000
    t = np.arange(90 * rate) / rate  # a long clip, so the render is still running when killed
    sf.write(tmp_path / "long.wav", (0.3 * np.sin(2 * math.pi * 220 * t)).astype(np.float32), rate)
    out = tmp_path / "o.mp4"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "studio",
            "render",
            "--demo",
            "--audio",
            str(tmp_path / "long.wav"),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".o*partial*")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the render never started writing"
        time.sleep(0.05)
    assert proc.poll() is None, "the render finished before it could be killed"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted; nothing was written" in err
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_no_display_is_a_clear_error_and_a_screenshot_goes_offscreen():
    from studio.cli import _qt_platform
    from studio.errors import StudioError

    env: dict[str, str] = {}
    _qt_platform(env, screenshot=True, platform="linux")
    assert env == {"QT_QPA_PLATFORM": "offscreen"}
    with pytest.raises(StudioError, match="no display found"):
        _qt_platform({}, screenshot=False, platform="linux")
    for kept in ({"DISPLAY": ":0"}, {"QT_QPA_PLATFORM": "xcb"}, {"WAYLAND_DISPLAY": "w"}):
        env = dict(kept)
        _qt_platform(env, screenshot=True, platform="linux")
        assert env == kept
    _qt_platform({}, screenshot=False, platform="darwin")  # other systems: Qt finds its own
