"""Exports for compositing: WebM (VP9 + Opus) and QuickTime (ProRes 4444 + PCM) with an alpha
channel, PNG sequences with the audio beside them, and the head over a keying colour."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from conftest import run_cli, write_speechlike

from studio.audio.io import load_audio
from studio.engines.base import straight_rgba
from studio.errors import Cancelled, OutputError
from studio.export.png_sequence import PngSequenceWriter
from studio.export.video import VideoWriter, check_output_path
from studio.export.writer import open_writer

H, W = 48, 64


def _rgba(i: int) -> np.ndarray:
    """A transparent frame with an opaque square whose green counts the frame."""
    f = np.zeros((H, W, 4), np.uint8)
    f[..., 0] = 200
    f[12:36, 16:48, 1] = 12 * i
    f[12:36, 16:48, 3] = 255
    return f


def _decoded_rgba(path: Path) -> list[np.ndarray]:
    """Every frame as RGBA (VP9's alpha needs libvpx's decoder: FFmpeg's own drops it)."""
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        if stream.codec_context.name != "vp9":
            return [f.to_ndarray(format="rgba") for f in c.decode(stream)]
        ctx = av.codec.CodecContext.create("libvpx-vp9", "r")
        frames = [f for p in c.demux(stream) if p.size for f in ctx.decode(p)]
        return [f.to_ndarray(format="rgba") for f in frames]


@pytest.mark.parametrize("suffix", [".webm", ".mov"])
def test_video_with_alpha_keeps_the_transparent_background(tmp_path: Path, suffix: str) -> None:
    audio = load_audio(write_speechlike(tmp_path / "s.wav", 0.8, sr=22050))
    path = tmp_path / f"a{suffix}"
    with VideoWriter(path, W, H, audio=audio, preset="ultrafast", alpha=True) as w:
        for i in range(20):
            w.write(_rgba(i))
    frames = _decoded_rgba(path)
    assert len(frames) == 20
    for i in (3, 19):
        alpha = frames[i][..., 3]
        assert alpha[:8].max() <= 2 and alpha[-6:].max() <= 2  # transparent where nothing is
        assert alpha[16:32, 20:44].min() >= 250  # opaque where the square is
        assert abs(int(frames[i][24, 32, 1]) - 12 * i) <= 8
    with av.open(str(path)) as c:
        a = c.streams.audio[0]
        assert a.codec_context.name in ({"opus", "libopus"} if suffix == ".webm" else {"pcm_s16le"})
        seconds = float(c.duration / av.time_base)
    assert abs(seconds - 0.8) < 0.1


def test_mp4_refuses_alpha_and_names_the_file_types_that_have_it(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"\.mp4 has no alpha.*\.webm.*\.mov.*\.png"):
        VideoWriter(tmp_path / "a.mp4", W, H, alpha=True)
    assert not list(tmp_path.iterdir())
    with pytest.raises(OutputError, match=r"must end in \.mp4, \.webm, \.mov or \.png"):
        check_output_path(tmp_path / "a.avi")


def test_a_png_sequence_is_a_folder_of_frames_and_the_audio(tmp_path: Path) -> None:
    audio = load_audio(write_speechlike(tmp_path / "s.wav", 0.5, sr=16000))
    target = tmp_path / "take.png"
    (tmp_path / "take").mkdir()
    for i in range(1, 10):  # an earlier, longer export: replaced whole, no frame of it left
        (tmp_path / "take" / f"take_{i:06d}.png").write_text("an earlier export")
    with open_writer(target, W, H, audio=audio, alpha=True) as w:
        assert isinstance(w, PngSequenceWriter)
        for i in range(5):
            w.write(_rgba(i))
        first = tmp_path / "take" / "take_000001.png"
        assert first.read_text() == "an earlier export"  # the new frames hidden until done
    names = sorted(p.name for p in (tmp_path / "take").iterdir())
    assert names == sorted([f"take_{i:06d}.png" for i in range(1, 6)] + ["take.wav"])
    with av.open(str(tmp_path / "take" / "take_000004.png")) as c:
        frame = next(c.decode(video=0))
        assert frame.format.name == "rgba"
        assert np.array_equal(frame.to_ndarray(format="rgba"), _rgba(3))  # lossless
    wav, rate = sf.read(tmp_path / "take" / "take.wav")
    assert rate == 16000 and len(wav) == 8000
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_cancelled_png_sequence_leaves_the_old_folder(tmp_path: Path) -> None:
    (tmp_path / "take").mkdir()
    (tmp_path / "take" / "take_000001.png").write_text("an earlier export")
    w = PngSequenceWriter(tmp_path / "take.png", W, H)
    with pytest.raises(Cancelled), w:
        w.write(_rgba(0)[..., :3])
        w.abort()
        w.write(_rgba(1)[..., :3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["take"]
    assert [p.name for p in (tmp_path / "take").iterdir()] == ["take_000001.png"]
    # what a file browser leaves, and another case of the names, are still an earlier export
    for name in (".DS_Store", "Thumbs.db", "Take_000002.png"):
        (tmp_path / "take" / name).write_text("x")
    check_output_path(tmp_path / "take.png")
    # a folder of anything else is not the sequence's to replace: refused, left as it is
    (tmp_path / "take" / "keep.txt").write_text("x")
    with pytest.raises(OutputError, match="holds 'keep.txt', not only an earlier PNG sequence"):
        PngSequenceWriter(tmp_path / "take.png", W, H)
    w = PngSequenceWriter(tmp_path / "other.png", W, H)
    with pytest.raises(OutputError, match="holds 'notes.txt'"), w:  # filled while it rendered
        w.write(_rgba(0)[..., :3])
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "notes.txt").write_text("x")
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "take"]
    with pytest.raises(OutputError, match="is a file"):
        (tmp_path / "clip").write_text("")
        check_output_path(tmp_path / "clip.png")


def test_straight_alpha_from_black_and_white_backdrops() -> None:
    rng = np.random.default_rng(0)
    colour = rng.integers(0, 256, (32, 32, 3)).astype(np.float64)
    alpha = rng.uniform(0, 1, (32, 32, 1))
    alpha[:4] = 0.0
    alpha[-4:] = 1.0
    black = np.rint(alpha * colour).astype(np.uint8)
    white = np.rint(alpha * colour + (1 - alpha) * 255).astype(np.uint8)
    rgba = straight_rgba(black, white)
    assert np.abs(rgba[..., 3].astype(int) - np.rint(alpha[..., 0] * 255)).max() <= 1
    assert (rgba[:4] == 0).all()
    assert np.array_equal(rgba[-4:, :, :3], colour[-4:].astype(np.uint8))
    firm = alpha[..., 0] > 0.5  # where the colour is well defined: within a few levels
    assert np.abs(rgba[..., :3][firm].astype(int) - colour[firm]).max() <= 3


def test_the_demo_head_on_transparent_and_green_backgrounds(tmp_path: Path, capsys) -> None:
    base = ["render", "--demo", "--size", "96", "--x264-preset", "ultrafast"]
    code, _, err = run_cli(
        [
            *base,
            "--background",
            "transparent",
            "--out",
            str(tmp_path / "t.webm"),
            "--report",
            str(tmp_path / "t.json"),
        ],
        capsys,
    )
    assert code == 0, err
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["background"] == "transparent" and report["codec"] == "vp9"
    frames = _decoded_rgba(tmp_path / "t.webm")
    assert len(frames) == report["frames"]
    alpha = frames[len(frames) // 2][..., 3]
    assert alpha[:10, :10].max() <= 2 and alpha[:10, -10:].max() <= 2  # the backdrop is gone
    assert alpha[40:56, 40:56].min() >= 250  # the face is there
    code, _, err = run_cli(
        [*base, "--background", "green", "--out", str(tmp_path / "g.mp4")], capsys
    )
    assert code == 0, err
    with av.open(str(tmp_path / "g.mp4")) as c:
        first = next(c.decode(video=0)).to_ndarray(format="rgb24")
    assert np.abs(first[:8, :8].astype(int) - (0, 177, 64)).max() <= 6  # chroma green
    assert np.abs(first[48, 48].astype(int) - (0, 177, 64)).max() > 60  # not on the face


def test_a_transparent_mp4_is_one_line_and_writes_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.mp4"
    argv = ["render", "--demo", "--size", "64", "--background", "transparent", "--out", str(out)]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "no alpha channel" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
