"""Behaviour of the procedural demo avatar: it shows what the motion says."""

from __future__ import annotations

import numpy as np
import pytest

from studio import layout
from studio.engines.demo import rig as rig
from studio.engines.demo.avatar import DemoAvatar
from studio.layout import MotionFrames


def _motion(
    opening: float = 0.0,
    rounding: float = 0.0,
    spread: float = 0.0,
    press: float = 0.0,
    blink: float = 0.0,
    brow: float = 0.0,
    gaze: tuple[float, float] = (0.0, 0.0),
    pitch: float = 0.0,
    yaw: float = 0.0,
    roll: float = 0.0,
    t: tuple[float, float] = (0.0, 0.0),
    scale: float = 1.0,
) -> np.ndarray:
    """One [265] motion frame with the demo rig's expression offsets (as demo_motion writes)."""
    exp = np.zeros((1, layout.NUM_KP, 3), dtype=np.float32)
    e = exp[0]
    e[rig.LIP_LOWER, 1] += opening * rig.MOUTH_OPEN_LOWER_LIP - press * rig.LIP_PRESS
    e[rig.JAW, 1] += opening * rig.MOUTH_OPEN_JAW
    e[rig.LIP_UPPER, 1] += opening * rig.MOUTH_OPEN_UPPER_LIP + press * rig.LIP_PRESS
    e[rig.MOUTH_CORNER_L, 0] += rounding * rig.LIP_ROUND_X - spread * rig.LIP_SPREAD_X
    e[rig.MOUTH_CORNER_R, 0] -= rounding * rig.LIP_ROUND_X - spread * rig.LIP_SPREAD_X
    e[rig.MOUTH_CORNER_L, 1] += spread * rig.LIP_SPREAD_Y
    e[rig.MOUTH_CORNER_R, 1] += spread * rig.LIP_SPREAD_Y
    e[rig.MOUTH_INNER, 2] += rounding * rig.LIP_ROUND_Z
    for lid in (rig.LID_UPPER_L, rig.LID_UPPER_R):
        e[lid, 1] += blink * rig.BLINK_UPPER_LID
    for lid in (rig.LID_LOWER_L, rig.LID_LOWER_R):
        e[lid, 1] += blink * rig.BLINK_LOWER_LID
    for b in (rig.BROW_L, rig.BROW_R):
        e[b, 1] -= brow * rig.BROW_RAISE
    e[rig.GAZE, :2] += np.asarray(gaze) * rig.GAZE_RANGE
    frames = MotionFrames(
        scale=np.array([scale], dtype=np.float32),
        pitch=np.array([pitch], dtype=np.float32),
        yaw=np.array([yaw], dtype=np.float32),
        roll=np.array([roll], dtype=np.float32),
        t=np.array([[t[0], t[1], 0.0]], dtype=np.float32),
        exp=exp,
    )
    return layout.pack(frames)[0]


def _px(v: float, size: int) -> float:
    """Keypoint coordinate in [-1, 1] -> pixel coordinate."""
    return (v * 0.5 + 0.5) * size


def _changed(a: np.ndarray, b: np.ndarray, level: int = 12) -> np.ndarray:
    """[H, W] mask of pixels whose colour differs by more than `level` in some channel."""
    return (np.abs(a.astype(np.int16) - b.astype(np.int16)) > level).any(axis=2)


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return int(ys.min()), int(ys.max()), int(xs.min()), int(xs.max())


@pytest.fixture(scope="module")
def avatar() -> DemoAvatar:
    return DemoAvatar(256)


@pytest.mark.parametrize("size", [256, 512])
def test_output_shape_and_dtype(size: int) -> None:
    img = DemoAvatar(size).render(_motion())
    assert img.shape == (size, size, 3)
    assert img.dtype == np.uint8
    # A portrait, not a flat fill: skin at the face's centre, many distinct colours.
    c = img[int(_px(0.0, size)), int(_px(0.0, size))].astype(int)
    assert c[0] > c[1] > c[2] and c[0] > 200
    assert len(np.unique(img.reshape(-1, 3), axis=0)) > 500


def test_deterministic_and_stateless(avatar: DemoAvatar) -> None:
    a = _motion(opening=0.6, yaw=12.0, blink=0.3)
    b = _motion(opening=0.1, pitch=-10.0, roll=8.0, t=(0.05, -0.03), scale=1.1)
    first = avatar.render(a)
    avatar.render(b)  # a different frame in between must leave no trace
    assert np.array_equal(avatar.render(a), first)
    assert np.array_equal(DemoAvatar(256).render(a), first)


def test_mouth_opening_changes_the_lower_middle_of_the_face(avatar: DemoAvatar) -> None:
    n = avatar.size
    closed = avatar.render(_motion())
    opened = avatar.render(_motion(opening=1.0))
    mask = _changed(closed, opened)
    assert mask.sum() > 0.002 * n * n
    y0, y1, x0, x1 = _bbox(mask)
    # Below the nose, within the face's width; nothing changes around the eyes.
    assert y0 > _px(rig.CANONICAL_KP[rig.NOSE, 1] + 0.03, n)
    assert _px(-0.36, n) < x0 and x1 < _px(0.36, n)
    assert y1 < _px(0.55, n)  # the chin drops with the jaw, the shoulders stay
    # The change centres on the mouth (around it: the chin's shading as the jaw drops).
    ys, xs = np.nonzero(mask)
    assert _px(-0.05, n) < xs.mean() < _px(0.05, n)
    assert _px(0.17, n) < ys.mean() < _px(0.33, n)
    # The open mouth is dark inside.
    inner = opened[int(_px(0.25, n)) - 1 : int(_px(0.25, n)) + 2, n // 2 - 1 : n // 2 + 2]
    assert inner.mean() < 0.6 * closed[int(_px(0.25, n)), n // 2].mean()


def test_mouth_shapes_differ_in_width(avatar: DemoAvatar) -> None:
    n = avatar.size
    base = avatar.render(_motion())
    width = {}
    for name, m in {"round": _motion(rounding=1.0), "spread": _motion(spread=1.0)}.items():
        mask = _changed(base, avatar.render(m), level=20)
        assert mask.any()
        width[name] = mask
    # Rounding pulls the corners in, spreading pushes them out: the changed pixels of
    # the spread mouth reach further out than the mouth's rest corners.
    corner = _px(rig.CANONICAL_KP[rig.MOUTH_CORNER_R, 0], n)
    assert _bbox(width["spread"])[3] > corner
    assert _bbox(width["round"])[3] <= corner + 2


def _eye_boxes(n: int) -> list[tuple[slice, slice]]:
    boxes = []
    for up, lo in ((rig.LID_UPPER_L, rig.LID_LOWER_L), (rig.LID_UPPER_R, rig.LID_LOWER_R)):
        cx = _px(rig.CANONICAL_KP[up, 0], n)
        cy = _px((rig.CANONICAL_KP[up, 1] + rig.CANONICAL_KP[lo, 1]) / 2, n)
        r = 0.1 * n / 2
        boxes.append((slice(int(cy - r), int(cy + r)), slice(int(cx - r), int(cx + r))))
    return boxes


def _white(img: np.ndarray) -> np.ndarray:
    """Eye-white pixels: bright and nearly grey (skin is bright but warm)."""
    c = img.astype(int)
    return (c.min(axis=2) > 225) & (c.max(axis=2) - c.min(axis=2) < 16)


def _iris(img: np.ndarray) -> np.ndarray:
    """Iris pixels: blue and not bright (the sky behind is bright)."""
    c = img.astype(int)
    return (c[..., 2] > c[..., 0] + 25) & (c[..., 2] >= c[..., 1]) & (c.max(axis=2) < 215)


def test_blink_closes_the_eyes(avatar: DemoAvatar) -> None:
    n = avatar.size
    open_ = avatar.render(_motion())
    shut = avatar.render(_motion(blink=1.0))
    for ys, xs in _eye_boxes(n):
        whites_open = _white(open_[ys, xs]).sum()
        assert whites_open > 20
        assert _white(shut[ys, xs]).sum() < 0.1 * whites_open
        # The iris is gone too.
        iris_open = _iris(open_[ys, xs]).sum()
        assert iris_open > 20
        assert _iris(shut[ys, xs]).sum() < 0.1 * iris_open
    # Only the eyes change.
    mask = _changed(open_, shut)
    y0, y1, _, _ = _bbox(mask)
    assert y0 > _px(-0.2, n) and y1 < _px(0.05, n)


def test_half_blink_is_in_between(avatar: DemoAvatar) -> None:
    ys, xs = _eye_boxes(avatar.size)[0]
    whites = [_white(avatar.render(_motion(blink=b))[ys, xs]).sum() for b in (0.0, 0.5, 1.0)]
    assert whites[0] > whites[1] > whites[2]


def _feature_centroid(img: np.ndarray) -> np.ndarray:
    """(x, y) centre of the irises, searched in the middle of the frame."""
    n = img.shape[0]
    y0, x0 = int(_px(-0.45, n)), int(_px(-0.5, n))
    ys, xs = np.nonzero(_iris(img[y0 : int(_px(0.3, n)), x0 : int(_px(0.5, n))]))
    assert xs.size > 20
    return np.array([xs.mean() + x0, ys.mean() + y0])


@pytest.mark.parametrize("yaw", [-20.0, 20.0])
def test_yaw_moves_the_face_sideways(avatar: DemoAvatar, yaw: float) -> None:
    n = avatar.size
    kp = layout.transform_keypoints(
        rig.CANONICAL_KP,
        np.zeros(1),
        np.array([yaw]),
        np.zeros(1),
        np.zeros((1, 3)),
        np.ones(1),
        np.zeros((1, layout.NUM_KP, 3)),
    )
    expected = np.sign(kp[0, rig.NOSE, 0])  # the transform moves the nose this way
    shift = _feature_centroid(avatar.render(_motion(yaw=yaw))) - _feature_centroid(
        avatar.render(_motion())
    )
    assert np.sign(shift[0]) == expected
    assert abs(shift[0]) > 0.03 * n
    assert abs(shift[1]) < abs(shift[0])


def test_pitch_moves_the_face_vertically(avatar: DemoAvatar) -> None:
    up = _feature_centroid(avatar.render(_motion(pitch=15.0)))
    down = _feature_centroid(avatar.render(_motion(pitch=-15.0)))
    # Positive pitch turns the face (z > 0 keypoints) towards -y in the transform.
    assert up[1] < down[1] - 0.02 * avatar.size


def test_roll_tilts_the_eyes(avatar: DemoAvatar) -> None:
    img = avatar.render(_motion(roll=15.0))
    mid = avatar.size // 2
    ys_l, _ = np.nonzero(_iris(img[:, :mid]))
    ys_r, _ = np.nonzero(_iris(img[:, mid:]))
    # Positive roll rotates x towards +y: the viewer's-right eye sits lower.
    assert ys_r.mean() > ys_l.mean() + 0.02 * avatar.size


def test_translation_and_scale_move_and_grow_the_head(avatar: DemoAvatar) -> None:
    n = avatar.size
    base = _feature_centroid(avatar.render(_motion()))
    moved = _feature_centroid(avatar.render(_motion(t=(0.1, 0.05))))
    np.testing.assert_allclose(moved - base, [0.1 * n / 2, 0.05 * n / 2], atol=0.01 * n)
    small = avatar.render(_motion(scale=0.8))
    big = avatar.render(_motion(scale=1.2))
    skin = [((img[..., 0].astype(int) - img[..., 2]) > 35).sum() for img in (small, big)]
    assert skin[1] > 1.5 * skin[0]


def test_render_batch_equals_render(avatar: DemoAvatar) -> None:
    motion = np.stack(
        [_motion(), _motion(opening=0.8, yaw=-15.0), _motion(blink=1.0, roll=-10.0, scale=0.9)]
    )
    batch = avatar.render_batch(motion)
    assert batch.shape == (3, avatar.size, avatar.size, 3) and batch.dtype == np.uint8
    for k in range(3):
        assert np.array_equal(batch[k], avatar.render(motion[k]))
    assert avatar.render_batch(np.zeros((0, layout.MOTION_DIM))).shape == (0, 256, 256, 3)


def test_sizes_draw_the_same_picture() -> None:
    m = _motion(opening=0.5, yaw=10.0)
    small = DemoAvatar(128).render(m).astype(np.float32)
    large = DemoAvatar(1024).render(m).astype(np.float32)
    pooled = large.reshape(128, 8, 128, 8, 3).mean(axis=(1, 3))
    assert np.abs(pooled - small).mean() < 4.0
    assert DemoAvatar(64).render(m).shape == (64, 64, 3)


@pytest.mark.parametrize(
    "call, shape",
    [
        ("render", (264,)),
        ("render", (1, 265)),
        ("render", ()),
        ("render_batch", (265,)),
        ("render_batch", (2, 264)),
        ("render_batch", (2, 265, 1)),
    ],
)
def test_wrong_motion_shape_is_rejected(avatar: DemoAvatar, call: str, shape: tuple) -> None:
    with pytest.raises(ValueError, match=r"265"):
        getattr(avatar, call)(np.zeros(shape, dtype=np.float32))


def test_non_finite_motion_is_rejected(avatar: DemoAvatar) -> None:
    m = _motion()
    m[layout.EXP.start] = np.nan
    with pytest.raises(ValueError, match="finite"):
        avatar.render(m)


@pytest.mark.parametrize("size", [63, 65, 32, 4096, 2.5])
def test_bad_size_is_rejected(size) -> None:
    with pytest.raises(ValueError, match="size"):
        DemoAvatar(size)
