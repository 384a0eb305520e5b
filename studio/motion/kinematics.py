"""Kinematic C² smoothing of the rigid head pose, and the motion-quality metrics.

Only rigid pose is touched: pitch, yaw and roll (as angles) and the translation t.
Expression (exp) and scale come back bit-for-bit unchanged, so lip-sync is kept.

1. Savitzky–Golay (scipy) over each pose channel: a local polynomial fit that
   keeps peaks and reproduces any polynomial up to its order exactly.
2. An acceleration limiter that enforces |Δ²θ| <= a_max on every channel: the
   curve closest to the filtered one (least squares) among those that obey the
   bound, solved by ADMM on the banded second-difference operator, then made
   exact by shrinking the remaining curvature about the channel's linear trend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve_banded, cholesky_banded
from scipy.signal import savgol_filter

from studio.motion import layout

DEFAULT_WINDOW = 5
DEFAULT_ORDER = 2
DEFAULT_ACCEL_LIMIT = 0.5  # degrees per frame² (312 deg/s² at 25 fps)
TRANSITION_RADIUS = 2  # frames either side of a stride change


@dataclass(frozen=True)
class SmoothingSettings:
    """What the smoother does; validated by the settings layer."""

    enabled: bool = True
    window: int = DEFAULT_WINDOW
    order: int = DEFAULT_ORDER
    accel_limit: float = DEFAULT_ACCEL_LIMIT


def second_difference(x: np.ndarray) -> np.ndarray:
    """Δ²x along axis 0."""
    return x[2:] - 2.0 * x[1:-1] + x[:-2]


def _second_difference_t(mu: np.ndarray, n: int) -> np.ndarray:
    """Dᵀ mu for the second-difference operator D ([n-2, n])."""
    out = np.zeros((n,) + mu.shape[1:])
    out[2:] += mu
    out[1:-1] -= 2.0 * mu
    out[:-2] += mu
    return out


def _banded_normal_matrix(n: int, rho: float) -> np.ndarray:
    """Upper banded form of I + rho DᵀD (pentadiagonal)."""
    diag = np.zeros(n)
    off1 = np.zeros(n - 1)
    off2 = np.zeros(n - 2)
    diag[: n - 2] += 1.0
    diag[1 : n - 1] += 4.0
    diag[2:] += 1.0
    off1[: n - 2] += -2.0
    off1[1 : n - 1] += -2.0
    off2[:] += 1.0
    ab = np.zeros((3, n))
    ab[2] = 1.0 + rho * diag
    ab[1, 1:] = rho * off1
    ab[0, 2:] = rho * off2
    return ab


def _shrink_curvature(x: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Scale each channel's deviation from its linear trend until |Δ²x| <= limit exactly."""
    n = x.shape[0]
    tt = np.arange(n, dtype=np.float64)
    for _ in range(4):
        peak = np.abs(second_difference(x)).max(axis=0)
        over = peak > limit
        if not over.any():
            return x
        coef = np.polyfit(tt, x[:, over], 1)
        trend = np.outer(tt, coef[0]) + coef[1]
        factor = limit[over] / peak[over] * (1.0 - 1e-9)
        x[:, over] = trend + (x[:, over] - trend) * factor
    return x


def limit_acceleration(
    y: np.ndarray, limit: float | np.ndarray, rho: float = 10.0, max_iter: int = 3000
) -> np.ndarray:
    """The curve nearest to ``y`` ([N] or [N, C]) with |Δ²x| <= limit on every channel.

    Solves min ||x - y||² s.t. |Dx| <= a by ADMM (x-step: one banded Cholesky
    solve; w-step: a clip), stopping when the bound holds to 1e-7 relative, then
    removes what is left of any violation exactly. Channels already within the
    bound are returned unchanged.
    """
    y = np.asarray(y, dtype=np.float64)
    squeeze = y.ndim == 1
    y2 = y[:, None] if squeeze else y
    n, chans = y2.shape
    lim = np.broadcast_to(np.asarray(limit, dtype=np.float64), (chans,)).copy()
    if np.any(lim <= 0):
        raise ValueError("acceleration limit must be positive")
    out = y2.copy()
    if n < 3:
        return out[:, 0] if squeeze else out
    todo = np.nonzero(np.abs(second_difference(y2)).max(axis=0) > lim)[0]
    if todo.size:
        yy, aa = y2[:, todo], lim[todo]
        chol = cholesky_banded(_banded_normal_matrix(n, rho))
        w = np.clip(second_difference(yy), -aa, aa)
        u = np.zeros_like(w)
        x = yy
        for it in range(max_iter):
            x = cho_solve_banded((chol, False), yy + rho * _second_difference_t(w - u, n))
            dx = second_difference(x)
            w = np.clip(dx + u, -aa, aa)
            u += dx - w
            if it % 10 == 9 and np.all(np.abs(dx).max(axis=0) <= aa * (1 + 1e-7)):
                break
        out[:, todo] = _shrink_curvature(x, aa)
    return out[:, 0] if squeeze else out


def savgol(x: np.ndarray, window: int, order: int) -> np.ndarray:
    """Savitzky–Golay along axis 0 with polynomial edges; the window shrinks for short clips."""
    n = x.shape[0]
    win = min(window, n if n % 2 else n - 1)
    if win <= order:
        return np.array(x, dtype=np.float64, copy=True)
    return savgol_filter(np.asarray(x, dtype=np.float64), win, order, axis=0, mode="interp")


def pose_channels(motion: np.ndarray) -> np.ndarray:
    """[N, 265] -> [N, 6]: pitch, yaw, roll (degrees), t_x, t_y, t_z."""
    return np.concatenate([layout.pose_degrees(motion), motion[:, layout.T]], axis=1)


def channel_limits(accel_limit: float) -> np.ndarray:
    """Per-channel |Δ²| bounds: degrees for the angles, t units for translation.

    The bounds sit a hair inside the limit (1e-4 relative plus 2e-5 degrees) so
    that it still holds after the angles are stored as float32 bin logits.
    """
    a = float(accel_limit)
    inner = max(a * (1 - 1e-4) - 2e-5, 0.5 * a)
    return np.array([inner] * 3 + [inner * layout.T_UNITS_PER_DEGREE] * 3)


def smooth_motion(motion: np.ndarray, settings: SmoothingSettings) -> np.ndarray:
    """C² pose smoothing of [N, 265] motion; exp and scale are returned bit-identical."""
    motion = np.asarray(motion, dtype=np.float32)
    if not settings.enabled or motion.shape[0] < 3:
        return motion.copy()
    pose = savgol(pose_channels(motion), settings.window, settings.order)
    pose = limit_acceleration(pose, channel_limits(settings.accel_limit))
    out = layout.with_pose_degrees(motion, pose[:, :3])
    out[:, layout.T] = pose[:, 3:].astype(np.float32)
    return out


# --- metrics -------------------------------------------------------------------


def pose_jerk(motion: np.ndarray) -> np.ndarray:
    """Per-frame pose jerk in rad/s³: |Δ³(pitch, yaw, roll)| at 25 fps.

    Entry j belongs to the frames j..j+3 (length N-3).
    """
    ang = np.deg2rad(layout.pose_degrees(motion))
    if ang.shape[0] < 4:
        return np.zeros(0)
    d3 = ang[3:] - 3 * ang[2:-1] + 3 * ang[1:-2] - ang[:-3]
    return np.linalg.norm(d3, axis=1) * layout.FPS**3


def stride_transitions(strides: np.ndarray) -> np.ndarray:
    """Frames k where the stride differs from frame k-1."""
    s = np.asarray(strides)
    return np.nonzero(s[1:] != s[:-1])[0] + 1


def transition_peak(jerk: np.ndarray, transitions: np.ndarray) -> float:
    """Mean over stride transitions of the peak jerk within ±2 frames (0 if none)."""
    if jerk.size == 0 or transitions.size == 0:
        return 0.0
    centres = np.arange(jerk.size) + 1.5  # jerk j is centred between frames j+1 and j+2
    peaks = []
    for k in transitions:
        near = np.abs(centres - k) <= TRANSITION_RADIUS + 0.5
        if near.any():
            peaks.append(jerk[near].max())
    return float(np.mean(peaks)) if peaks else 0.0


def exp_metrics(raw: np.ndarray, smoothed: np.ndarray) -> tuple[float, float]:
    """(MAE, velocity correlation) of exp between smoothed and unsmoothed motion."""
    a, b = raw[:, layout.EXP].astype(np.float64), smoothed[:, layout.EXP].astype(np.float64)
    mae = float(np.mean(np.abs(a - b)))
    va, vb = np.diff(a, axis=0).ravel(), np.diff(b, axis=0).ravel()
    if va.size == 0 or np.array_equal(va, vb):
        return mae, 1.0
    sa, sb = va.std(), vb.std()
    corr = float(np.mean((va - va.mean()) * (vb - vb.mean())) / (sa * sb)) if sa * sb > 0 else 0.0
    return mae, corr


def accel_max(motion: np.ndarray) -> float:
    """Largest |Δ²| of pitch, yaw, roll in degrees per frame²."""
    ang = layout.pose_degrees(motion)
    return float(np.abs(second_difference(ang)).max()) if ang.shape[0] >= 3 else 0.0


def kinematics_report(
    raw: np.ndarray, smoothed: np.ndarray, strides: np.ndarray, accel_limit: float
) -> dict[str, float]:
    """The report's kinematics block: jerk raw vs smoothed, transition peaks, exp fidelity."""
    jr, js = pose_jerk(raw), pose_jerk(smoothed)
    trans = stride_transitions(strides)
    mae, corr = exp_metrics(raw, smoothed)
    return {
        "pose_jerk_mean_raw": float(jr.mean()) if jr.size else 0.0,
        "pose_jerk_mean_smoothed": float(js.mean()) if js.size else 0.0,
        "transition_jerk_peak_raw": transition_peak(jr, trans),
        "transition_jerk_peak_smoothed": transition_peak(js, trans),
        "exp_mae": mae,
        "exp_velocity_corr": corr,
        "accel_max_smoothed": accel_max(smoothed),
        "accel_limit": float(accel_limit),
    }
