"""Reading avatar images: the formats Pillow reads as Ditto's OpenCV would hand them on, and a
one-line InputError naming the file for everything else."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from studio.avatar.image import (
    MAX_PIXELS,
    MIN_FACE_PX,
    MIN_IMAGE_SIDE,
    load_image,
    read_image,
    read_image_bytes,
)
from studio.errors import InputError


def gradient(h: int = 72, w: int = 96) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x * y) % 256], axis=2).astype(np.uint8)


def saved(path: Path, image: Image.Image | np.ndarray, **kw) -> Path:
    """``image`` saved by Pillow to ``path`` (format from the suffix unless given)."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    image.save(path, **kw)
    return path


def refused(path: Path, pattern: str) -> str:
    """The InputError message for ``path``: one line, naming the file, matching ``pattern``."""
    with pytest.raises(InputError, match=pattern) as e:
        load_image(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


# --- formats --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "options"),
    [("png", {}), ("bmp", {}), ("tif", {"compression": "tiff_lzw"}), ("webp", {"lossless": True})],
)
def test_lossless_formats_read_exactly(tmp_path: Path, suffix: str, options: dict) -> None:
    rgb = gradient()
    out = load_image(saved(tmp_path / f"g.{suffix}", rgb, **options))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_jpeg_and_gif_read_as_pillow_decodes_them(tmp_path: Path) -> None:
    rgb = gradient()
    for name in ("g.jpg", "g.gif"):  # lossy: the pixels Pillow decodes
        path = saved(tmp_path / name, rgb)
        np.testing.assert_array_equal(load_image(path), np.asarray(Image.open(path).convert("RGB")))
    cmyk = saved(tmp_path / "cmyk.jpg", Image.fromarray(rgb).convert("CMYK"), quality=95)
    assert load_image(cmyk).shape == rgb.shape


def test_alpha_is_dropped_not_composited(tmp_path: Path) -> None:
    rgb = gradient()
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 90, np.uint8)])
    np.testing.assert_array_equal(load_image(saved(tmp_path / "a.png", rgba)), rgb)
    np.testing.assert_array_equal(load_image(saved(tmp_path / "a.webp", rgba, lossless=True)), rgb)
    la = Image.fromarray(rgba).convert("LA")
    grey = np.asarray(la)[..., 0]
    np.testing.assert_array_equal(load_image(saved(tmp_path / "la.png", la)), np.dstack([grey] * 3))


def test_palettes_are_expanded_and_their_transparency_dropped(tmp_path: Path) -> None:
    palette = Image.fromarray(gradient()).quantize(16)
    path = saved(tmp_path / "p.png", palette, transparency=0)
    assert Image.open(path).mode == "P"
    np.testing.assert_array_equal(load_image(path), np.asarray(palette.convert("RGB")))
    bilevel = saved(tmp_path / "bw.png", Image.fromarray(gradient()[..., 0] > 127))
    assert set(np.unique(load_image(bilevel))) == {0, 255}


def test_16_bit_samples_are_scaled_to_8(tmp_path: Path) -> None:
    levels = np.arange(72 * 96).reshape(72, 96) % 256
    grey16 = (levels * 257).astype(np.uint16)  # 8-bit level k is 16-bit k * 257
    path = saved(tmp_path / "g16.png", grey16)
    assert Image.open(path).mode == "I;16"
    np.testing.assert_array_equal(load_image(path), np.dstack([levels.astype(np.uint8)] * 3))
    rgb = gradient()
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = 96, 72, "rgb48be"
    frame = av.VideoFrame.from_ndarray(rgb.astype(np.uint16) * 257, format="rgb48le")
    data = b"".join(
        bytes(p) for p in [*ctx.encode(frame.reformat(format="rgb48be")), *ctx.encode(None)]
    )
    (tmp_path / "rgb16.png").write_bytes(data)
    np.testing.assert_array_equal(load_image(tmp_path / "rgb16.png"), rgb)


# --- EXIF orientation -----------------------------------------------------------------------------

# What each EXIF orientation does to the stored pixels (as OpenCV's imread applies it).
ORIENTED = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(ORIENTED))
@pytest.mark.parametrize("suffix", ["png", "webp"])
def test_exif_orientation_is_applied(tmp_path: Path, orientation: int, suffix: str) -> None:
    rgb = gradient()
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = saved(tmp_path / f"o.{suffix}", rgb, exif=exif.tobytes(), lossless=True)
    np.testing.assert_array_equal(load_image(path), ORIENTED[orientation](rgb))


def test_a_jpeg_exif_block_turns_the_photo_like_opencv_imread(tmp_path: Path) -> None:
    jpeg = saved(tmp_path / "plain.jpg", gradient(64, 96)).read_bytes()
    tiff = b"II*\x00\x08\x00\x00\x00\x01\x00" + b"\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00\x00\x00"
    tiff += b"\x00\x00\x00\x00"
    app1 = b"\xff\xe1" + (8 + len(tiff)).to_bytes(2, "big") + b"Exif\x00\x00" + tiff
    turned = tmp_path / "turned.jpg"
    turned.write_bytes(jpeg[:2] + app1 + jpeg[2:])
    np.testing.assert_array_equal(
        load_image(turned), np.rot90(load_image(tmp_path / "plain.jpg"), -1)
    )
    # a damaged EXIF block leaves the photo as stored
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(jpeg[:2] + app1[:10] + b"\xff" * (len(app1) - 10) + jpeg[2:])
    np.testing.assert_array_equal(load_image(broken), load_image(tmp_path / "plain.jpg"))


# --- animations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "options"), [("gif", {}), ("png", {}), ("webp", {"lossless": True})]
)
def test_an_animation_gives_its_first_frame_and_says_so(
    tmp_path: Path, suffix: str, options: dict
) -> None:
    frames = [Image.fromarray(np.full((72, 96, 3), v, np.uint8)) for v in (40, 200, 120)]
    path = tmp_path / f"anim.{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:], **options)
    picture = read_image(path)
    np.testing.assert_array_equal(picture.rgb, np.full((72, 96, 3), 40, np.uint8))
    assert picture.notes == ("the image is an animation: its first frame is used",)
    still = saved(tmp_path / f"still.{suffix}", frames[1], **options)
    assert read_image(still).notes == ()


# --- refusals -------------------------------------------------------------------------------------


def _png_header(w: int, h: int) -> bytes:
    """A PNG that declares w x h RGB pixels and holds almost none."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))


@pytest.mark.parametrize(("w", "h"), [(12_000, 9_000), (40_000, 40_000)])
def test_decompression_bombs_are_refused_from_the_header(tmp_path: Path, w: int, h: int) -> None:
    assert w * h > MAX_PIXELS
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_header(w, h))  # decoding it would report a truncated file instead
    msg = refused(path, "is too large .*megapixels.*resize it")
    assert f"at most {MAX_PIXELS // 1_000_000} megapixels" in msg
    if w * h < 2 * Image.MAX_IMAGE_PIXELS:  # below Pillow's own error: the size is ours to say
        assert f"{w}x{h} px" in msg


def test_truncated_and_damaged_files_are_refused(tmp_path: Path) -> None:
    for suffix in ("png", "jpg", "webp", "tif"):
        data = saved(tmp_path / f"whole.{suffix}", gradient()).read_bytes()
        cut = tmp_path / f"cut.{suffix}"
        cut.write_bytes(data[: len(data) * 2 // 3])
        refused(cut, "is truncated or damaged .*export or download the photo again")
    declared = tmp_path / "declared.png"
    declared.write_bytes(_png_header(640, 480))
    refused(declared, "is truncated or damaged")


def test_images_without_room_for_a_face_are_refused(tmp_path: Path) -> None:
    msg = refused(saved(tmp_path / "thin.png", np.zeros((200, 1, 3), np.uint8)), "is 1x200 px")
    assert f"at least {MIN_IMAGE_SIDE} px on each side and {MIN_FACE_PX} px" in msg
    refused(saved(tmp_path / "icon.png", np.zeros((40, 40, 3), np.uint8)), "is 40x40 px")
    side = np.zeros((MIN_IMAGE_SIDE, MIN_FACE_PX, 3), np.uint8)
    assert load_image(saved(tmp_path / "least.png", side)).shape == side.shape


def test_files_that_are_not_images_are_named_for_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("hello, this is text")
    refused(tmp_path / "notes.png", r"is not an image file \(PNG/JPEG/...\): it holds text")
    (tmp_path / "notes.txt").write_text("Meeting notes\n\n- item one: to do\n- item two\n" * 30)
    assert "video" not in refused(tmp_path / "notes.txt", "it holds text")
    sf.write(str(tmp_path / "speech.wav"), np.zeros(1600, np.float32), 16000)
    refused(tmp_path / "speech.wav", "is not an image file .*it has no picture")
    video = tmp_path / "clip.mp4"
    with av.open(str(video), "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=25, width=64, height=64, pix_fmt="yuv420p")
        black = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
        out.mux([*stream.encode(black), *stream.encode(None)])
    refused(video, r"clip.mp4 is a video \(MP4/MOV\), not a photo: a still image")
    (tmp_path / "clip.png").write_bytes(video.read_bytes())
    refused(tmp_path / "clip.png", "is a video")
    noise = np.random.default_rng(0).bytes(4096)
    (tmp_path / "noise.bin").write_bytes(noise)
    refused(tmp_path / "noise.bin", "is not an image file .*not recognised")
    (tmp_path / "noise.png").write_bytes(noise)  # named as an image: FFmpeg guesses by the name
    refused(tmp_path / "noise.png", "is damaged or an image format the studio does not read")
    ctx = av.CodecContext.create("dpx", "w")  # an image format FFmpeg reads and Pillow does not
    ctx.width, ctx.height, ctx.pix_fmt = 96, 72, "rgb24"
    frame = av.VideoFrame.from_ndarray(gradient(), format="rgb24")
    (tmp_path / "scan.dpx").write_bytes(
        b"".join(bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)])
    )
    refused(tmp_path / "scan.dpx", "image format the studio does not read .*re-export it as PNG")


def test_missing_odd_and_unreadable_files_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused(tmp_path / "absent.png", "absent.png does not exist: check the path")
    refused(tmp_path, "is a folder: point at an image file")
    (tmp_path / "empty.png").write_bytes(b"")
    refused(tmp_path / "empty.png", "empty.png is empty")
    if hasattr(os, "mkfifo"):  # reading a FIFO would wait for a writer forever
        os.mkfifo(tmp_path / "pipe.png")
        refused(tmp_path / "pipe.png", "is not a regular file")
    if Path("/dev/zero").exists():  # a device would never end
        with pytest.raises(InputError, match="/dev/zero is not a regular file"):
            read_image_bytes("/dev/zero")
    locked = saved(tmp_path / "locked.png", gradient())

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # chmod 000 does not stop root
    refused(locked, r"cannot read avatar image .*locked.png \(Permission denied\): check its perm")


def test_bytes_already_read_are_decoded_as_given(tmp_path: Path) -> None:
    data = saved(tmp_path / "g.png", gradient()).read_bytes()
    np.testing.assert_array_equal(load_image(tmp_path / "elsewhere.png", data), gradient())
    assert read_image_bytes(tmp_path / "g.png") == data
