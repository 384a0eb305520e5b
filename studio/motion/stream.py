"""Streaming cadence and pose smoothing: :func:`studio.render.pipeline.postprocess` for live audio.

The same stages as the clip, composed for frames that arrive in pieces:

1. Strides: :func:`~studio.motion.cadence.frame_strides` and
   :func:`~studio.motion.cadence.pose_stride_cap` of each frame ``q`` as if the clip ended
   at ``q + cue_ahead`` (the offline functions on a short truncated window), capped at the
   preset's longest stride.
2. Keyframes: :func:`~studio.motion.cadence.next_keyframe` from the last keyframe once the
   strides and the motion rows it reads are known (the warp's bounds on each candidate gap,
   :func:`~studio.motion.cadence.bridgeable_gaps`, as offline); the gap is sampled by
   :func:`~studio.motion.cadence.sample_motion` and weighted by
   :func:`~studio.motion.cadence.blend_weights`.
3. Savitzky–Golay over the pose channels with the user's window and order, evaluated with
   at most ``sg_ahead`` frames ahead (centred when the budget allows, as offline).
4. The acceleration limiter on a receding horizon: each frame is solved for with the last
   two committed frames fixed, over its ``limiter_ahead`` known targets and a tail that
   holds the last one (so it brakes in time), and only that frame is committed. The bound
   |Δ²θ| <= a_max therefore holds on everything emitted, across every chunk boundary.

Every quantity of frame ``j`` is a fixed function of the input up to a fixed frame after
``j``, so the output does not depend on how the input was chunked. A frame leaves in a
:class:`PostChunk` once the keyframe after it has been committed (a renderer holding the
keyframe rows can make it). Buffers keep only the frames still needed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np
from scipy.optimize import lsq_linear
from scipy.signal import savgol_coeffs

from studio import layout
from studio.audio.phonetics import PhoneticFrames
from studio.motion.cadence import (
    STRIDES,
    CadencePlan,
    CadenceThresholds,
    blend_weights,
    bridgeable_gaps,
    frame_strides,
    next_keyframe,
    pose_stride_cap,
    sample_motion,
)
from studio.motion.kinematics import (
    SmoothingSettings,
    angle_jerk,
    channel_limits,
    pose_channels,
    second_difference,
)

# --- presets -------------------------------------------------------------------------


@dataclass(frozen=True)
class PostPreset:
    """How a latency setting spends its lookahead (frames after a frame it may wait for).

    A frame waits for its next keyframe (up to ``max_stride - 1`` frames), whose gap is
    decided from strides up to ``max_stride - 1`` further, each read ``cue_ahead`` ahead;
    then the Savitzky–Golay lookahead and the limiter's known targets take what is left
    of ``budget`` (Savitzky–Golay first, up to the window's half).
    """

    budget: int  # most frames of lookahead
    max_stride: int  # longest cadence stride (1: every frame a keyframe)
    cue_ahead: int = 0  # frames the stride cues (phonetics, head speed) read ahead
    prediction: int = 12  # frames the limiter's horizon holds the last target past the data


def cadence_frames(max_stride: int, cue_ahead: int) -> int:
    """Lookahead the cadence takes: the next keyframe, its decision, and the cues."""
    return 0 if max_stride == 1 else 2 * (max_stride - 1) + cue_ahead


LATENCY = {
    # every frame a keyframe, Savitzky–Golay one frame ahead (off-centre), causal limiter
    "low": PostPreset(budget=1, max_stride=1),
    # strides up to 2, Savitzky–Golay one frame ahead (off-centre), causal limiter
    "balanced": PostPreset(budget=3, max_stride=2),
    # strides up to 3, centred Savitzky–Golay, limiter sees 2 frames of data ahead
    "smooth": PostPreset(budget=8, max_stride=3),
}


# --- the chunk -----------------------------------------------------------------------


@dataclass(frozen=True)
class PostChunk:
    """Frames ``start .. start + k - 1``, final: rows to render and how to blend them."""

    start: int  # first frame index
    motion: np.ndarray  # [k, 265] float32 cadence-sampled, smoothed rows
    keyframe: np.ndarray  # [k] bool
    prev_key: np.ndarray  # [k] int64 keyframe at or before the frame
    next_key: np.ndarray  # [k] int64 keyframe at or after (the frame itself on keyframes)
    weight: np.ndarray  # [k] float32 blend weight toward next_key (0 on keyframes)
    strides: np.ndarray  # [k] int64

    @property
    def indices(self) -> np.ndarray:
        return np.arange(self.start, self.start + len(self), dtype=np.int64)

    def __len__(self) -> int:
        return int(self.keyframe.shape[0])

    @property
    def rows(self) -> np.ndarray:
        """Alias of :attr:`motion`."""
        return self.motion

    @property
    def keyframes(self) -> np.ndarray:
        """Alias of :attr:`keyframe`."""
        return self.keyframe

    @classmethod
    def empty(cls, start: int = 0) -> PostChunk:
        return cls(
            start,
            np.zeros((0, layout.MOTION_DIM), np.float32),
            np.zeros(0, bool),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            np.zeros(0, np.float32),
            np.zeros(0, np.int64),
        )

    def concat(self, other: PostChunk) -> PostChunk:
        """This chunk followed by the next one."""
        if not len(other):
            return self
        if not len(self):
            return other
        if other.start != self.start + len(self):
            raise ValueError(f"chunk at {other.start} does not follow {self.start}+{len(self)}")
        parts = [
            np.concatenate([getattr(self, f.name), getattr(other, f.name)])
            for f in fields(self)[1:]
        ]
        return PostChunk(self.start, *parts)


# --- buffers -------------------------------------------------------------------------


class _Frames:
    """Per-frame arrays from absolute frame ``start`` on; appended at the end, trimmed at
    the front, so only the frames still needed are held."""

    def __init__(self, width: int | None, dtype: type = np.float64) -> None:
        shape = (0,) if width is None else (0, width)
        self.data = np.zeros(shape, dtype)
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def append(self, rows: np.ndarray) -> None:
        self.data = np.concatenate([self.data, np.asarray(rows, self.data.dtype)])

    def get(self, lo: int, hi: int) -> np.ndarray:
        """Frames [lo, hi) (absolute)."""
        return self.data[lo - self.start : hi - self.start]

    def trim(self, keep_from: int) -> None:
        """Drop frames before ``keep_from``."""
        cut = min(max(keep_from - self.start, 0), len(self.data))
        if cut:
            self.data = self.data[cut:].copy()
            self.start += cut


class _Phon:
    """A :class:`PhoneticFrames` buffer with the same absolute indexing as :class:`_Frames`."""

    NAMES = tuple(f.name for f in fields(PhoneticFrames))

    def __init__(self) -> None:
        self.parts = {n: _Frames(None, np.float32) for n in self.NAMES}

    @property
    def end(self) -> int:
        return self.parts[self.NAMES[0]].end

    def append(self, phon: PhoneticFrames) -> None:
        for n in self.NAMES:
            arr = getattr(phon, n)
            buf = self.parts[n]
            if not len(buf.data):
                buf.data = np.zeros(0, arr.dtype)
            buf.append(arr)

    def get(self, lo: int, hi: int) -> PhoneticFrames:
        return PhoneticFrames(**{n: b.get(lo, hi) for n, b in self.parts.items()})

    def trim(self, keep_from: int) -> None:
        for b in self.parts.values():
            b.trim(keep_from)


# --- Savitzky–Golay and the receding limiter -------------------------------------------


@lru_cache(maxsize=256)
def _sg_weights(length: int, order: int, pos: int) -> np.ndarray:
    """Weights of a Savitzky–Golay fit of ``length`` frames evaluated at ``pos``; the
    identity when the fit would interpolate every point."""
    if length <= order:
        w = np.zeros(length)
        w[pos] = 1.0
        return w
    return savgol_coeffs(length, order, pos=pos, use="dot")


@lru_cache(maxsize=64)
def _integrator(n: int) -> np.ndarray:
    """[n, n] x = A z for z = (x₀, x₁, Δ²x₂, ..., Δ²x_{n-1}): positions from two starting
    values and the accelerations after them."""
    k = np.arange(n, dtype=np.float64)
    a = np.zeros((n, n))
    a[:, 0] = 1.0 - k
    a[:, 1] = k
    for j in range(2, n):
        a[j:, j] = k[j:] - j + 1.0
    return a


def limit_step(past: np.ndarray, targets: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """The next committed value [C] of a receding-horizon acceleration limiter.

    ``past`` [p <= 2, C] are the last committed values (fixed), ``targets`` [H, C] what the
    horizon should follow. Per channel: the least-squares fit to the targets among curves
    whose every second difference from the fixed frames on is within ±limit, solved as a
    box-bounded least squares in the accelerations; its first free value is returned. The
    first acceleration is clipped exactly, so |Δ²| <= limit holds whatever the solver did.
    """
    p, h = past.shape[0], targets.shape[0]
    seq = np.concatenate([past, targets])
    out = targets[0].copy()
    if p + h < 3:
        return out
    over = np.abs(second_difference(seq)).max(axis=0) > limits
    if not over.any():
        return out
    a = _integrator(p + h)
    for c in np.flatnonzero(over):
        rhs = seq[p:, c] - a[p:, :p] @ seq[:p, c]
        lo = np.r_[np.full(2 - p, -np.inf), np.full(p + h - 2, -limits[c])]
        z = lsq_linear(a[p:, p:], rhs, bounds=(lo, -lo), method="bvls").x
        if p == 2:
            out[c] = 2.0 * seq[1, c] - seq[0, c] + np.clip(z[0], -limits[c], limits[c])
        else:
            out[c] = a[p, p:] @ z + a[p, :p] @ seq[:p, c]
    return out


# --- the stream ----------------------------------------------------------------------


class PostStream:
    """Cadence plan, cadence sampling and pose smoothing on motion that arrives in pieces.

    ``stride`` is "auto" or a fixed 1, 2, 3 (capped at the preset's longest stride);
    ``latency`` a key of :data:`LATENCY` or a :class:`PostPreset`.
    """

    LATENCY = LATENCY

    def __init__(
        self,
        stride: str | int,
        thresholds: CadenceThresholds,
        smoothing: SmoothingSettings,
        latency: str | PostPreset = "balanced",
    ) -> None:
        preset = latency if isinstance(latency, PostPreset) else self.LATENCY[latency]
        self.auto = stride == "auto"
        if not self.auto and int(stride) not in STRIDES:
            raise ValueError(f"stride must be auto, 1, 2 or 3, got {stride!r}")
        self.preset = preset
        self.thresholds = thresholds
        self.smoothing = smoothing
        self.max_stride = min(preset.max_stride, 3 if self.auto else int(stride))
        self.cue_ahead = preset.cue_ahead if self.auto and self.max_stride > 1 else 0
        cadence = cadence_frames(self.max_stride, self.cue_ahead)
        rest = max(preset.budget - cadence, 0)
        smooth = smoothing.enabled
        self.window = smoothing.window
        self.sg_ahead = min(smoothing.window // 2, rest) if smooth else 0
        self.limiter_ahead = rest - self.sg_ahead if smooth else 0
        self.lookahead_frames: int = cadence + self.sg_ahead + self.limiter_ahead
        self.limits = channel_limits(smoothing.accel_limit) if smooth else None
        self._raw = _Frames(layout.MOTION_DIM, np.float32)
        self._phon = _Phon()
        self._strides = _Frames(None, np.int64)
        self._sampled = _Frames(layout.MOTION_DIM, np.float32)  # rows up to the last key
        self._pose = _Frames(6, np.float64)  # their pose channels
        self._blend = _Frames(3, np.float64)  # (prev key, next key, weight) per sampled frame
        self._y = _Frames(6, np.float64)  # Savitzky–Golay output
        self._x = _Frames(6, np.float64)  # committed pose (the last two stay as the past)
        self._key = -1  # last decided keyframe
        self._emitted = 0
        self._total: int | None = None  # frame count, known after finish()
        self._stats = _Kinematics()

    # --- public -------------------------------------------------------------------

    def push(self, motion: np.ndarray, phon: PhoneticFrames | None = None) -> PostChunk:
        """Take the next motion rows and phonetic frames (any lengths); the frames now final."""
        if self._total is not None:
            raise RuntimeError("push after finish")
        rows = np.asarray(motion, np.float32).reshape(-1, layout.MOTION_DIM)
        self._raw.append(rows)
        if phon is not None and phon.num_frames:
            self._phon.append(phon)
        return self._advance()

    def finish(self) -> PostChunk:
        """The input has ended: every frame not emitted yet."""
        if self._total is None:
            self._total = self._known()
        return self._advance()

    def kinematics(self) -> dict[str, float]:
        """Running figures over everything emitted (see :class:`_Kinematics`)."""
        return self._stats.report()

    @property
    def buffered_frames(self) -> int:
        """Frames held in the buffers (bounded: they are trimmed as frames leave)."""
        bufs = (self._raw, self._strides, self._sampled, self._y, self._x)
        return max(len(b.data) for b in bufs) + len(self._phon.parts["level"].data)

    # --- stages -------------------------------------------------------------------

    def _known(self) -> int:
        """Frames whose input is complete: motion rows, and phonetics where auto needs it."""
        return min(self._raw.end, self._phon.end) if self.auto else self._raw.end

    def _advance(self) -> PostChunk:
        self._stride_frames()
        self._decide_keys()
        self._savgol_frames()
        self._commit_frames()
        chunk = self._emit()
        self._trim()
        return chunk

    def _stride_frames(self) -> None:
        """Strides of the frames whose cues are in (each as if the clip ended cue_ahead later)."""
        known, total = self._known(), self._total
        q = self._strides.end
        out = []
        while q < (total if total is not None else known - self.cue_ahead):
            out.append(self._stride_of(q, min(q + self.cue_ahead, known - 1)))
            q += 1
        if out:
            self._strides.append(np.asarray(out))

    def _stride_of(self, q: int, last: int) -> int:
        """Frame q's stride from the input up to frame ``last``."""
        s = self.max_stride
        if not self.auto or s == 1:
            return s
        th = self.thresholds
        lo = max(0, q - th.plosive_guard - 1)
        s = min(s, int(frame_strides(self._phon.get(lo, last + 1), th)[q - lo]))
        radius = min(max(self.cue_ahead - 1, 0), 6)
        lo = max(0, q - radius - 1)
        cap = pose_stride_cap(self._raw.get(lo, last + 1), th.max_pose_gap_deg, radius)
        return min(s, int(cap[q - lo]))

    def _decide_keys(self) -> None:
        """Next keyframes while their strides are known; the gaps sampled as offline."""
        first = self._key
        keys = [first] if first >= 0 else []
        if first < 0 and self._strides.end > 0:
            keys = [0]
        if not keys:
            return
        end, total = self._strides.end, self._total
        while keys[-1] < (total if total is not None else end) - 1:
            k = keys[-1]
            if total is None and k + self.max_stride >= end:
                break
            window = self._strides.get(k, min(k + self.max_stride + 1, end))
            ok = None
            if self.auto:
                th = self.thresholds
                rows = self._raw.get(k, k + window.size)
                ok = bridgeable_gaps(rows, th.max_warp_px, th.max_lid_px)
            keys.append(k + next_keyframe(window, 0, ok))
        if first >= 0 and len(keys) == 1:
            return
        lo = keys[0]
        plan = CadencePlan(self._strides.get(lo, keys[-1] + 1), np.asarray(keys) - lo)
        rows = sample_motion(self._raw.get(lo, keys[-1] + 1), plan)
        prv, nxt, w = blend_weights(plan)
        new = slice(0 if first < 0 else 1, None)
        self._sampled.append(rows[new])
        self._pose.append(pose_channels(rows[new]))
        self._blend.append(np.stack([prv + lo, nxt + lo, w], axis=1)[new])
        self._key = keys[-1]

    def _savgol_frames(self) -> None:
        """Savitzky–Golay of the frames whose window (up to sg_ahead ahead) is sampled."""
        have, total = self._sampled.end, self._total
        i = self._y.end
        stop = total if total is not None else have - self.sg_ahead
        if i >= stop:
            return
        if not self.smoothing.enabled:
            self._y.append(self._pose.get(i, stop))
            return
        order, out = self.smoothing.order, []
        for j in range(i, stop):
            hi = min(j + self.sg_ahead, have - 1)
            lo = max(0, hi - self.window + 1)
            w = _sg_weights(hi - lo + 1, order, j - lo)
            out.append(w @ self._pose.get(lo, hi + 1))
        self._y.append(np.asarray(out))

    def _commit_frames(self) -> None:
        """Commit each frame whose known targets reach limiter_ahead frames ahead."""
        have, total = self._y.end, self._total
        c = self._x.end
        stop = total if total is not None else have - self.limiter_ahead
        if c >= stop:
            return
        if self.limits is None:
            self._x.append(self._y.get(c, stop))
            return
        past = list(self._x.get(max(0, c - 2), c))
        out = []
        for j in range(c, stop):
            known = self._y.get(j, min(j + self.limiter_ahead + 1, have))
            hold = np.repeat(known[-1:], self.preset.prediction, axis=0)
            x = limit_step(np.reshape(past, (-1, 6)), np.concatenate([known, hold]), self.limits)
            out.append(x)
            past = [*past[-1:], x]
        self._x.append(np.asarray(out))

    def _emit(self) -> PostChunk:
        """Committed frames up to the last committed keyframe, as rows."""
        start, committed = self._emitted, self._x.end
        blend = self._blend.get(start, committed)
        keys = np.flatnonzero(blend[:, 1] == np.arange(start, committed))
        if self._total is not None:
            stop = committed
        else:
            stop = start + int(keys[-1]) + 1 if keys.size else start
        if stop <= start:
            return PostChunk.empty(start)
        rows = self._sampled.get(start, stop)
        if self.limits is not None:
            x = self._x.get(start, stop)
            rows = layout.with_pose_degrees(rows, x[:, :3])
            rows[:, layout.T] = x[:, 3:].astype(np.float32)
        else:
            rows = rows.copy()
        b = blend[: stop - start]
        chunk = PostChunk(
            start,
            rows,
            b[:, 1] == np.arange(start, stop),
            b[:, 0].astype(np.int64),
            b[:, 1].astype(np.int64),
            b[:, 2].astype(np.float32),
            self._strides.get(start, stop).copy(),
        )
        self._emitted = stop
        self._stats.add(rows)
        return chunk

    def _trim(self) -> None:
        """Drop what no later frame reads."""
        g = self.thresholds.plosive_guard + 1
        cue_from = self._strides.end - max(g, 7)
        self._raw.trim(min(self._key, cue_from))
        self._phon.trim(cue_from)
        self._strides.trim(min(self._key, self._emitted))
        back = self.window
        y_from = self._y.end - back
        for buf in (self._sampled, self._pose, self._blend):
            buf.trim(min(self._emitted, y_from))
        self._y.trim(self._x.end)
        self._x.trim(min(self._emitted, self._x.end - 2))


# --- running kinematics --------------------------------------------------------------


class _Kinematics:
    """Figures over the emitted sequence, kept as running sums with a three-frame tail.

    ``accel_max``: largest |Δ²| of pitch, yaw, roll in degrees/frame², across chunk
    boundaries. ``pose_jerk_mean``: mean |Δ³| in rad/s³
    (:func:`~studio.motion.kinematics.pose_jerk`). At each emission boundary b (the first
    frame of a chunk) the jerk entries that straddle it (frames from both chunks: entries
    b-3 .. b-1) are taken: their mean, averaged over boundaries, is ``boundary_jerk``
    (``boundary_jerk_ratio`` = that / the mean: 1 when boundaries are like any other
    frame); their peak likewise gives ``boundary_jerk_peak`` and ``boundary_peak_ratio``
    (a peak of three entries, so above 1 even on seamless motion).
    """

    def __init__(self) -> None:
        self.tail = np.zeros((0, 3))  # the last three emitted angles, degrees
        self.frames = 0
        self.accel_max = 0.0
        self.jerk_sum = 0.0
        self.jerk_count = 0
        self.open: dict[int, list[float]] = {}  # boundary -> straddling entries seen (<= 3)
        self.peak_sum = 0.0
        self.near_sum = 0.0
        self.peak_count = 0

    def add(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        if self.frames:
            self.open[self.frames] = []
        ang = np.concatenate([self.tail, layout.pose_degrees(rows)])
        first = self.frames - len(self.tail)  # absolute frame of ang[0]
        if len(ang) >= 3:
            self.accel_max = max(self.accel_max, float(np.abs(second_difference(ang)).max()))
        jerk = angle_jerk(ang)
        self.jerk_sum += float(jerk.sum())
        self.jerk_count += int(jerk.size)
        self.frames += len(rows)
        for b in list(self.open):
            lo, hi = max(b - 3, first), min(b - 1, first + jerk.size - 1)
            if hi >= lo:
                self.open[b] += jerk[lo - first : hi - first + 1].tolist()
            if b - 1 <= first + jerk.size - 1:  # every straddling entry seen
                seen = self.open.pop(b)
                if seen:
                    self.peak_sum += max(seen)
                    self.near_sum += float(np.mean(seen))
                    self.peak_count += 1
        self.tail = ang[-3:]

    def report(self) -> dict[str, float]:
        mean = self.jerk_sum / self.jerk_count if self.jerk_count else 0.0
        n = self.peak_count
        peak, near = (self.peak_sum / n, self.near_sum / n) if n else (0.0, 0.0)
        return {
            "frames": float(self.frames),
            "accel_max": self.accel_max,
            "pose_jerk_mean": mean,
            "boundary_jerk": near,
            "boundary_jerk_ratio": near / mean if mean > 0 else 0.0,
            "boundary_jerk_peak": peak,
            "boundary_peak_ratio": peak / mean if mean > 0 else 0.0,
            "boundaries": float(n),
        }
