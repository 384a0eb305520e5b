"""How close adaptive cadence's in-between frames are to rendering them in full.

Cadence renders keyframes and makes the frames between them from the two neighbouring
keyframe images (:func:`studio.render.pipeline.iter_frames`). :func:`inbetween_fidelity`
renders the clip as the product does, then renders the same smoothed motion row of every
in-between (or of an even subsample) in full and compares the two images: :func:`psnr` and
:func:`ssim`, mean / 5th percentile / worst, with the frames saved and the cost of an
in-between as a fraction of a keyframe render. On the demo engine the full render is the
truth; on a learned renderer it is what the network would have drawn at that motion.

Metrics (numpy/scipy, uint8 RGB frames of one shape):

- PSNR over all pixels and channels, peak 255, ``inf`` for identical frames;
- SSIM (Wang et al. 2004) on luma (BT.601 Y = 0.299 R + 0.587 G + 0.114 B): an 11-tap
  Gaussian window of sigma 1.5, K1 = 0.01, K2 = 0.03, L = 255, the SSIM map averaged over
  the pixels whose window lies inside the image (a 5-pixel border left out, as scikit-image
  does with ``gaussian_weights=True``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.ndimage import gaussian_filter

from studio.engines.base import Progress, Renderer
from studio.motion.cadence import CadencePlan, blend_weights
from studio.render.pipeline import MotionResult, iter_frames

__all__ = [
    "LUMA",
    "SSIM_SIGMA",
    "inbetween_fidelity",
    "inbetween_psnr",
    "psnr",
    "sample_inbetweens",
    "ssim",
    "summarize",
]

PEAK = 255.0
LUMA = np.array([0.299, 0.587, 0.114])  # BT.601 weights of R, G, B
SSIM_SIGMA = 1.5
SSIM_RADIUS = 5  # 11-tap window: truncate = radius / sigma
SSIM_K1, SSIM_K2 = 0.01, 0.03


def _pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim < 2:
        raise ValueError(f"frames of different or too few dimensions: {a.shape} vs {b.shape}")
    return a, b


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 frames (any shape, all pixels and channels); inf if equal."""
    a, b = _pair(a, b)
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0.0 else float(10.0 * np.log10(PEAK**2 / mse))


def _luma(frame: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 RGB (or [H, W] grey) -> [H, W] float64 luma."""
    f = frame.astype(np.float64)
    return f @ LUMA if f.ndim == 3 else f


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two uint8 RGB (or grey) frames on luma (module docstring); 1.0 if equal."""
    a, b = _pair(a, b)
    x, y = _luma(a), _luma(b)
    if min(x.shape) <= 2 * SSIM_RADIUS:
        raise ValueError(f"frames of {x.shape} are too small for the 11-pixel SSIM window")

    def blur(img: np.ndarray) -> np.ndarray:
        return gaussian_filter(img, SSIM_SIGMA, truncate=SSIM_RADIUS / SSIM_SIGMA)

    mx, my = blur(x), blur(y)
    vx = blur(x * x) - mx * mx
    vy = blur(y * y) - my * my
    cxy = blur(x * y) - mx * my
    c1, c2 = (SSIM_K1 * PEAK) ** 2, (SSIM_K2 * PEAK) ** 2
    smap = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    r = SSIM_RADIUS
    return float(smap[r:-r, r:-r].mean())


def summarize(values: np.ndarray) -> dict[str, float | None]:
    """mean / p5 / worst (the minimum) of per-frame scores; None for no frames. A mean over
    identical frames (inf dB) is inf: the percentiles stay finite where most frames differ."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"mean": None, "p5": None, "worst": None}
    with np.errstate(invalid="ignore"):
        p5 = float(np.percentile(v, 5)) if np.isfinite(v).any() else float("inf")
    return {"mean": float(np.mean(v)), "p5": p5, "worst": float(np.min(v))}


def _pick(frames: np.ndarray, max_frames: int | None) -> np.ndarray:
    """``frames``, or ``max_frames`` of them evenly spread over the clip."""
    if max_frames is None or frames.size <= max_frames:
        return frames
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    pos = np.unique(np.round(np.linspace(0, frames.size - 1, max_frames)).astype(int))
    return frames[pos]


PSNR_SAMPLE = 12  # in-betweens of a render or preview measured against full renders


def sample_inbetweens(plan: CadencePlan, max_frames: int | None = None) -> np.ndarray:
    """The plan's in-between frames, or ``max_frames`` of them evenly spread."""
    _, _, w = blend_weights(plan)
    return _pick(np.flatnonzero(w > 0.0), max_frames)


MEASURE_STAGE = "measuring in-betweens"  # the progress stage of their full renders


def inbetween_psnr(
    result: MotionResult,
    renderer: Renderer,
    made: Mapping[int, np.ndarray],
    progress: Progress | None = None,
) -> dict[str, Any]:
    """PSNR of in-betweens already made (``made``: frame -> image, e.g. the GUI preview's)
    against full renders of their smoothed motion rows: {mean, p5, worst} and how many
    were measured (of how many in-betweens the clip has). ``progress`` hears of the full
    renders (:data:`MEASURE_STAGE`, frames done, frames)."""
    frames = np.array(sorted(made), dtype=np.int64)
    ref, _ = _reference(renderer, result, frames, progress)
    scores = np.array([psnr(made[int(f)], r) for f, r in zip(frames, ref, strict=True)])
    return {
        **summarize(scores),
        "measured": int(frames.size),
        "inbetweens": int(sample_inbetweens(result.plan).size),
    }


def _reference(
    renderer: Renderer,
    result: MotionResult,
    frames: np.ndarray,
    progress: Progress | None = None,
) -> tuple[np.ndarray, float]:
    """Full renders of the clip's ``frames`` (their smoothed rows, and their indices: a video
    avatar's source frame follows them) in the renderer's batches; (frames, seconds)."""
    motion = np.asarray(result.smoothed[frames])
    out, t0 = [], time.perf_counter()
    for start in range(0, motion.shape[0], renderer.batch):
        part = slice(start, start + renderer.batch)
        out.append(np.asarray(renderer.render_batch(motion[part], frames[part])))
        if progress is not None:
            progress(MEASURE_STAGE, min(start + renderer.batch, len(frames)), len(frames))
    seconds = time.perf_counter() - t0
    return (np.concatenate(out) if out else np.empty((0,))), seconds


def _warm(result: MotionResult, renderer: Renderer) -> None:
    """Make the clip once, untimed: the first calls of a warp (imports, kernel selection,
    graph captures per batch size) or of a device renderer are not an in-between's cost."""
    for _ in iter_frames(result, renderer, overlap=False):
        pass


def inbetween_fidelity(
    result: MotionResult, renderer: Renderer, max_frames: int | None = None, warmup: bool = True
) -> dict[str, Any]:
    """Every in-between of the clip against a full render of the same smoothed motion row.

    The clip is rendered as the product renders it (:func:`iter_frames`, whatever it makes
    the in-betweens with); the in-betweens kept (all, or ``max_frames`` evenly spread) are
    then rendered in full with ``renderer.render_batch`` and compared. Keys: frames,
    keyframes, inbetweens (frames - keyframes), measured (in-betweens compared),
    frames_saved (fraction not rendered), psnr_db and ssim ({mean, p5, worst}), per_frame
    (frame, psnr_db, ssim lists), timing: inbetween_ms and keyframe_ms (the clip made
    without a device renderer's run-ahead, so each is its stage's own time: iter_frames'
    ``blend_s`` per in-between, its render time less blending per keyframe, the frames'
    paste-back and download included in both), reference_keyframe_ms (the reference renders,
    in the renderer's batches), cost_fraction (inbetween_ms / keyframe_ms); ``warmup``: the
    clip made once before, untimed. Holds the measured
    in-betweens in memory (frames x H x W x 3 bytes): give ``max_frames`` for long clips.
    """
    plan = result.plan
    n, keys = plan.num_frames, plan.keyframes
    inner = sample_inbetweens(plan)
    picked = _pick(inner, max_frames)
    wanted = set(picked.tolist())
    stats: dict[str, float] = {}
    made: dict[int, np.ndarray] = {}
    if renderer.pixel_format != "rgb24":
        raise ValueError(f"fidelity needs RGB frames, the renderer makes {renderer.pixel_format}")
    if warmup and inner.size:
        _warm(result, renderer)
    for i, frame in enumerate(iter_frames(result, renderer, stats=stats, overlap=False)):
        if i in wanted:
            made[i] = np.array(frame, copy=True)
    ref, ref_s = _reference(renderer, result, picked)
    scores_p = np.array([psnr(made[int(f)], r) for f, r in zip(picked, ref, strict=True)])
    scores_s = np.array([ssim(made[int(f)], r) for f, r in zip(picked, ref, strict=True)])
    blend_s, render_s = stats.get("blend_s", 0.0), stats.get("render_s", 0.0)
    inbetween_ms = 1e3 * blend_s / inner.size if inner.size else None
    keyframe_ms = 1e3 * (render_s - blend_s) / keys.size if keys.size else None
    cost = inbetween_ms / keyframe_ms if inbetween_ms is not None and keyframe_ms else None
    return {
        "frames": int(n),
        "keyframes": int(keys.size),
        "inbetweens": int(n - keys.size),
        "measured": int(picked.size),
        "frames_saved": float((n - keys.size) / max(1, n)),
        "psnr_db": summarize(scores_p),
        "ssim": summarize(scores_s),
        "per_frame": {
            "frame": picked.tolist(),
            "psnr_db": scores_p.tolist(),
            "ssim": scores_s.tolist(),
        },
        "timing": {
            "inbetween_ms": inbetween_ms,
            "keyframe_ms": keyframe_ms,
            "reference_keyframe_ms": 1e3 * ref_s / picked.size if picked.size else None,
            "cost_fraction": cost,
        },
    }
