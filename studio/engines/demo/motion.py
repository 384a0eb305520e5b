"""The demo engine's motion source: speech -> motion in the Ditto 265-dim layout.

Deterministic for a given audio and seed. It reads the per-frame phonetics and
writes what a talking head does: the mouth opens with the speech envelope,
closes on the closure before each plosive burst, rounds or spreads with the
spectral shape; the head nods on emphasis and sways slowly (seeded noise); the
eyes blink and glance; in silence the head keeps breathing, swaying and blinking.
A little frame-to-frame pose jitter stands in for the sampling noise of a diffusion
generator, which is what pose smoothing removes.

The motion is one streaming process (:class:`DemoMotion`) used by both the clip
(:func:`generate_motion`: the whole clip pushed at once) and live audio (pieces as they
arrive), so the live motion is frame for frame the clip's. Every stage is either causal
with carried state (envelope, nod spring, blink schedule), a window that looks at most
``lookahead`` frames ahead, or a function of the absolute frame index and the seed
(counter-based noise), so nothing depends on how the frames were chunked.
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter
from scipy.special import ndtri

from studio import layout
from studio.audio.phonetics import PhoneticFrames
from studio.engines.demo import rig as rig

POSE_JITTER_DEG = 0.05  # per-frame pose noise of the "generator"
LOOKAHEAD = {"low": 1, "balanced": 2, "smooth": 4}  # frames ahead a row may read, per latency
OFFLINE_LATENCY = "balanced"  # the clip's motion is the balanced stream's, exactly

BLINK_SHAPE = np.array([0.35, 0.85, 1.0, 0.7, 0.3])  # lid closure over a blink's frames
BLINK_FIRST = (20, 60)  # first blink: frames [lo, hi)
BLINK_INTERVAL = (60, 101)  # then every 2.4-4 s (frames [lo, hi))
BLINK_AFTER_PAUSE = (2, 6)  # a blink this many frames after a pause starts ...
BLINK_MIN_GAP = BLINK_INTERVAL[0]  # ... unless the last blink was less than 2.4 s before
CLOSURE_FRAMES = 2  # the lips close this many frames before a plosive burst
TRUNCATE = 4.0  # Gaussian windows reach this many sigmas into the past

# Counter-based noise streams: one id per independent signal.
(_PITCH, _YAW, _YAW_FAST, _ROLL, _TX, _TY, _GAZE_X, _GAZE_Y, _JITTER, _BLINK, _PAUSE) = range(11)

# Per-frame channels held in the phonetic history (see DemoMotion._signals).
(_LEVEL, _SPEECH, _BURST, _ROUND, _BRIGHT, _EMPH, _OPEN, _NOD, _BLINKC) = range(9)
_CHANNELS = 9
_SIGMAS = {"rounding": 1.0, "brow": 2.0, "pitch_level": 6.0, "scale_level": 8.0}
_HISTORY = int(TRUNCATE * max(_SIGMAS.values()))  # past frames a window reads


# --- counter-based noise -------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of uint64 values."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _hash_uniform(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """Uniform values in (0, 1), a pure function of (seed, stream, index): the same number
    for the same frame whatever else was asked for, in any order."""
    key = _mix(np.array([(seed & (2**64 - 1)) ^ (stream << 56)], np.uint64))
    x = _mix(np.asarray(index, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ key)
    return ((x >> np.uint64(11)).astype(np.float64) + 0.5) / float(2**53)


def _hash_normal(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """Standard normal values from (seed, stream, index) (:func:`_hash_uniform`)."""
    return ndtri(_hash_uniform(seed, stream, index))


def _hash_int(seed: int, stream: int, index: int, lo: int, hi: int) -> int:
    """An integer in [lo, hi) from (seed, stream, index)."""
    return lo + int(_hash_uniform(seed, stream, np.array([index]))[0] * (hi - lo))


def _slow_noise(seed: int, stream: int, frames: np.ndarray, sigma_frames: float) -> np.ndarray:
    """Zero-mean, unit-variance smooth noise at absolute ``frames``, of the time scale of
    white noise Gaussian-filtered with ``sigma_frames``.

    Value noise: seeded normal values on a lattice every ``1.7 sigma`` frames (where the two
    autocorrelations cross 0.5), joined by a cubic B-spline and divided by the spline
    weights' norm, so the variance is 1 at every phase; a function of the frame index
    and the seed only, so a clip and a live session draw the same head sway.
    """
    spacing = 1.7 * sigma_frames
    pos = np.asarray(frames, np.float64) / spacing
    k = np.floor(pos)
    f = pos - k
    w = np.stack(
        [
            (1 - f) ** 3 / 6,
            (3 * f**3 - 6 * f**2 + 4) / 6,
            (-3 * f**3 + 3 * f**2 + 3 * f + 1) / 6,
            f**3 / 6,
        ]
    )
    v = _hash_normal(seed, stream, k.astype(np.int64)[None, :] + np.arange(-1, 3)[:, None])
    return (w[0] * v[0] + w[1] * v[1] + w[2] * v[2] + w[3] * v[3]) / np.sqrt(
        w[0] ** 2 + w[1] ** 2 + w[2] ** 2 + w[3] ** 2
    )


# --- causal stages (state carried across pieces) -------------------------------------------


def _envelope(x: np.ndarray, attack: float, release: float, v: float) -> tuple[np.ndarray, float]:
    """One-pole follower from value ``v``: rises with `attack`, falls with `release`
    (0..1 per frame); returns the output and the last value (the next piece's start)."""
    out = np.empty_like(x)
    for i, xi in enumerate(x):
        k = attack if xi > v else release
        v += k * (xi - v)
        out[i] = v
    return out, v


def _damped_coeffs(freq_hz: float, damping: float) -> tuple[list[float], list[float]]:
    """Second-order (spring) filter (b, a): an impulse gives a nod that settles."""
    w = 2 * np.pi * freq_hz / layout.FPS
    r = np.exp(-damping * w)
    return [1.0 - r], [1.0, -2 * r * np.cos(w), r * r]


_NOD_B, _NOD_A = _damped_coeffs(freq_hz=1.6, damping=0.45)


class _Blinks:
    """Blink closure 0..1 per frame, causal: a seeded schedule (first after 0.8-2.4 s, then
    every 2.4-4 s) and a blink soon after a pause starts; each blink restarts the schedule."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.count = 0
        self.next = _hash_int(seed, _BLINK, 0, *BLINK_FIRST)
        self.last = -(10**9)  # start of the last blink
        self.pending: list[int] = []  # pause blinks to come (at most a few)
        self.was_silent = True  # before frame 0 there was silence

    def step(self, start: int, silence: np.ndarray) -> np.ndarray:
        """Closure for frames ``start ..`` given their silence flags."""
        out = np.zeros(silence.size)
        for n, silent in enumerate(silence.tolist()):
            i = start + n
            if silent and not self.was_silent:
                self.pending.append(i + _hash_int(self.seed, _PAUSE, i, *BLINK_AFTER_PAUSE))
            self.was_silent = silent
            if i == self.next or (i in self.pending and i - self.last >= BLINK_MIN_GAP):
                self.last = i
                self.count += 1
                self.next = i + _hash_int(self.seed, _BLINK, self.count, *BLINK_INTERVAL)
            self.pending = [p for p in self.pending if p > i]
            if i - self.last < BLINK_SHAPE.size:
                out[n] = BLINK_SHAPE[i - self.last]
        return out


# --- windows within the lookahead ----------------------------------------------------------


def _window(sigma: float, ahead: int) -> tuple[np.ndarray, int]:
    """Gaussian weights over offsets [-4 sigma, min(4 sigma, ahead)], summing to 1: the
    non-causal Gaussian filter cut at the lookahead (past side whole). Returns (weights,
    past) with past the number of offsets before 0."""
    past = int(TRUNCATE * sigma)
    k = np.arange(-past, min(past, ahead) + 1)
    w = np.exp(-0.5 * (k / sigma) ** 2)
    return w / w.sum(), past


def _windowed(x: np.ndarray, first: int, count: int, weights: np.ndarray, past: int) -> np.ndarray:
    """Weighted sums of ``x`` around indices ``first .. first+count-1``; summed a weight at a
    time (elementwise), so every output is the same number however the rows are batched."""
    out = np.zeros(count)
    for k, w in enumerate(weights):
        lo = first - past + k
        out += w * x[lo : lo + count]
    return out


# --- the process ---------------------------------------------------------------------------


class DemoMotion:
    """The demo motion as a stream: fed phonetic frames in pieces, it returns the motion
    rows that became final. Row ``j`` reads phonetic frames up to ``j + lookahead``; its
    causal state (envelope, nod filter, blink schedule) is carried across pieces and only
    the last few frames of phonetics are held, so memory does not grow with the session.
    Satisfies :class:`studio.engines.base.MotionStream` (``push`` ignores the samples).
    """

    reads_phonetics = True  # its lookahead counts in phonetic frames, after the phonetics'

    def __init__(self, seed: int = 0, lookahead: int = LOOKAHEAD[OFFLINE_LATENCY]) -> None:
        if lookahead < 1:
            raise ValueError(f"lookahead must be at least 1 frame, got {lookahead}")
        self.seed = int(seed)
        self.lookahead_frames = int(lookahead)
        self._windows = {name: _window(s, lookahead) for name, s in _SIGMAS.items()}
        self._closure = min(CLOSURE_FRAMES, lookahead)
        # Frames [self._base, self._received) of the per-frame channels; the frames before 0
        # are silence (so a live session starting in speech reads as speech after a pause).
        self._buf = np.zeros((_CHANNELS, _HISTORY))
        self._base = -_HISTORY
        self._received = 0  # phonetic frames pushed (padding included after finish)
        self._emitted = 0  # rows returned
        self._end: int | None = None  # frame count once finished
        self._level = 0.0  # last frame's level (for the loudness rise)
        self._open = 0.0  # envelope follower's value
        self._nod_zi = np.zeros(2)
        self._blinks = _Blinks(self.seed)

    @property
    def held_frames(self) -> int:
        """Frames of per-frame history held (bounded: history + lookahead + last piece)."""
        return int(self._buf.shape[1])

    def push(self, samples: np.ndarray | None, phon: PhoneticFrames) -> np.ndarray:
        """The :class:`~studio.engines.base.MotionStream` call: ``samples`` are not read."""
        return self.feed(phon)

    def feed(self, phon: PhoneticFrames) -> np.ndarray:
        """Take the next phonetic frames; the rows [k, 265] float32 that became final."""
        if self._end is not None:
            raise RuntimeError("the motion stream has finished")
        self._append(self._signals(phon))
        return self._emit(self._received - self.lookahead_frames)

    def finish(self) -> np.ndarray:
        """The remaining rows, reading silence past the end of the audio."""
        if self._end is not None:
            return np.zeros((0, layout.MOTION_DIM), np.float32)
        self._end = self._received
        pad = np.zeros((_CHANNELS, self.lookahead_frames))
        pad[_BLINKC] = self._blinks.step(self._received, np.ones(self.lookahead_frames, bool))
        self._append(pad)
        return self._emit(self._end)

    # -- per-frame signals, at arrival (causal stages) --

    def _signals(self, phon: PhoneticFrames) -> np.ndarray:
        """[channels, m] for the pushed frames, advancing the causal state."""
        m = phon.num_frames
        s = np.zeros((_CHANNELS, m))
        if m == 0:
            return s
        level = np.clip(np.asarray(phon.level, np.float64), 0, 1)
        speech = ~np.asarray(phon.silence, bool)
        voicing = np.asarray(phon.voicing, np.float64)
        s[_LEVEL] = level
        s[_SPEECH] = speech
        s[_BURST] = np.asarray(phon.burst, bool)
        low = np.clip((np.asarray(phon.low_ratio, np.float64) - 0.55) / 0.35, 0, 1)
        bright = np.clip((np.asarray(phon.centroid_hz, np.float64) - 1400.0) / 1800.0, 0, 1)
        s[_ROUND] = low * voicing * speech
        s[_BRIGHT] = bright * voicing * speech

        # Mouth: envelope-driven opening (closed in silence).
        drive = np.sqrt(level) * np.clip(0.35 + voicing, 0, 1) * speech
        s[_OPEN], self._open = _envelope(drive, 0.75, 0.45, self._open)
        # Head: a nod (spring) on emphasis, i.e. rising loudness in speech.
        rise = np.clip(np.diff(level, prepend=self._level), 0, None)
        self._level = float(level[-1])
        s[_EMPH] = np.where(rise > 0.18, rise, 0.0) * speech
        s[_NOD], self._nod_zi = lfilter(_NOD_B, _NOD_A, s[_EMPH], zi=self._nod_zi)
        s[_BLINKC] = self._blinks.step(self._received, ~speech)
        return s

    def _append(self, s: np.ndarray) -> None:
        self._buf = np.concatenate([self._buf, s], axis=1)
        self._received += s.shape[1]

    # -- rows, once their lookahead has arrived --

    def _emit(self, stop: int) -> np.ndarray:
        """Rows [self._emitted, stop) and trim the history they no longer need."""
        first, count = self._emitted, max(0, stop - self._emitted)
        rows = self._rows(first - self._base, first, count)
        self._emitted += count
        keep = self._emitted - _HISTORY
        self._buf = self._buf[:, keep - self._base :].copy()
        self._base = keep
        return rows

    def _rows(self, at: int, first: int, n: int) -> np.ndarray:
        """[n, 265] rows for frames ``first ..`` (at ``at`` in the history)."""
        if n == 0:
            return np.zeros((0, layout.MOTION_DIM), np.float32)
        b = self._buf
        cur = b[:, at : at + n]
        idx = np.arange(first, first + n)
        seed = self.seed

        def smooth(ch: int, name: str) -> np.ndarray:
            return _windowed(b[ch], at, n, *self._windows[name])

        # Mouth: closed (lips pressed) before a burst, popped open at it.
        opening = cur[_OPEN].copy()
        level = cur[_LEVEL]
        speech = cur[_SPEECH]
        burst = cur[_BURST] > 0
        closing = np.zeros(n, bool)
        for k in range(1, self._closure + 1):
            closing |= b[_BURST, at + k : at + k + n] > 0
        opening = np.where(burst, np.maximum(opening, 0.55 * np.sqrt(level)), opening)
        opening[closing] = 0.0
        press = closing.astype(np.float64)
        rounding = smooth(_ROUND, "rounding")
        spread = smooth(_BRIGHT, "rounding") * (1 - rounding)

        # Head: nods on emphasis, slow sway, the generator's jitter.
        nod = cur[_NOD] * 9.0
        pitch = (
            2.0 * _slow_noise(seed, _PITCH, idx, 40)
            + nod
            - 3.0 * smooth(_LEVEL, "pitch_level")
            + 1.5
        )
        yaw = 6.0 * _slow_noise(seed, _YAW, idx, 55) + 2.0 * _slow_noise(seed, _YAW_FAST, idx, 14)
        roll = 2.5 * _slow_noise(seed, _ROLL, idx, 60) + 0.6 * yaw * 0.2
        jitter = _hash_normal(seed, _JITTER, idx[:, None] * 3 + np.arange(3)) * POSE_JITTER_DEG
        jitter *= 0.4 + 0.6 * speech[:, None]
        angles = np.stack([pitch, yaw, roll], axis=1) + jitter

        t = np.zeros((n, 3))
        t[:, 0] = 0.012 * _slow_noise(seed, _TX, idx, 50) + 0.002 * jitter[:, 1]
        t[:, 1] = 0.006 * _slow_noise(seed, _TY, idx, 45) - 0.004 * nod / 9.0
        breathing = 0.004 * np.sin(2 * np.pi * idx / (layout.FPS * 3.7))
        scale = 1.0 + breathing + 0.01 * smooth(_LEVEL, "scale_level")

        # Eyes and brows.
        blink = cur[_BLINKC]
        brow = np.clip(4.0 * smooth(_EMPH, "brow"), 0, 1)
        gaze = np.stack(
            [_slow_noise(seed, _GAZE_X, idx, 30), 0.5 * _slow_noise(seed, _GAZE_Y, idx, 30)],
            axis=1,
        )
        exp = _expression(opening, press, rounding, spread, blink, brow, gaze)
        frames = layout.MotionFrames(
            scale=scale.astype(np.float32),
            pitch=angles[:, 0].astype(np.float32),
            yaw=angles[:, 1].astype(np.float32),
            roll=angles[:, 2].astype(np.float32),
            t=t.astype(np.float32),
            exp=exp.astype(np.float32),
        )
        return layout.pack(frames)


def _expression(
    opening: np.ndarray,
    press: np.ndarray,
    rounding: np.ndarray,
    spread: np.ndarray,
    blink: np.ndarray,
    brow: np.ndarray,
    gaze: np.ndarray,
) -> np.ndarray:
    """[n, 21, 3] expression offsets of the demo rig from the per-frame controls."""
    exp = np.zeros((opening.size, layout.NUM_KP, layout.KP_DIMS))
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
    return exp


def generate_motion(phon: PhoneticFrames, seed: int = 0) -> np.ndarray:
    """[N, 265] float32 motion for the demo character, N = phon.num_frames: the balanced
    stream fed the whole clip at once."""
    stream = DemoMotion(seed, LOOKAHEAD[OFFLINE_LATENCY])
    return np.concatenate([stream.feed(phon), stream.finish()])
