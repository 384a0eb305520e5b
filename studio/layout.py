"""The Ditto motion layout and the LivePortrait keypoint geometry.

This module is the one home of every number that describes the model: the
265-dim motion vector, the 66 pose bins, the 80-frame window, the 25 fps frame
rate, the keypoint sets. Everything else imports these names.

Motion vector (one frame, float32):

    dim 0          scale - 1
    dims 1..66     pitch bin logits
    dims 67..132   yaw bin logits
    dims 133..198  roll bin logits
    dims 199..201  t (x, y, z; z is ignored by the keypoint transform)
    dims 202..264  exp, 21 keypoints x (x, y, z), keypoint-major
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# --- timing -----------------------------------------------------------------
FPS = 25
SAMPLE_RATE = 16000
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640

# --- keypoints ---------------------------------------------------------------
NUM_KP = 21
KP_DIMS = 3
EXP_DIM = NUM_KP * KP_DIMS  # 63
LIP_KP = (6, 12, 14, 17, 19, 20)
EYE_KP = (11, 13, 15, 16, 18)
# Roles within those sets (the demo rig's names; LivePortrait's own expression edits move
# 11/15 against 13/16 to close an eye, so the lid pairs hold for the learned keypoints too).
LIP_UPPER_KP = 6
LIP_LOWER_KP = 14
EYE_LIDS_KP = ((11, 13), (15, 16))  # (upper, lower) lid of the left and the right eye
assert {LIP_UPPER_KP, LIP_LOWER_KP} <= set(LIP_KP)
assert {k for pair in EYE_LIDS_KP for k in pair} <= set(EYE_KP)


def lid_gaps(points: np.ndarray) -> np.ndarray:
    """[..., 21, D] keypoints -> [..., 2, D]: each eye's upper lid keypoint less its lower
    one (:data:`EYE_LIDS_KP`), the vector whose length is the eye's opening."""
    ups, lows = zip(*EYE_LIDS_KP, strict=True)
    return points[..., list(ups), :] - points[..., list(lows), :]

# --- pose bins ---------------------------------------------------------------
NUM_BINS = 66
BIN_STEP_DEG = 3.0
BIN_OFFSET_DEG = 97.5
BIN_CENTERS_DEG = np.arange(NUM_BINS, dtype=np.float64) * BIN_STEP_DEG - BIN_OFFSET_DEG
POSE_LIMIT_DEG = BIN_OFFSET_DEG  # degrees are confined to (-97.5, 97.5)

# --- the 265-dim motion vector ----------------------------------------------
SCALE = slice(0, 1)
PITCH = slice(1, 1 + NUM_BINS)
YAW = slice(PITCH.stop, PITCH.stop + NUM_BINS)
ROLL = slice(YAW.stop, YAW.stop + NUM_BINS)
T = slice(ROLL.stop, ROLL.stop + 3)
EXP = slice(T.stop, T.stop + EXP_DIM)
MOTION_DIM = EXP.stop  # 265
POSE_ANGLES = ("pitch", "yaw", "roll")
ANGLE_SLICES = {"pitch": PITCH, "yaw": YAW, "roll": ROLL}
SMOOTHED_DIMS = slice(0, T.stop)  # the reference's box filter covers dims 0..201
assert MOTION_DIM == 265 and SMOOTHED_DIMS.stop == 202

# --- audio features (HuBERT) -------------------------------------------------
HUBERT_DIM = 1024
HUBERT_HOP = 320  # samples per HuBERT frame (50 Hz, two per video frame)
HUBERT_RECEPTIVE_FIELD = 400  # samples seen by the conv front end per frame
HUBERT_CHUNK = (3, 5, 2)  # (left context, valid, right context) in video frames
HUBERT_CHUNK_EXTRA = HUBERT_RECEPTIVE_FIELD - HUBERT_HOP  # 80: brings 6400 to 20 frames

# --- the avatar's face crop (Ditto's crop_scale, crop_vx_ratio, crop_vy_ratio) ---
CROP_SCALE = 2.3  # the crop's side as a multiple of the face's landmarks
CROP_VX = 0.0  # sideways shift, a fraction of the side (Ditto takes it and ignores it)
CROP_VY = -0.125  # vertical shift, a fraction of the side (-: up)

# --- the LMDM condition, in this order: HuBERT, emotion, eye_open, eye_ball, sc ---
EMOTIONS = ("Angry", "Disgust", "Fear", "Happy", "Neutral", "Sad", "Surprise", "Contempt")
NUM_EMOTIONS = len(EMOTIONS)  # 8
DEFAULT_EMOTION = EMOTIONS.index("Neutral")  # 4
EMOTION_LOGIT = 8.0  # logit of a chosen label before the softmax (others 0)
EYE_OPEN_DIM = 2  # (left, right)
EYE_BALL_DIM = 6  # (xL, xR, yL, yR, zL, zR)
SC_DIM = EXP_DIM  # 63: canonical keypoints of source frame 0
COND_DIM = HUBERT_DIM + NUM_EMOTIONS + EYE_OPEN_DIM + EYE_BALL_DIM + SC_DIM  # 1103
assert COND_DIM == 1103

# --- LMDM windows and diffusion -----------------------------------------------
SEQ_FRAMES = 80
OVERLAP_OFFLINE = 10
OVERLAP_ONLINE = 70
SMOOTH_KERNEL = 3  # smo_k_d
# LMDM's precisions on a GPU: fp32 (the released weights' own), TF32 matmuls, or a cast
# half-type copy of the weights (studio.motion.fast_lmdm; the setting motion_precision)
LMDM_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
DIFFUSION_STEPS = 1000
COSINE_S = 0.008
DDIM_ETA = 1.0
GUIDANCE_WEIGHT = 2.0
DEFAULT_SAMPLING_STEPS = 50

# Translation is in normalised keypoint units. The acceleration limiter and the
# jerk metric treat one unit of t like one radian of rotation of a unit-radius
# head, so a degree-valued bound maps onto t through this factor.
T_UNITS_PER_DEGREE = np.pi / 180.0


@dataclass
class MotionFrames:
    """Unpacked motion for N frames (all float32 numpy)."""

    scale: np.ndarray  # [N]
    pitch: np.ndarray  # [N] degrees
    yaw: np.ndarray  # [N] degrees
    roll: np.ndarray  # [N] degrees
    t: np.ndarray  # [N, 3]
    exp: np.ndarray  # [N, 21, 3]


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


BLOCK_ROWS = 8192  # angle rows per block: float64 working arrays stay a few MB for any clip


def _by_blocks(
    fn: Any, lead: tuple[int, ...], out_tail: tuple[int, ...], *arrays: np.ndarray
) -> np.ndarray:
    """``fn`` of ``arrays`` (each shaped ``lead + its own tail``) over rows flattened from
    ``lead``, a block of :data:`BLOCK_ROWS` at a time: one call's result, without the
    [N, 66] float64 temporaries of a long clip."""
    n = int(np.prod(lead, dtype=np.int64))
    flat = [a.reshape(n, *a.shape[len(lead) :]) for a in arrays]
    if n <= BLOCK_ROWS:
        return fn(*flat).reshape(*lead, *out_tail)
    out = np.empty((n, *out_tail), np.float64)
    for b in range(0, n, BLOCK_ROWS):
        out[b : b + BLOCK_ROWS] = fn(*(f[b : b + BLOCK_ROWS] for f in flat))
    return out.reshape(*lead, *out_tail)


def bins_to_degrees(logits: np.ndarray) -> np.ndarray:
    """Expected angle of 66-bin logits: 3 * sum(softmax * i) - 97.5, over the last axis."""
    logits = np.asarray(logits)
    return _by_blocks(lambda z: softmax(z) @ BIN_CENTERS_DEG, logits.shape[:-1], (), logits)


def _tilt(base: np.ndarray, degrees: np.ndarray, iters: int = 60) -> np.ndarray:
    """:func:`_tilt_rows` a block of rows at a time (rows are solved independently)."""
    return _by_blocks(
        lambda b, d: _tilt_rows(b, d, iters), degrees.shape, (base.shape[-1],), base, degrees
    )


def _tilt_rows(base: np.ndarray, degrees: np.ndarray, iters: int = 60) -> np.ndarray:
    """Solve for lam so that softmax(base + lam * c) has mean `degrees` (c = bin centres).

    Exponential tilting is the smallest change (in KL) to a distribution that moves
    its mean, so re-encoding a smoothed angle this way keeps the shape of the bins.
    Newton's method on a monotone function, safeguarded by bisection.
    """
    c = BIN_CENTERS_DEG / BIN_STEP_DEG  # unit-spaced centres keep lam well scaled
    target = np.asarray(degrees, dtype=np.float64) / BIN_STEP_DEG
    lo = np.full(target.shape, -60.0)
    hi = np.full(target.shape, 60.0)
    lam = np.zeros(target.shape)
    for _ in range(iters):
        p = softmax(base + lam[..., None] * c)
        mean = p @ c
        err = mean - target
        open_ = np.abs(err) > 1e-11
        if not open_.any():
            break
        var = np.maximum(p @ (c * c) - mean * mean, 1e-300)
        hi = np.where(open_ & (err > 0), lam, hi)
        lo = np.where(open_ & (err < 0), lam, lo)
        step = lam - err / var
        bad = (step <= lo) | (step >= hi) | ~np.isfinite(step)
        lam = np.where(open_, np.where(bad, 0.5 * (lo + hi), step), lam)
    return base + lam[..., None] * c


def degrees_to_bins(degrees: np.ndarray, width_deg: float = 4.5) -> np.ndarray:
    """66-bin logits whose expected angle is exactly `degrees` (round trip to 1e-9).

    The logits are a Gaussian bump of `width_deg` around the angle, tilted to hit the
    mean exactly (a plain bump is biased near the ends of the range).
    """
    deg = np.clip(
        np.asarray(degrees, dtype=np.float64), -POSE_LIMIT_DEG + 0.5, POSE_LIMIT_DEG - 0.5
    )
    base = -0.5 * ((BIN_CENTERS_DEG - deg[..., None]) / width_deg) ** 2
    return _tilt(base, deg)


def retarget_bins(logits: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """Move logits to a new expected angle with the smallest change of their shape."""
    deg = np.clip(
        np.asarray(degrees, dtype=np.float64), -POSE_LIMIT_DEG + 0.5, POSE_LIMIT_DEG - 0.5
    )
    base = np.asarray(logits, dtype=np.float64)
    base = base - base.max(axis=-1, keepdims=True)
    return _tilt(base, deg)


def unpack(motion: np.ndarray) -> MotionFrames:
    """[N, 265] motion -> MotionFrames (angles in degrees, scale with the 1 added back)."""
    m = np.asarray(motion)
    if m.ndim != 2 or m.shape[1] != MOTION_DIM:
        raise ValueError(f"motion must be [N, {MOTION_DIM}], got {list(m.shape)}")
    return MotionFrames(
        scale=(m[:, SCALE.start] + 1.0).astype(np.float32),
        pitch=bins_to_degrees(m[:, PITCH]).astype(np.float32),
        yaw=bins_to_degrees(m[:, YAW]).astype(np.float32),
        roll=bins_to_degrees(m[:, ROLL]).astype(np.float32),
        t=m[:, T].astype(np.float32),
        exp=m[:, EXP].reshape(-1, NUM_KP, KP_DIMS).astype(np.float32),
    )


def pack(frames: MotionFrames) -> np.ndarray:
    """MotionFrames -> [N, 265] float32 motion (angles encoded as 66-bin logits)."""
    n = len(frames.scale)
    m = np.empty((n, MOTION_DIM), dtype=np.float32)
    m[:, SCALE.start] = np.asarray(frames.scale) - 1.0
    m[:, PITCH] = degrees_to_bins(frames.pitch)
    m[:, YAW] = degrees_to_bins(frames.yaw)
    m[:, ROLL] = degrees_to_bins(frames.roll)
    m[:, T] = frames.t
    m[:, EXP] = np.asarray(frames.exp).reshape(n, EXP_DIM)
    return m


def pose_degrees(motion: np.ndarray) -> np.ndarray:
    """[N, 265] -> [N, 3] pitch, yaw, roll in degrees."""
    m = np.asarray(motion)
    return np.stack([bins_to_degrees(m[:, ANGLE_SLICES[a]]) for a in POSE_ANGLES], axis=1)


def with_pose_degrees(motion: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """Copy of `motion` whose pitch/yaw/roll bins are retargeted to `degrees` [N, 3]."""
    out = np.array(motion, dtype=np.float32, copy=True)
    set_pose_degrees(out, degrees)
    return out


def set_pose_degrees(motion: np.ndarray, degrees: np.ndarray, rows: Any = slice(None)) -> None:
    """Retarget, in place, the pitch/yaw/roll bins of ``motion[rows]`` (float32 [N, 265]) to
    ``degrees`` [len(rows), 3]: no copy of the whole motion."""
    for i, a in enumerate(POSE_ANGLES):
        sl = ANGLE_SLICES[a]
        motion[rows, sl] = retarget_bins(motion[rows, sl], degrees[:, i])


def rotation_from_radians(xp: Any, pitch: Any, yaw: Any, roll: Any) -> Any:
    """[N] angles in radians -> [N, 3, 3] R = Rz(roll) @ Ry(yaw) @ Rx(pitch) (LivePortrait).

    ``xp`` is the array module of the angles, numpy or torch: both name ``cos``, ``sin``,
    ``stack``, ``ones_like`` and ``zeros_like`` alike, so the two agree to the operation.
    """
    cp, sp, cy, sy = xp.cos(pitch), xp.sin(pitch), xp.cos(yaw), xp.sin(yaw)
    cr, sr = xp.cos(roll), xp.sin(roll)
    one, zero = xp.ones_like(pitch), xp.zeros_like(pitch)
    rx = xp.stack([one, zero, zero, zero, cp, -sp, zero, sp, cp], -1).reshape(-1, 3, 3)
    ry = xp.stack([cy, zero, sy, zero, one, zero, -sy, zero, cy], -1).reshape(-1, 3, 3)
    rz = xp.stack([cr, -sr, zero, sr, cr, zero, zero, zero, one], -1).reshape(-1, 3, 3)
    return rz @ ry @ rx


def rotation_matrices(pitch: np.ndarray, yaw: np.ndarray, roll: np.ndarray) -> np.ndarray:
    """[N] angles in degrees -> [N, 3, 3] R = Rz(roll) @ Ry(yaw) @ Rx(pitch) (LivePortrait)."""
    p, y, r = (np.deg2rad(np.asarray(a, dtype=np.float64)) for a in (pitch, yaw, roll))
    return rotation_from_radians(np, p, y, r)


def transform_keypoints(
    kp: np.ndarray,
    pitch: np.ndarray,
    yaw: np.ndarray,
    roll: np.ndarray,
    t: np.ndarray,
    scale: np.ndarray,
    exp: np.ndarray,
) -> np.ndarray:
    """LivePortrait Eqn. 2: x = scale * (R @ kp + exp) + (t_x, t_y, 0).

    kp: [21, 3] or [N, 21, 3]; angles, scale: [N]; t: [N, 3]; exp: [N, 21, 3].
    Returns [N, 21, 3] float32. t_z is ignored, as in the reference.
    """
    rot = rotation_matrices(pitch, yaw, roll)
    kp = np.broadcast_to(np.asarray(kp, dtype=np.float64), (rot.shape[0], NUM_KP, KP_DIMS))
    x = kp @ rot.transpose(0, 2, 1) + np.asarray(exp, dtype=np.float64)
    x = x * np.asarray(scale, dtype=np.float64)[:, None, None]
    shift = np.asarray(t, dtype=np.float64).copy()
    shift[:, 2] = 0.0
    return (x + shift[:, None, :]).astype(np.float32)


def motion_from_info(info: dict) -> np.ndarray:
    """[265] motion vector of one keypoint-info dict (motion extractor heads, leading 1s
    allowed): the reference's ``dic2arr`` (scale stored minus 1, pose kept as bin logits)."""
    m = np.empty(MOTION_DIM, dtype=np.float32)
    m[SCALE] = np.reshape(info["scale"], -1) - 1.0
    for name, sl in (("pitch", PITCH), ("yaw", YAW), ("roll", ROLL), ("t", T), ("exp", EXP)):
        m[sl] = np.reshape(info[name], -1)
    return m
