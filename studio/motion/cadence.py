"""Adaptive cadence: how often each stretch of speech needs a fully rendered frame.

Every 25 fps frame gets a stride of 1, 2 or 3 from its phonetic activity: 1 around
plosive bursts, onsets and fast articulation (where the mouth changes every
frame), 3 in silence and sustained sounds, 2 in between. Keyframes are placed so
that no frame is further from a keyframe than its own stride allows. Motion is
kept at keyframes and interpolated between them; the renderer renders keyframes
in full and blends the frames between, so the fraction of keyframes is the
fraction of render work done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from pydantic.dataclasses import dataclass as schema_dataclass

from studio import layout

if TYPE_CHECKING:  # the analysis (scipy.fft, scipy.ndimage) is imported where it runs
    from studio.audio.phonetics import PhoneticFrames

STRIDES = (1, 2, 3)


def _threshold(
    default: float, low: float, high: float, help: str, step: float = 0.05, unit: str = ""
) -> Any:
    """A threshold's schema: default, inclusive range, help, and the GUI's step, decimals and
    unit (a float shows two decimals, an integer none)."""
    decimals = 0 if isinstance(default, int) else 2
    gui = {"step": step, "decimals": decimals, "unit": unit}
    return Field(default, ge=low, le=high, strict=True, description=help, json_schema_extra=gui)


@schema_dataclass(frozen=True, config=ConfigDict(extra="forbid", allow_inf_nan=False))
class CadenceThresholds:
    """When a frame counts as fast (stride 1) or calm (stride 3).

    The settings schema's cadence part (:mod:`studio.settings`): each threshold's range,
    default and help live here, checked when it is built (strict types, finite numbers,
    unknown keys refused, calm_flux below fast_flux).
    """

    plosive_guard: int = _threshold(
        0, 0, 12, "frames either side of a plosive burst or onset kept at stride 1", step=1
    )
    fast_flux: float = _threshold(
        0.6, 0.01, 1.0, "spectral flux at or above which articulation counts as fast (stride 1)"
    )
    calm_flux: float = _threshold(
        0.15,
        0.0,
        0.99,
        "flux at or below which a voiced, steady sound counts as sustained "
        "(stride 3); below fast_flux",
    )
    calm_voicing: float = _threshold(0.5, 0.0, 1.0, "voicing a calm frame needs to be sustained")
    calm_level_step: float = _threshold(
        0.08, 0.0, 1.0, "largest change of loudness (0..1) of a sustained frame", step=0.01
    )
    max_pose_gap_deg: float = _threshold(
        2.0,
        0.1,
        20.0,
        "most head rotation a blended gap between keyframes may span, degrees",
        step=0.25,
        unit="°",
    )

    max_warp_px: float = _threshold(
        26.0,
        1.0,
        64.0,
        "most keypoint displacement between two keyframes that an in-between is warped "
        "across (pixels of a 512 frame, estimated from the motion); a larger one is rendered",
        step=0.5,
        unit="px",
    )
    max_lid_px: float = _threshold(
        2.0,
        0.25,
        64.0,
        "most change of an eye's lid gap between two keyframes (pixels of a 512 frame): a "
        "closing lid covers the iris, which no warp can draw, so a blink is rendered",
        step=0.25,
        unit="px",
    )

    @field_validator("calm_flux")
    @classmethod
    def _calm_below_fast(cls, value: float, info: ValidationInfo) -> float:
        fast = info.data.get("fast_flux")
        if fast is not None and value >= fast:
            raise ValueError(f"{value!r} must be below fast_flux, {fast!r}")
        return value


@dataclass(frozen=True)
class CadencePlan:
    """Per-frame stride (what the speech and the head's speed allow) and the keyframes it
    implies, with those the warp's bounds add (:func:`bridgeable_gaps`)."""

    strides: np.ndarray  # [N] int, 1..3
    keyframes: np.ndarray  # [K] int, sorted, first and last frame included
    warp_forced: int = 0  # keyframes added because the motion between two was too large to warp

    @property
    def num_frames(self) -> int:
        return int(self.strides.size)

    @property
    def rendered_fraction(self) -> float:
        return self.keyframes.size / max(1, self.strides.size)

    def histogram(self) -> dict[str, int]:
        """{"1": n, "2": n, "3": n} over frames."""
        return {str(s): int(np.count_nonzero(self.strides == s)) for s in STRIDES}


def _dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    if radius <= 0 or not mask.any():
        return mask.copy()
    kernel = np.ones(2 * radius + 1)  # full convolution, centred: also for masks shorter than it
    return np.convolve(mask.astype(float), kernel)[radius : radius + mask.size] > 0


def frame_strides(phon: PhoneticFrames, th: CadenceThresholds | None = None) -> np.ndarray:
    """Stride 1, 2 or 3 for every frame from its phonetic activity."""
    th = th or CadenceThresholds()
    n = phon.num_frames
    level_step = np.abs(np.diff(phon.level, prepend=phon.level[:1]))
    fast = _dilate(phon.burst | phon.onset, th.plosive_guard) | (phon.flux >= th.fast_flux)
    sustained = (
        (phon.flux <= th.calm_flux)
        & (phon.voicing >= th.calm_voicing)
        & (level_step <= th.calm_level_step)
    )
    strides = np.full(n, 2, dtype=np.int64)
    strides[phon.silence | sustained] = 3
    strides[fast] = 1
    return strides


POSE_SPEED_SIGMA = 1.5  # frames: the light smoothing of the pose before its speed is taken
POSE_SPEED_RADIUS = 6  # frames either side that smoothing reads (scipy's default truncation)


def pose_stride_cap(
    motion: np.ndarray, max_gap_deg: float, radius: int = POSE_SPEED_RADIUS
) -> np.ndarray:
    """Largest stride per frame whose gap spans at most ``max_gap_deg`` of head rotation.

    Blending two keyframes of a head that turned between them shows as ghosting;
    this keeps gaps short where the head moves fast (speed from a lightly smoothed
    pose, so generator jitter does not count). ``radius`` truncates the smoothing (the
    frame's reach is radius + 1): a stream with less lookahead passes a smaller one, 0
    for none (then jitter counts, so strides only get shorter).
    """
    deg = layout.pose_degrees(motion)
    if radius > 0:
        from scipy.ndimage import gaussian_filter1d  # here: the settings' import stays quick

        deg = gaussian_filter1d(deg, POSE_SPEED_SIGMA, axis=0, radius=radius)
    speed = np.abs(np.diff(deg, axis=0, prepend=deg[:1])).max(axis=1)
    speed = np.maximum(speed, np.roll(speed, -1))
    cap = np.ones(speed.size, dtype=np.int64)
    for s in STRIDES[1:]:
        cap[speed * s <= max_gap_deg] = s
    return cap


WARP_HEAD_RADIUS = 0.5  # keypoint units: the lever arm a rotation or a scale change moves
WARP_FRAME_PX = 256.0  # pixels per keypoint unit in a 512 frame (the image spans [-1, 1])


def warp_displacement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Estimated largest 2-D keypoint displacement from rows ``a`` to rows ``b`` [N, 265],
    in pixels of a 512 frame.

    The motion layer does not know a renderer's canonical keypoints, so this bounds
    ``x = s (R kp + exp) + t`` with a keypoint at :data:`WARP_HEAD_RADIUS` from the centre:
    the largest change of ``s * exp`` (x, y) over the keypoints, plus the change of (t_x,
    t_y), plus the lever arm times (the rotation change in radians times s, plus the change
    of s).
    """
    fa, fb = layout.unpack(np.asarray(a)), layout.unpack(np.asarray(b))
    ea = fa.exp[:, :, :2] * fa.scale[:, None, None]
    eb = fb.exp[:, :, :2] * fb.scale[:, None, None]
    exp = np.linalg.norm(eb - ea, axis=2).max(axis=1)
    t = np.linalg.norm(fb.t[:, :2] - fa.t[:, :2], axis=1)
    ang = np.deg2rad(np.abs(layout.pose_degrees(b) - layout.pose_degrees(a)).sum(axis=1))
    lever = WARP_HEAD_RADIUS * (ang * np.maximum(fa.scale, fb.scale) + np.abs(fb.scale - fa.scale))
    return (exp + t + lever) * WARP_FRAME_PX


def lid_displacement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Largest change of an eye's lid gap (the upper lid's keypoint less the lower one's,
    (x, y), times the scale) from rows ``a`` to rows ``b`` [N, 265], in pixels of a 512
    frame. The canonical keypoints cancel in the difference, so the motion alone gives it."""
    fa, fb = layout.unpack(np.asarray(a)), layout.unpack(np.asarray(b))
    gap_a = layout.lid_gaps(fa.exp[..., :2]) * fa.scale[:, None, None]
    gap_b = layout.lid_gaps(fb.exp[..., :2]) * fb.scale[:, None, None]
    return np.linalg.norm(gap_b - gap_a, axis=-1).max(axis=-1) * WARP_FRAME_PX


def bridgeable_gaps(
    motion: np.ndarray, max_warp_px: float, max_lid_px: float = float("inf")
) -> np.ndarray:
    """[N, 4] bool: row ``i``, column ``d``: whether the gap from frame ``i`` to frame
    ``i + d`` moves keypoints at most ``max_warp_px`` (:func:`warp_displacement`) and an eye's
    lid gap at most ``max_lid_px`` (:func:`lid_displacement`); beyond them a
    motion-compensated in-between tears, smears or shows the iris through a closing lid.
    Column 0 is True; a gap past the last frame is False."""
    motion = np.asarray(motion, dtype=np.float32)
    n = motion.shape[0]
    ok = np.zeros((n, STRIDES[-1] + 1), dtype=bool)
    ok[:, 0] = True
    for d in STRIDES:
        if n > d:
            a, b = motion[:-d], motion[d:]
            within = warp_displacement(a, b) <= max_warp_px
            ok[:-d, d] = within & (lid_displacement(a, b) <= max_lid_px)
    return ok


def _bridged(ok: np.ndarray, k: int, j: int) -> bool:
    """Whether keyframes ``k`` and ``j`` can be warped across: the gap, and from ``k`` and to
    ``j`` every frame inside it (so a blink between two open eyes is not skipped)."""
    return bool(ok[k, j - k]) and all(ok[k, i - k] and ok[i, j - i] for i in range(k + 1, j))


def next_keyframe(strides: np.ndarray, k: int, bridgeable: np.ndarray | None = None) -> int:
    """The keyframe after keyframe ``k`` (< the last frame): the gap is as long as every
    frame inside it, both ends included, tolerates, and (given ``bridgeable``, rows aligned
    with ``strides``: :func:`bridgeable_gaps`) as the warp can bridge. Reads
    ``strides[k : k + strides[k] + 1]`` and those rows, so a stream can decide it as soon as
    they are known."""
    n = len(strides)
    best = k + 1
    tolerance = strides[k]
    for j in range(k + 1, min(n, k + int(strides[k]) + 1)):
        tolerance = min(tolerance, strides[j])
        if j - k > tolerance:
            break
        if j > k + 1 and bridgeable is not None and not _bridged(bridgeable, k, j):
            break
        best = j
    return best


def keyframes_for(strides: np.ndarray, bridgeable: np.ndarray | None = None) -> np.ndarray:
    """Greedy keyframes: each gap is as long as every frame inside it tolerates (and the
    warp can bridge, given ``bridgeable``: :func:`next_keyframe`)."""
    s = np.asarray(strides, dtype=np.int64)
    n = s.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = [0]
    k = 0
    while k < n - 1:
        k = next_keyframe(s, k, bridgeable)
        keys.append(k)
    return np.asarray(keys, dtype=np.int64)


def plan_cadence(
    phon: PhoneticFrames | None,
    mode: str | int = "auto",
    thresholds: CadenceThresholds | None = None,
    num_frames: int | None = None,
    motion: np.ndarray | None = None,
) -> CadencePlan:
    """The cadence plan: ``mode`` is "auto" (from ``phon``, capped by the head's speed
    in ``motion`` when given, and by the keypoint displacement an in-between can be warped
    across, counted in :attr:`CadencePlan.warp_forced`) or a fixed stride 1, 2 or 3."""
    if mode == "auto":
        if phon is None:
            raise ValueError("auto cadence needs phonetic frames")
        th = thresholds or CadenceThresholds()
        strides = frame_strides(phon, th)
        if motion is not None:
            strides = np.minimum(strides, pose_stride_cap(motion, th.max_pose_gap_deg))
            ok = bridgeable_gaps(motion, th.max_warp_px, th.max_lid_px)
            keys = keyframes_for(strides, ok)
            forced = keys.size - keyframes_for(strides).size
            return CadencePlan(strides, keys, max(int(forced), 0))
    else:
        stride = int(mode)
        if stride not in STRIDES:
            raise ValueError(f"stride must be auto, 1, 2 or 3, got {mode!r}")
        n = phon.num_frames if phon is not None else num_frames
        if n is None:
            raise ValueError("a fixed stride needs the frame count")
        strides = np.full(n, stride, dtype=np.int64)
    return CadencePlan(strides, keyframes_for(strides))


def blend_weights(plan: CadencePlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every frame: (previous keyframe, next keyframe, weight of the next one)."""
    frames = np.arange(plan.num_frames)
    keys = plan.keyframes
    nxt_pos = np.clip(np.searchsorted(keys, frames, side="left"), 0, keys.size - 1)
    nxt = keys[nxt_pos]
    prv = np.where(nxt == frames, frames, keys[np.maximum(nxt_pos - 1, 0)])
    span = np.maximum(nxt - prv, 1)
    w = np.where(nxt == prv, 0.0, (frames - prv) / span)
    return prv, nxt, w


def blend_rows(motion: np.ndarray, lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Rows ``(1 - w) motion[lo] + w motion[hi]`` [len(lo), 265], the head's angles
    interpolated in degrees and re-encoded onto the bins (what is linear is the angle, not its
    logits); a row with ``w == 0`` is ``motion[lo]`` bit for bit. Made a block at a time: no
    clip-long temporaries."""
    motion = np.asarray(motion, dtype=np.float32)
    wc = np.asarray(w, dtype=np.float32)[:, None]
    out = np.empty((len(lo), motion.shape[1]), dtype=np.float32)
    for b in range(0, len(out), layout.BLOCK_ROWS):
        rows = slice(b, b + layout.BLOCK_ROWS)
        out[rows] = motion[lo[rows]] * (1 - wc[rows]) + motion[hi[rows]] * wc[rows]
    wd = np.asarray(w, dtype=np.float64)[:, None]  # the angles' weights in double precision
    inner = np.flatnonzero(wd[:, 0] > 0)
    if inner.size:
        deg = layout.pose_degrees(motion)
        target = deg[lo[inner]] * (1 - wd[inner]) + deg[hi[inner]] * wd[inner]
        layout.set_pose_degrees(out, target, inner)
    exact = np.flatnonzero(wc[:, 0] == 0)
    out[exact] = motion[lo[exact]]
    return out


def sample_motion(motion: np.ndarray, plan: CadencePlan) -> np.ndarray:
    """Motion kept at keyframes and interpolated linearly between them (:func:`blend_rows`)."""
    motion = np.asarray(motion, dtype=np.float32)
    if motion.shape[0] != plan.num_frames:
        raise ValueError(f"motion has {motion.shape[0]} frames, plan has {plan.num_frames}")
    prv, nxt, w = blend_weights(plan)
    return blend_rows(motion, prv, nxt, w)
