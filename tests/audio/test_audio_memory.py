"""Memory follows the 16 kHz mono model input, not the file: a long 48 kHz stereo clip is
loaded, and its AAC track written, without a full-rate copy of it (traced by tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import av
import numpy as np
import pytest
import soundfile as sf

from studio.audio.io import OriginalFile, load_audio
from studio.export.video import VideoWriter
from studio.layout import SAMPLE_RATE

RATE, CHANNELS, MINUTES = 48000, 2, 3
SLACK = 4 << 20  # bytes beyond the model input: decode blocks, buffers, the writer's block
T = TypeVar("T")


def long_clip(path: Path, fmt: str = "WAV") -> Path:
    """MINUTES of 48 kHz stereo speech-like tone, written a second at a time."""
    t = np.arange(RATE) / RATE
    second = 0.3 * np.sin(2 * np.pi * 200 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    block = np.stack([second, 0.5 * second], axis=1).astype(np.float32)
    with sf.SoundFile(str(path), "w", RATE, CHANNELS, format=fmt) as f:
        for _ in range(MINUTES * 60):
            f.write(block)
    return path


def traced(fn: Callable[[], T]) -> tuple[T, int]:
    """``fn()`` and the peak of memory it allocated (numpy and Python), in bytes."""
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_loading_holds_the_model_input_not_the_file(tmp_path, fmt):
    path = long_clip(tmp_path / f"long.{fmt.lower()}", fmt)
    audio, peak = traced(lambda: load_audio(path))
    full_rate = MINUTES * 60 * RATE * CHANNELS * 4  # what the old loader kept: 69 MB
    assert audio.duration_s == MINUTES * 60 and isinstance(audio.source, OriginalFile)
    assert audio.samples.nbytes == MINUTES * 60 * SAMPLE_RATE * 4
    assert peak < audio.samples.nbytes + SLACK < full_rate // 4, peak


def test_writing_the_track_holds_a_block_not_the_clip(tmp_path):
    audio = load_audio(long_clip(tmp_path / "long.wav"))
    target = tmp_path / "long.mp4"
    frame = np.zeros((64, 64, 3), np.uint8)

    def export() -> None:
        with VideoWriter(target, 64, 64, audio=audio, preset="ultrafast") as w:
            w.write_many([frame] * 5)  # the whole track is still written, at close

    _, peak = traced(export)
    assert peak < SLACK, peak
    with av.open(str(target)) as c:
        samples = sum(f.samples for f in c.decode(audio=0))
        assert c.streams.audio[0].rate == RATE and c.streams.audio[0].channels == CHANNELS
    assert abs(samples / RATE - MINUTES * 60) < 0.1
