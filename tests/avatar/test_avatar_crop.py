"""Crop geometry (§5.3) and the torch warps behind registration's crops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from studio.avatar.crop import (
    anchor_points,
    area_downsample,
    crop_geometry,
    crop_image,
    crop_rect,
    invert_affine,
    resize_bilinear,
    scale_center_matrix,
    transform_points,
    warp_affine,
)
from studio.fixtures.face_standins import (
    EYE_CENTRES,
    FEATURE_RGB,
    MOUTH_CENTRE,
    SKIN_RGB,
    face_image,
    face_layout,
    template_106,
    template_203,
)


def _in_box(tmpl: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    x1, y1, x2, y2 = box
    return np.stack([x1 + tmpl[:, 0] * (x2 - x1), y1 + tmpl[:, 1] * (y2 - y1)], axis=1)


def _similarity(pts: np.ndarray, angle: float, scale: float, shift: tuple[float, float]):
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])  # rotates clockwise on screen (image y points down)
    return pts @ rot.T * scale + np.asarray(shift)


BOX = (100.0, 60.0, 300.0, 300.0)


@pytest.mark.parametrize("tmpl", [template_203(), template_106()], ids=["203", "106"])
def test_anchor_points_are_eye_and_mouth_centres(tmpl: np.ndarray) -> None:
    pts = _in_box(tmpl, BOX)
    eye, mouth = anchor_points(pts)
    lay = face_layout(BOX)
    np.testing.assert_allclose(eye, lay["eyes"].mean(axis=0), atol=1e-9)
    np.testing.assert_allclose(mouth, lay["mouth"], atol=1e-9)


def test_anchor_points_reject_other_layouts() -> None:
    with pytest.raises(ValueError, match="203, 2"):
        anchor_points(np.zeros((68, 2)))


def test_upright_crop_size_centre_and_vy_shift() -> None:
    pts = _in_box(template_203(), BOX)
    center, size, angle = crop_rect(pts, scale=2.3, vy_ratio=-0.125)
    assert angle == pytest.approx(0.0, abs=1e-12)
    lo, hi = pts.min(axis=0), pts.max(axis=0)
    assert size == pytest.approx(2.3 * max(hi - lo))
    mid = (lo + hi) / 2
    # vy < 0 moves the centre up (towards the forehead) by vy * size; x stays put.
    np.testing.assert_allclose(center, [mid[0], mid[1] - 0.125 * size], atol=1e-9)
    # vx > 0 moves it right by vx * size (Ditto never applies its vx: 0 is its crop)
    right, same_size, _ = crop_rect(pts, scale=2.3, vy_ratio=-0.125, vx_ratio=0.1)
    np.testing.assert_allclose(right - center, [0.1 * size, 0.0], atol=1e-9)
    assert same_size == size


@pytest.mark.parametrize("angle_deg", [-35.0, -8.0, 0.0, 12.0, 60.0])
def test_roll_angle_and_crop_are_invariant_to_a_similarity(angle_deg: float) -> None:
    """The crop is defined by the landmarks alone: rotating, scaling and moving the face
    moves the crop with it, so the landmarks land on the same crop pixels."""
    upright = _in_box(template_203(), BOX)
    moved = _similarity(upright, math.radians(angle_deg), 1.7, (40.0, -25.0))
    ref = crop_geometry(upright, 512, 2.3, -0.125)
    geo = crop_geometry(moved, 512, 2.3, -0.125)
    assert math.degrees(geo.angle) == pytest.approx(angle_deg, abs=1e-6)
    assert geo.size == pytest.approx(1.7 * ref.size, rel=1e-9)
    np.testing.assert_allclose(
        transform_points(moved, geo.m_o2c), transform_points(upright, ref.m_o2c), atol=2e-3
    )


def test_without_rotation_the_crop_keeps_the_roll() -> None:
    upright = _in_box(template_203(), BOX)
    moved = _similarity(upright, math.radians(20), 1.0, (0.0, 0.0))
    geo = crop_geometry(moved, 224, 1.5, -0.1, rotate=False)
    assert geo.angle == 0.0
    m = geo.m_o2c.astype(np.float64)
    assert m[0, 1] == 0.0 and m[1, 0] == 0.0 and m[0, 0] == pytest.approx(m[1, 1])


def test_matrices_are_inverse_float32_3x3() -> None:
    pts = _similarity(_in_box(template_106(), BOX), 0.3, 1.0, (5.0, 7.0))
    geo = crop_geometry(pts, 512, 2.3, -0.125)
    for m in (geo.m_o2c, geo.m_c2o):
        assert m.shape == (3, 3) and m.dtype == np.float32
        np.testing.assert_array_equal(m[2], [0, 0, 1])
    np.testing.assert_allclose(geo.m_o2c @ geo.m_c2o, np.eye(3), atol=1e-5)
    # The crop centre maps to the geometry's centre in the original image.
    np.testing.assert_allclose(
        transform_points([[256.0, 256.0]], geo.m_c2o)[0], geo.center, atol=1e-3
    )
    np.testing.assert_allclose(invert_affine(geo.m_o2c), geo.m_c2o, atol=1e-4)


def test_scale_center_matrix_centres_the_point() -> None:
    m = scale_center_matrix((50.0, 80.0), 0.5, 192)
    np.testing.assert_allclose(
        transform_points([[50.0, 80.0], [52.0, 80.0]], m), [[96.0, 96.0], [97.0, 96.0]]
    )


# --- warps ----------------------------------------------------------------------------------------


def _random_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_warp_identity_and_integer_shift_with_black_border() -> None:
    img = _random_image(37, 53)
    np.testing.assert_array_equal(warp_affine(img, np.eye(3), (53, 37)), img)
    m = np.array([[1.0, 0.0, 4.0], [0.0, 1.0, -3.0]])  # 2x3 accepted too
    out = warp_affine(img, m, (53, 37))
    np.testing.assert_array_equal(out[:-3, 4:], img[3:, :-4])
    assert out[:, :4].max() == 0 and out[-3:].max() == 0
    # Only the region the destination reaches is read: offsets must still be exact.
    big = _random_image(300, 400, 5)
    window = warp_affine(big, np.array([[1.0, 0, -250], [0, 1.0, -100], [0, 0, 1]]), 64)
    np.testing.assert_array_equal(window, big[100:164, 250:314])
    outside = warp_affine(big, np.array([[1.0, 0, 5000], [0, 1.0, 0], [0, 0, 1]]), 16)
    assert outside.shape == (16, 16, 3) and outside.max() == 0


def test_warp_quarter_turn_is_exact() -> None:
    img = _random_image(32, 32, 1)
    # dst = R src about the centre (15.5, 15.5): x' = 31 - y, y' = x (a clockwise quarter turn).
    m = np.array([[0.0, -1.0, 31.0], [1.0, 0.0, 0.0]])
    np.testing.assert_array_equal(warp_affine(img, m, 32), np.rot90(img, -1))


def test_warp_half_pixel_is_the_neighbour_mean_and_batches_match() -> None:
    img = _random_image(20, 30, 2).astype(np.float32)
    m = np.array([[1.0, 0.0, -0.5], [0.0, 1.0, 0.0]])  # dst(x) = src(x + 0.5)
    out = warp_affine(img, m, (30, 20))
    np.testing.assert_allclose(out[:, :-1], (img[:, :-1] + img[:, 1:]) / 2, atol=1e-2)
    # Past the last column OpenCV's constant border blends in black: half the last pixel.
    np.testing.assert_allclose(out[:, -1], img[:, -1] / 2, atol=1e-2)
    batch = np.stack([img, img[::-1].copy()])
    mats = np.stack([np.eye(3), np.array([[2.0, 0, 1], [0, 2.0, 3], [0, 0, 1]])])
    both = warp_affine(batch, mats, (30, 20))
    assert both.shape == (2, 20, 30, 3)
    for i in range(2):
        np.testing.assert_allclose(both[i], warp_affine(batch[i], mats[i], (30, 20)), atol=1e-2)


def test_crop_image_of_a_drawn_face_puts_eyes_where_the_matrix_says() -> None:
    box = (150.0, 90.0, 330.0, 300.0)
    img = face_image((400, 480), [box])
    pts = _similarity(_in_box(template_203(), box), 0.0, 1.0, (0.0, 0.0))
    geo = crop_geometry(pts, 512, 2.3, -0.125)
    crop = crop_image(img, geo)
    assert crop.shape == (512, 512, 3) and crop.dtype == np.uint8
    lay = face_layout(box)
    for p in transform_points(lay["eyes"], geo.m_o2c):
        np.testing.assert_array_equal(crop[int(round(p[1])), int(round(p[0]))], FEATURE_RGB)
    x, y = transform_points([lay["center"]], geo.m_o2c)[0]
    np.testing.assert_array_equal(crop[int(round(y)), int(round(x))], SKIN_RGB)
    assert abs(x - 256) < 1.0  # horizontally centred on the face
    assert EYE_CENTRES[0][1] < MOUTH_CENTRE[1]


def test_resize_bilinear_matches_opencv_half_pixel_rule() -> None:
    img = _random_image(6, 8, 3).astype(np.float32)
    out = resize_bilinear(img, (12, 16))

    # OpenCV INTER_LINEAR: src = (dst + 0.5) / 2 - 0.5, clamped at the edges.
    def ref(d: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s = np.clip((np.arange(d) + 0.5) / 2 - 0.5, 0, n - 1)
        lo = np.floor(s).astype(int)
        hi = np.minimum(lo + 1, n - 1)
        return lo, hi, s - lo

    ylo, yhi, fy = ref(12, 6)
    xlo, xhi, fx = ref(16, 8)
    rows = img[ylo] * (1 - fy)[:, None, None] + img[yhi] * fy[:, None, None]
    want = rows[:, xlo] * (1 - fx)[None, :, None] + rows[:, xhi] * fx[None, :, None]
    np.testing.assert_allclose(out, want, atol=1e-4)
    assert resize_bilinear(_random_image(6, 8), (3, 4)).dtype == np.uint8


def test_area_downsample_is_the_rounded_block_mean() -> None:
    img = _random_image(8, 10, 4)
    out = area_downsample(img)
    sums = img.reshape(4, 2, 5, 2, 3).astype(np.int64).sum(axis=(1, 3))
    np.testing.assert_array_equal(out, (sums + 2) >> 2)  # OpenCV's INTER_AREA for a factor 2
    with pytest.raises(ValueError, match="multiples"):
        area_downsample(_random_image(5, 4))
