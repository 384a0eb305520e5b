"""The demo engine's motion source: speech -> motion in the Ditto 265-dim layout.

Deterministic for a given audio and seed. It reads the per-frame phonetics and
writes what a talking head does: the mouth opens with the speech envelope,
closes on the closure before each plosive burst, rounds or spreads with the
spectral shape; the head nods on emphasis and sways slowly (seeded noise); the
eyes blink and glance. A little frame-to-frame pose jitter stands in for the
sampling noise of a diffusion generator, which is what pose smoothing removes.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import gaussian_filter1d
from scipy.signal import lfilter

from studio import layout
from studio.audio.phonetics import PhoneticFrames
from studio.engines.demo import rig as rig

POSE_JITTER_DEG = 0.05  # per-frame pose noise of the "generator"


def _envelope(x: np.ndarray, attack: float, release: float) -> np.ndarray:
    """One-pole follower: rises with `attack`, falls with `release` (0..1 per frame)."""
    out = np.empty_like(x)
    v = 0.0
    for i, xi in enumerate(x):
        k = attack if xi > v else release
        v += k * (xi - v)
        out[i] = v
    return out


def _slow_noise(rng: np.random.Generator, n: int, sigma_frames: float) -> np.ndarray:
    """Zero-mean, unit-variance smooth noise with the given time scale.

    Drawn over a long buffer and normalised there, so a short clip is a piece of a
    stationary process (not rescaled until its own spread is 1, which would blow up
    a slow drift into a large constant offset).
    """
    span = max(n, int(20 * sigma_frames)) + 200
    z = gaussian_filter1d(rng.standard_normal(span), sigma_frames, mode="wrap")
    z = (z - z.mean()) / (z.std() + 1e-9)
    return z[100 : 100 + n]


def _damped_response(impulses: np.ndarray, freq_hz: float, damping: float) -> np.ndarray:
    """Second-order (spring) response to an impulse train: a nod that settles."""
    w = 2 * np.pi * freq_hz / layout.FPS
    r = np.exp(-damping * w)
    b = [1.0 - r]
    a = [1.0, -2 * r * np.cos(w), r * r]
    return lfilter(b, a, impulses)


def _blinks(rng: np.random.Generator, n: int, pauses: np.ndarray) -> np.ndarray:
    """Blink closure 0..1 per frame: every 2-5 s, and soon after a pause starts."""
    shape = np.array([0.35, 0.85, 1.0, 0.7, 0.3])
    closure = np.zeros(n)
    t = int(rng.integers(20, 60))
    pause_starts = np.nonzero(pauses[1:] & ~pauses[:-1])[0] + 1
    extra = {int(p + rng.integers(2, 6)) for p in pause_starts}
    i = 0
    while i < n:
        if i == t or i in extra:
            seg = closure[i : i + shape.size]
            closure[i : i + shape.size] = np.maximum(seg, shape[: seg.size])
            t = i + int(rng.integers(50, 125))
            i += shape.size
            continue
        i += 1
    return closure


def generate_motion(phon: PhoneticFrames, seed: int = 0) -> np.ndarray:
    """[N, 265] float32 motion for the demo character, N = phon.num_frames."""
    n = phon.num_frames
    rng = np.random.default_rng(seed)
    level = np.clip(phon.level.astype(np.float64), 0, 1)
    speech = ~phon.silence

    # Mouth: envelope-driven opening, closed in silence and on plosive closures.
    drive = np.sqrt(level) * np.clip(0.35 + phon.voicing, 0, 1) * speech
    opening = _envelope(drive, attack=0.75, release=0.45)
    press = np.zeros(n)
    for b in np.nonzero(phon.burst)[0]:
        lo = max(0, b - 2)
        opening[lo:b] = 0.0
        press[lo:b] = 1.0
        if b < n:
            opening[b] = max(opening[b], 0.55 * np.sqrt(level[b]))
    low = np.clip((phon.low_ratio - 0.55) / 0.35, 0, 1)
    bright = np.clip((phon.centroid_hz - 1400.0) / 1800.0, 0, 1)
    rounding = gaussian_filter1d(low * phon.voicing * speech, 1.0)
    spread = gaussian_filter1d(bright * phon.voicing * speech, 1.0) * (1 - rounding)

    # Head: nods on emphasis (rising loudness), slow sway, the generator's jitter.
    rise = np.clip(np.diff(level, prepend=level[0]), 0, None)
    emphasis = np.where(rise > 0.18, rise, 0.0) * speech
    nod = _damped_response(emphasis, freq_hz=1.6, damping=0.45) * 9.0
    pitch = 2.0 * _slow_noise(rng, n, 40) + nod - 3.0 * gaussian_filter1d(level, 6) + 1.5
    yaw = 6.0 * _slow_noise(rng, n, 55) + 2.0 * _slow_noise(rng, n, 14)
    roll = 2.5 * _slow_noise(rng, n, 60) + 0.6 * yaw * 0.2
    jitter = rng.standard_normal((n, 3)) * POSE_JITTER_DEG * (0.4 + 0.6 * speech[:, None])
    angles = np.stack([pitch, yaw, roll], axis=1) + jitter

    t = np.zeros((n, 3))
    t[:, 0] = 0.012 * _slow_noise(rng, n, 50) + 0.002 * jitter[:, 1]
    t[:, 1] = 0.006 * _slow_noise(rng, n, 45) - 0.004 * nod / 9.0
    breathing = 0.004 * np.sin(2 * np.pi * np.arange(n) / (layout.FPS * 3.7))
    scale = 1.0 + breathing + 0.01 * gaussian_filter1d(level, 8)

    # Eyes and brows.
    blink = _blinks(rng, n, phon.silence)
    brow = np.clip(gaussian_filter1d(emphasis * 4.0, 2.0), 0, 1)
    gaze = np.stack([_slow_noise(rng, n, 30), 0.5 * _slow_noise(rng, n, 30)], axis=1)

    exp = np.zeros((n, layout.NUM_KP, layout.KP_DIMS))
    exp[:, rig.LIP_LOWER, 1] += opening * rig.MOUTH_OPEN_LOWER_LIP - press * rig.LIP_PRESS
    exp[:, rig.JAW, 1] += opening * rig.MOUTH_OPEN_JAW
    exp[:, rig.LIP_UPPER, 1] += opening * rig.MOUTH_OPEN_UPPER_LIP + press * rig.LIP_PRESS
    exp[:, rig.MOUTH_CORNER_L, 0] += rounding * rig.LIP_ROUND_X - spread * rig.LIP_SPREAD_X
    exp[:, rig.MOUTH_CORNER_R, 0] -= rounding * rig.LIP_ROUND_X - spread * rig.LIP_SPREAD_X
    exp[:, rig.MOUTH_CORNER_L, 1] += spread * rig.LIP_SPREAD_Y
    exp[:, rig.MOUTH_CORNER_R, 1] += spread * rig.LIP_SPREAD_Y
    exp[:, rig.MOUTH_INNER, 2] += rounding * rig.LIP_ROUND_Z
    for lid in (rig.LID_UPPER_L, rig.LID_UPPER_R):
        exp[:, lid, 1] += blink * rig.BLINK_UPPER_LID
    for lid in (rig.LID_LOWER_L, rig.LID_LOWER_R):
        exp[:, lid, 1] += blink * rig.BLINK_LOWER_LID
    for b in (rig.BROW_L, rig.BROW_R):
        exp[:, b, 1] -= brow * rig.BROW_RAISE
    exp[:, rig.GAZE, :2] += gaze * rig.GAZE_RANGE

    frames = layout.MotionFrames(
        scale=scale.astype(np.float32),
        pitch=angles[:, 0].astype(np.float32),
        yaw=angles[:, 1].astype(np.float32),
        roll=angles[:, 2].astype(np.float32),
        t=t.astype(np.float32),
        exp=exp.astype(np.float32),
    )
    return layout.pack(frames)
