"""A video as the avatar: registration of every frame (tracking, per-frame crops and
features, Ditto's source smoothing), its cache, and its refusals — reduced extractors and the
ONNX face stand-ins on real MP4 files written by PyAV."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import drifting_face as conftest_drifting_face
from conftest import write_video

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from studio.avatar.register import (  # noqa: E402
    SOURCE_SMOOTH_FRAMES,
    register_avatar,
    smooth_source,
)
from studio.errors import InputError  # noqa: E402
from studio.fixtures.face_standins import face_image  # noqa: E402
from studio.models.checkpoints import discover  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HW = (240, 320)
BOX = (100.0, 40.0, 220.0, 190.0)  # the face in frame 0; it drifts right 1 px a frame


def drifting_face(n: int, step: float = 1.0, hw: tuple[int, int] = HW) -> list[np.ndarray]:
    return conftest_drifting_face(n, BOX, hw, step)


@pytest.fixture(scope="module")
def tree(registration_tree: Path) -> Path:
    return registration_tree


@pytest.fixture(scope="module")
def registered(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("video_avatar")
    video = write_video(d / "talk.mp4", drifting_face(30))
    stages: list[tuple[str, int, int]] = []
    avatar = register_avatar(
        video, discover(tree), cache_dir=d / "cache", progress=lambda *a: stages.append(a)
    )
    return {"avatar": avatar, "video": video, "cache": d / "cache", "stages": stages}


def test_every_frame_gets_its_crop_features_and_keypoints(registered: dict) -> None:
    a = registered["avatar"]
    assert a.is_video and a.num_frames == 30
    assert a.frames.shape == (30, *HW, 3)
    np.testing.assert_array_equal(a.image, a.frames[0])
    assert a.m_c2o.shape == (30, 3, 3)
    assert a.f_s.shape[0] == 30 and a.eye_open.shape == (30, 2) and a.eye_ball.shape == (30, 6)
    for v in a.x_s_info.values():
        assert v.shape[0] == 30
    # the tracked crop follows the face: its centre (crop pixel 256, 256 in the frame) moves
    # right one pixel a frame, as the drawn face does
    centre = a.m_c2o[:, :2, :] @ np.array([256.0, 256.0, 1.0])
    drift = np.diff(centre[:, 0])
    assert abs(drift.mean() - 1.0) < 0.1
    assert np.abs(centre[:, 1] - centre[0, 1]).max() < 1.5
    info = a.source_info()
    assert info["is_image_flag"] is False
    assert len(info["f_s_lst"]) == len(info["M_c2o_lst"]) == len(info["img_rgb_lst"]) == 30
    assert any("tracking the face" in s for s, _, _ in registered["stages"])


def test_keypoints_are_box_smoothed_and_sc_is_frame_0_before_smoothing(
    registered: dict, tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from studio.avatar import register as reg

    seen = []

    def spy(info, window):
        seen.append(({k: v.copy() for k, v in info.items()}, window))
        return smooth_source(info, window)

    monkeypatch.setattr(reg, "smooth_source", spy)
    a = register_avatar(registered["video"], discover(tree), cache_dir=tmp_path / "cache")
    (raw, window), = seen
    assert window == SOURCE_SMOOTH_FRAMES == 13
    for k, v in smooth_source(raw, window).items():
        np.testing.assert_array_equal(a.x_s_info[k], v)
    np.testing.assert_array_equal(a.sc, raw["kp"][:1])  # before smoothing
    assert not np.array_equal(a.sc, a.x_s_info["kp"][:1])
    # the per-frame jitter of the extractors is averaged out
    jitter = {k: np.abs(np.diff(v, axis=0)).mean() for k, v in raw.items()}
    for k, v in a.x_s_info.items():
        assert np.abs(np.diff(v, axis=0)).mean() < jitter[k]


def test_smoothing_is_a_centred_box_cut_at_the_ends() -> None:
    x = np.arange(10, dtype=np.float32)[:, None] ** 2
    out = smooth_source({"exp": x}, 5)["exp"][:, 0]
    expect = [np.mean(x[max(0, i - 2) : i + 3]) for i in range(10)]
    np.testing.assert_allclose(out, expect, rtol=1e-6)
    one = {"exp": np.ones((1, 63), np.float32)}
    assert smooth_source(one, 13)["exp"] is one["exp"]


def test_the_cache_reopens_the_video_without_running_a_model(registered: dict, tree) -> None:
    again = register_avatar(registered["video"], discover(tree), cache_dir=registered["cache"])
    a = registered["avatar"]
    assert again.cached and again.is_video
    np.testing.assert_array_equal(again.frames, a.frames)
    np.testing.assert_array_equal(again.f_s, a.f_s)
    np.testing.assert_array_equal(again.m_c2o, a.m_c2o)
    for k, v in a.x_s_info.items():
        np.testing.assert_array_equal(again.x_s_info[k], v)
    # reopened from the folder path too (the GUI's and batch's registered avatar)
    from studio.avatar.folder import avatar_source

    source, cache = avatar_source(again.folder)
    assert Path(source) == registered["video"] and Path(cache) == registered["cache"]


def test_a_video_with_a_cut_is_refused(tree, tmp_path: Path) -> None:
    frames = drifting_face(15) + [
        face_image(HW, [(40.0, 30.0, 170.0, 200.0)], background=(20, 90, 160)) for _ in range(15)
    ]
    video = write_video(tmp_path / "two_shots.mp4", frames)
    with pytest.raises(InputError, match=r"two_shots.mp4 has a cut at 0.60 s \(frame 15\)"):
        register_avatar(video, discover(tree), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/meta.json"))


def test_a_video_whose_first_frame_has_no_face_is_refused(tree, tmp_path: Path) -> None:
    video = write_video(tmp_path / "wall.mp4", [face_image(HW, []) for _ in range(26)])
    with pytest.raises(InputError, match=r"no face found in the first frame of .*wall.mp4"):
        register_avatar(video, discover(tree), cache_dir=tmp_path / "cache")


def test_a_face_that_leaves_the_shot_is_lost_with_its_time(tree, tmp_path: Path) -> None:
    # a small face in a wide shot steps out of it at frame 12: too little of the picture
    # changes for a cut, but tracking loses the face (the detector checks every 5th frame)
    big = (360, 480)
    frames = drifting_face(12, hw=big) + [face_image(big, []) for _ in range(14)]
    video = write_video(tmp_path / "gone.mp4", frames)
    lost = r"the face in .*gone.mp4 is lost at 0.60 s \(frame 15: no face"
    with pytest.raises(InputError, match=lost):
        register_avatar(video, discover(tree), cache_dir=tmp_path / "cache")


def test_a_too_short_video_is_refused(tree, tmp_path: Path) -> None:
    video = write_video(tmp_path / "blink.mp4", drifting_face(10))
    with pytest.raises(InputError, match=r"blink.mp4 is 0.40 s long .*at least 1 s"):
        register_avatar(video, discover(tree), cache_dir=tmp_path / "cache")
