import numpy as np
import pytest

from studio import layout as L
from studio.motion import kinematics as K
from studio.motion.cadence import CadencePlan, keyframes_for, sample_motion


def _motion(pitch, yaw, roll, t=None, seed=0):
    n = len(pitch)
    rng = np.random.default_rng(seed)
    frames = L.MotionFrames(
        scale=np.ones(n, np.float32) + rng.normal(0, 0.01, n).astype(np.float32),
        pitch=np.asarray(pitch, np.float32),
        yaw=np.asarray(yaw, np.float32),
        roll=np.asarray(roll, np.float32),
        t=(np.zeros((n, 3)) if t is None else t).astype(np.float32),
        exp=rng.normal(0, 0.02, (n, 21, 3)).astype(np.float32),
    )
    return L.pack(frames)


@pytest.mark.parametrize("window, order", [(5, 2), (7, 2), (9, 3), (31, 4)])
def test_savgol_reproduces_quadratics_exactly(window, order):
    rng = np.random.default_rng(window)
    x = np.arange(60, dtype=np.float64)
    for _ in range(3):
        a, b, c = rng.normal(size=3)
        q = a * x**2 + b * x + c
        np.testing.assert_allclose(K.savgol(q, window, order), q, rtol=1e-9, atol=1e-7)


def test_smoothing_leaves_exp_and_scale_bit_identical_and_touches_pose():
    rng = np.random.default_rng(1)
    n = 120
    m = _motion(
        rng.normal(0, 3, n), rng.normal(0, 3, n), rng.normal(0, 3, n), t=rng.normal(0, 0.01, (n, 3))
    )
    out = K.smooth_motion(m, K.SmoothingSettings(True, 7, 2, 0.5))
    assert out.dtype == np.float32 and out.shape == m.shape
    assert np.array_equal(out[:, L.EXP], m[:, L.EXP])
    assert np.array_equal(out[:, L.SCALE], m[:, L.SCALE])
    assert not np.allclose(L.pose_degrees(out), L.pose_degrees(m), atol=0.1)
    assert not np.allclose(out[:, L.T], m[:, L.T])
    off = K.smooth_motion(m, K.SmoothingSettings(enabled=False))
    assert np.array_equal(off, m)


@pytest.mark.parametrize("seed", range(12))
def test_limiter_bound_holds_on_random_inputs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 900))
    chans = int(rng.integers(1, 5))
    y = np.cumsum(np.cumsum(rng.normal(0, 1, (n, chans)), 0), 0) * rng.uniform(0.01, 0.3)
    y += rng.normal(0, rng.uniform(0, 3), (n, chans))
    a = rng.uniform(0.005, 1.0, chans)
    x = K.limit_acceleration(y, a)
    assert x.shape == y.shape
    assert np.all(np.abs(K.second_difference(x)) <= a)


def test_limiter_is_identity_when_feasible_and_close_to_optimal_otherwise():
    t = np.arange(100.0)
    smooth = 0.001 * t**2
    np.testing.assert_array_equal(K.limit_acceleration(smooth, 0.5), smooth)
    rng = np.random.default_rng(3)
    y = np.sin(t / 5) * 10 + rng.normal(0, 0.3, 100)
    x = K.limit_acceleration(y, 0.2)
    assert np.abs(K.second_difference(x)).max() <= 0.2
    # Optimality: no feasible direction improves the objective (check random feasible
    # perturbations by convex combination with another feasible curve).
    other = K.limit_acceleration(np.zeros(100), 0.2)
    for lam in (0.01, 0.1, 0.5):
        z = (1 - lam) * x + lam * other
        assert np.sum((x - y) ** 2) <= np.sum((z - y) ** 2) + 1e-6


def test_smoothed_motion_respects_the_accel_limit_in_degrees():
    rng = np.random.default_rng(4)
    n = 200
    steps = np.repeat(rng.normal(0, 6, n // 10), 10)  # jumpy pose
    m = _motion(steps, -steps, steps * 0.5)
    for limit in (0.1, 0.5, 2.0):
        out = K.smooth_motion(m, K.SmoothingSettings(True, 5, 2, limit))
        assert K.accel_max(out) <= limit


def _stepped_cadence_trajectory(n=250, seed=5):
    """A smooth head motion sampled with a stride 1 / 3 cadence: linear between keyframes."""
    rng = np.random.default_rng(seed)
    f = np.arange(n)
    pitch = 6 * np.sin(f / 9) + rng.normal(0, 0.2, n)
    yaw = 8 * np.sin(f / 13 + 1) + rng.normal(0, 0.2, n)
    roll = 3 * np.sin(f / 17 + 2)
    m = _motion(pitch, yaw, roll)
    strides = np.where((f // 25) % 2 == 0, 1, 3)
    plan = CadencePlan(strides, keyframes_for(strides))
    return sample_motion(m, plan), plan


def test_jerk_at_stride_transitions_drops_after_smoothing():
    raw, plan = _stepped_cadence_trajectory()
    out = K.smooth_motion(raw, K.SmoothingSettings(True, 5, 2, 0.5))
    rep = K.kinematics_report(raw, out, plan.strides, 0.5)
    assert rep["transition_jerk_peak_smoothed"] < 0.7 * rep["transition_jerk_peak_raw"]
    assert rep["pose_jerk_mean_smoothed"] < rep["pose_jerk_mean_raw"]
    assert rep["exp_mae"] == 0.0 and rep["exp_velocity_corr"] == 1.0
    assert rep["accel_max_smoothed"] <= 0.5 and rep["accel_limit"] == 0.5


def test_jerk_units_rad_per_s3():
    n = 30
    f = np.arange(n, dtype=np.float64) - 15
    deg = 0.002 * f**3  # Δ³ = 0.012 deg per frame³
    m = _motion(deg, np.zeros(n), np.zeros(n))
    j = K.pose_jerk(m)
    assert j.shape == (n - 3,)
    np.testing.assert_allclose(j, np.deg2rad(0.012) * 25**3, rtol=5e-3)


def test_transition_peak_and_exp_metrics():
    jerk = np.zeros(20)
    jerk[9] = 5.0
    assert K.transition_peak(jerk, np.array([10])) == 5.0
    assert K.transition_peak(jerk, np.array([17])) == 0.0
    assert K.transition_peak(jerk, np.array([])) == 0.0
    rng = np.random.default_rng(6)
    a = _motion(np.zeros(30), np.zeros(30), np.zeros(30))
    b = a.copy()
    b[:, L.EXP] += rng.normal(0, 0.01, b[:, L.EXP].shape).astype(np.float32)
    mae, corr = K.exp_metrics(a, b)
    assert mae > 0 and corr < 1


def _kkt_gap(y, x, a):
    """Largest breach of the QP's optimality conditions by x, relative to the multipliers.

    Recovers the multipliers from x - y = -Dᵀλ by least squares (independent of the
    solver) and checks stationarity, signs on the bound and zeros off it.
    """
    d = np.diff(np.eye(len(y)), 2, axis=0)
    r = y - x
    lam = np.linalg.lstsq(d.T, r, rcond=None)[0]
    scale = np.abs(lam).max(axis=0) + 1e-300
    z = (d @ x) / a
    wrong_sign = np.where(z > 1 - 1e-6, -lam, np.where(z < -1 + 1e-6, lam, np.abs(lam)))
    stationarity = np.abs(d.T @ lam - r).max(axis=0) / (np.abs(r).max(axis=0) + 1e-300)
    return float(max((np.maximum(wrong_sign, 0).max(axis=0) / scale).max(), stationarity.max()))


def _jumpy_pose(seed=0, n=165):
    """Savitzky–Golay pose of random-weight-LMDM-like motion: every dim a fresh N(0, 1)."""
    m = np.random.default_rng(seed).normal(0, 1, (n, L.MOTION_DIM)).astype(np.float32)
    return m, K.savgol(K.pose_channels(m), K.DEFAULT_WINDOW, K.DEFAULT_ORDER)


@pytest.mark.parametrize("seed", range(3))
def test_limiter_agrees_with_a_bounded_least_squares_solver(seed):
    from scipy.optimize import lsq_linear

    rng = np.random.default_rng(7 + seed)
    n, a = 60, 0.3
    y = np.cumsum(rng.normal(0, 1, n)) + rng.normal(0, 2, n)
    # The same QP over (x0, v0, Δ²x): x is linear in them and the bound is a box.
    k = np.arange(n)[:, None]
    basis = np.hstack([np.ones((n, 1)), k, np.maximum(k - 1 - np.arange(n - 2), 0)])
    bound = np.r_[np.inf, np.inf, np.full(n - 2, a)]
    ref = lsq_linear(basis, y, bounds=(-bound, bound), method="bvls", tol=1e-12)
    assert ref.success
    want = basis @ ref.x
    x = K.limit_acceleration(y, a)
    np.testing.assert_allclose(x, want, atol=1e-6 * np.abs(y - want).max())
    assert np.sum((x - y) ** 2) <= np.sum((want - y) ** 2) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_jumpy_motion_is_bounded_and_optimal_by_convergence(seed):
    m, pose = _jumpy_pose(seed)
    lim = K.channel_limits(K.DEFAULT_ACCEL_LIMIT)
    assert np.all(np.abs(K.second_difference(pose)).max(axis=0) > 10 * lim)  # really jumpy
    x, stats = K.limit_acceleration_stats(pose, lim)
    assert stats.exact and 0 < stats.newton_steps < 80  # converged, not stopped by the cap
    assert np.all(np.abs(K.second_difference(x)) <= lim)
    assert _kkt_gap(pose, x, lim) < 1e-6
    # No other feasible curve is closer: e.g. the same curvature shrunk about the trend.
    shrunk = K._shrink_curvature(pose.copy(), lim)
    assert np.sum((x - pose) ** 2) < np.sum((shrunk - pose) ** 2)
    out = K.smooth_motion(m, K.SmoothingSettings())
    assert K.accel_max(out) <= K.DEFAULT_ACCEL_LIMIT
    assert np.array_equal(out[:, L.EXP], m[:, L.EXP])
    assert np.array_equal(out[:, L.SCALE], m[:, L.SCALE])
    np.testing.assert_allclose(L.pose_degrees(out), x[:, :3], atol=1e-3)


def test_limiter_bound_holds_when_the_cap_ends_it():
    _, pose = _jumpy_pose(3)
    lim = K.channel_limits(K.DEFAULT_ACCEL_LIMIT)
    for cap in (0, 1, 3):
        x, stats = K.limit_acceleration_stats(pose, lim, max_iter=cap)
        assert stats.newton_steps <= cap
        assert np.all(np.abs(K.second_difference(x)) <= lim)


def test_calm_motion_with_a_few_spikes_needs_no_interior_point_steps():
    rng = np.random.default_rng(8)
    f = np.arange(165.0)
    y = np.stack([6 * np.sin(f / 9), 8 * np.sin(f / 13 + 1)], axis=1)
    y[[30, 90, 140]] += rng.normal(0, 2, (3, 2))
    x, stats = K.limit_acceleration_stats(y, 0.5)
    assert stats.exact and stats.newton_steps == 0
    assert np.all(np.abs(K.second_difference(x)) <= 0.5)
    assert _kkt_gap(y, x, np.array([0.5, 0.5])) < 1e-6
    np.testing.assert_allclose(x[:20], y[:20], rtol=0, atol=1e-12)  # far from the spikes


@pytest.mark.parametrize("seed", range(6))
def test_the_smallest_accepted_accel_limit_is_honoured(seed):
    """At MIN_ACCEL_LIMIT (the settings schema's minimum) the bound holds after the angles are
    stored as float32 bin logits, for head poses anywhere in ±60° and any window."""
    rng = np.random.default_rng(seed)
    n = 300
    angles = [np.clip(b + np.cumsum(rng.normal(0, 2, n)), -85, 85) for b in rng.uniform(-60, 60, 3)]
    m = _motion(*angles, seed=seed)
    for window in (3, 9, 31):
        out = K.smooth_motion(m, K.SmoothingSettings(True, window, 2, K.MIN_ACCEL_LIMIT))
        assert K.accel_max(out) <= K.MIN_ACCEL_LIMIT


def test_a_limit_below_the_smallest_honoured_is_refused_not_ignored():
    m = _motion(np.linspace(0, 20, 50) ** 1.5, np.zeros(50), np.zeros(50))
    with pytest.raises(ValueError, match="below 0.001"):
        K.smooth_motion(m, K.SmoothingSettings(True, 5, 2, 1e-6))
