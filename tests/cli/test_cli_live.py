"""`studio live` end to end on the demo engine: a file, raw PCM on stdin, a recording that
survives Ctrl-C, and bad input as one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import av
import numpy as np
import pytest
import soundfile as sf
from conftest import run_cli as run
from conftest import sigint_as_from_a_terminal

from studio.layout import FPS, SAMPLE_RATE

STUDIO = [sys.executable, "-m", "studio"]


def speech(path, seconds):
    from studio.audio.io import load_audio
    from studio.engines.demo import demo_audio_path

    x = np.resize(load_audio(demo_audio_path()).samples, int(seconds * SAMPLE_RATE))
    sf.write(path, x, SAMPLE_RATE)
    return path, x


def media(path):
    with av.open(str(path)) as c:
        frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(path)) as c:
        samples = sum(f.samples for f in c.decode(audio=0))
        rate = c.streams.audio[0].rate
    return frames, samples / rate


def test_a_file_goes_live_into_a_recording_and_a_report(tmp_path, capsys):
    clip, x = speech(tmp_path / "in.wav", 3.0)
    out, rep = tmp_path / "rec.mp4", tmp_path / "r.json"
    argv = [
        "live",
        "--demo",
        "--audio",
        str(clip),
        "--out",
        str(out),
        "--report",
        str(rep),
        "--size",
        "128",
        "--x264-preset",
        "ultrafast",
        "-q",
    ]
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    report = json.loads(rep.read_text())
    n = 3 * FPS
    assert report["frames"] == n and report["stopped"] == "end of input"
    assert report["time_to_first_frame_ms"] > 0 and report["latency_ms"]["p95"] > 0
    assert report["lookahead_frames"] >= 1 and report["output"] == str(out)
    frames, seconds = media(out)
    assert frames == n and abs(seconds - 3.0) < 0.1
    assert "first frame after" in stdout and "recorded" in stdout


def test_raw_pcm_on_stdin(tmp_path):
    _, x = speech(tmp_path / "in.wav", 2.0)
    pcm = (x * 32767).astype("<i2").tobytes()
    rep = tmp_path / "r.json"
    cmd = [
        *STUDIO,
        "live",
        "--demo",
        "--audio",
        "-",
        "--size",
        "64",
        "--report",
        str(rep),
        "--latency",
        "low",
        "-q",
    ]
    done = subprocess.run(cmd, input=pcm, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(rep.read_text())
    # stdin is a live source: fed on the wall clock, gaps filled with silence
    assert report["frames"] >= 2 * FPS and report["latency_setting"] == "low"


@pytest.mark.slow
def test_ctrl_c_keeps_a_finalised_recording(tmp_path):
    clip, _ = speech(tmp_path / "in.wav", 30.0)
    out = tmp_path / "rec.mp4"
    cmd = [
        *STUDIO,
        "live",
        "--demo",
        "--audio",
        str(clip),
        "--realtime",
        "--out",
        str(out),
        "--size",
        "64",
        "--x264-preset",
        "ultrafast",
    ]
    proc = subprocess.Popen(
        cmd,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=sigint_as_from_a_terminal,
    )
    lines = []
    deadline = time.monotonic() + 90
    for line in proc.stderr:
        lines.append(line)
        if "frames, latency" in line or time.monotonic() > deadline:
            break  # the first status line: the session is live and recording
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, "".join(lines) + rest
    frames, seconds = media(out)
    assert 25 <= frames < 30 * FPS and abs(seconds - frames / FPS) < 0.15
    assert not list(tmp_path.glob(".*partial*"))
    assert "Traceback" not in rest


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--audio", "missing.wav"], "missing.wav"),
        (["--browser-mic"], "--browser-mic"),
        (["--audio", "x.wav", "--mic"], "--mic"),
        (["--serve", "http"], "--serve"),
        (["--latency", "fast"], "--latency"),
        (["--audio", "udp:1:2"], "udp:1:2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, needle):
    out = tmp_path / "rec.mp4"
    code, _, err = run(["live", "--demo", "--out", str(out), *extra], capsys)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert not out.exists()
