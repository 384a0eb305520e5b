"""MP4 export: real libx264/AAC encoding through PyAV, atomic commit and output-path checks."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf

from studio.audio.io import Audio, audio_from_array, load_audio
from studio.errors import Cancelled, InputError, OptionError, OutputError
from studio.export.video import VideoWriter, check_output_path
from studio.layout import FPS

W, H = 96, 64


def frames(n: int, width: int = W, height: int = H) -> np.ndarray:
    """A moving gradient with a bright square: [n, H, W, 3] uint8."""
    yy, xx = np.mgrid[0:height, 0:width]
    out = np.empty((n, height, width, 3), np.uint8)
    for i in range(n):
        out[i, ..., 0] = (xx * 2 + i * 5) % 256
        out[i, ..., 1] = yy * 3 % 256
        out[i, ..., 2] = 128
        out[i, 10:30, (i % 40) : (i % 40) + 20] = 255
    return out


def speech(seconds: float, rate: int, channels: int = 1) -> Audio:
    t = np.arange(round(seconds * rate)) / rate
    sig = 0.4 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
    return audio_from_array(np.repeat(sig[:, None], channels, axis=1).astype(np.float32), rate)


def probe(path: Path) -> dict:
    """Decode the file fully: stream facts plus counted video frames and audio samples."""
    with av.open(str(path)) as c:
        info: dict = {"streams": [s.type for s in c.streams]}
        v = c.streams.video[0]
        info.update(
            codec=v.codec_context.name,
            pix_fmt=v.codec_context.pix_fmt,
            rate=v.average_rate,
            size=(v.codec_context.width, v.codec_context.height),
        )
        if c.streams.audio:
            a = c.streams.audio[0]
            info.update(
                acodec=a.codec_context.name, arate=a.rate, achannels=a.codec_context.channels
            )
    with av.open(str(path)) as c:
        info["frames"] = sum(1 for _ in c.decode(video=0))
    if "acodec" in info:
        with av.open(str(path)) as c:
            info["asamples"] = sum(f.samples for f in c.decode(audio=0))
    return info


def test_round_trip_h264_aac(tmp_path):
    audio = speech(1.3, 44100, channels=2)
    target = tmp_path / "out.mp4"
    n = audio.num_frames
    with VideoWriter(target, W, H, audio=audio, preset="ultrafast") as w:
        w.write_many(frames(n))
    assert w.frames_written == n == 33 and w.encode_seconds > 0
    info = probe(target)
    assert info["streams"] == ["video", "audio"]
    assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert info["rate"] == FPS and info["size"] == (W, H) and info["frames"] == n
    assert info["acodec"] == "aac" and info["arate"] == 44100 and info["achannels"] == 2
    assert abs(info["asamples"] / 44100 - audio.duration_s) < 0.1
    assert os.listdir(tmp_path) == ["out.mp4"]


def test_default_settings_and_colours(tmp_path):
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [0, 0, 0]])
    img = np.repeat(np.repeat(colours[:, None, None, :], 32, 1), W, 2).reshape(-1, W, 3)
    img = np.ascontiguousarray(img[:H].astype(np.uint8))  # red and green bands
    with VideoWriter(tmp_path / "c.mp4", W, H) as w:  # crf 18, preset medium
        w.write_many([img] * 3)
    with av.open(str(tmp_path / "c.mp4")) as c:
        got = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert np.abs(got[8:24].astype(int) - [255, 0, 0]).max() <= 4
    assert np.abs(got[40:56].astype(int) - [0, 255, 0]).max() <= 4


@pytest.mark.parametrize(
    ("rate", "channels", "want_rate", "want_channels"),
    [(16000, 1, 16000, 1), (22000, 1, 48000, 1), (48000, 3, 48000, 1)],
)
def test_audio_track_rate_and_layout(tmp_path, rate, channels, want_rate, want_channels):
    audio = speech(0.8, rate, channels)
    with VideoWriter(tmp_path / "a.mp4", W, H, audio=audio, preset="ultrafast") as w:
        w.write_many(frames(5))  # audio longer than the video: all of it is still written
    info = probe(tmp_path / "a.mp4")
    assert info["arate"] == want_rate and info["achannels"] == want_channels
    assert abs(info["asamples"] / want_rate - 0.8) < 0.1
    assert info["frames"] == 5


def decoded_track(path: Path) -> np.ndarray:
    """The MP4's audio track decoded: [channels, n] float32."""
    with av.open(str(path)) as c:
        return np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)


@pytest.mark.parametrize(("rate", "channels"), [(48000, 2), (22000, 1), (44100, 3)])
def test_track_streamed_from_the_file_equals_the_track_from_memory(tmp_path, rate, channels):
    data = speech(2.5, rate, channels).original
    wav = tmp_path / "in.wav"
    sf.write(str(wav), data, rate, subtype="FLOAT")  # float: the file holds the array exactly
    tracks = []
    for name, audio in (("file", load_audio(wav)), ("array", audio_from_array(data, rate))):
        with VideoWriter(tmp_path / f"{name}.mp4", W, H, audio=audio, preset="ultrafast") as w:
            w.write_many(frames(7))  # most of the track is written at close
        tracks.append(decoded_track(tmp_path / f"{name}.mp4"))
    assert tracks[0].shape == tracks[1].shape and tracks[0].shape[1] > 2.4 * min(rate, 48000)
    np.testing.assert_array_equal(tracks[0], tracks[1])


def test_audio_file_changed_since_loading_is_refused_before_any_frame(tmp_path):
    wav = tmp_path / "speech.wav"
    sf.write(str(wav), speech(1.0, 44100).original, 44100)
    audio = load_audio(wav)
    sf.write(str(wav), speech(1.5, 44100).original, 44100)  # re-recorded meanwhile
    with pytest.raises(InputError, match="speech.wav' changed since it was loaded; open it again"):
        with VideoWriter(tmp_path / "o.mp4", W, H, audio=audio, preset="ultrafast") as w:
            w.write_many(frames(2))
    assert os.listdir(tmp_path) == ["speech.wav"]


def test_video_only(tmp_path):
    with VideoWriter(tmp_path / "v.mp4", W, H, preset="ultrafast") as w:
        for f in frames(4):
            w.write(f)
    info = probe(tmp_path / "v.mp4")
    assert info["streams"] == ["video"] and info["frames"] == 4


def test_exception_inside_with_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with VideoWriter(tmp_path / "x.mp4", W, H, audio=speech(1, 16000)) as w:
            w.write_many(frames(3))
            assert w.temp_path is not None and w.temp_path.exists()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_exception_keeps_existing_target(tmp_path):
    target = tmp_path / "keep.mp4"
    target.write_bytes(b"previous export")
    with pytest.raises(KeyboardInterrupt):
        with VideoWriter(target, W, H, preset="ultrafast") as w:
            w.write_many(frames(3))
            raise KeyboardInterrupt
    assert target.read_bytes() == b"previous export"
    assert os.listdir(tmp_path) == ["keep.mp4"]


def test_success_replaces_existing_target(tmp_path):
    target = tmp_path / "keep.mp4"
    target.write_bytes(b"previous export")
    with VideoWriter(target, W, H, preset="ultrafast") as w:
        w.write_many(frames(2))
    assert probe(target)["frames"] == 2
    assert os.listdir(tmp_path) == ["keep.mp4"]


def test_abort_leaves_nothing_and_cancels_later_writes(tmp_path):
    target = tmp_path / "keep.mp4"
    target.write_bytes(b"old")
    with pytest.raises(Cancelled):
        with VideoWriter(target, W, H, preset="ultrafast") as w:
            w.write_many(frames(3))
            w.abort()
            assert os.listdir(tmp_path) == ["keep.mp4"]
            w.write(frames(1)[0])
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["keep.mp4"]


def test_abort_then_normal_exit_writes_nothing(tmp_path):
    with VideoWriter(tmp_path / "a.mp4", W, H, preset="ultrafast") as w:
        w.write_many(frames(2))
        w.abort()
        w.abort()  # idempotent
    assert os.listdir(tmp_path) == []


def test_bad_frame_shape_raises_and_discards(tmp_path):
    with pytest.raises(ValueError, match="frame must be"):
        with VideoWriter(tmp_path / "s.mp4", W, H, preset="ultrafast") as w:
            w.write(np.zeros((H, W + 2, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        with VideoWriter(tmp_path / "s.mp4", W, H, preset="ultrafast") as w:
            w.write(np.zeros((H, W, 3), np.float32))
    assert os.listdir(tmp_path) == []


def test_no_frames_is_an_output_error(tmp_path):
    with pytest.raises(OutputError, match="No video frames"):
        with VideoWriter(tmp_path / "e.mp4", W, H):
            pass
    assert os.listdir(tmp_path) == []


def test_folder_removed_during_export_is_an_output_error(tmp_path):
    folder = tmp_path / "renders"
    folder.mkdir()
    with pytest.raises(OutputError, match="out.mp4"):
        with VideoWriter(folder / "out.mp4", W, H, preset="ultrafast") as w:
            w.write_many(frames(2))
            shutil.rmtree(folder)
    assert not folder.exists()


@pytest.mark.parametrize(("width", "height"), [(95, 64), (96, 63), (0, 64)])
def test_odd_or_empty_size_is_rejected(tmp_path, width, height):
    with pytest.raises(ValueError, match="even"):
        VideoWriter(tmp_path / "o.mp4", width, height)


def test_bad_options(tmp_path):
    with pytest.raises(OptionError, match="crf"):
        VideoWriter(tmp_path / "o.mp4", W, H, crf=60)
    with pytest.raises(OptionError, match="preset"):
        VideoWriter(tmp_path / "o.mp4", W, H, preset="warp")
    assert os.listdir(tmp_path) == []


# --- check_output_path ---------------------------------------------------------------


def test_check_output_path_ok(tmp_path):
    assert check_output_path(tmp_path / "a.MP4") == (tmp_path / "a.MP4").resolve()
    assert os.listdir(tmp_path) == []  # the writability probe cleans up


def test_check_output_path_missing_folder(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        check_output_path(tmp_path / "nope" / "a.mp4")


def test_check_output_path_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="not a folder"):
        check_output_path(tmp_path / "file" / "a.mp4")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only folders")
def test_check_output_path_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(OutputError, match="not writable"):
            check_output_path(folder / "a.mp4")
    finally:
        folder.chmod(0o755)


def test_check_output_path_directory(tmp_path):
    (tmp_path / "film.mp4").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        check_output_path(tmp_path / "film.mp4")


def test_check_output_path_suffix(tmp_path):
    with pytest.raises(OutputError, match=r"must end in \.mp4, \.webm, \.mov or \.png"):
        check_output_path(tmp_path / "a.avi")
    with pytest.raises(OutputError, match=r"\.mp4"):
        check_output_path(tmp_path / "a")
    assert check_output_path(tmp_path / "a.MOV") == tmp_path / "a.MOV"


def test_abort_from_another_thread(tmp_path):
    import threading

    errors: list[BaseException] = []
    started = threading.Event()
    w = VideoWriter(tmp_path / "t.mp4", W, H, preset="ultrafast")

    def render() -> None:
        try:
            with w:
                for f in frames(500):
                    w.write(f)
                    started.set()
        except BaseException as e:  # noqa: B036 - collected for the main thread
            errors.append(e)

    t = threading.Thread(target=render)
    t.start()
    assert started.wait(10)
    w.abort()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)
    assert w.frames_written < 100 and os.listdir(tmp_path) == []
