"""In-between fidelity: PSNR/SSIM on known cases, and the measure on a short demo clip."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from studio.audio.io import SAMPLE_RATE, audio_from_array, load_audio
from studio.engines.demo import demo_audio_path
from studio.engines.demo.engine import DemoEngine
from studio.render import pipeline
from studio.render.fidelity import inbetween_fidelity, psnr, ssim, summarize
from studio.settings import RenderSettings


def _texture(size: int = 96, seed: int = 0) -> np.ndarray:
    """A uint8 RGB image with structure at several scales (edges and smooth shading)."""
    rng = np.random.default_rng(seed)
    base = gaussian_filter(rng.uniform(0, 255, (size, size, 3)), (2, 2, 0))
    yy, xx = np.mgrid[:size, :size]
    base += 60.0 * ((xx // 12 + yy // 12) % 2)[..., None]  # a checkerboard of hard edges
    return np.clip(base, 0, 255).astype(np.uint8)


def test_identical_frames():
    img = _texture()
    assert psnr(img, img) == math.inf
    assert ssim(img, img) == pytest.approx(1.0, abs=1e-12)


def test_psnr_of_a_known_noise_level():
    rng = np.random.default_rng(1)
    a = np.full((256, 256, 3), 128, dtype=np.uint8)
    sigma = 10.0
    b = np.clip(np.round(128 + rng.normal(0, sigma, a.shape)), 0, 255).astype(np.uint8)
    assert psnr(a, b) == pytest.approx(10 * math.log10(255**2 / sigma**2), abs=0.1)
    # exactly: a uniform offset of 5 levels is an MSE of 25
    assert psnr(a, a + 5) == pytest.approx(10 * math.log10(255**2 / 25), abs=1e-9)
    assert psnr(a, b) == psnr(b, a)


def test_ssim_falls_with_blur():
    img = _texture()
    scores = [
        ssim(img, np.round(gaussian_filter(img.astype(float), (s, s, 0))).astype(np.uint8))
        for s in (0.5, 1.0, 2.0, 4.0)
    ]
    assert all(0 < s < 1 for s in scores)
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1] + 0.1
    grey = img[..., 0]
    assert ssim(grey, grey) == pytest.approx(1.0)


def test_metrics_reject_mismatched_frames():
    with pytest.raises(ValueError):
        psnr(np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8))
    with pytest.raises(ValueError):
        ssim(np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3), np.uint8))  # below the window


def test_summarize():
    s = summarize(np.array([30.0, 40.0, 50.0, math.inf]))
    assert s["worst"] == 30.0 and s["mean"] == math.inf and 30.0 <= s["p5"] < 40.0
    assert summarize(np.array([])) == {"mean": None, "p5": None, "worst": None}


@pytest.fixture(scope="module")
def short_clip():
    audio = load_audio(demo_audio_path())
    return audio_from_array(audio.samples[: 3 * SAMPLE_RATE], SAMPLE_RATE)


def _analyze(audio, stride: str = "auto", size: int = 96):
    settings = RenderSettings(size=size, stride=stride).validate()
    engine = DemoEngine(settings)
    return pipeline.analyze(audio, settings, engine), engine.renderer(settings)


def test_inbetween_fidelity_on_a_short_demo_clip(short_clip):
    result, renderer = _analyze(short_clip)
    fid = inbetween_fidelity(result, renderer)
    n, k = result.num_frames, result.plan.keyframes.size
    assert fid["frames"] == n and fid["keyframes"] == k
    assert fid["inbetweens"] == n - k == fid["measured"] > 0
    assert fid["frames_saved"] == pytest.approx((n - k) / n)
    assert len(fid["per_frame"]["frame"]) == fid["measured"]
    assert not set(fid["per_frame"]["frame"]) & set(result.plan.keyframes.tolist())
    for key in ("psnr_db", "ssim"):
        s = fid[key]
        assert all(math.isfinite(s[q]) for q in ("mean", "p5", "worst"))
        assert s["worst"] <= s["p5"] <= s["mean"]
    assert 15.0 < fid["psnr_db"]["worst"] and fid["ssim"]["mean"] <= 1.0
    t = fid["timing"]
    assert t["inbetween_ms"] > 0 and t["keyframe_ms"] > 0
    assert t["cost_fraction"] == pytest.approx(t["inbetween_ms"] / t["keyframe_ms"])


def test_subsampling_and_no_inbetweens(short_clip):
    result, renderer = _analyze(short_clip)
    fid = inbetween_fidelity(result, renderer, max_frames=3, warmup=False)
    assert fid["measured"] == 3 < fid["inbetweens"]
    frames = fid["per_frame"]["frame"]
    assert frames == sorted(frames) and len(set(frames)) == 3
    every, renderer = _analyze(short_clip, stride="1")
    fid = inbetween_fidelity(every, renderer)
    assert fid["inbetweens"] == fid["measured"] == 0 and fid["frames_saved"] == 0.0
    assert fid["psnr_db"]["mean"] is None and fid["timing"]["cost_fraction"] is None


def test_inbetween_psnr_scores_made_frames_against_full_renders() -> None:
    from studio.audio.io import load_audio
    from studio.engines.demo import demo_audio_path
    from studio.engines.demo.engine import DemoEngine
    from studio.render.fidelity import inbetween_psnr, sample_inbetweens
    from studio.render.pipeline import analyze
    from studio.settings import RenderSettings

    s = RenderSettings(size=96, stride="3")
    engine = DemoEngine(s)
    result = analyze(load_audio(demo_audio_path()), s, engine)
    renderer = engine.renderer(s)
    frames = sample_inbetweens(result.plan, 4)
    assert frames.size == 4
    full = renderer.render_batch(result.smoothed[frames])
    same = inbetween_psnr(result, renderer, dict(zip(frames.tolist(), full, strict=True)))
    assert same["mean"] == float("inf") and same["measured"] == 4
    assert same["inbetweens"] == result.num_frames - result.plan.keyframes.size
    off = {
        int(f): np.clip(img.astype(int) + 4, 0, 255).astype(np.uint8)
        for f, img in zip(frames, full, strict=True)
    }
    worse = inbetween_psnr(result, renderer, off)
    assert 30.0 < worse["worst"] <= worse["p5"] <= worse["mean"] < 40.0
