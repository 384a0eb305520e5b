import numpy as np
import pytest

from studio import layout as L


def test_layout_slices_cover_265_dims_in_reference_order():
    assert (L.SCALE.start, L.PITCH.start, L.YAW.start, L.ROLL.start, L.T.start, L.EXP.start) == (
        0,
        1,
        67,
        133,
        199,
        202,
    )
    assert L.MOTION_DIM == 265 and L.EXP.stop == 265


def test_bins_to_degrees_matches_reference_formula():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(7, 66)) * 3
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ref = 3 * (p * np.arange(66)).sum(1) - 97.5
    np.testing.assert_allclose(L.bins_to_degrees(logits), ref, atol=1e-12)


@pytest.mark.parametrize("deg", [-96.0, -45.3, -0.01, 0.0, 12.5, 60.0, 96.9])
def test_degrees_bins_round_trip(deg):
    logits = L.degrees_to_bins(np.array([deg]))
    assert logits.shape == (1, 66)
    assert abs(L.bins_to_degrees(logits)[0] - deg) < 1e-8


def test_retarget_moves_mean_and_keeps_shape_for_small_moves():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 66))
    target = L.bins_to_degrees(logits) + 2.0
    out = L.retarget_bins(logits, target)
    np.testing.assert_allclose(L.bins_to_degrees(out), target, atol=1e-8)
    # Exponential tilting adds a linear ramp over the bins: second differences are unchanged.
    np.testing.assert_allclose(np.diff(out - logits, 2, axis=1), 0, atol=1e-9)


def test_pack_unpack_round_trip():
    rng = np.random.default_rng(2)
    n = 4
    frames = L.MotionFrames(
        scale=rng.uniform(0.9, 1.1, n).astype(np.float32),
        pitch=rng.uniform(-30, 30, n).astype(np.float32),
        yaw=rng.uniform(-30, 30, n).astype(np.float32),
        roll=rng.uniform(-30, 30, n).astype(np.float32),
        t=rng.normal(size=(n, 3)).astype(np.float32),
        exp=rng.normal(size=(n, 21, 3)).astype(np.float32),
    )
    m = L.pack(frames)
    assert m.shape == (n, 265) and m.dtype == np.float32
    np.testing.assert_allclose(m[:, 0], frames.scale - 1, atol=1e-7)
    back = L.unpack(m)
    for name in ("scale", "pitch", "yaw", "roll"):
        np.testing.assert_allclose(getattr(back, name), getattr(frames, name), atol=2e-4)
    np.testing.assert_array_equal(back.exp, frames.exp)
    np.testing.assert_array_equal(back.t, frames.t)
    with pytest.raises(ValueError, match="265"):
        L.unpack(np.zeros((3, 264)))


def test_rotation_matrices_are_rz_ry_rx():
    r = L.rotation_matrices(np.array([90.0]), np.array([0.0]), np.array([0.0]))[0]
    np.testing.assert_allclose(r @ [0, 1, 0], [0, 0, 1], atol=1e-12)  # Rx(90): y -> z
    r = L.rotation_matrices(np.array([0.0]), np.array([90.0]), np.array([0.0]))[0]
    np.testing.assert_allclose(r @ [0, 0, 1], [1, 0, 0], atol=1e-12)  # Ry(90): z -> x
    r = L.rotation_matrices(np.array([0.0]), np.array([0.0]), np.array([90.0]))[0]
    np.testing.assert_allclose(r @ [1, 0, 0], [0, 1, 0], atol=1e-12)  # Rz(90): x -> y
    rng = np.random.default_rng(3)
    p, y, ro = rng.uniform(-60, 60, (3, 5))
    rs = L.rotation_matrices(p, y, ro)
    for i in range(5):
        rx = L.rotation_matrices(p[i : i + 1], [0.0], [0.0])[0]
        ry = L.rotation_matrices([0.0], y[i : i + 1], [0.0])[0]
        rz = L.rotation_matrices([0.0], [0.0], ro[i : i + 1])[0]
        np.testing.assert_allclose(rs[i], rz @ ry @ rx, atol=1e-12)
        np.testing.assert_allclose(rs[i] @ rs[i].T, np.eye(3), atol=1e-12)


def test_transform_keypoints_is_liveportrait_eqn2_and_ignores_tz():
    rng = np.random.default_rng(4)
    kp = rng.normal(size=(21, 3))
    exp = rng.normal(size=(2, 21, 3))
    ang = rng.uniform(-40, 40, size=(3, 2))
    t = rng.normal(size=(2, 3))
    scale = np.array([0.8, 1.3])
    out = L.transform_keypoints(kp, ang[0], ang[1], ang[2], t, scale, exp)
    rot = L.rotation_matrices(*ang)
    for i in range(2):
        ref = scale[i] * (kp @ rot[i].T + exp[i]) + np.array([t[i, 0], t[i, 1], 0.0])
        np.testing.assert_allclose(out[i], ref, rtol=1e-5, atol=1e-5)
    t2 = t.copy()
    t2[:, 2] += 5.0
    np.testing.assert_array_equal(L.transform_keypoints(kp, *ang, t2, scale, exp), out)


def test_lid_gaps_are_upper_less_lower_per_eye():
    pts = np.zeros((3, L.NUM_KP, 2))
    for eye, (up, low) in enumerate(L.EYE_LIDS_KP):
        pts[:, up] = [0.0, -1.0 - eye]
        pts[:, low] = [0.5, 2.0]
    gaps = L.lid_gaps(pts)
    assert gaps.shape == (3, 2, 2)
    np.testing.assert_array_equal(gaps[0], [[-0.5, -3.0], [-0.5, -4.0]])
