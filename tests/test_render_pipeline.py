"""The frame loop: progress from 0 before the first batch, balanced batches, frames in order."""

from __future__ import annotations

import numpy as np

from studio.audio.io import audio_from_array
from studio.render.demo import DemoEngine
from studio.render.pipeline import analyze, iter_frames
from studio.settings import RenderSettings


class _Recorder:
    """The demo avatar, recording the batches it is asked for."""

    def __init__(self, inner, batch: int) -> None:
        self.inner, self.batch, self.sizes = inner, batch, []
        self.width = self.height = inner.size

    def render_batch(self, motion: np.ndarray) -> np.ndarray:
        self.sizes.append(len(motion))
        return self.inner.render_batch(motion)


def test_progress_starts_at_zero_and_batches_fill_the_renderer() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(int(16000 * 1.6)) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    noisy = speech + 0.01 * rng.standard_normal(t.size)
    audio = audio_from_array(noisy.astype(np.float32), 16000)
    settings = RenderSettings(stride="1", size=64)
    result = analyze(audio, settings, DemoEngine())
    n = result.num_frames
    renderer = _Recorder(DemoEngine().renderer(64), batch=16)
    calls: list[tuple[str, int, int]] = []
    frames = list(iter_frames(result, renderer, progress=lambda *a: calls.append(a)))
    assert len(frames) == n == 40 and frames[0].shape == (64, 64, 3)
    assert calls[0] == ("render", 0, n) and calls[-1] == ("render", n, n)
    assert renderer.sizes == [16, 16, 8]  # the renderer's batch, the rest last
