"""Export formats: HEVC and AV1 beside H.264, and other frame rates resampled from the motion."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import run_cli

from studio import layout
from studio.audio.io import load_audio
from studio.engines.demo import demo_audio_path
from studio.engines.demo.engine import DemoEngine
from studio.export.video import ENCODERS, VideoWriter, encoder_available, hardware_encoder
from studio.motion.retime import output_frames, retime
from studio.render.pipeline import generate


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_each_codec_writes_a_playable_mp4(tmp_path: Path, codec: str) -> None:
    if not encoder_available(codec):
        pytest.skip(f"this PyAV has no {codec} encoder")
    path = tmp_path / f"{codec}.mp4"
    with VideoWriter(path, 64, 48, codec=codec, preset="veryfast") as w:
        for i in range(10):
            w.write(np.full((48, 64, 3), 20 * i, np.uint8))
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        name = stream.codec_context.name
    assert len(frames) == 10 and frames[0].shape == (48, 64, 3)
    decoders = {"h264": ("h264",), "hevc": ("hevc",), "av1": ("av1", "libdav1d", "libaom-av1")}
    assert name in decoders[codec]
    assert abs(int(frames[9].mean()) - 180) <= 3


def test_retime_keeps_the_source_frames_and_interpolates_between() -> None:
    _, motion, _ = generate(DemoEngine(), load_audio(demo_audio_path()), 0)
    fifty = retime(motion, 50)
    assert fifty.shape[0] == output_frames(motion.shape[0], 50) == 2 * motion.shape[0]
    assert np.array_equal(fifty[::2], motion)  # every other frame is a source frame
    deg, mid = layout.pose_degrees(motion), layout.pose_degrees(fifty[1::2][:-1])
    assert np.allclose(mid, (deg[:-1] + deg[1:]) / 2, atol=0.02)  # angles halfway, in degrees
    assert retime(motion, 25) is motion or np.array_equal(retime(motion, 25), motion)


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_hardware_encoding_where_the_gpu_encoder_opens_else_the_software_one(
    tmp_path: Path, codec: str
) -> None:
    """--hw-encode: NVENC where it really opens (probed by encoding a frame), otherwise the
    software encoder and a note saying why; the MP4 plays either way."""
    found, why = hardware_encoder(codec)
    if not encoder_available(codec) and found is None:
        pytest.skip(f"this PyAV has no {codec} encoder")
    path = tmp_path / f"hw_{codec}.mp4"
    with VideoWriter(path, 256, 128, codec=codec, preset="veryfast", hardware=True) as w:
        for i in range(10):
            w.write(np.full((128, 256, 3), 20 * i, np.uint8))
    if found is None:
        assert w.encoder == ENCODERS[codec][0] and why in w.note
        assert w.note.startswith("--hw-encode: ") and "on the CPU" in w.note
    else:
        assert w.encoder == found and w.note == ""
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 10 and abs(int(frames[9].mean()) - 180) <= 4


def test_hw_encode_without_a_gpu_encoder_is_a_note_and_the_report_names_the_encoder(
    tmp_path: Path, capsys
) -> None:
    found, why = hardware_encoder("h264")
    out, report = tmp_path / "hw.mp4", tmp_path / "hw.json"
    argv = ["render", "--demo", "--size", "64", "--hw-encode", "--out", str(out)]
    code, _, err = run_cli([*argv, "--report", str(report), "--x264-preset", "ultrafast"], capsys)
    assert code == 0, err
    r = json.loads(report.read_text())
    assert r["settings"]["hw_encode"] is True
    if found is None:
        assert f"studio render: note: --hw-encode: {why}" in err
        assert r["encoder"] == "libx264" and any("--hw-encode" in n for n in r["notes"])
    else:
        assert r["encoder"] == found


@pytest.mark.parametrize("fps", ["30", "24"])
def test_an_export_at_another_frame_rate(tmp_path: Path, capsys, fps: str) -> None:
    out, report = tmp_path / "a.mp4", tmp_path / "a.json"
    argv = ["render", "--demo", "--size", "64", "--fps", fps, "--out", str(out)]
    code, _, err = run_cli([*argv, "--report", str(report)], capsys)
    assert code == 0, err
    r = json.loads(report.read_text())
    with av.open(str(out)) as c:
        v = c.streams.video[0]
        n = sum(1 for _ in c.decode(video=0))
        rate = float(v.average_rate)
        seconds = n / rate
    assert rate == int(fps) and r["fps"] == int(fps) and r["frames"] == n
    assert n == round(r["duration_s"] * int(fps))  # the same duration as the speech
    assert abs(seconds - r["duration_s"]) < 1.0 / int(fps)
