"""The live recording: H.264 + AAC of the frames and the audio they show, atomic, and kept
whole when the session stops early."""

from __future__ import annotations

from types import SimpleNamespace

import av
import numpy as np
import pytest

from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.live.sinks import RecordingSink


def frames(n: int, size: int = 64):
    for i in range(n):
        image = np.full((size, size, 3), (i * 7) % 255, np.uint8)
        t = (np.arange(SAMPLES_PER_FRAME) + i * SAMPLES_PER_FRAME) / SAMPLE_RATE
        audio = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
        yield SimpleNamespace(index=i, image=image, audio=audio)


def test_recording_has_every_frame_and_its_audio(tmp_path):
    out = tmp_path / "rec.mp4"
    sink = RecordingSink(str(out), preset="ultrafast")
    sink.start(64, 64)
    all_frames = list(frames(50))
    for k in range(0, 50, 7):
        sink.write(all_frames[k : k + 7])
    assert not out.exists()  # written to a temporary file until closed
    sink.close()
    with av.open(str(out)) as c:
        video = sum(1 for _ in c.decode(video=0))
    with av.open(str(out)) as c:
        stream = c.streams.audio[0]
        samples = sum(f.samples for f in c.decode(audio=0))
        assert stream.rate == SAMPLE_RATE and stream.codec_context.name == "aac"
    assert video == 50
    assert abs(samples / SAMPLE_RATE - 50 / FPS) < 0.1
    assert not list(tmp_path.glob(".*partial*"))


def test_nothing_recorded_leaves_no_file_and_abort_drops_it(tmp_path):
    out = tmp_path / "empty.mp4"
    sink = RecordingSink(str(out), preset="ultrafast")
    sink.start(64, 64)
    sink.close()
    assert not out.exists()
    sink = RecordingSink(str(out), preset="ultrafast")
    sink.start(64, 64)
    sink.write(list(frames(5)))
    sink.abort()
    assert not out.exists() and not list(tmp_path.glob(".*partial*"))


def test_write_audio_needs_a_writer_opened_for_it(tmp_path):
    from studio.export.video import VideoWriter

    with VideoWriter(tmp_path / "v.mp4", 64, 64, preset="ultrafast") as w:
        with pytest.raises(ValueError, match="audio_rate"):
            w.write_audio(np.zeros(10, np.float32))
        w.write(np.zeros((64, 64, 3), np.uint8))
