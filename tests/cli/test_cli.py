"""The `studio` command end to end: real audio files, real PyAV decoding."""

import json
import math
import os
import subprocess
import sys
from typing import Any

import av
import numpy as np
import pytest
import soundfile as sf
from conftest import run_cli as _run
from conftest import sigint_as_from_a_terminal

from studio.cli import _summary, main
from studio.engines.demo import demo_audio_path


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
    # the checks and inputs, the pipeline's imports, opening the engine, the renderer and
    # building its engines, apart from the stages: every part of the command's total
    warm = r["warmup_ms"]
    assert set(warm) == {"inputs", "imports", "open_engine", "renderer", "build_engines"}
    assert all(v >= 0 for v in warm.values()) and warm["inputs"] > 0
    assert sum(warm.values()) < r["timings_ms"]["total"]
    peak = r["peak_memory_mb"]  # the process's own: torch alone is past 100 MB resident
    assert peak["host"] > 100 and set(peak) == {"host", "gpu"}  # gpu: None until CUDA starts
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
        ("fake mp3", "is a text file"),  # named for what it holds, not for its suffix
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
        (["--smooth-window", "151"], "--smooth-window: 151 is above the maximum, 101"),
        (["--accel-limit", "0.0001"], "--accel-limit: 0.0001 is below the minimum, 0.001"),
        (["--accel-limit", "inf"], "--accel-limit: inf is not a finite number"),
        (["--seed", "2147483648"], "--seed: 2147483648 is above the maximum"),
        (["--memory", "lots"], "--memory"),
        (["--precision", "fp8"], "--precision"),
        (["--device", "banana"], "--device banana: not a device"),
    ],
)
def test_invalid_options(tmp_path, capsys, opts, option):
    out = tmp_path / "out.mp4"
    code, _, err = _run(["render", "--demo", "--out", str(out), *opts], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "target, words", [("nodir/out.mp4", "does not exist"), ("out.avi", ".mp4"), (".", "directory")]
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
    assert code == 2 and "bad.json: smooth_window: 4 is even; must be an odd integer 3..101" in err
    bad.write_text("{not json")
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad)], capsys)
    assert code == 2 and "bad.json" in err
    bad.write_text('{"compile": "yes"}')
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad)], capsys)
    assert code == 2 and "bad.json: compile: got the string 'yes'; must be true or false" in err
    assert len(err.strip().splitlines()) == 1
    bad.write_text('{"smooth_window": 51, "accel_limit": 20}')  # kept as they are
    code, _, err = _run(["analyze", "--demo", "--preset", str(bad), "--json", str(j)], capsys)
    s = json.loads(j.read_text())["settings"]
    assert code == 0 and (s["smooth_window"], s["accel_limit"]) == (51, 20.0)


def test_doctor(capsys):
    code, out, _ = _run(["doctor", "--json"], capsys)
    info = json.loads(out)
    assert code == 0 and info["torch"]["available"] and info["pyav"]["encoders"]["libx264"]
    assert "offscreen" in info["qt"]["platform_plugins"]
    assert info["tensorrt"]["available"] in (True, False)
    code, out, _ = _run(["doctor"], capsys)
    assert code == 0 and "torch" in out and "PyAV" in out


def test_doctor_tells_what_the_caches_hold(tmp_path, capsys):
    aot = tmp_path / "compiled" / "aot"
    aot.mkdir(parents=True)
    (aot / "decoder-fp16-b32-0123.art").write_bytes(b"x" * 2_000_000)
    (aot / "warp_network-fp16-b32-4567.art.failed.json").write_text("{}")
    (aot / ".decoder-fp16-b32-0123.art.77.partial.art").write_bytes(b"half")  # being built
    (aot / "probe-89ab.json").write_text('{"ok": false}')  # another torch's, or GPU's
    code, out, _ = _run(["--cache-dir", str(tmp_path), "doctor", "--json"], capsys)
    c = json.loads(out)["caches"]
    assert code == 0 and c["root"] == str(tmp_path) and c["packages_load"] is None  # no GPU
    assert c["folders"]["compiled"]["bytes"] > 2_000_000 and not c["folders"]["avatars"]["exists"]
    assert c["compiled_engines"] == ["decoder-fp16-b32-0123.art"]
    assert c["failed_builds"] == ["warp_network-fp16-b32-4567.art"]
    code, out, _ = _run(["--cache-dir", str(tmp_path), "doctor"], capsys)
    assert f"caches under {tmp_path}:" in out and "1 kept (not probed yet)" in out
    assert "warp_network-fp16-b32-4567.art: failed to build; remove its .failed.json" in out


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
    # a quiet start: none of QtMultimedia's library probes or FFmpeg's stream dumps
    for chatter in ("pipewire", "symbolsresolver", "Input #0", "qt.multimedia"):
        assert chatter not in r.stderr, r.stderr[-2000:]


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
        argv = ["bench", "--suite", "kinematics", "--no-cadence", "--json", target]
        code, _, err = _run(argv, capsys)
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


# --- progress and notices (studio.progress) -----------------------------------------------------


class _Terminal(__import__("io").StringIO):
    """A stream that says it is a terminal (tqdm bars are drawn into it)."""

    def isatty(self):
        return True


def _stages(progress):
    """Drive a progress the way a Ditto render does: registration, HuBERT, frames."""
    progress("registering avatar", 0, 7)
    progress("registering avatar: face detection", 2, 7)
    progress.note("avatar 360x300, registered")
    progress("registering avatar: cache", 7, 7)
    progress("HuBERT features", 0, 1)
    progress("HuBERT features", 1, 1)
    progress("render", 0, 50)
    progress("render", 25, 50)
    progress("render", 50, 50)


def test_progress_without_a_terminal_prints_a_line_per_stage_start_and_end():
    import io
    import re

    from studio.progress import StageProgress

    stream = io.StringIO()
    with StageProgress(stream) as progress:
        assert not progress.live
        _stages(progress)
    text = stream.getvalue()
    assert "\r" not in text and "\033" not in text
    lines = text.splitlines()
    expected = [
        r"registering avatar: 0/7 steps …",
        r"avatar 360x300, registered",
        r"registering avatar: 7/7 steps in \d+\.\d s",
        r"HuBERT features: 0/1 …",
        r"HuBERT features: 1/1 in \d+\.\d s",
        r"rendering frames: 0/50 frames …",  # the pipeline's "render", named for people
        r"rendering frames: 50/50 frames in \d+\.\d s(, \S+ frames/s)?",
    ]
    assert len(lines) == len(expected), lines
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_progress_on_a_terminal_draws_a_bar_per_stage_with_count_rate_and_eta():
    import re

    from studio.progress import StageProgress

    stream = _Terminal()
    with StageProgress(stream) as progress:
        assert progress.live
        _stages(progress)
    text = stream.getvalue()
    for stage in ("registering avatar", "HuBERT features", "rendering frames"):
        assert f"\r{stage}:" in text
    assert "7/7" in text and "50/50" in text and "face detection" in text
    assert re.search(r"\d+/50 \[\d\d:\d\d<\d\d:\d\d, ", text)  # elapsed < remaining (ETA)
    assert " frames/s" in text and " steps/s" in text
    assert "\navatar 360x300, registered\n" in "\n" + text.replace("\r", "\n")
    # A stage cut short by an error is cleared, so the error line stands alone.
    stream = _Terminal()
    with pytest.raises(ValueError), StageProgress(stream) as progress:
        progress("render", 0, 50)
        progress("render", 10, 50)
        raise ValueError("stop")
    assert stream.getvalue().endswith("\r") and stream.getvalue().split("\r")[-2].strip() == ""


def test_notices_logged_by_the_work_appear_on_stderr_only_while_shown():
    import io
    import logging

    from studio.progress import show_notices

    log = logging.getLogger("studio.runtime.onnx_cache")
    stream = io.StringIO()
    with show_notices(stream):
        log.info("exporting warp_network to ONNX for ONNX Runtime (≈ 180 MB, once)")
        log.debug("detail nobody asked for")
    log.info("after: not shown")
    assert stream.getvalue() == (
        "exporting warp_network to ONNX for ONNX Runtime (≈ 180 MB, once)\n"
    )


def test_export_notice_is_said_before_writing_with_the_estimated_size(tmp_path, caplog):
    """The ONNX cache says what it is about to write, for which runtime and about how big."""
    import logging
    import re

    import torch

    from studio.fixtures.random_tree import random_network
    from studio.runtime.onnx_cache import estimated_onnx_bytes, export_for_engine, export_purpose

    torch.manual_seed(0)
    net = random_network("stitch_network", reduced=True)
    with caplog.at_level(logging.INFO, logger="studio"), export_purpose("ONNX Runtime"):
        path = export_for_engine("stitch_network", net, tmp_path / "onnx", verify=False)
    (message,) = [r.getMessage() for r in caplog.records if "exporting" in r.getMessage()]
    assert re.fullmatch(
        r"exporting stitch_network to ONNX for ONNX Runtime \(≈ [\d.]+ [kMG]?B, once; batch 1, "
        r"fp32\) into .*onnx",
        message,
    ), message
    estimate = estimated_onnx_bytes(net)
    assert 0.8 * estimate <= path.stat().st_size <= 1.2 * estimate + 64 * 1024
    assert estimated_onnx_bytes(net, "fp16") < 0.6 * estimate  # half weights, half the bytes
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="studio"):
        assert export_for_engine("stitch_network", net, tmp_path / "onnx", verify=False) == path
    assert not [r for r in caplog.records if "exporting" in r.getMessage()]  # cached: silent


# --- doctor: required vs optional, encoders ----------------------------------------------------


def test_doctor_calls_a_folder_render_can_use_complete_for_pytorch(tmp_path, capsys):
    from conftest import PYTORCH_FILES, make_tree

    files = [f for f in PYTORCH_FILES if not f.endswith("face_landmarker.task")]
    tree = make_tree(tmp_path / "ck", [*files, "ditto_cfg/v0.4_hubert_cfg_pytorch.pkl"])
    code, out, err = _run(["doctor", "--checkpoints", str(tree)], capsys)
    assert code == 0, err
    assert "INCOMPLETE" not in out and "Complete layouts: none" not in out
    assert "Complete layouts: pytorch, cfg" in out
    assert "absent   ditto_pytorch/aux_models/face_landmarker.task  (optional: " in out
    assert out.rstrip().splitlines()[-1].startswith("Result: complete for PyTorch: `studio render")
    code, out, _ = _run(["doctor", "--checkpoints", str(tree), "--json"], capsys)
    ck = json.loads(out)["checkpoints"]
    assert code == 0 and ck["complete_for_pytorch"] is True and ck["missing_required"] == []


def test_doctor_lists_encoders_as_built_in_and_hardware_present_or_not(capsys):
    from studio.doctor import format_text

    code, out, _ = _run(["doctor", "--json"], capsys)
    info = json.loads(out)
    hw = info["pyav"]["hardware"]
    if info["pyav"]["encoders"]["h264_nvenc"]:
        assert isinstance(hw["h264_nvenc"]["present"], bool)
        if not info["torch"]["cuda_available"] and not __import__("glob").glob("/dev/nvidia*"):
            assert hw["h264_nvenc"]["present"] is False
            assert "no NVIDIA GPU" in hw["h264_nvenc"]["reason"]
    pyav = {
        "available": True,
        "version": "18.1.0",
        "encoders": {"libx264": True, "h264_nvenc": True, "libx265": False},
        "hardware": {"h264_nvenc": {"present": False, "reason": "no NVIDIA GPU here"}},
    }
    text = format_text({**info, "pyav": pyav})
    assert "PyAV 18.1.0 encoders built in: libx264, h264_nvenc (not built in: libx265)" in text
    assert "hardware encoder h264_nvenc: built in, no NVIDIA GPU here" in text
    assert "h264_nvenc yes" not in text
    pyav["hardware"]["h264_nvenc"] = {"present": True, "reason": None}
    assert "h264_nvenc: built in, NVIDIA GPU present" in format_text({**info, "pyav": pyav})


# --- errors in the order a user fixes things ------------------------------------------------------


@pytest.fixture
def bad_inputs(tmp_path):
    """A complete checkpoint tree of empty files, an incomplete one, an empty folder, text
    notes FFmpeg opens as "tty" video, and a real video."""
    from conftest import PYTORCH_FILES, make_tree

    notes = tmp_path / "notes.txt"
    notes.write_text("Meeting notes\n\n- item one: something to do\n- item two\n" * 30)
    video = tmp_path / "clip.mp4"
    with av.open(str(video), "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        frame = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    (tmp_path / "empty").mkdir()
    return {
        "complete": make_tree(tmp_path / "complete", PYTORCH_FILES),
        "no decoder": make_tree(
            tmp_path / "partial", [f for f in PYTORCH_FILES if not f.endswith("decoder.pth")]
        ),
        "empty": tmp_path / "empty",
        "notes": notes,
        "video": video,
        "out": tmp_path / "out.mp4",
    }


def _one_line_error(code, err, *words):
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize("command", ["render", "analyze"])
def test_checkpoints_are_checked_before_the_avatar(bad_inputs, capsys, command):
    b = bad_inputs
    out = ["--out", str(b["out"])] if command == "render" else []
    code, _, err = _run([command, "--checkpoints", str(b["empty"]), *out], capsys)
    _one_line_error(code, err, "no Ditto checkpoints in", str(b["empty"]))
    assert "--avatar" not in err
    argv = [command, "--checkpoints", str(b["no decoder"]), "--avatar", str(b["notes"]), *out]
    code, _, err = _run(argv, capsys)
    _one_line_error(code, err, "decoder.pth")
    assert "notes.txt" not in err
    # the checkpoints before a bad --audio too
    argv = [command, "--checkpoints", str(b["empty"]), "--audio", str(b["out"]) + ".wav", *out]
    code, _, err = _run(argv, capsys)
    _one_line_error(code, err, "no Ditto checkpoints in")
    code, _, err = _run([command, "--checkpoints", str(b["complete"]), *out], capsys)
    _one_line_error(code, err, "--avatar", "face photo")
    assert not b["out"].exists()


def test_an_avatar_that_is_not_an_image_says_so(bad_inputs, capsys):
    b = bad_inputs
    base = ["render", "--checkpoints", str(b["complete"]), "--out", str(b["out"])]
    code, out, err = _run([*base, "--avatar", str(b["notes"])], capsys)
    _one_line_error(code, err, "notes.txt is not an image file (PNG/JPEG/...)", "holds text")
    assert "video" not in err and out == ""
    code, _, err = _run([*base, "--avatar", str(b["video"])], capsys)
    _one_line_error(code, err, "clip.mp4 is 0.04 s long (1 frame", "needs at least 1 s")
    code, _, err = _run([*base, "--avatar", str(b["out"].parent / "absent.png")], capsys)
    _one_line_error(code, err, "absent.png does not exist")
    assert not b["out"].exists() and [p for p in b["out"].parent.glob("*.mp4")] == [b["video"]]


def test_compile_without_a_gpu_to_compile_for_is_a_note_not_an_error(capsys, tmp_path):
    code, out, err = _run(["analyze", "--demo", "--compile"], capsys)
    assert code == 0 and "pose jerk" in out
    assert "studio analyze: note: --compile is ignored by analyze" in err
    out_mp4 = tmp_path / "o.mp4"
    argv = ["render", "--demo", "--compile", "--out", str(out_mp4), "--size", "128"]
    code, _, err = _run([*argv, "--x264-preset", "ultrafast"], capsys)
    assert code == 0 and out_mp4.exists()
    (note,) = [line for line in err.splitlines() if "note:" in line]
    assert note.startswith("studio render: note: --compile is ignored by the demo engine")


# --- conventions and the last line of defence: stdout, -v/-q, caches, errors, signals -----------


def test_json_outputs_take_dash_for_stdout_and_the_summary_moves_to_stderr(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a file named "-" would land here
    code, out, err = _run(["analyze", "--demo", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)["frames"] > 0 and "pose jerk" in err
    video = tmp_path / "o.mp4"
    argv = ["render", "--demo", "--size", "128", "--x264-preset", "ultrafast", "--out", str(video)]
    code, out, err = _run([*argv, "--report", "-"], capsys)
    assert code == 0 and json.loads(out)["output"] == str(video) and "wrote" in err
    argv = ["bench", "--suite", "kinematics", "--repeats", "1", "--strides", "auto"]
    argv += ["--no-cadence", "--json", "-"]
    code, out, err = _run(argv, capsys)
    assert code == 0 and json.loads(out)["suite"] == "kinematics" and "Kinematics" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.mp4"]


def test_export_onnx_json_to_stdout(tmp_path, capsys):
    pytest.importorskip("onnx")
    from studio.fixtures.random_tree import write_checkpoint_tree

    tree = write_checkpoint_tree(tmp_path / "ckpt", reduced=True, networks=["stitch_network"])
    argv = ["export-onnx", "--checkpoints", str(tree), "--out", str(tmp_path / "onnx")]
    code, out, err = _run([*argv, "--no-verify", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)["networks"]["stitch_network"]["ok"]
    assert "ONNX export of" in err


def test_help_lists_every_command_and_completion_is_printed(capsys):
    from studio.cli import COMMANDS

    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and all(f"    {c} " in out for c in COMMANDS)
    assert "-v, --verbose" in out and "-q, --quiet" in out and "--cache-dir DIR" in out
    for shell in ("bash", "zsh"):
        code, out, _ = _run(["--print-completion", shell], capsys)
        assert code == 0 and "export-onnx" in out and "--x264-preset" in out
    code, out, _ = _run(["bench", "--help"], capsys)  # the suites' own usage, forwarded
    assert code == 0 and "--suite" in out
    code, _, err = _run(["-v", "-q", "doctor"], capsys)
    assert code == 2 and "cannot be combined" in err


def test_quiet_hides_progress_and_notices_and_verbose_adds_debug_lines(
    tmp_path, capsys, monkeypatch
):
    import logging

    import studio.cli as cli

    video = tmp_path / "o.mp4"
    argv = ["render", "--demo", "--size", "128", "--x264-preset", "ultrafast", "--out", str(video)]
    code, out, err = _run(argv, capsys)
    assert code == 0 and "rendering frames:" in err
    code, out, err = _run([*argv, "-q"], capsys)
    assert code == 0 and err == "" and "wrote" in out

    def talk(args):
        log = logging.getLogger("studio.test")
        log.debug("a detail")
        log.info("a notice")
        return 0

    monkeypatch.setattr(cli, "cmd_doctor", talk)
    assert _run(["doctor"], capsys)[2] == "a notice\n"
    assert _run(["-q", "doctor"], capsys)[2] == ""
    assert _run(["doctor", "-v"], capsys)[2] == "debug: studio.test: a detail\na notice\n"


def test_the_cache_root_follows_the_option_then_the_variable(tmp_path, capsys, monkeypatch):
    import os
    from pathlib import Path

    import studio.cli as cli
    from studio import paths

    monkeypatch.chdir(tmp_path)
    seen = []
    monkeypatch.setattr(
        cli,
        "cmd_doctor",
        lambda args: seen.append((paths.engine_cache_dir(), os.environ["TRITON_CACHE_DIR"])),
    )
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "env"))
    monkeypatch.delenv(paths.ENGINE_ENV, raising=False)
    for argv in (["--cache-dir", str(tmp_path / "opt"), "doctor"], ["doctor", "--cache-dir", "o2"]):
        _run(argv, capsys)
    _run(["doctor"], capsys)
    opt, o2, env = (Path(e) for e, _ in seen)
    assert opt == tmp_path / "opt" / "engines" and o2 == Path("o2").absolute() / "engines"
    assert env == tmp_path / "env" / "engines"
    assert seen[0][1] == str(tmp_path / "opt" / "compiled" / "triton")
    assert os.environ[paths.CACHE_ENV] == str(tmp_path / "env")  # put back after each command
    assert "TRITON_CACHE_DIR" not in os.environ
    (tmp_path / "f").write_text("")
    code, _, err = _run(["--cache-dir", str(tmp_path / "f"), "doctor"], capsys)
    assert code == 2 and "--cache-dir" in err and "is a file" in err
    code, _, err = _run(["--cache-dir", str(tmp_path / "f" / "sub"), "doctor"], capsys)
    assert code == 2 and f"is under a file ({tmp_path / 'f'})" in err


def test_an_unexpected_error_is_one_line_with_its_traceback_in_a_log_file(
    tmp_path, capsys, monkeypatch
):
    import re
    import struct
    import threading
    from pathlib import Path

    import studio.cli as cli

    def crash(args):
        struct.unpack("<I", b"\x00")  # the kind of bug a hand-written header parser had

    monkeypatch.setattr(cli, "cmd_analyze", crash)
    code, out, err = _run(["--cache-dir", str(tmp_path), "analyze", "--demo"], capsys)
    assert code == 1 and out == "" and "Traceback" not in err
    (line,) = err.splitlines()
    m = re.fullmatch(
        r"studio analyze: internal error: struct\.error: unpack requires a buffer of 4 bytes"
        r" — details in (\S+\.log)",
        line,
    )
    assert m, line
    log = Path(m.group(1))
    assert log.parent == tmp_path / "logs"
    text = log.read_text()
    assert "Traceback" in text and "struct.unpack" in text and "command: studio" in text

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_analyze", interrupted)
    code, _, err = _run(["analyze", "--demo"], capsys)
    # one line, none blank before it: stderr here is not a terminal, which echoed a ^C
    assert code == 130 and err == "studio analyze: interrupted; nothing was written\n"

    def worker_crash(args):
        t = threading.Thread(target=lambda: [][1])
        t.start()
        t.join()
        return 0

    monkeypatch.setattr(cli, "cmd_analyze", worker_crash)
    code, _, err = _run(["--cache-dir", str(tmp_path), "analyze", "--demo"], capsys)
    assert code == 0 and "Traceback" not in err
    assert err.startswith("studio analyze: internal error: IndexError: list index out of range")


def _render_process(tmp_path, *extra, seconds=None, **popen):
    """`studio render --demo` (on ``seconds`` of speech when given) as a child process."""
    argv = [sys.executable, "-m", "studio", "render", "--demo", "--size", "128"]
    argv += ["--x264-preset", "ultrafast", "--out", str(tmp_path / "o.mp4"), *extra]
    if seconds is not None:
        rate = 16000
        t = np.arange(int(seconds * rate)) / rate
        speech = (0.3 * np.sin(2 * math.pi * 220 * t) * (1 + np.sin(2 * math.pi * 3 * t))) / 2
        sf.write(tmp_path / "long.wav", speech.astype(np.float32), rate)
        argv += ["--audio", str(tmp_path / "long.wav")]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_in_the_first_second_is_one_line_and_status_130(tmp_path, name):
    """Sent while torch and the engine are still importing: no traceback, no 143."""
    import signal
    import time

    if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN:
        pytest.skip(f"{name} is ignored in this session (nohup): the studio keeps it ignored")

    proc = _render_process(tmp_path)
    time.sleep(0.3)
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "studio render: interrupted; nothing was written"
    assert not (tmp_path / "o.mp4").exists()


def _slow_import(folder: Any, name: str, signals: int, seconds: float) -> None:
    """A module ``name`` in ``folder`` whose import sends SIGINT ``signals`` times, 50 ms
    apart, then takes ``seconds`` more."""
    (folder / f"{name}.py").write_text(
        "import os, signal, time\n"
        f"for _ in range({signals}):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.05)\n"
        f"time.sleep({seconds})\n"
        "READY = True\n"
    )


@pytest.mark.parametrize(
    ("signals", "wait_s", "finished"),
    [
        (1, 3.0, True),  # waits for the import, then acts
        (2, 3.0, False),  # a second Ctrl-C from outside: at once, inside the import
        (1, 0.1, False),  # an import that takes too long: acted on inside it after all
    ],
)
def test_a_signal_inside_an_import_waits_for_the_import(
    tmp_path, monkeypatch, signals, wait_s, finished
):
    """Ctrl-C while a library imports (soundfile's C start aborted, pydantic's schema build
    failed when interrupted there) is acted on once the import is over, unless the user
    insists or the import hangs."""
    import signal
    import time

    from studio import cli

    name = f"slow_start_{signals}_{int(wait_s * 10)}"
    _slow_import(tmp_path, name, signals, 0.4)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "IMPORT_WAIT_S", wait_s)
    restore = cli._catch_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            __import__(name)
            time.sleep(2.0)  # the interrupt, sent again, once the import is done
        assert (name in sys.modules) == finished
    finally:
        restore(False)
        cli._SIGNALLED.clear()
        assert signal.getsignal(signal.SIGINT) is not cli._interrupt and not cli._HELD


def test_an_inherited_sighup_ignore_is_respected(tmp_path):
    """Under nohup (SIGHUP ignored by the parent) a closed terminal does not stop a render."""
    import signal
    import time

    def ignore_hangups():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = _render_process(tmp_path, seconds=30, preexec_fn=ignore_hangups)
    for delay in (0.3, 1.0):
        time.sleep(delay)
        assert proc.poll() is None, "the render ended before the hang-up"
        proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "wrote" in out and (tmp_path / "o.mp4").is_file()


def test_a_png_sequence_never_replaces_a_folder_holding_its_input(tmp_path, capsys):
    """take.png is the folder take/, replaced whole: the speech read from take/take.wav (the
    name the sequence's own sound file has) is refused, not overwritten."""
    (tmp_path / "take").mkdir()
    wav = tmp_path / "take" / "take.wav"
    wav.write_bytes(demo_audio_path().read_bytes())
    argv = ["render", "--audio", str(wav), "--size", "64", "--out", str(tmp_path / "take.png")]
    code, _, err = _run(argv, capsys)
    assert code == 2 and "the folder holds the --audio file" in err and "Traceback" not in err
    assert wav.read_bytes() == demo_audio_path().read_bytes()
    assert [p.name for p in (tmp_path / "take").iterdir()] == ["take.wav"]


def test_outputs_never_overwrite_inputs_through_symlinks(tmp_path, capsys):
    wav = tmp_path / "speech.wav"
    wav.write_bytes(demo_audio_path().read_bytes())
    before = wav.read_bytes()
    link = tmp_path / "o.mp4"
    link.symlink_to(wav)
    code, _, err = _run(["render", "--audio", str(wav), "--out", str(link)], capsys)
    assert code == 2 and "--audio" in err and "overwritten" in err
    alias = tmp_path / "a.json"
    alias.symlink_to(wav)
    code, _, err = _run(["analyze", "--audio", str(wav), "--json", str(alias)], capsys)
    assert code == 2 and "--json" in err and "--audio" in err
    preset = tmp_path / "p.json"
    preset.write_text("{}")
    argv = ["analyze", "--demo", "--preset", str(preset), "--json", str(preset)]
    code, _, err = _run(argv, capsys)
    assert code == 2 and "--preset" in err and preset.read_text() == "{}"
    assert wav.read_bytes() == before and len(err.strip().splitlines()) == 1


def test_long_but_legal_output_names_are_accepted_and_too_long_ones_say_so(tmp_path, capsys):
    legal = tmp_path / ("n" * 250 + ".json")  # 255 bytes
    code, _, err = _run(["analyze", "--demo", "--json", str(legal)], capsys)
    assert code == 0 and json.loads(legal.read_text())["frames"] > 0, err
    for option, name in (("--json", "n" * 251 + ".json"), ("--out", "n" * 252 + ".mp4")):
        command = "analyze" if option == "--json" else "render"
        code, _, err = _run([command, "--demo", option, str(tmp_path / name)], capsys)
        assert code == 2 and "file name too long" in err and "cannot write in" not in err
        assert len(err.strip().splitlines()) == 1


_GUI_CHILD = """if True:
    import os, signal, sys
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from studio.cli import main
    from studio.gui import window
    app = QApplication(sys.argv[:1])
    {setup}
    sys.exit(main(["gui"]))
"""


def _assert_interrupted_gui(tmp_path, setup: str) -> None:
    """``studio gui`` in a child (a QApplication whose loop has run cannot run another) with
    ``setup`` arranging a SIGINT: the window closes with one line and status 130, no hang."""
    import os

    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "STUDIO_CONFIG_DIR": str(tmp_path / "c")}
    r = subprocess.run(
        [sys.executable, "-c", _GUI_CHILD.replace("{setup}", setup)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        preexec_fn=sigint_as_from_a_terminal,
    )
    assert r.returncode == 130, r.stderr[-2000:]
    assert "studio gui: interrupted; closing the window" in r.stderr
    assert "Traceback" not in r.stderr


def test_ctrl_c_quits_the_gui(tmp_path):
    """SIGINT a second into Qt's loop (as Ctrl-C in the terminal)."""
    _assert_interrupted_gui(
        tmp_path, "QTimer.singleShot(1000, lambda: os.kill(os.getpid(), signal.SIGINT))"
    )


def test_ctrl_c_while_the_window_is_made_quits_the_gui(tmp_path):
    """SIGINT handled in a Qt callback while the window is still being made (its making runs
    Qt's events): Qt's loop is never entered."""
    setup = """made = window.MainWindow.__init__
    def slow_init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        QTimer.singleShot(0, lambda: os.kill(os.getpid(), signal.SIGINT))
        QApplication.processEvents()
    window.MainWindow.__init__ = slow_init"""
    _assert_interrupted_gui(tmp_path, setup)


def test_a_screenshot_with_an_error_dialog_up_fails(tmp_path):
    """The window opens on the demo (its render finishes) with an avatar folder it refuses:
    not a success."""
    import os

    (tmp_path / "not-an-avatar").mkdir()
    shot = tmp_path / "shot.png"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "STUDIO_CONFIG_DIR": str(tmp_path / "c")}
    argv = ["gui", "--screenshot", str(shot), "--avatar", str(tmp_path / "not-an-avatar")]
    r = subprocess.run(
        [sys.executable, "-m", "studio", *argv, "--window-size", "640x480"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 2 and not shot.exists(), r.stderr[-2000:]
    assert "not a registered avatar folder" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.qt_no_exception_capture
def test_an_unexpected_error_in_the_gui_opens_the_dialog_and_the_window_goes_on(
    qtbot, tmp_path, monkeypatch, capsys
):
    from PySide6.QtCore import QTimer

    from studio.gui.app import install_excepthook
    from studio.gui.window import MainWindow

    monkeypatch.setenv("STUDIO_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("STUDIO_CACHE_DIR", str(tmp_path / "cache"))
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.renderFinished, timeout=120_000):
        pass
    restore = install_excepthook(lambda: w)
    try:

        def slot_with_a_bug():
            raise ZeroDivisionError("a bug in a slot")

        QTimer.singleShot(0, slot_with_a_bug)
        qtbot.waitUntil(lambda: w.error_box is not None and w.error_box.isVisible())
    finally:
        restore()
    assert "ZeroDivisionError: a bug in a slot" in w.error_box.text()
    (log,) = (tmp_path / "cache" / "logs").glob("studio-gui-error-*.log")
    assert "Traceback" in log.read_text() and "slot_with_a_bug" in log.read_text()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error: ZeroDivisionError" in err
    w.error_box.close()
    with qtbot.waitSignal(w.renderFinished, timeout=120_000):  # the window goes on
        w.controls.window.setValue(15)


def test_the_demo_engine_checks_the_device(tmp_path, capsys):
    import torch

    out = tmp_path / "o.json"
    code, _, err = _run(["analyze", "--demo", "--device", "cpu", "--json", str(out)], capsys)
    assert code == 0 and out.exists() and "note" not in err
    if not torch.cuda.is_available():
        code, _, err = _run(["analyze", "--demo", "--device", "cuda"], capsys)
        assert code == 2 and "cuda" in err and "no CUDA GPU" in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_torch_compile_caches_its_kernels_under_the_cache_root(tmp_path):
    """A command that compiles (here a stand-in for --compile) leaves Inductor's artifacts
    in <cache>/compiled/inductor, not in /tmp/torchinductor_<user>."""
    import os

    child = """if True:
        import sys, torch
        import studio.cli as cli
        def compiled(args):
            f = torch.compile(lambda x: (x * 2).sin() + 1)
            return int(f(torch.ones(8)).shape[0] != 8)
        cli.cmd_doctor = compiled
        sys.exit(cli.main(["--cache-dir", sys.argv[1], "doctor"]))
    """
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR",)}
    r = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert any((tmp_path / "c" / "compiled" / "inductor").iterdir())


def test_reports_carry_the_quality_metrics(demo_render):
    _, report = demo_render
    q = report["quality"]
    assert q["frames"] == report["frames"]
    assert 0.0 <= q["silent_lips"]["deviation"] < 0.2 * q["silent_lips"]["speech_deviation"]
    assert q["blinks"]["count"] >= 2 and q["blinks"]["in_schedule"] == 1.0
    assert q["lip_sync"]["envelope_correlation"] > 0.3 and q["head"]["smoothness"] > 0
    assert q["silent_lips"]["silence_from"] == "silero-vad"  # the speech's own silences
    # what cadence cost this clip in picture: a dozen in-betweens against full renders
    psnr, saved = report["inbetween_psnr"], report["frames"] - report["rendered_frames"]
    assert psnr["measured"] == min(12, saved) and psnr["inbetweens"] == saved > 0
    assert 35.0 < psnr["worst"] <= psnr["p5"] <= psnr["mean"] < 80.0
    assert report["warp_forced_keyframes"] >= 0
    assert f"in-betweens {psnr['mean']:.1f} dB mean (p5 {psnr['p5']:.1f})" in _summary(report)


def test_a_signal_swallowed_where_it_landed_stops_the_work_at_the_next_report():
    """A signal's KeyboardInterrupt can land in a finaliser that swallows it: the next
    progress report raises it again, so the command still ends as interrupted."""
    import signal

    from studio import cli

    progress = cli._progress()
    progress("rendering frames", 1, 10)  # nothing caught: nothing raised
    cli._SIGNALLED.append(int(signal.SIGHUP))
    try:
        with pytest.raises(KeyboardInterrupt, match="signal"):
            progress("rendering frames", 2, 10)
    finally:
        cli._SIGNALLED.clear()
        progress.close(finished=False)


_WITNESS = """
import atexit, os
_log = os.environ["WITNESS_LOG"]
def _say(word):
    with open(_log, "a") as f:
        f.write(word + "\\n")
atexit.register(_say, "exit handlers ran")
class _AtTeardown:
    def __del__(self, write=os.write, fd=os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)):
        write(fd, b"teardown ran\\n")  # what it needs held: open() may be gone by then
_kept = _AtTeardown()  # freed only when the interpreter tears its modules down
"""


@pytest.mark.parametrize("command", ["render", "doctor"])
def test_a_render_process_ends_without_the_interpreters_teardown(tmp_path, command):
    """`studio render` as the process: its outputs and stdout whole, the exit handlers run,
    the interpreter's teardown (half a second with torch) skipped; `studio doctor` ends as
    any Python process does."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_WITNESS)
    log = tmp_path / "witness.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
        "WITNESS_LOG": str(log),
    }
    audio = tmp_path / "a.wav"
    sf.write(audio, (0.1 * np.sin(np.arange(16000) / 5.0)).astype(np.float32), 16000)
    argv = {
        "render": ["render", "--demo", "--audio", str(audio), "--size", "64"]
        + ["--out", str(tmp_path / "o.mp4"), "--report", "-", "-q"],
        "doctor": ["doctor"],
    }[command]
    run = subprocess.run(
        [sys.executable, "-m", "studio", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    said = log.read_text().splitlines()
    if command == "render":
        assert said == ["exit handlers ran"]  # not "teardown ran"
        report = json.loads(run.stdout)  # the whole report reached the pipe
        assert report["frames"] == 25 and report["output"] == str(tmp_path / "o.mp4")
        with av.open(str(tmp_path / "o.mp4")) as c:
            assert sum(1 for _ in c.decode(video=0)) == 25
    else:
        assert said == ["exit handlers ran", "teardown ran"]


def test_reading_the_speech_imports_no_engine_motion():
    """A render reads its speech before it opens an engine: the demo speech's path (every
    engine's default) comes without the demo engine's motion, whose SciPy signal module took
    a second of a GPU render's start."""
    import subprocess

    check = (
        "import argparse, sys\n"
        "from studio import cli\n"
        "from studio.engines.demo import demo_audio_path\n"
        "for audio in (str(demo_audio_path()), None):\n"
        "    assert cli._load_audio(argparse.Namespace(audio=audio)).num_frames > 0\n"
        "print(sorted(m for m in ('scipy.signal', 'studio.engines.demo.engine')"
        " if m in sys.modules))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=120, check=True
    )
    assert run.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", ["render", "analyze"])
def test_the_quality_reports_vad_starts_before_the_engine_opens(command, monkeypatch, tmp_path):
    """The speech's VAD (for the quality report) runs on its own thread from the moment the
    speech is read: the engine's opening, the analysis and the frames hide it."""
    from studio.render import engines, pipeline

    seen: list[int] = []
    opened = engines.open_prepared

    def open_prepared(*args, **kwargs):
        with pipeline._SILENCES_LOCK:
            seen.append(len(pipeline._SILENCES))  # the audio's VAD already asked for
        return opened(*args, **kwargs)

    monkeypatch.setattr(engines, "open_prepared", open_prepared)
    out = ["--out", str(tmp_path / "x.mp4"), "--size", "64"] if command == "render" else []
    argv = [command, "--demo", *out, "--report" if command == "render" else "--json"]
    assert main([*argv, str(tmp_path / "r.json")]) == 0
    assert seen and seen[0] >= 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["quality"]["silent_lips"]["silence_from"] == "silero-vad"
