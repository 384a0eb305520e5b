"""EncoderThread: frames encoded in order on their own thread, errors raised in the caller,
and no file left behind when it fails (real PyAV, real libx264)."""

from __future__ import annotations

import av
import numpy as np
import pytest

from studio.export.encoder_thread import EncoderThread
from studio.export.video import VideoWriter


def _frames(n: int, hw=(64, 96)) -> list[np.ndarray]:
    """Frame i is flat grey level 10 + 8 i: the order survives H.264."""
    return [np.full((*hw, 3), 10 + 8 * i, np.uint8) for i in range(n)]


def test_frames_arrive_in_order_and_the_queue_bounds_the_caller(tmp_path) -> None:
    out = tmp_path / "ordered.mp4"
    with VideoWriter(out, 96, 64, preset="ultrafast") as w, EncoderThread(w, depth=2) as enc:
        for f in _frames(24):
            enc.put(f)
        enc.finish()
    assert w.frames_written == 24
    with av.open(str(out)) as c:
        levels = [int(f.to_ndarray(format="rgb24").mean().round()) for f in c.decode(video=0)]
    assert len(levels) == 24
    assert all(abs(a - (10 + 8 * i)) <= 2 for i, a in enumerate(levels)), levels


def test_an_encoder_error_reaches_the_caller_and_discards_the_file(tmp_path) -> None:
    out = tmp_path / "broken.mp4"
    with pytest.raises(ValueError, match="frame must be"):
        with VideoWriter(out, 96, 64, preset="ultrafast") as w, EncoderThread(w) as enc:
            frames = _frames(4)
            frames[2] = np.zeros((10, 10, 3), np.uint8)  # the wrong size, found on the thread
            for f in frames:
                enc.put(f)
            enc.finish()
    assert not out.exists()
    assert not list(tmp_path.glob("*.partial-*"))


def test_leaving_on_an_exception_stops_the_thread_without_waiting(tmp_path) -> None:
    out = tmp_path / "cancelled.mp4"
    with pytest.raises(KeyboardInterrupt):
        with VideoWriter(out, 96, 64, preset="ultrafast") as w, EncoderThread(w) as enc:
            for f in _frames(8):
                enc.put(f)
            raise KeyboardInterrupt
    assert not enc._thread.is_alive()
    assert not out.exists() and not list(tmp_path.glob("*.partial-*"))
