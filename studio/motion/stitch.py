"""Motion stitching (Ditto's ``MotionStitch``) for a whole clip at once, on the device.

The reference runs once per frame on the host: scipy softmax, numpy rotations, dict deep
copies and a batch-1 MLP call. :func:`stitch_motion` does the same steps for N frames as a
few batched torch ops on whatever device the motion lives on, and never reads a value back
to the host (no ``.item()``, no data-dependent Python branches), so it can run inside a
device pipeline. Step order (reference ``MotionStitch.__call__``, image source):

 1. mix source and driving, per key, relative to d0 (in *logit* space for the pose);
 2. expression masks: lips (and eyes, or scripted blinks) from the driving, rest from source;
 3. ``vad_alpha`` blend of the whole expression towards the source;
 4. ``delta_*`` (degrees), ``alpha_*`` and ``delta_exp`` controls;
 5. fades towards frame 0 (``"d0"``) or the source (``"s"``);
 6. gaze correction of the eye keypoints from the head turn (``drive_eye``);
 7. x_s, x_d = keypoint transform (LivePortrait Eqn. 2), then the stitching network.

Reference quirks kept on purpose (parity; ditto-reference.md §2.5-2.8, §9):

- Relative pose is mixed in bin-logit space: ``L_s + w * (L_d - L_d0)``, not in degrees.
- ``alpha_pitch/yaw/roll`` scale the logits unless a ``delta_*`` was given for that frame,
  in which case they scale degrees (the delta converts the angle to degrees first).
- A fade of a pose key mixes degrees and logits when exactly one side holds degrees: the
  result is logits (degrees broadcast over the 66 bins), so the degree side adds a constant
  to every bin and drops out of the softmax. ``fade_alpha == 1`` is therefore *not* a no-op
  in that case, and "absent" is spelt NaN (see :class:`StitchControls`).
- ``vad_alpha`` < 1 blends all 63 expression dims, not only the lips.
- Fades do nothing unless ``fade_type`` is ``"d0"`` or ``"s"`` (default ``""``).
- A given ``d0`` makes the mix relative even with ``relative=False`` (the reference uses
  d0 whenever it is set; its online worker always sets it).
- Scale always comes from the source with the image default ``use_d_keys``.
- With ``fade_type="d0"`` the target is this call's first frame after step 4.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from studio.layout import (
    BIN_CENTERS_DEG,
    EXP,
    EXP_DIM,
    EYE_KP,
    KP_DIMS,
    LIP_KP,
    MOTION_DIM,
    NUM_BINS,
    NUM_KP,
    PITCH,
    ROLL,
    SCALE,
    YAW,
    T,
    rotation_from_radians,
)

ArrayLike = Tensor | np.ndarray | float | Sequence[float]

MOTION_KEYS = ("scale", "pitch", "yaw", "roll", "t", "exp")
SOURCE_KEYS = (*MOTION_KEYS, "kp")
ANGLES = ("pitch", "yaw", "roll")
IMAGE_USE_D_KEYS = ("exp", "pitch", "yaw", "roll", "t")
VIDEO_USE_D_KEYS = ("exp",)
FADE_TYPES = ("", "d0", "s")
SCALE_RATIO_KEYS = ("exp", "pitch", "yaw", "roll")  # keys the ch_info scale ratio weights

# Scripted blinks (_set_eye_blink_idx): random open intervals and the online schedule length.
BLINK_OPEN_MIN = 60
BLINK_OPEN_MAX = 100
ONLINE_BLINK_FRAMES = 3000

# Gaze correction (_fix_gaze): head turn in degrees -> eye keypoint offsets. Keypoints 11 and
# 15 are the two eyes; exp index 3*k is x, 3*k+1 is y.
GAZE_YAW_RATIO = 0.26
GAZE_PITCH_RATIO = 0.28
GAZE_X_IDX = (3 * 11, 3 * 15)  # 33, 45
GAZE_Y_IDX = (3 * 11 + 1, 3 * 15 + 1)  # 34, 46
GAZE_X_GAIN_POS = (0.0007, 0.001)  # dx > 0
GAZE_X_GAIN_NEG = (0.001, 0.0007)  # dx <= 0
GAZE_Y_GAIN = -0.001

_SHAPES = {"scale": 1, "pitch": NUM_BINS, "yaw": NUM_BINS, "roll": NUM_BINS, "t": 3}
_SHAPES |= {"exp": EXP_DIM, "kp": EXP_DIM}
_SLICES = {"scale": SCALE, "pitch": PITCH, "yaw": YAW, "roll": ROLL, "t": T, "exp": EXP}


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class StitchConfig:
    """Whole-clip motion-stitch options (reference ``MotionStitch.setup``; image source).

    use_d_keys: driving keys (tuple) or per-key weights (dict); None = image default
        (exp, pitch, yaw, roll, t), so scale comes from the source.
    relative / d0: mix relative to d0 ([265] raw driving frame); d0=None takes the first
        frame of the clip (offline). A given d0 is used even when ``relative`` is False.
    drive_eye: eyes follow the driving (or ``delta_eye_arr``) and gaze correction runs.
    delta_eye_arr: [n, 63] scripted eye expression offsets added to the source eyes; row 0
        plays on open frames, rows 0..n-1 on each blink (see :func:`blink_schedule`).
    delta_eye_open_n: open interval between blinks: -1 never, 0 random 60..100 (drawn from
        ``random.Random(blink_seed)``), int fixed, list cycled. Default 0 as Ditto's SDK.
    blink_frames: the schedule length N_d; None = this clip's length (offline), -1 = 3000.
    frame_offset: index of this clip's first frame in the blink schedule (chunked calls).
    fade_type: "" (fades off), "d0" (towards frame 0) or "s" (towards the source).
    fade_out_keys: keys the fade touches ("kp" is skipped, as in the reference).
    flag_stitching: apply the stitching network when one is passed.
    scale_ratio: ch_info scale ratio; != 1 turns use_d_keys into weights (x ratio for
        exp/pitch/yaw/roll).
    """

    use_d_keys: Sequence[str] | Mapping[str, float] | None = None
    relative: bool = True
    d0: ArrayLike | None = None
    drive_eye: bool = True
    delta_eye_arr: ArrayLike | None = None
    delta_eye_open_n: int | Sequence[int] = 0
    blink_frames: int | None = None
    blink_seed: int | None = 0
    frame_offset: int = 0
    fade_type: str = ""
    fade_out_keys: Sequence[str] = ("exp",)
    flag_stitching: bool = True
    scale_ratio: float = 1.0

    def __post_init__(self) -> None:
        keys = IMAGE_USE_D_KEYS if self.use_d_keys is None else self.use_d_keys
        if isinstance(keys, str) or not all(k in MOTION_KEYS for k in keys):
            raise ValueError(f"use_d_keys must name keys of {MOTION_KEYS}, got {keys!r}")
        if self.fade_type not in FADE_TYPES:
            raise ValueError(f"fade_type must be one of {FADE_TYPES}, got {self.fade_type!r}")
        if isinstance(self.fade_out_keys, str) or not all(
            k in SOURCE_KEYS for k in self.fade_out_keys
        ):
            raise ValueError(f"fade_out_keys must name keys of {SOURCE_KEYS}")
        _open_intervals(self.delta_eye_open_n)  # validates
        if self.frame_offset < 0:
            raise ValueError("frame_offset must be >= 0")

    def weights(self) -> tuple[tuple[str, ...], dict[str, float] | None]:
        """(driving keys, weights or None) after the scale ratio (reference _set_scale_ratio)."""
        keys = IMAGE_USE_D_KEYS if self.use_d_keys is None else self.use_d_keys
        w = {k: float(v) for k, v in keys.items()} if isinstance(keys, Mapping) else None
        if self.scale_ratio != 1:
            r = float(self.scale_ratio)
            base = w if w is not None else dict.fromkeys(keys, 1.0)
            w = {k: v * (r if k in SCALE_RATIO_KEYS else 1.0) for k, v in base.items()}
        return tuple(keys), w


@dataclass(frozen=True, eq=False)
class StitchControls:
    """Per-frame controls (reference ``ctrl_info`` kwargs), each [N] (delta_exp [N, 63] or
    [63]) or a scalar broadcast over the clip; None = absent on every frame.

    NaN marks a control as absent on that frame. This matters where the reference tells
    "absent" from a neutral value: ``delta_* = 0`` still turns the angle into degrees, and
    ``fade_alpha = 1`` still mixes representations (see the module notes). Absent
    ``alpha_*``/``vad_alpha`` act as 1 and absent ``delta_exp`` as 0.
    """

    delta_pitch: ArrayLike | None = None
    delta_yaw: ArrayLike | None = None
    delta_roll: ArrayLike | None = None
    alpha_pitch: ArrayLike | None = None
    alpha_yaw: ArrayLike | None = None
    alpha_roll: ArrayLike | None = None
    delta_exp: ArrayLike | None = None
    vad_alpha: ArrayLike | None = None
    fade_alpha: ArrayLike | None = None

    @classmethod
    def from_ctrl_info(
        cls,
        ctrl_info: Mapping[int, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
        n: int,
        overall: Mapping[str, Any] | None = None,
    ) -> StitchControls:
        """Controls from reference-style per-frame kwargs (dict by frame or list) and
        ``overall_ctrl_info`` defaults (per-frame keys win). Unknown keys are ignored, as in
        the reference; a per-frame ``fade_out_keys`` is refused (use StitchConfig)."""
        names = [f.name for f in fields(cls)]
        cols: dict[str, np.ndarray] = {}
        for i in range(n):
            if isinstance(ctrl_info, Mapping):
                item = ctrl_info.get(i, {})
            else:
                item = ctrl_info[i] if i < len(ctrl_info) else {}
            merged = {**(overall or {}), **item}
            if "fade_out_keys" in merged:
                raise ValueError("per-frame fade_out_keys is not supported; set StitchConfig")
            for name in names:
                if name not in merged:
                    continue
                v = np.asarray(merged[name], dtype=np.float64).reshape(-1)
                if name not in cols:
                    width = EXP_DIM if name == "delta_exp" else 1
                    cols[name] = np.full((n, width), np.nan)
                cols[name][i] = v
        out = {k: (v if k == "delta_exp" else v[:, 0]).astype(np.float32) for k, v in cols.items()}
        return cls(**out)


def fade_alpha_schedule(n: int, fade_in: int = -1, fade_out: int = -1) -> np.ndarray:
    """[n] fade_alpha as the reference ``setup_Nd`` writes it; NaN where it writes nothing.

    Frames i < fade_in get i / fade_in; frames N-fade_out-1 .. N-1 get
    max((N-1-i) / fade_out, 0) (1 on the first of them), overriding the fade-in.
    """
    alpha = np.full(n, np.nan, dtype=np.float64)
    if fade_in > 0:
        i = np.arange(min(fade_in, n))
        alpha[i] = i / fade_in
    if fade_out > 0:
        i = np.arange(max(n - fade_out - 1, 0), n)
        alpha[i] = np.maximum((n - 1 - i) / fade_out, 0.0)
    return alpha.astype(np.float32)


def video_config(**kw: Any) -> StitchConfig:
    """A video source's defaults (§2.5-2.6): only the expression is driven (pose and
    translation follow the source video) and the eyes stay the video's own."""
    return StitchConfig(**{"use_d_keys": VIDEO_USE_D_KEYS, "drive_eye": False, **kw})


# --- blink schedule -----------------------------------------------------------------------


def _open_intervals(open_n: int | Sequence[int]) -> tuple[int, ...] | None:
    """None = never blink; () = random intervals; else the cycled intervals."""
    if isinstance(open_n, bool) or not isinstance(open_n, int | Sequence):
        raise ValueError(f"delta_eye_open_n must be an int or a list of ints, got {open_n!r}")
    if isinstance(open_n, int):
        return None if open_n < 0 else ((open_n,) if open_n > 0 else ())
    if not all(isinstance(v, int) and v >= 0 for v in open_n):
        raise ValueError(f"delta_eye_open_n intervals must be ints >= 0, got {open_n!r}")
    return tuple(open_n)  # an empty list means random, as in the reference


def blink_schedule(
    n: int, blink_n: int, open_n: int | Sequence[int] = 0, seed: int | None = 0
) -> np.ndarray:
    """[n] rows of ``delta_eye_arr`` per frame (reference ``_set_eye_blink_idx``).

    Open frames get 0; each blink plays 0..blink_n-1. The first blink starts after the first
    open interval; blinks are separated by the next interval (cycled list, or random
    60..100 drawn from ``random.Random(seed)`` in the reference's draw order); no blink
    starts within max(last interval, blink_n) frames of the end, so clips end with open eyes.
    """
    if blink_n < 1:
        raise ValueError("delta_eye_arr needs at least one row")
    idx = np.zeros(n, dtype=np.int64)
    opens = _open_intervals(open_n)
    if opens is None:
        return idx
    rng = random.Random(seed)

    def draw() -> int:
        return rng.randint(BLINK_OPEN_MIN, BLINK_OPEN_MAX)

    first = opens[0] if opens else draw()
    last = opens[-1] if opens else draw()
    stop = n - max(last, blink_n)
    i, k = first, 1
    while i < stop:
        idx[i : i + blink_n] = np.arange(blink_n)
        if opens:
            gap = opens[k % len(opens)]
            k += 1
        else:
            gap = draw()
        i += blink_n + gap
    return idx


@functools.lru_cache(maxsize=32)
def _cached_schedule(n: int, blink_n: int, open_n: tuple[int, ...] | int, seed: int) -> np.ndarray:
    out = blink_schedule(n, blink_n, list(open_n) if isinstance(open_n, tuple) else open_n, seed)
    out.setflags(write=False)
    return out


# --- device helpers -----------------------------------------------------------------------


def _upload(x: ArrayLike, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A tensor on `device`; host data goes through pinned memory without a stream sync."""
    if isinstance(x, Tensor):
        return x.to(device=device, dtype=dtype)
    host = torch.as_tensor(np.asarray(x), dtype=dtype)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


@dataclass(frozen=True)
class _Consts:
    centers: Tensor  # [66] bin centres in degrees
    lip: Tensor  # [63] 1 on lip keypoints
    eye: Tensor  # [63] 1 on eye keypoints


@functools.lru_cache(maxsize=16)
def _consts(device: torch.device, dtype: torch.dtype) -> _Consts:
    def mask(kps: Sequence[int]) -> Tensor:
        m = np.zeros((NUM_KP, KP_DIMS))
        m[list(kps)] = 1.0
        return _upload(m.reshape(-1), device, dtype)

    return _Consts(_upload(BIN_CENTERS_DEG, device, dtype), mask(LIP_KP), mask(EYE_KP))


def bins_to_degrees_tensor(logits: Tensor, centers: Tensor | None = None) -> Tensor:
    """Expected angle (degrees) of 66-bin logits over the last axis, on the logits' device."""
    if centers is None:
        centers = _consts(logits.device, logits.dtype).centers
    return torch.softmax(logits, dim=-1) @ centers


def rotation_matrices_tensor(pitch: Tensor, yaw: Tensor, roll: Tensor) -> Tensor:
    """[N] degrees -> [N, 3, 3] R = Rz(roll) @ Ry(yaw) @ Rx(pitch) (layout.rotation_matrices)."""
    p, y, r = (torch.deg2rad(a) for a in (pitch, yaw, roll))
    return rotation_from_radians(torch, p, y, r)


def transform_keypoints_tensor(
    kp: Tensor, pitch: Tensor, yaw: Tensor, roll: Tensor, t: Tensor, scale: Tensor, exp: Tensor
) -> Tensor:
    """LivePortrait Eqn. 2 on the device: scale * (R @ kp + exp) + (t_x, t_y, 0).

    kp [63] or [N, 63]; angles [N] degrees; t [N, 3]; scale [N, 1]; exp [N, 63] -> [N, 21, 3].
    """
    rot = rotation_matrices_tensor(pitch, yaw, roll)
    kp = kp.reshape(-1, NUM_KP, KP_DIMS)
    x = kp @ rot.transpose(1, 2) + exp.reshape(-1, NUM_KP, KP_DIMS)
    x = x * scale.reshape(-1, 1, 1)
    shift = torch.cat([t[:, :2], torch.zeros_like(t[:, 2:])], dim=1)
    return x + shift[:, None, :]


def fix_gaze(exp: Tensor, yaw_d: Tensor, pitch_d: Tensor, yaw_s: Tensor, pitch_s: Tensor) -> Tensor:
    """Gaze correction (reference ``_fix_gaze``): shift the eye keypoints with the head turn.

    dx = 0.26 (yaw_d - yaw_s), dy = 0.28 (pitch_d - pitch_s) in degrees; x of keypoints
    11/15 gets 0.0007/0.001 x dx (0.001/0.0007 when dx <= 0), y of both gets -0.001 x dy.
    exp [N, 63], yaw_d/pitch_d [N], yaw_s/pitch_s scalars or [N]; returns a new tensor.
    """
    dx = GAZE_YAW_RATIO * (yaw_d - yaw_s)
    dy = GAZE_PITCH_RATIO * (pitch_d - pitch_s)
    pos = dx > 0
    out = exp.clone()
    for j, col in enumerate(GAZE_X_IDX):
        out[:, col] += torch.where(pos, dx * GAZE_X_GAIN_POS[j], dx * GAZE_X_GAIN_NEG[j])
    for col in GAZE_Y_IDX:
        out[:, col] += dy * GAZE_Y_GAIN
    return out


# --- the pipeline -------------------------------------------------------------------------


@dataclass
class _Angle:
    """One pose angle per frame: bin logits, or degrees where a delta_* converted it."""

    logits: Tensor  # [N, 66]
    deg: Tensor  # [N], meaningful where is_deg
    is_deg: Tensor  # [N] bool

    def degrees(self, centers: Tensor) -> Tensor:
        return torch.where(self.is_deg, self.deg, bins_to_degrees_tensor(self.logits, centers))

    def as_logits(self) -> Tensor:
        """What the reference array holds after broadcasting degrees against logits."""
        return torch.where(self.is_deg[..., None], self.deg[..., None], self.logits)


def _source(
    info: Mapping[str, ArrayLike], n: int, device: torch.device, dtype: torch.dtype
) -> dict[str, Tensor]:
    """The source keys as [1, width] (one source frame: an image) or [n, width] (one source
    frame per driving frame: a video avatar's frames, already picked for these rows)."""
    missing = [k for k in SOURCE_KEYS if k not in info]
    if missing:
        raise ValueError(f"source info lacks {missing}")
    out = {}
    for k in SOURCE_KEYS:
        v = _upload(info[k], device, dtype)
        width = _SHAPES[k]
        if v.numel() not in (width, n * width):
            raise ValueError(
                f"source {k!r} must hold {width} values (or {width} per frame), "
                f"got {list(v.shape)}"
            )
        out[k] = v.reshape(-1, width)
    rows = {v.shape[0] for v in out.values()}
    if len(rows) > 1:
        raise ValueError(f"source keys disagree on their frame count: {sorted(rows)}")
    return out


def _per_frame(
    x: ArrayLike | None, n: int, width: int, device: torch.device, dtype: torch.dtype
) -> Tensor | None:
    """Control as [N] (width 1) or [N, width] on the device; None stays None."""
    if x is None:
        return None
    if isinstance(x, int | float):
        shape = (n,) if width == 1 else (n, width)
        return torch.full(shape, float(x), device=device, dtype=dtype)
    v = _upload(x, device, dtype)
    ok = {(), (1,), (n,)} if width == 1 else {(), (width,), (1, width), (n, width)}
    if tuple(v.shape) not in ok:
        raise ValueError(f"control must be a scalar or {'[N]' if width == 1 else '[N, 63]'}")
    return v.expand((n,) if width == 1 else (n, width))


def _mix(
    src: dict[str, Tensor],
    drv: dict[str, Tensor],
    keys: Sequence[str],
    w: dict[str, float] | None,
    d0: dict[str, Tensor] | None,
    n: int,
) -> dict[str, Tensor]:
    """Reference _mix_s_d_info for N frames: keys outside use_d_keys come from the source."""
    out = {}
    for k in MOTION_KEYS:
        if k not in keys:
            out[k] = src[k].expand(n, -1)
        elif d0 is not None:
            out[k] = src[k] + (drv[k] - d0[k]) * (w[k] if w is not None else 1.0)
        else:
            out[k] = drv[k] * w[k] if w is not None else drv[k]
    return out


def _split(motion: Tensor) -> dict[str, Tensor]:
    """[N, 265] -> per-key views (scale with the 1 added back)."""
    out = {k: motion[..., sl] for k, sl in _SLICES.items()}
    out["scale"] = out["scale"] + 1.0
    return out


def stitch_motion(
    source_info: Mapping[str, ArrayLike],
    motion: Tensor,
    config: StitchConfig | None = None,
    controls: StitchControls | None = None,
    stitch_net: nn.Module | None = None,
) -> tuple[Tensor, Tensor]:
    """Ditto's motion stitch for a whole clip: (x_s, x_d), each [N, 21, 3].

    source_info: the source keypoint info (pitch/yaw/roll [66] logits, t [3], exp [63],
    scale [1], kp [63]; leading 1s allowed), numpy or tensors: one source frame (an image)
    or one per driving row ([N, width]: a video avatar's frames for these rows, with
    ``config`` :func:`video_config`'s driven keys). motion: [N, 265] driving
    motion; everything runs on its device and dtype. x_s is the source keypoints expanded
    over the clip (a view; ``x_s[0]`` is [21, 3]). ``stitch_net`` (a StitchNetwork) is applied
    batched when given and ``config.flag_stitching``. Pass device tensors to avoid uploads.
    """
    cfg = config or StitchConfig()
    ctl = controls or StitchControls()
    if not isinstance(motion, Tensor):
        motion = torch.as_tensor(np.asarray(motion, dtype=np.float32))
    if motion.ndim != 2 or motion.shape[1] != MOTION_DIM:
        raise ValueError(f"motion must be [N, {MOTION_DIM}], got {list(motion.shape)}")
    dev = motion.device
    dt = motion.dtype if motion.dtype.is_floating_point else torch.float32
    motion = motion.to(dt)
    n = motion.shape[0]
    c = _consts(dev, dt)
    src = _source(source_info, n, dev, dt)
    x_s = transform_keypoints_tensor(
        src["kp"],
        *(bins_to_degrees_tensor(src[a], c.centers) for a in ANGLES),
        src["t"],
        src["scale"],
        src["exp"],
    )
    if n == 0:
        return x_s[:0].expand(0, -1, -1), x_s.new_zeros(0, NUM_KP, KP_DIMS)

    # 1. mix (relative to d0 whenever a d0 exists; pose in logit space)
    keys, w = cfg.weights()
    d0 = None
    if cfg.d0 is not None:
        d0 = _split(_upload(cfg.d0, dev, dt).reshape(1, MOTION_DIM))
    elif cfg.relative:
        d0 = _split(motion[:1])
    x = _mix(src, _split(motion), keys, w, d0, n)
    false = torch.zeros(n, dtype=torch.bool, device=dev)
    ang = {a: _Angle(x[a], torch.zeros(n, device=dev, dtype=dt), false) for a in ANGLES}

    # 2. expression masks
    lip, eye = c.lip, c.eye
    if cfg.drive_eye and cfg.delta_eye_arr is not None:
        arr = _upload(cfg.delta_eye_arr, dev, dt).reshape(-1, EXP_DIM)
        length = n if cfg.blink_frames is None else cfg.blink_frames
        length = ONLINE_BLINK_FRAMES if length == -1 else length
        open_n = cfg.delta_eye_open_n
        open_key = open_n if isinstance(open_n, int) else tuple(open_n)
        if cfg.blink_seed is None:
            sched = blink_schedule(length, arr.shape[0], open_n, None)
        else:
            sched = _cached_schedule(length, arr.shape[0], open_key, cfg.blink_seed)
        rows = sched[(cfg.frame_offset + np.arange(n)) % len(sched)]
        delta_eye = arr[_upload(rows, dev, torch.int64)]
        exp = x["exp"] * lip + src["exp"] * (1 - lip) + delta_eye * eye
    else:
        a1 = lip + eye if cfg.drive_eye else lip
        exp = x["exp"] * a1 + src["exp"] * (1 - a1)

    # 3. vad_alpha (< 1 only; NaN = absent), whole expression
    vad = _per_frame(ctl.vad_alpha, n, 1, dev, dt)
    if vad is not None:
        va = vad[:, None]
        exp = torch.where(va < 1, exp * va + src["exp"] * (1 - va), exp)

    # 4. ctrl_motion: delta_* in degrees, then alpha_* on whatever the angle holds
    for a in ANGLES:
        delta = _per_frame(getattr(ctl, f"delta_{a}"), n, 1, dev, dt)
        if delta is not None:
            has = ~torch.isnan(delta)
            st = ang[a]
            deg = torch.where(has, st.degrees(c.centers) + delta, st.deg)
            ang[a] = _Angle(st.logits, deg, st.is_deg | has)
    for a in ANGLES:
        alpha = _per_frame(getattr(ctl, f"alpha_{a}"), n, 1, dev, dt)
        if alpha is not None:
            al = torch.nan_to_num(alpha, nan=1.0)
            st = ang[a]
            ang[a] = _Angle(st.logits * al[:, None], st.deg * al, st.is_deg)
    dexp = _per_frame(ctl.delta_exp, n, EXP_DIM, dev, dt)
    if dexp is not None:
        exp = exp + torch.nan_to_num(dexp, nan=0.0)
    x["exp"] = exp

    # 5. fades (need fade_type "d0"/"s"; NaN = absent)
    fade = _per_frame(ctl.fade_alpha, n, 1, dev, dt)
    if fade is not None and cfg.fade_type in ("d0", "s"):
        on = ~torch.isnan(fade)
        f = torch.where(on, fade, 1.0)[:, None]
        if cfg.fade_type == "d0":
            dst = {k: x[k][:1] for k in ("scale", "t", "exp")}
            dst_ang = {a: _Angle(s.logits[:1], s.deg[:1], s.is_deg[:1]) for a, s in ang.items()}
        else:
            dst = {k: src[k] for k in ("scale", "t", "exp")}
            r = src["exp"].shape[0]
            zero = torch.zeros(r, device=dev, dtype=dt)
            no = torch.zeros(r, dtype=torch.bool, device=dev)
            dst_ang = {a: _Angle(src[a], zero, no) for a in ANGLES}
        for k in dict.fromkeys(cfg.fade_out_keys):
            if k in ANGLES:
                st, tg = ang[k], dst_ang[k]
                logits = st.as_logits() * f + tg.as_logits() * (1 - f)
                deg = st.deg * f[:, 0] + tg.deg * (1 - f[:, 0])
                is_deg = st.is_deg & tg.is_deg
                ang[k] = _Angle(
                    torch.where(on[:, None], logits, st.logits),
                    torch.where(on, deg, st.deg),
                    torch.where(on, is_deg, st.is_deg),
                )
            elif k != "kp":
                x[k] = torch.where(on[:, None], x[k] * f + dst[k] * (1 - f), x[k])

    # 6. gaze correction, 7. keypoints
    deg = {a: ang[a].degrees(c.centers) for a in ANGLES}
    if cfg.drive_eye:
        yaw_s = bins_to_degrees_tensor(src["yaw"], c.centers)
        pitch_s = bins_to_degrees_tensor(src["pitch"], c.centers)
        x["exp"] = fix_gaze(x["exp"], deg["yaw"], deg["pitch"], yaw_s, pitch_s)
    x_d = transform_keypoints_tensor(
        src["kp"], deg["pitch"], deg["yaw"], deg["roll"], x["t"], x["scale"], x["exp"]
    )
    x_s = x_s.expand(n, -1, -1)
    if cfg.flag_stitching and stitch_net is not None:
        with torch.no_grad():
            x_d = stitch_net(x_s, x_d)
    return x_s, x_d
