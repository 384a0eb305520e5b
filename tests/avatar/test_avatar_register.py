"""Avatar registration end to end: reduced extractors, ONNX stand-ins, the on-disk cache."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from studio.avatar import register as reg  # noqa: E402
from studio.avatar.crop import area_downsample, invert_affine, transform_points  # noqa: E402
from studio.avatar.eyes import mediapipe_status  # noqa: E402
from studio.avatar.image import load_image  # noqa: E402
from studio.avatar.register import (  # noqa: E402
    MIN_FACE_PX,
    RegistrationSettings,
    register_avatar,
)
from studio.errors import InputError  # noqa: E402
from studio.fixtures.face_standins import (  # noqa: E402
    FEATURE_RGB,
    SKIN_RGB,
    build_det_standin,
    face_image,
    face_layout,
)
from studio.models.checkpoints import S_LMK203, discover  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BIG = (100.0, 80.0, 300.0, 320.0)
FACES = [BIG, (420.0, 200.0, 520.0, 320.0), (540.0, 60.0, 620.0, 150.0)]


def _encode(rgb: np.ndarray, codec: str = "png", pix_fmt: str = "rgb24") -> bytes:
    import av

    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt = rgb.shape[1], rgb.shape[0], pix_fmt
    src = "rgba" if rgb.shape[2] == 4 else "rgb24"
    frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format=src)
    if pix_fmt != src:
        frame = frame.reformat(format=pix_fmt)
    return b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])


def _png(path: Path, rgb: np.ndarray) -> Path:
    path.write_bytes(_encode(rgb, pix_fmt="rgba" if rgb.shape[2] == 4 else "rgb24"))
    return path


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.fixture(scope="module")
def tree(registration_tree: Path) -> Path:
    return registration_tree


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, tree: Path) -> dict:
    """One registration of a three-face image, shared by the read-only tests."""
    d = tmp_path_factory.mktemp("base")
    image = _png(d / "three faces.png", face_image((480, 640), FACES))
    calls: list[tuple[str, int, int]] = []
    t0 = time.perf_counter()
    avatar = register_avatar(
        image, discover(tree), cache_dir=d / "cache", progress=lambda *a: calls.append(a)
    )
    cold = time.perf_counter() - t0
    return {"avatar": avatar, "image": image, "cache": d / "cache", "cold_s": cold, "calls": calls}


def _copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst, ignore=lambda _d, names: [n for n in names if n in skip])
    return dst


# --- what registration produces ------------------------------------------------------------------


def test_avatar_holds_what_the_engine_needs(base: dict) -> None:
    a = base["avatar"]
    assert not a.cached
    assert a.image.shape == (480, 640, 3) and a.image.dtype == np.uint8
    assert a.crop.shape == (512, 512, 3) and a.crop.dtype == np.uint8
    assert a.m_c2o.shape == (3, 3) and a.m_c2o.dtype == np.float32
    shapes = {k: v.shape for k, v in a.x_s_info.items()}
    assert shapes == {
        "pitch": (1, 66),
        "yaw": (1, 66),
        "roll": (1, 66),
        "t": (1, 3),
        "exp": (1, 63),
        "scale": (1, 1),
        "kp": (1, 63),
    }
    assert all(v.dtype == np.float32 for v in a.x_s_info.values())
    assert a.f_s.shape == (1, 8, 4, 64, 64) and a.f_s.dtype == np.float32  # reduced network
    assert a.eye_open.shape == (1, 2) and a.eye_ball.shape == (1, 6)
    np.testing.assert_array_equal(a.sc, a.x_s_info["kp"])
    if mediapipe_status() is not None:
        assert a.eye_method == "landmark203 fallback (mediapipe not installed)"
        np.testing.assert_array_equal(a.eye_ball, np.zeros((1, 6), np.float32))
    assert a.notes == ["3 faces found; used the largest (200x240 px)"]
    assert _iou(a.face_box, np.asarray(BIG)) > 0.9


def test_crop_is_centred_on_the_largest_face(base: dict) -> None:
    a = base["avatar"]
    m_o2c = invert_affine(a.m_c2o)
    lay = face_layout(BIG)
    cx, cy = transform_points([lay["center"]], m_o2c)[0]
    assert abs(cx - 256) < 2.0
    # The 203 points span the face width, so the face is 512 / 2.3 px wide in the crop.
    left, right = transform_points([[BIG[0], lay["center"][1]], [BIG[2], lay["center"][1]]], m_o2c)
    assert right[0] - left[0] == pytest.approx(512 / 2.3, rel=0.03)
    # vy = -0.125 puts the crop centre above the face centre, at about eye height.
    assert 256 < cy < 256 + 0.2 * (right[0] - left[0])
    for x, y in transform_points(lay["eyes"], m_o2c):
        np.testing.assert_array_equal(a.crop[round(y), round(x)], FEATURE_RGB)
    np.testing.assert_array_equal(a.crop[round(cy), round(cx)], SKIN_RGB)


def test_extractors_see_the_area_resized_crop(base: dict, tree: Path) -> None:
    import torch

    from studio.models import load_network

    a = base["avatar"]
    x = torch.from_numpy(area_downsample(a.crop).astype(np.float32) / 255.0)
    x = x.permute(2, 0, 1)[None].contiguous()  # NCHW, as registration hands it over
    ckpt = tree / "ditto_pytorch" / "models"
    with torch.no_grad():
        heads = load_network("motion_extractor", ckpt / "motion_extractor.pth")(x)
        f_s = load_network("appearance_extractor", ckpt / "appearance_extractor.pth")(x)
    np.testing.assert_allclose(a.x_s_info["kp"], heads[-1].numpy(), atol=1e-6)
    np.testing.assert_allclose(a.x_s_info["pitch"], heads[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(a.f_s, f_s.numpy(), atol=1e-6)


def test_source_info_is_dittos_and_feeds_the_condition(base: dict) -> None:
    from studio.motion.condition import ConditionSource

    info = base["avatar"].source_info()
    assert set(info) == {
        "x_s_info_lst",
        "f_s_lst",
        "M_c2o_lst",
        "eye_open_lst",
        "eye_ball_lst",
        "sc",
        "is_image_flag",
        "img_rgb_lst",
    }
    assert info["is_image_flag"] is True and info["sc"].shape == (63,)
    src = ConditionSource.from_source_info(info)
    np.testing.assert_array_equal(src.eye_open, base["avatar"].eye_open)
    assert src.is_image


def test_cache_folder_and_progress(base: dict) -> None:
    a = base["avatar"]
    sha = hashlib.sha256(base["image"].read_bytes()).hexdigest()
    assert a.folder == base["cache"] / sha[:24]
    assert {p.name for p in a.folder.iterdir()} == {
        "arrays.npz",
        "image.npy",
        "crop.png",
        "meta.json",
    }
    meta = json.loads((a.folder / "meta.json").read_text())
    assert meta["format_version"] == reg.FORMAT_VERSION and meta["image_sha256"] == sha
    assert meta["settings"] == {
        "crop_scale": 2.3,
        "crop_vy_ratio": -0.125,
        "crop_rotate": True,
        "max_size": 1920,
        "eye_method": "landmark203" if mediapipe_status() else "mediapipe",
    }
    assert set(meta["models"]) >= {
        "insightface_det",
        "landmark106",
        "landmark203",
        "motion_extractor",
        "appearance_extractor",
    }
    for fp in meta["models"].values():
        assert fp["sha256"] == hashlib.sha256(Path(fp["path"]).read_bytes()).hexdigest()
    np.testing.assert_array_equal(load_image(a.folder / "crop.png"), a.crop)
    done = [c[1] for c in base["calls"]]
    assert done == list(range(len(done))) and done[-1] == base["calls"][-1][2] == 7
    # one stage for people, the step as its detail: "registering avatar: face detection"
    stages = [c[0] for c in base["calls"]]
    assert stages[0] == reg.STAGE == "registering avatar"
    assert all(s.startswith("registering avatar: ") for s in stages[1:])
    assert "registering avatar: face detection" in stages


# --- the cache -----------------------------------------------------------------------------------


def test_reopening_runs_no_model(
    base: dict, tree: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def boom(*_a, **_k):
        raise AssertionError("a model ran while reopening a cached avatar")

    for name in ("FaceDetector", "Landmark106", "Landmark203"):
        monkeypatch.setattr(reg, name, boom)
    monkeypatch.setattr(reg, "_network", boom)
    again = register_avatar(base["image"], discover(tree), cache_dir=base["cache"])
    assert again.cached  # and no model ran (they raise above)
    first = base["avatar"]
    np.testing.assert_array_equal(again.f_s, first.f_s)
    np.testing.assert_array_equal(again.image, first.image)
    np.testing.assert_array_equal(again.m_c2o, first.m_c2o)
    for k, v in first.x_s_info.items():
        np.testing.assert_array_equal(again.x_s_info[k], v)
    assert again.eye_method == first.eye_method and again.notes == first.notes
    # Without the aux models the cache still opens (they are only needed to rebuild).
    bare = _copy_tree(tree, tmp_path / "bare", skip=("aux_models",))
    opened = register_avatar(base["image"], discover(bare), cache_dir=base["cache"])
    assert opened.cached
    assert opened.notes[-1] == (
        "loaded from the cache; det_10g.onnx, 2d106det.onnx, landmark203.onnx missing now"
    )


def test_stale_caches_are_rebuilt(tree: Path, tmp_path: Path) -> None:
    own = _copy_tree(tree, tmp_path / "tree")
    ckpt = discover(own)
    cache = tmp_path / "cache"
    image = _png(tmp_path / "me.png", face_image((300, 360), [(80, 40, 260, 260)]))
    first = register_avatar(image, ckpt, cache_dir=cache)
    assert not first.cached
    assert register_avatar(image, ckpt, cache_dir=cache).cached
    # Other settings: rebuilt into the same folder.
    wide = register_avatar(
        image, ckpt, cache_dir=cache, settings=RegistrationSettings(crop_scale=2.0)
    )
    assert not wide.cached and wide.folder == first.folder
    assert wide.m_c2o[0, 0] == pytest.approx(first.m_c2o[0, 0] * 2.0 / 2.3, rel=1e-4)
    assert register_avatar(
        image, ckpt, cache_dir=cache, settings=RegistrationSettings(crop_scale=2.0)
    ).cached
    # Framing moved sideways: registered again, the crop's centre moved right by vx * side.
    side = RegistrationSettings(crop_vx_ratio=0.1)
    shifted = register_avatar(image, ckpt, cache_dir=cache, settings=side)
    assert not shifted.cached
    moved_px = shifted.m_c2o[0, 2] - first.m_c2o[0, 2]
    assert moved_px == pytest.approx(0.1 * first.m_c2o[0, 0] * 512, rel=1e-3)
    assert "crop_vx_ratio" not in RegistrationSettings().to_dict()  # old caches stay valid
    # A changed model file (same name, other bytes).
    build_det_standin(own / "ditto_pytorch" / "aux_models" / "det_10g.onnx", side=2048)
    ckpt = discover(own)
    assert not register_avatar(image, ckpt, cache_dir=cache).cached
    assert register_avatar(image, ckpt, cache_dir=cache).cached
    assert not register_avatar(image, ckpt, cache_dir=cache, refresh=True).cached
    # A changed image under the same name: another hash, another folder.
    _png(image, face_image((300, 360), [(100, 40, 280, 260)]))
    moved = register_avatar(image, ckpt, cache_dir=cache)
    assert not moved.cached and moved.folder != first.folder
    assert moved.face_box[0] > first.face_box[0] + 15


def test_cache_writes_are_atomic(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = discover(tree)
    cache = tmp_path / "cache"
    image = _png(tmp_path / "me.png", face_image((300, 360), [(80, 40, 260, 260)]))

    def crash(_rgb):
        raise RuntimeError("disk full")

    with monkeypatch.context() as mp:
        mp.setattr(reg, "_png_bytes", crash)
        with pytest.raises(RuntimeError, match="disk full"):
            register_avatar(image, ckpt, cache_dir=cache)
    assert list(cache.iterdir()) == []  # neither a folder nor a partial one
    good = register_avatar(image, ckpt, cache_dir=cache)
    with monkeypatch.context() as mp:
        mp.setattr(reg, "_png_bytes", crash)
        with pytest.raises(RuntimeError):
            register_avatar(image, ckpt, cache_dir=cache, refresh=True)
    assert [p.name for p in cache.iterdir()] == [good.folder.name]
    assert register_avatar(image, ckpt, cache_dir=cache).cached


def test_default_cache_dir_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(reg.CACHE_ENV, str(tmp_path / "c"))
    assert reg.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(reg.CACHE_ENV)
    monkeypatch.delenv("STUDIO_CACHE_DIR")  # the test session's own root (conftest)
    assert reg.default_cache_dir().parts[-2:] == ("talkinghead-studio", "avatars")


# --- inputs and errors ---------------------------------------------------------------------------


def test_alpha_is_dropped_and_sides_become_even(tree: Path, tmp_path: Path) -> None:
    rgb = face_image((301, 401), [(80, 40, 260, 260)])
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 90, np.uint8)])
    a = register_avatar(_png(tmp_path / "alpha.png", rgba), discover(tree), cache_dir=tmp_path)
    assert a.image.shape == (300, 400, 3)
    assert _iou(a.face_box, np.array([80, 40, 260, 260])) > 0.9
    assert a.notes == []


def test_large_images_are_resized_to_max_size(tree: Path, tmp_path: Path) -> None:
    image = _png(tmp_path / "big.png", face_image((480, 640), [BIG]))
    a = register_avatar(
        image, discover(tree), cache_dir=tmp_path / "c", settings=RegistrationSettings(max_size=400)
    )
    assert a.image.shape == (300, 400, 3)
    assert a.notes == ["image resized from 640x480 to 400x300 px (max side 400)"]
    assert _iou(a.face_box, np.asarray(BIG) * 400 / 640) > 0.9


def test_an_animation_registers_its_first_frame_with_a_note(tree: Path, tmp_path: Path) -> None:
    from PIL import Image

    face = Image.fromarray(face_image((300, 360), [(80, 40, 260, 260)]))
    wall = Image.fromarray(face_image((300, 360), []))
    path = tmp_path / "waving.png"  # an APNG: lossless, so the drawn colours stay exact
    face.save(path, save_all=True, append_images=[wall])
    a = register_avatar(path, discover(tree), cache_dir=tmp_path / "cache")
    assert a.notes == ["the image is an animation: its first frame is used"]
    assert _iou(a.face_box, np.array([80, 40, 260, 260])) > 0.9
    assert register_avatar(path, discover(tree), cache_dir=tmp_path / "cache").notes == a.notes


def _video(path: Path) -> Path:
    import av

    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(
                np.full((64, 64, 3), 40 * i, np.uint8), format="rgb24"
            )
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def test_bad_inputs_get_clear_errors(tree: Path, tmp_path: Path) -> None:
    ckpt = discover(tree)

    def fails(path: Path, pattern: str) -> None:
        with pytest.raises(InputError, match=pattern):
            register_avatar(path, ckpt, cache_dir=tmp_path / "cache")

    fails(tmp_path / "absent.png", "absent.png does not exist")
    fails(tmp_path, "is a folder")
    (tmp_path / "empty.png").write_bytes(b"")
    fails(tmp_path / "empty.png", "empty.png is empty")
    (tmp_path / "notes.png").write_text("hello, this is text")
    fails(tmp_path / "notes.png", "notes.png is not an image")
    # FFmpeg opens this text as "tty" (ANSI art) video: still text, not a video
    (tmp_path / "notes.txt").write_text("Meeting notes\n\n- item one: to do\n- item two\n" * 30)
    fails(tmp_path / "notes.txt", r"notes.txt is not an image file \(PNG/JPEG/...\): it holds text")
    with pytest.raises(InputError) as e:
        register_avatar(tmp_path / "notes.txt", ckpt, cache_dir=tmp_path / "cache")
    assert "video" not in str(e.value)
    sound = tmp_path / "speech.wav"
    sf.write(str(sound), np.zeros(1600, np.float32), 16000)
    fails(sound, "speech.wav is not an image file .*it has no picture")
    video = _video(tmp_path / "clip.mp4")
    fails(video, r"clip.mp4 is [\d.]+ s long .*a video avatar needs at least 1 s")
    shutil.copy(video, tmp_path / "clip.png")
    fails(tmp_path / "clip.png", "a video avatar needs at least 1 s")
    fails(_png(tmp_path / "wall.png", face_image((200, 300), [])), "no face found in .*wall.png")
    tiny = _png(tmp_path / "tiny.png", face_image((240, 320), [(100, 60, 140, 108)]))
    with pytest.raises(
        InputError, match=rf"too small: \d+x\d+ px.* at least {MIN_FACE_PX} px"
    ) as e:
        register_avatar(tiny, ckpt, cache_dir=tmp_path / "cache")
    w, h = (int(v) for v in re.search(r"(\d+)x(\d+) px", str(e.value)).groups())
    assert abs(w - 40) <= 3 and abs(h - 48) <= 3  # the face drawn 40x48 px
    assert list((tmp_path / "cache").glob("*")) == []


def test_missing_aux_model_names_the_file_and_stage(tree: Path, tmp_path: Path) -> None:
    partial = _copy_tree(tree, tmp_path / "tree", skip=("landmark203.onnx",))
    image = _png(tmp_path / "me.png", face_image((300, 360), [(80, 40, 260, 260)]))
    with pytest.raises(InputError, match=f"landmark203.onnx is missing .*stage: {S_LMK203}"):
        register_avatar(image, discover(partial), cache_dir=tmp_path / "cache")


def test_a_broken_face_landmarker_task_falls_back_and_says_why(tmp_path):
    """Where mediapipe imports, an unreadable face_landmarker.task gives the 203 fallback."""
    pytest.importorskip("mediapipe", reason="mediapipe is optional and not installed here")
    from studio.avatar.eyes import METHOD_LMK203, eye_features

    task = tmp_path / "face_landmarker.task"
    task.write_bytes(b"not a task bundle")
    lmk = np.random.default_rng(0).uniform(100, 400, (203, 2)).astype(np.float32)
    feats = eye_features(np.zeros((512, 512, 3), np.uint8), lmk, task)
    assert feats.method == METHOD_LMK203 and "face_landmarker.task" in feats.description


def test_a_sliver_image_and_an_unusable_cache_are_clear_errors(tree: Path, tmp_path: Path) -> None:
    from studio.errors import OutputError

    thin = _png(tmp_path / "thin.png", np.full((200, 1, 3), 128, np.uint8))
    with pytest.raises(InputError, match=r"is 1x200 px: an avatar needs at least 16 px"):
        register_avatar(thin, discover(tree), cache_dir=tmp_path / "cache")
    image = _png(tmp_path / "me.png", face_image((300, 360), [(80, 40, 260, 260)]))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(OutputError, match="avatar cache .*cannot create it"):
        register_avatar(image, discover(tree), cache_dir=not_a_folder)
    if Path("/proc").is_dir():  # a folder that takes no files, even for root
        with pytest.raises(OutputError, match="avatar cache /proc: cannot write in /proc"):
            register_avatar(image, discover(tree), cache_dir="/proc")
