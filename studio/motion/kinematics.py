"""Kinematic C² smoothing of the rigid head pose, and the motion-quality metrics.

Only rigid pose is touched: pitch, yaw and roll (as angles) and the translation t.
Expression (exp) and scale come back bit-for-bit unchanged, so lip-sync is kept.

1. Savitzky–Golay (scipy) over each pose channel: a local polynomial fit that
   keeps peaks and reproduces any polynomial up to its order exactly.
2. An acceleration limiter that enforces |Δ²θ| <= a_max on every channel: the
   curve closest to the filtered one (least squares) among those that obey the
   bound. The QP is solved exactly (interior point on the pentadiagonal normal
   equations, finished by an active-set solve that passes the KKT test); the
   last rounding is removed by shrinking the curvature about the linear trend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from studio import layout

DEFAULT_WINDOW = 5
DEFAULT_ORDER = 2
DEFAULT_ACCEL_LIMIT = 0.5  # degrees per frame² (312 deg/s² at 25 fps)
# The smallest limit the smoother honours: angles are stored as float32 bin logits, which hold
# a head angle to about 1e-5 degrees, so a bound much below that is lost in rounding (1e-6
# came back as 1.1e-6 .. 1.7e-6); at 0.001 (0.6 deg/s², a still head) the bound holds with
# room to spare. The settings schema takes its minimum from here.
MIN_ACCEL_LIMIT = 0.001
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


@dataclass(frozen=True)
class LimiterStats:
    """How :func:`limit_acceleration` ended, for tests and benchmarks.

    ``exact`` is True when an active set passed the KKT test (the result is the
    optimum to rounding); False means the iteration cap ended it and the bound
    was enforced by shrinking the last iterate.
    """

    newton_steps: int = 0  # interior-point iterations
    active_set_solves: int = 0  # exact solves on a guessed active set
    exact: bool = True


# The QP, per channel, after scaling by the limit: min ½||x - y||² s.t. |Dx| <= 1.
# The interior point keeps x = y - Dᵀλ with λ = l₊ - l₋ (dual feasible), so it only
# iterates on z = Dx, the slacks of Dx + s₊ = 1 and -Dx + s₋ = 1, and the
# multipliers (l₊, l₋) ("dual"); the two bounds are stacked on axis 0.
_SIDES = np.array([1.0, -1.0])[:, None, None]
_KKT_TOL = 1e-9  # relative slack on the multipliers' signs in the active-set test
_TARGET = 1.0 - 1e-9  # active rows aim a hair inside the bound, so rounding rarely breaks it
_GUESSES_FIRST = 10  # active-set tries from the clipped start (calm motion settles here)
_SWAPS_FIRST = 0.1  # ... while under this fraction of the rows swap per try
_GUESSES_STABLE = 2  # active-set tries once the interior point's guess repeats
_GUESSES_LAST = 20  # active-set tries from the interior point's last iterate


def _active_bands(chan: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Upper bands of DDᵀ restricted to the active rows (idx, chan), channels block-diagonal.

    DDᵀ is the Toeplitz band (1, -4, 6, -4, 1), so any principal submatrix is
    again pentadiagonal: its entries depend only on the gaps between kept rows.
    """
    ab = np.zeros((3, idx.size))
    ab[2] = 6.0
    gap1 = np.where(chan[1:] == chan[:-1], idx[1:] - idx[:-1], 0)
    ab[1, 1:] = np.where(gap1 == 1, -4.0, np.where(gap1 == 2, 1.0, 0.0))
    gap2 = np.where(chan[2:] == chan[:-2], idx[2:] - idx[:-2], 0)
    ab[0, 2:] = gap2 == 2
    return ab


def _active_solve(b: np.ndarray, up: np.ndarray, lo: np.ndarray) -> np.ndarray | None:
    """Multipliers λ [m, C] that put Dx at ±1 on ``up`` / ``lo`` (λ = 0 on the other rows)."""
    from scipy.linalg import lapack  # here: scipy's import is the CLI's slowest

    lam = np.zeros_like(b)
    chan, idx = np.nonzero((up | lo).T)  # channel-major, so each channel is one block
    if idx.size:
        rhs = b[idx, chan] - np.where(up[idx, chan], _TARGET, -_TARGET)
        _, sol, info = lapack.dpbsv(_active_bands(chan, idx), rhs)
        if info:
            return None
        lam[idx, chan] = sol
    return lam


def _active_set(
    b: np.ndarray, up: np.ndarray, lo: np.ndarray, tries: int, max_swaps: float = np.inf
) -> tuple[np.ndarray | None, int]:
    """Primal-dual active-set iterations from a guess; (λ, solves), λ None if not settled.

    A guess is the optimum when its multipliers have the right signs and the
    inactive rows are within the bound (the KKT conditions); otherwise rows swap
    sides and it tries again. Fast from a good guess, but it can cycle from a
    bad one, hence the few tries, and giving up when more than ``max_swaps``
    rows would swap at once.
    """
    n = b.shape[0] + 2
    for k in range(tries):
        lam = _active_solve(b, up, lo)
        if lam is None:
            return None, k + 1
        z = b - second_difference(_second_difference_t(lam, n))
        tol = _KKT_TOL * (1.0 + np.abs(lam).max(axis=0))  # multipliers scale with the clip
        free = ~(up | lo)
        new_up = (up & (lam > -tol)) | (free & (z > 1.0))
        new_lo = (lo & (lam < tol)) | (free & (z < -1.0))
        swaps = np.count_nonzero(new_up != up) + np.count_nonzero(new_lo != lo)
        if swaps == 0:
            return lam, k + 1
        if swaps > max_swaps:
            return None, k + 1
        up, lo = new_up, new_lo
    return None, tries


def _initial_point(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z = Dx, slacks, multipliers [2, m, C]) at x = y: dual feasible, slacks positive.

    The multipliers start at the scale the optimum needs (λ grows with the clip
    length and the size of the violations), which keeps the path centred.
    """
    m = b.shape[0]
    s = np.maximum(1.0 - _SIDES * b, 1.0)
    scale = 10.0 * (m + 2) * np.maximum(1.0, np.sqrt(np.mean(b * b, axis=0)))
    return b.copy(), s, np.broadcast_to(scale, s.shape).copy()


def _max_step(s: np.ndarray, ds: np.ndarray, dual: np.ndarray, ddual: np.ndarray) -> np.ndarray:
    """Per channel, the largest t in (0, 1] keeping s + t ds and dual + t ddual non-negative."""
    worst = np.minimum((ds / s).min(axis=(0, 1)), (ddual / dual).min(axis=(0, 1)))
    return np.minimum(1.0, -1.0 / np.minimum(worst, -1e-300))


def _newton(
    chol: np.ndarray,
    winv: np.ndarray,
    s: np.ndarray,
    dual: np.ndarray,
    rp: np.ndarray,
    rc: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Newton direction (dz, ds, ddual); rc is the complementarity residual s·l - target.

    Eliminating x and the slacks leaves (DDᵀ + W⁻¹) dλ = W⁻¹ g, W = l₊/s₊ + l₋/s₋:
    well conditioned as rows become active (W⁻¹ -> 0), unlike I + DᵀWD.
    """
    from scipy.linalg import lapack

    m, c = winv.shape
    gk = (dual * rp - rc) / s
    g = gk[0] - gk[1]
    dlam, _ = lapack.dpbtrs(chol, (winv * g).T.ravel())
    dz = winv * (dlam.reshape(c, m).T - g)
    ds = -rp - _SIDES * dz
    return dz, ds, -(rc + dual * ds) / s


def _mehrotra_step(
    base: np.ndarray, z: np.ndarray, s: np.ndarray, dual: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """One predictor-corrector step from (z, s, dual); None if the factorisation failed."""
    from scipy.linalg import lapack

    m = z.shape[0]
    rp = _SIDES * z + s - 1.0
    winv = 1.0 / (dual / s).sum(axis=0)
    ab = base.copy()
    ab[2] += winv.T.ravel()
    chol, info = lapack.dpbtrf(ab)
    if info:
        return None
    gap = s * dual
    mu = gap.sum(axis=(0, 1)) / (2 * m)
    dz, ds, ddual = _newton(chol, winv, s, dual, rp, gap)
    t = _max_step(s, ds, dual, ddual)
    mu_aff = ((s + t * ds) * (dual + t * ddual)).sum(axis=(0, 1)) / (2 * m)
    sigma = (mu_aff / mu) ** 3
    dz, ds, ddual = _newton(chol, winv, s, dual, rp, gap + ds * ddual - sigma * mu)
    t = 0.99 * _max_step(s, ds, dual, ddual)
    return z + t * dz, s + t * ds, dual + t * ddual


def _guess(s: np.ndarray, dual: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Active rows guessed from an interior iterate (multiplier above slack); None if ambiguous."""
    active = dual > s
    if (active[0] & active[1]).any():  # both bounds of a row: still far from the optimum
        return None
    return active[0], active[1]


def _interior_point(b: np.ndarray, max_iter: int) -> tuple[np.ndarray, LimiterStats]:
    """λ of the unit-bound QP by Mehrotra's method, finished by an exact active-set solve.

    After each step the rows whose multiplier exceeds their slack are the guessed
    active set; once that guess repeats, an active-set solve (and one correction)
    either proves it optimal or the iteration goes on.
    """
    m, c = b.shape
    base = np.zeros((3, c, m))
    base[2], base[1, :, 1:], base[0, :, 2:] = 6.0, -4.0, 1.0  # DDᵀ per channel
    base = base.reshape(3, c * m)
    z, s, dual = _initial_point(b)
    steps, solves, last = 0, 0, None
    while True:
        guess = _guess(s, dual)
        if guess is not None and last is not None and _same_sets(guess, last):
            mult, k = _active_set(b, *guess, tries=_GUESSES_STABLE)
            solves += k
            if mult is not None:
                return mult, LimiterStats(steps, solves, True)
        last = guess
        step = _mehrotra_step(base, z, s, dual) if steps < max_iter else None
        if step is None:
            break
        z, s, dual = step
        steps += 1
    mult, k = _active_set(b, dual[0] > s[0], dual[1] > s[1], _GUESSES_LAST)
    if mult is not None:
        return mult, LimiterStats(steps, solves + k, True)
    return dual[0] - dual[1], LimiterStats(steps, solves + k, False)


def _same_sets(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether two (upper, lower) active-set guesses are equal."""
    return np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def _unit_limiter(b: np.ndarray, max_iter: int) -> tuple[np.ndarray, LimiterStats]:
    """λ for the unit-bound QP: active-set tries from the clipped start, else interior point."""
    lam, k = _active_set(b, b > 1.0, b < -1.0, _GUESSES_FIRST, _SWAPS_FIRST * b.size)
    if lam is not None:
        return lam, LimiterStats(0, k, True)
    lam, stats = _interior_point(b, max_iter)
    return lam, LimiterStats(stats.newton_steps, stats.active_set_solves + k, stats.exact)


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


def limit_acceleration_stats(
    y: np.ndarray, limit: float | np.ndarray, max_iter: int = 80
) -> tuple[np.ndarray, LimiterStats]:
    """:func:`limit_acceleration` and how it ended (iterations, exactness).

    ``max_iter`` caps the interior-point steps; the bound holds either way.
    """
    y = np.asarray(y, dtype=np.float64)
    squeeze = y.ndim == 1
    y2 = y[:, None] if squeeze else y
    n, chans = y2.shape
    lim = np.broadcast_to(np.asarray(limit, dtype=np.float64), (chans,)).copy()
    if np.any(lim <= 0):
        raise ValueError("acceleration limit must be positive")
    out = y2.copy()
    stats = LimiterStats()
    todo = np.nonzero(np.abs(second_difference(y2)).max(axis=0) > lim)[0] if n >= 3 else ()
    if len(todo):
        unit = y2[:, todo] / lim[todo]
        lam, stats = _unit_limiter(second_difference(unit), max_iter)
        x = (unit - _second_difference_t(lam, n)) * lim[todo]
        out[:, todo] = _shrink_curvature(x, lim[todo])
    return (out[:, 0] if squeeze else out), stats


def limit_acceleration(y: np.ndarray, limit: float | np.ndarray, max_iter: int = 80) -> np.ndarray:
    """The curve nearest to ``y`` ([N] or [N, C]) with |Δ²x| <= limit on every channel.

    Solves min ||x - y||² s.t. |Dx| <= a exactly: a primal-dual active-set guess
    (enough when few frames break the bound), else Mehrotra's interior-point
    method on the pentadiagonal DDᵀ (all channels in one banded factorisation
    per step) until its guessed active set passes the KKT test. Rounding left
    in the bound is removed by shrinking. Channels within the bound come back
    unchanged.
    """
    return limit_acceleration_stats(y, limit, max_iter)[0]


SMOOTHING_MODULES = ("scipy.signal",)  # imported by savgol on first use (a caller may ahead)


def savgol(x: np.ndarray, window: int, order: int) -> np.ndarray:
    """Savitzky–Golay along axis 0 with polynomial edges; the window shrinks for short clips."""
    from scipy.signal import savgol_filter  # here: scipy.signal's import takes 0.5-1 s

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
    that it still holds after the angles are stored as float32 bin logits; a limit below
    MIN_ACCEL_LIMIT could not be honoured there and is a ValueError.
    """
    a = float(accel_limit)
    if not a >= MIN_ACCEL_LIMIT:
        raise ValueError(f"acceleration limit {a!r} is below {MIN_ACCEL_LIMIT}, the least honoured")
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
    return angle_jerk(layout.pose_degrees(motion))


def angle_jerk(degrees: np.ndarray) -> np.ndarray:
    """:func:`pose_jerk` of pitch, yaw, roll already in degrees [N, 3]."""
    ang = np.deg2rad(degrees)
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
    if np.array_equal(raw[:, layout.EXP], smoothed[:, layout.EXP]):
        return 0.0, 1.0  # smoothing leaves exp untouched: no float64 copies of a long clip
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
