"""The frame loop: progress from 0 before the first batch, balanced batches, frames in order."""

from __future__ import annotations

import numpy as np
import pytest

from studio.audio.io import audio_from_array
from studio.engines.base import Renderer
from studio.engines.demo.engine import DemoEngine
from studio.render.pipeline import WARMUP_STAGES, analyze, iter_frames, warmup_of
from studio.settings import RenderSettings


class _Recorder(Renderer):
    """The demo avatar, recording the batches it is asked for."""

    def __init__(self, inner, batch: int) -> None:
        super().__init__(inner.size, batch)
        self.inner, self.sizes = inner, []

    def render_batch(self, motion: np.ndarray, frames=None) -> np.ndarray:
        self.sizes.append(len(motion))
        return self.inner.render_batch(motion)

    def keypoints_2d(self, motion: np.ndarray) -> np.ndarray | None:
        return self.inner.keypoints_2d(motion)  # in-betweens made as the demo makes them


def test_progress_starts_at_zero_and_batches_fill_the_renderer() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(int(16000 * 1.6)) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    noisy = speech + 0.01 * rng.standard_normal(t.size)
    audio = audio_from_array(noisy.astype(np.float32), 16000)
    settings = RenderSettings(stride="1", size=64)
    result = analyze(audio, settings, DemoEngine())
    n = result.num_frames
    renderer = _Recorder(DemoEngine().renderer(RenderSettings(size=64)), batch=16)
    calls: list[tuple[str, int, int]] = []
    frames = list(iter_frames(result, renderer, progress=lambda *a: calls.append(a)))
    assert len(frames) == n == 40 and frames[0].shape == (64, 64, 3)
    assert calls[0] == ("render", 0, n) and calls[-1] == ("render", n, n)
    assert renderer.sizes == [16, 16, 8]  # the renderer's batch, the rest last


def _speech_result(stride: str, seconds: float = 2.4):
    t = np.arange(int(16000 * seconds)) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    audio = audio_from_array(speech.astype(np.float32), 16000)
    return analyze(audio, RenderSettings(stride=stride, size=64), DemoEngine())


class _Counting(_Recorder):
    def __init__(self, inner, batch: int) -> None:
        super().__init__(inner, batch)
        self.rows: list[np.ndarray] = []

    def render_batch(self, motion: np.ndarray, frames=None) -> np.ndarray:
        self.rows.append(motion)
        return super().render_batch(motion)


def test_known_frames_are_reused_and_only_the_missing_ones_are_rendered() -> None:
    result = _speech_result("3")
    n = result.num_frames
    full = list(iter_frames(result, DemoEngine().renderer(RenderSettings(size=64))))
    # a preview cancelled after frame 20: the rest is missing
    known = [f if i <= 20 else None for i, f in enumerate(full)]
    renderer = _Counting(DemoEngine().renderer(RenderSettings(size=64)), batch=4)
    stats: dict = {}
    again = list(iter_frames(result, renderer, known=known, stats=stats))
    assert len(again) == n and all(np.array_equal(a, b) for a, b in zip(again, full, strict=True))
    assert all(again[i] is known[i] for i in range(21))  # passed through, not re-rendered
    keys = result.plan.keyframes
    # frame 21 blends keyframes 21 and 24 (stride 3): 21 is the first one needed
    assert sum(r.shape[0] for r in renderer.rows) == int((keys >= 21).sum())
    assert stats["reused_frames"] == 21
    # every frame known: nothing rendered at all
    idle = _Counting(DemoEngine().renderer(RenderSettings(size=64)), batch=4)
    assert len(list(iter_frames(result, idle, known=full))) == n and idle.rows == []


def test_cadence_bounds_the_gaps_of_an_avatar_that_moves_by_itself() -> None:
    """A video avatar's frames show its own head: where it moves fast, adaptive cadence
    renders every frame, however still the driving motion is."""
    from studio import layout
    from studio.audio.io import load_audio
    from studio.engines.demo import demo_audio_path
    from studio.render.pipeline import generate, postprocess

    audio = load_audio(demo_audio_path())
    engine = DemoEngine()
    settings = RenderSettings(size=64)
    phon, raw, timings = generate(engine, audio, 0)
    raw[:, : layout.EXP.start] = raw[:1, : layout.EXP.start]  # the driving head holds still
    still = postprocess(audio, phon, raw, settings, timings)
    assert still.plan.keyframes.size < still.num_frames  # in-betweens where nothing moves
    source = np.repeat(raw[:1], raw.shape[0], axis=0)
    source[:, layout.T.start] += 0.08 * np.arange(raw.shape[0])  # the head slides fast
    sliding = postprocess(audio, phon, raw, settings, timings, source_motion=source)
    assert sliding.plan.keyframes.size == sliding.num_frames
    # the source only bounds the plan: the motion itself stays the driving one
    np.testing.assert_array_equal(sliding.raw, still.raw)


def test_silences_come_from_the_vad_once_per_audio_else_from_the_phonetics(monkeypatch):
    import sys

    from studio.render.pipeline import speech_silence

    result = _speech_result("auto")
    silence, source = speech_silence(result.audio, result.phon)
    assert source == "silero-vad" and silence.shape == result.phon.silence.shape
    assert speech_silence(result.audio, result.phon)[0] is silence  # found once
    monkeypatch.setitem(sys.modules, "silero_vad", None)  # not installed
    other = _speech_result("auto")
    silence, source = speech_silence(other.audio, other.phon)
    assert source == "phonetics" and np.array_equal(silence, other.phon.silence)


def test_silences_found_aside_a_render_are_the_ones_its_report_gets(monkeypatch):
    """A render starts the VAD on a thread as soon as it has read the speech; the quality
    report then takes that answer (one VAD run), and a VAD that fails is tried again by the
    next asker."""
    import threading

    from studio.motion import quality
    from studio.render.pipeline import find_silence_aside, speech_silence

    runs: list[str] = []
    vad = quality.vad_silence

    def counted(samples):
        runs.append(threading.current_thread().name)
        if len(runs) == 1:
            raise ValueError("a broken VAD")
        return vad(samples)

    monkeypatch.setattr(quality, "vad_silence", counted)
    result = _speech_result("auto")
    find_silence_aside(result.audio)
    with pytest.raises(ValueError, match="a broken VAD"):
        speech_silence(result.audio, result.phon)
    find_silence_aside(result.audio)
    silence, source = speech_silence(result.audio, result.phon)
    assert source == "silero-vad" and runs == ["silence", "silence"]
    assert speech_silence(result.audio, result.phon)[0] is silence and len(runs) == 2


def test_a_render_measures_its_inbetweens_and_says_so(tmp_path) -> None:
    from studio.render.fidelity import MEASURE_STAGE
    from studio.render.pipeline import start_video

    result = _speech_result("auto")
    settings = RenderSettings(stride="auto", size=64, preset="ultrafast")
    calls: list[tuple] = []
    report = start_video(
        result,
        DemoEngine().renderer(settings),
        str(tmp_path / "clip.mp4"),
        settings,
        progress=lambda *a: calls.append(a),
    ).finish()
    saved = result.num_frames - result.plan.keyframes.size
    psnr = report["inbetween_psnr"]
    assert saved > 0 and psnr["measured"] == min(12, saved) and psnr["inbetweens"] == saved
    measuring = [c for c in calls if c[0] == MEASURE_STAGE]
    assert measuring and measuring[-1] == (MEASURE_STAGE, psnr["measured"], psnr["measured"])
    assert calls.index(measuring[0]) > max(i for i, c in enumerate(calls) if c[0] == "render")


def test_an_engines_warm_up_stages_move_from_the_stages_to_the_warm_up():
    """LMDM's graph capture (a GPU process's first clip) is warm-up: a render's report gives it
    in warmup_ms, so that its stages measure the clip's work only."""
    assert WARMUP_STAGES == ("lmdm_capture",)
    report = {"timings_ms": {"hubert": 300.0, "lmdm_capture": 280.0, "lmdm": 2190.0}}
    assert warmup_of(report) == {"lmdm_capture": 280.0}
    assert report["timings_ms"] == {"hubert": 300.0, "lmdm": 2190.0}
    assert warmup_of(report) == {}  # a later clip of the process: nothing captured
