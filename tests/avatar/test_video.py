"""Reading video avatars: frames resampled to 25 fps by their timestamps, resized and turned
upright, a one-line InputError naming the file for everything refused, and the cut detector."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from studio.avatar import video as video_module
from studio.avatar.video import (
    MIN_VIDEO_FRAMES,
    VIDEO_FPS,
    find_cut,
    is_video,
    read_video,
    video_sha256,
)
from studio.errors import InputError
from studio.fixtures.face_standins import face_image

H, W = 80, 96
LEVEL_STEP = 4  # frame i is painted grey level 4 * i (a marker that survives YUV rounding)


def write_video(
    path: Path,
    frames: Sequence[np.ndarray] | np.ndarray,
    fps: int = VIDEO_FPS,
    codec: str = "libx264",
    rotation: int | None = None,
    container_options: dict[str, str] | None = None,
) -> Path:
    """``frames`` (RGB uint8) encoded by PyAV at ``fps`` into ``path`` (nearly lossless)."""
    with av.open(str(path), "w", options=container_options or {}) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": "0"} if codec == "libx264" else {}
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def level_frames(n: int, h: int = H, w: int = W) -> np.ndarray:
    """``n`` flat grey frames whose level encodes their index."""
    return np.broadcast_to(
        (np.arange(n) * LEVEL_STEP).astype(np.uint8)[:, None, None, None], (n, h, w, 3)
    ).copy()


def decoded_index(frames: np.ndarray) -> np.ndarray:
    """The source index each output frame shows (the level at its centre)."""
    h, w = frames.shape[1:3]
    return np.rint(frames[:, h // 2, w // 2].mean(axis=1) / LEVEL_STEP).astype(int)


def moving_face(n: int, h: int = H, w: int = W, dx: float = 0.5, bg=(60, 110, 150)) -> np.ndarray:
    """A face drifting right by ``dx`` px per frame (and nodding a little)."""
    return np.stack(
        [
            face_image((h, w), [(20 + dx * i, 12 + 2 * np.sin(i / 6), 62 + dx * i, 66)], bg)
            for i in range(n)
        ]
    )


def one_line_error(call, *needles: str) -> str:
    with pytest.raises(InputError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    for needle in needles:
        assert needle in text, text
    return text


# --- resampling -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fps", "seconds"), [(30, 2), (24, 2), (50, 1)])
def test_frames_are_resampled_to_25_fps_by_timestamp(tmp_path, fps, seconds):
    n = fps * seconds
    path = write_video(tmp_path / f"v{fps}.mp4", level_frames(n), fps=fps)
    clip = read_video(path)
    assert clip.frames.shape == (VIDEO_FPS * seconds, H, W, 3)
    assert clip.frames.dtype == np.uint8
    assert clip.source_fps == pytest.approx(fps)
    assert clip.duration_s == pytest.approx(seconds, abs=0.05)
    assert clip.notes == ()
    k = np.arange(VIDEO_FPS * seconds)
    np.testing.assert_array_equal(decoded_index(clip.frames), k * fps // VIDEO_FPS)


def test_long_video_stops_at_max_frames_with_a_note(tmp_path):
    path = write_video(tmp_path / "long.mp4", level_frames(60, 32, 64), fps=20)
    clip = read_video(path, max_frames=MIN_VIDEO_FRAMES)
    assert clip.frames.shape == (25, 32, 64, 3)
    assert clip.duration_s == pytest.approx(3.0, abs=0.05)
    assert clip.notes == ("the video is 3.0 s long: its first 1.0 s are used",)
    np.testing.assert_array_equal(decoded_index(clip.frames), np.arange(25) * 20 // 25)


def test_webm_reads_and_frames_are_resized_with_a_note(tmp_path):
    if "libvpx-vp9" not in av.codecs_available:
        pytest.skip("no VP9 encoder in this FFmpeg")
    frames = moving_face(25)
    path = write_video(tmp_path / "face.webm", frames, codec="libvpx-vp9")
    clip = read_video(path, max_size=48)
    assert clip.frames.shape == (25, 40, 48, 3)
    assert clip.duration_s == pytest.approx(1.0, abs=0.05)
    assert any("resized from 96x80 to 48x40" in note for note in clip.notes)
    assert is_video(path)


def test_display_rotation_turns_frames_upright(tmp_path):
    frames = np.zeros((25, H, W, 3), np.uint8)
    frames[:, :16, :16] = (255, 0, 0)  # stored top-left
    path = write_video(tmp_path / "phone.mp4", frames, rotation=90)
    clip = read_video(path)
    assert clip.frames.shape == (25, W, H, 3)  # 90 degrees counter-clockwise: portrait
    first = clip.frames[0].astype(int)
    assert first[-8, 8, 0] > 200 and first[-8, 8, 1] < 60  # top-left went to bottom-left
    assert first[8, 8, 0] < 60
    assert any("rotation 90 degrees" in note for note in clip.notes)


# --- refusals -------------------------------------------------------------------------------------


def test_too_short_video_is_refused(tmp_path):
    path = write_video(tmp_path / "short.mp4", level_frames(10))
    one_line_error(
        lambda: read_video(path),
        str(path),
        "is 0.40 s long (10 frames at 25 fps): a video avatar needs at least 1 s",
        "use a longer clip or a photo",
    )


def test_audio_file_has_no_picture(tmp_path):
    path = tmp_path / "voice.wav"
    sf.write(path, np.zeros(16000, np.float32), 16000)
    one_line_error(lambda: read_video(path), str(path), "is not a video", "no picture")
    assert not is_video(path)


def test_truncated_mp4_is_one_error(tmp_path):
    whole = write_video(tmp_path / "whole.mp4", moving_face(50)).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(whole[: len(whole) // 2])  # the index (moov) at the end is lost
    one_line_error(lambda: read_video(cut), str(cut), "truncated", "export it again")

    front = write_video(
        tmp_path / "front.mp4", moving_face(75), container_options={"movflags": "faststart"}
    ).read_bytes()
    cut.write_bytes(front[: len(front) // 2])  # index first, half of the frames lost
    one_line_error(lambda: read_video(cut), str(cut), "truncated")


def test_files_that_are_not_videos(tmp_path):
    missing = tmp_path / "nope.mp4"
    one_line_error(lambda: read_video(missing), str(missing), "does not exist")
    one_line_error(lambda: read_video(tmp_path), str(tmp_path), "is a folder")
    empty = tmp_path / "empty.mp4"
    empty.touch()
    one_line_error(lambda: read_video(empty), str(empty), "is empty")
    text = tmp_path / "notes.mp4"
    text.write_text("not a video at all\n" * 20)
    one_line_error(lambda: read_video(text), str(text), "holds text")
    png = tmp_path / "still.png"
    Image.fromarray(face_image((H, W), [(20, 12, 62, 66)])).save(png)
    one_line_error(lambda: read_video(png), str(png), "still image")
    one_line_error(lambda: video_sha256(missing), str(missing), "does not exist")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    one_line_error(lambda: read_video(fifo), str(fifo), "not a regular file")
    assert not is_video(fifo)


def test_frame_size_limits(tmp_path, monkeypatch):
    tiny = write_video(tmp_path / "tiny.mp4", level_frames(25, 12, 48))
    one_line_error(lambda: read_video(tiny), "48x12 px frames", "at least 16 px")
    path = write_video(tmp_path / "big.mp4", level_frames(25))
    monkeypatch.setattr(video_module, "MAX_PIXELS", 1000)
    one_line_error(lambda: read_video(path), "96x80 px frames", "lower resolution")


def test_large_file_is_refused_before_decoding(tmp_path, monkeypatch):
    path = write_video(tmp_path / "v.mp4", level_frames(25))
    monkeypatch.setattr(video_module, "MAX_VIDEO_BYTES", 100)
    one_line_error(lambda: read_video(path), str(path), "GiB", "trim it")


# --- sniffing and hashing -------------------------------------------------------------------------


def test_is_video(tmp_path):
    assert is_video(write_video(tmp_path / "a.mp4", level_frames(5)))
    assert is_video(write_video(tmp_path / "a.mkv", level_frames(5)))
    png = tmp_path / "a.png"
    Image.fromarray(level_frames(1)[0]).save(png)
    wav = tmp_path / "a.wav"
    sf.write(wav, np.zeros(800, np.float32), 8000)
    text = tmp_path / "a.txt"
    text.write_text("hello\n")
    for path in (png, wav, text, tmp_path / "missing.mp4", tmp_path):
        assert not is_video(path), path


def test_video_sha256_streams_the_file(tmp_path):
    path = write_video(tmp_path / "a.mp4", level_frames(5))
    assert video_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# --- cuts -----------------------------------------------------------------------------------------


def test_no_cut_in_a_moving_face_a_pan_or_noise():
    assert find_cut(moving_face(100, dx=0.4)) is None
    assert find_cut(moving_face(30, dx=3.0)) is None  # fast but smooth
    wide = np.random.default_rng(0).integers(0, 256, (60, 140, 3), dtype=np.uint8)
    pan = np.stack([wide[:, i : i + W] for i in range(40)])
    assert find_cut(pan) is None
    noise = np.random.default_rng(1).integers(0, 256, (50, H, W, 3), dtype=np.uint8)
    assert find_cut(noise) is None
    face = moving_face(1)[0].astype(float)
    noisy = np.random.default_rng(2).normal(face, 6.0, (60, H, W, 3))
    assert find_cut(np.clip(noisy, 0, 255).astype(np.uint8)) is None
    assert find_cut(moving_face(1)) is None


def test_no_cut_in_lighting_changes_or_fades():
    face = moving_face(40).astype(float)
    gain = np.linspace(1.0, 0.4, 40)[:, None, None, None]  # the light dims over 1.6 s
    assert find_cut((face * gain).astype(np.uint8)) is None
    other = moving_face(40, bg=(150, 60, 40))[:, :, ::-1].astype(float)
    alpha = np.clip((np.arange(40) - 15) / 8, 0, 1)[:, None, None, None]  # 8-frame cross-fade
    assert find_cut((face * (1 - alpha) + other * alpha).astype(np.uint8)) is None
    to_black = np.clip((np.arange(40) - 30) / 5, 0, 1)[:, None, None, None]  # fade out, 5 frames
    assert find_cut((face * (1 - to_black)).astype(np.uint8)) is None


def test_hard_cut_is_found_at_its_frame(tmp_path):
    first = moving_face(37)
    second = np.stack(
        [
            face_image((H, W), [(40 - 0.5 * i, 20, 80 - 0.5 * i, 70)], (90, 160, 70))
            for i in range(23)
        ]
    )
    frames = np.concatenate([first, second])
    assert find_cut(frames) == 37
    assert find_cut(frames[30:]) == 7
    assert find_cut(np.concatenate([second[:5], first])) == 5
    clip = read_video(write_video(tmp_path / "cut.mp4", frames))
    assert find_cut(clip.frames) == 37


def test_find_cut_on_large_frames_pools_in_place():
    frames = np.zeros((20, 1080, 1920, 3), np.uint8)
    frames[12:] = 200
    assert find_cut(frames) == 12
