"""Motion-compensated in-betweens: the thin-plate warp, the renderer hook, the cadence bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from studio import layout
from studio.audio.io import load_audio
from studio.engines.base import Renderer, crossfade
from studio.engines.demo import demo_audio_path, rig
from studio.engines.demo.engine import DemoEngine
from studio.motion.cadence import (
    CadenceThresholds,
    blend_weights,
    bridgeable_gaps,
    keyframes_for,
    lid_displacement,
    warp_displacement,
)
from studio.render.inbetween import motion_inbetween, motion_inbetweens
from studio.render.pipeline import analyze, iter_frames
from studio.settings import RenderSettings


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10.0 * np.log10(255.0**2 / max(mse, 1e-10)))


def _pattern(size: int = 96) -> np.ndarray:
    """A smooth test image (a bilinear warp of it is accurate to well under a grey level)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    img = np.stack(
        [128 + 90 * np.sin(x / 9.0), 128 + 90 * np.cos(y / 11.0), 128 + 60 * np.sin((x + y) / 13)],
        axis=-1,
    )
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def _keypoints(size: int = 96) -> np.ndarray:
    rng = np.random.default_rng(3)
    return size * (0.3 + 0.4 * rng.random((21, 2)))


def test_identity_keypoints_give_the_image_back() -> None:
    img, kp = _pattern(), _keypoints()
    out = motion_inbetween(img, img, kp, kp, kp, 0.4)
    assert out.dtype == np.uint8 and out.shape == img.shape
    assert np.array_equal(out, img)


def test_a_pure_translation_moves_the_image() -> None:
    size = 96
    img, kp = _pattern(size), _keypoints(size)
    shift = np.array([3.0, -2.0])  # the in-between's keypoints sit 3 px right, 2 px up
    out = motion_inbetween(img, img, kp, kp, kp + shift, 0.0)
    # the centre of the picture (far from the pinned border) moved with the keypoints
    inner = slice(30, 66)
    moved = np.roll(img, (-2, 3), axis=(0, 1))
    assert np.abs(out[inner, inner].astype(int) - moved[inner, inner]).mean() < 4.0
    assert np.abs(out[inner, inner].astype(int) - img[inner, inner]).mean() > 8.0
    # the border is anchored
    assert np.abs(out[0].astype(int) - img[0]).max() <= 1


def test_base_renderer_cross_fades() -> None:
    a = np.zeros((8, 8, 3), np.uint8)
    b = np.full((8, 8, 3), 200, np.uint8)
    rows = np.zeros((3, layout.MOTION_DIM), np.float32)
    out = Renderer(8).inbetween(a, b, rows, 0.25, warp=motion_inbetweens)
    assert np.array_equal(out, crossfade(a, b, 0.25))


def test_demo_keypoints_are_where_the_face_is_drawn() -> None:
    renderer = DemoEngine().renderer(RenderSettings(size=128))
    rows = np.zeros((2, layout.MOTION_DIM), np.float32)
    kp = renderer.keypoints_2d(rows)
    assert kp.shape == (2, 81, 2)
    assert np.all((kp > 0) & (kp < 128))


def test_demo_correspondence_follows_the_jaw_and_pins_the_eye_corners() -> None:
    renderer = DemoEngine().renderer(RenderSettings(size=512))
    rows = np.zeros((3, layout.MOTION_DIM), np.float32)
    exp = layout.EXP.start
    rows[1, exp + rig.JAW * 3 + 1] = 0.06  # the jaw drops (a wide-open mouth)
    rows[1, exp + rig.LIP_LOWER * 3 + 1] = 0.10
    rows[2, exp + rig.LID_UPPER_L * 3 + 1] = 0.045  # the left eye shuts
    rows[2, [exp + rig.BROW_L * 3 + 1, exp + rig.BROW_R * 3 + 1]] = -0.03  # the brows go up
    kp = renderer.keypoints_2d(rows)
    outline, corners, fringe = slice(21, 29), slice(29, 33), slice(33, 38)
    assert np.array_equal(kp[2, fringe], kp[0, fringe])  # the brows move below the fringe
    assert np.all(np.diff(kp[0, fringe, 0]) > 0) and np.all(kp[0, fringe, 1] < kp[0, rig.BROW_L, 1])
    moved = kp[1, outline] - kp[0, outline]
    assert np.all(moved[[3, 4], 1] > 2.0)  # the jaw line beside the chin goes down with it
    assert np.all(np.abs(moved[[0, 7]]) < 0.5)  # the temples stay
    assert np.array_equal(kp[2, corners], kp[0, corners])  # a blink moves the lid only
    assert np.array_equal(kp[1, corners], kp[0, corners])
    # the outline points sit on the drawn head's edge: backdrop outside, face inside
    renderer.set_backdrop((0, 255, 0))
    image = renderer.render_batch(rows[:2])
    for k in range(2):
        centre = kp[k, rig.HEAD_CENTER]
        for q in kp[k, outline][2:6]:  # (the ears cover the outline beside them)
            out = q + 6.0 * (q - centre) / np.linalg.norm(q - centre)
            inside = q - 6.0 * (q - centre) / np.linalg.norm(q - centre)
            assert tuple(image[k, int(out[1]), int(out[0])]) == (0, 255, 0)
            assert image[k, int(inside[1]), int(inside[0]), 1] < 250


def test_demo_correspondence_pins_the_lips_and_teeth() -> None:
    """Five rows of points across the mouth: the upper lip's outer and inner edges, the
    upper teeth's edge, the lower lip's inner and outer edges; the lips and teeth drawn
    between them."""
    renderer = DemoEngine().renderer(RenderSettings(size=512))
    rows = np.zeros((2, layout.MOTION_DIM), np.float32)
    exp = layout.EXP.start
    rows[1, exp + rig.JAW * 3 + 1] = 0.06  # the mouth opens
    rows[1, exp + rig.LIP_LOWER * 3 + 1] = 0.10
    kp = renderer.keypoints_2d(rows)
    lips = kp[:, 38:63].reshape(2, 5, 5, 2)  # [frame, edge (top to bottom), across, (x, y)]
    assert np.all(np.diff(lips[1, :, :, 1], axis=0) > 1.0)  # open: the edges apart, in order
    np.testing.assert_allclose(lips[0, 1], lips[0, 3])  # shut: the inner edges meet
    assert np.all(np.diff(lips[0, 1, :, 0]) > 0)  # corner to corner
    image = renderer.render_batch(rows[1:]).astype(int)[0]
    centre = lips[1, :, 2]
    upper, teeth, lower = ((centre[a] + centre[a + 1]) / 2.0 for a in (0, 1, 3))
    at = lambda q: image[int(round(q[1])), int(round(q[0]))]  # noqa: E731
    assert np.all(at(teeth) > 220)  # white
    for q in (upper, lower):
        assert at(q)[0] - at(q)[1] > 60  # lip red


def test_demo_correspondence_puts_the_lids_where_they_are_drawn() -> None:
    """The lid keypoints and two points across each lid sit on the drawn lid edges: open,
    the eye shows between them and skin above; shut, the edges meet (the rig's blink)."""
    renderer = DemoEngine().renderer(RenderSettings(size=512))
    rows = np.zeros((2, layout.MOTION_DIM), np.float32)
    exp = layout.EXP.start
    rows[1, exp + rig.LID_UPPER_L * 3 + 1] = rig.BLINK_UPPER_LID  # the left eye shuts
    rows[1, exp + rig.LID_LOWER_L * 3 + 1] = rig.BLINK_LOWER_LID
    kp = renderer.keypoints_2d(rows)
    across = kp[:, 73:81].reshape(2, 2, 2, 2, 2)  # [frame, eye, (upper, lower), across, xy]
    image = renderer.render_batch(rows[:1]).astype(int)[0]
    at = lambda q: image[int(round(q[1])), int(round(q[0]))]  # noqa: E731
    for eye, (up, lo) in enumerate(
        ((rig.LID_UPPER_L, rig.LID_LOWER_L), (rig.LID_UPPER_R, rig.LID_LOWER_R))
    ):
        upper = np.concatenate([kp[0, up][None], across[0, eye, 0]])
        lower = np.concatenate([kp[0, lo][None], across[0, eye, 1]])
        assert np.all(lower[:, 1] - upper[:, 1] > 6.0)  # open
        for u, v in zip(upper, lower, strict=True):
            skin = at(u - np.array([0.0, 8.0]))
            assert np.abs(at((u + v) / 2.0) - skin).sum() > 60  # the eye, not skin
    shut = np.concatenate([kp[1, rig.LID_UPPER_L][None], across[1, 0, 0]])
    np.testing.assert_allclose(
        shut, np.concatenate([kp[1, rig.LID_LOWER_L][None], across[1, 0, 1]]), atol=1.0
    )
    np.testing.assert_array_equal(kp[1, rig.LID_UPPER_R], kp[0, rig.LID_UPPER_R])  # the right stays


THREES = np.full(12, 3)  # strides that allow a gap of three frames everywhere


def test_the_planner_renders_frames_the_warp_cannot_bridge() -> None:
    still = np.zeros((12, layout.MOTION_DIM), np.float32)
    assert np.all(warp_displacement(still[:-1], still[1:]) == 0.0)
    ok = bridgeable_gaps(still, 8.0)
    assert ok[:-3].all() and not ok[-1, 1:].any()  # no gap past the last frame
    assert keyframes_for(THREES, ok).tolist() == [0, 3, 6, 9, 11]
    moving = still.copy()
    lip = layout.EXP.start + layout.LIP_LOWER_KP * 3 + 1  # the lower lip's y
    moving[6:, lip] = 0.05  # a 12.8 px jump between frames 5 and 6 (512 frame)
    keys = keyframes_for(THREES, bridgeable_gaps(moving, 8.0))
    assert keys.tolist() == [0, 3, 5, 6, 9, 11]  # nothing is blended across the jump
    assert keyframes_for(THREES, bridgeable_gaps(moving, 16.0)).tolist() == [0, 3, 6, 9, 11]
    with pytest.raises(ValueError):
        CadenceThresholds(max_warp_px=0.0)


def test_the_planner_renders_a_blink_but_warps_eyes_that_move_together() -> None:
    still = np.zeros((12, layout.MOTION_DIM), np.float32)
    (up, low), _ = layout.EYE_LIDS_KP
    lid_y = layout.EXP.start + up * 3 + 1
    blink = still.copy()
    blink[6:, lid_y] = 0.012  # the upper lid drops 3.1 px between frames 5 and 6
    assert lid_displacement(blink[5:6], blink[6:7])[0] == pytest.approx(0.012 * 256, rel=1e-5)
    assert keyframes_for(THREES, bridgeable_gaps(blink, 16.0)).tolist() == [0, 3, 6, 9, 11]
    keys = keyframes_for(THREES, bridgeable_gaps(blink, 16.0, max_lid_px=2.0))
    assert keys.tolist() == [0, 3, 5, 6, 9, 11]
    # shut at frame 4 only: the gap 3..6 has open eyes at both ends, yet the blink is kept
    shut = still.copy()
    shut[4, lid_y] = 0.012
    keys = keyframes_for(THREES, bridgeable_gaps(shut, 16.0, max_lid_px=2.0))
    assert 4 in keys.tolist() and keys.tolist()[:3] == [0, 3, 4]
    both = still.copy()
    both[6:, [lid_y, layout.EXP.start + low * 3 + 1]] = 0.012  # the whole eye moves down
    assert np.all(lid_displacement(both[:-1], both[1:]) == 0.0)
    assert bridgeable_gaps(both, 16.0, max_lid_px=2.0)[:-3].all()
    turned = still.copy()
    turned[6:, layout.YAW.start + 50] = 10.0  # the head turns: no lid opens or closes
    assert np.abs(layout.pose_degrees(turned[5:6]) - layout.pose_degrees(turned[6:7])).max() > 5
    assert np.all(lid_displacement(turned[:-1], turned[1:]) == 0.0)


def _demo_clip(**bounds: float):
    """The demo speech at 256²: its motion (under the bounds given, else the defaults) and
    renderer."""
    engine = DemoEngine()
    settings = RenderSettings(size=256, cadence=CadenceThresholds(**bounds))
    return analyze(load_audio(demo_audio_path()), settings, engine), engine.renderer(settings)


def _inbetween_psnr(result, renderer: Renderer) -> np.ndarray:
    """PSNR of every in-between of iter_frames against a full render of its motion row."""
    frames = list(iter_frames(result, renderer))
    _, _, w = blend_weights(result.plan)
    inner = np.flatnonzero(w > 0)
    truth = DemoEngine().renderer(RenderSettings(size=256)).render_batch(result.smoothed[inner])
    return np.array([_psnr(frames[i], t) for i, t in zip(inner, truth, strict=True)])


class _NoKeypoints(Renderer):
    """The demo pictures from a renderer that cannot say where its keypoints are."""

    def __init__(self, inner: Renderer) -> None:
        super().__init__(inner.size)
        self.render_batch = inner.render_batch


def test_motion_compensated_inbetweens_beat_the_cross_fade() -> None:
    result, renderer = _demo_clip(max_warp_px=64.0, max_lid_px=64.0)  # the old plan
    assert result.plan.warp_forced == 0
    ours = _inbetween_psnr(result, renderer)
    theirs = _inbetween_psnr(result, _NoKeypoints(renderer))
    assert ours.mean() > theirs.mean() + 1.0
    assert np.percentile(ours, 5) > np.percentile(theirs, 5)


def test_the_bound_keeps_inbetweens_clean() -> None:
    result, renderer = _demo_clip()
    assert result.plan.warp_forced > 0 and result.plan.keyframes.size < result.num_frames
    ours = _inbetween_psnr(result, renderer)
    assert np.percentile(ours, 5) >= 38.0 and ours.mean() >= 46.0


def test_a_batch_equals_its_frames_one_by_one() -> None:
    img, kp = _pattern(), _keypoints()
    other = np.roll(img, 5, axis=1)
    shifted = kp + np.array([2.0, 1.0])
    batch = motion_inbetweens(
        np.stack([img, other]),
        np.stack([other, img]),
        np.stack([kp, shifted]),
        np.stack([shifted, kp]),
        np.stack([kp + 1.0, kp]),
        np.array([0.3, 0.7]),
    )
    assert np.array_equal(batch[0], motion_inbetween(img, other, kp, shifted, kp + 1.0, 0.3))
    assert np.array_equal(batch[1], motion_inbetween(other, img, shifted, kp, kp, 0.7))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_device_it_makes_the_hosts_frames() -> None:
    img, kp = _pattern(), _keypoints()
    other = np.roll(img, 5, axis=1)
    want = motion_inbetween(img, other, kp, kp + 2.0, kp + 1.0, 0.4)
    dev = torch.device("cuda")
    got = motion_inbetweens(
        torch.from_numpy(img[None]).to(dev),
        torch.from_numpy(other[None]).to(dev),
        torch.from_numpy(kp[None]).to(dev),
        torch.from_numpy(kp[None] + 2.0).to(dev),
        torch.from_numpy(kp[None] + 1.0).to(dev),
        torch.tensor([0.4]),
    )
    assert got.device.type == "cuda" and got.dtype == torch.uint8
    assert np.abs(got[0].cpu().numpy().astype(int) - want).max() <= 2
