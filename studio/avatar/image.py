"""Read a face photo into an RGB uint8 [H, W, 3] array, or refuse it with one clear line.

Pillow decodes every still format it knows (JPEG, PNG including 16-bit, palette and alpha,
WebP, TIFF, BMP, GIF, ...), as Ditto's OpenCV ``imread`` would give it to registration:

* alpha is dropped, not composited (``imread`` keeps the colour channels only); palettes are
  expanded; 16-bit samples are scaled to 8 bits; the EXIF orientation is applied
  (``ImageOps.exif_transpose``; an unreadable EXIF block leaves the image as stored);
* an animation (GIF, WebP, APNG with several frames) gives its first frame, and
  :func:`read_image` says so in its notes (registration keeps them with the avatar).

Refused, each with an :class:`~studio.errors.InputError` naming the file, what is wrong and
what to do: a missing file, a folder, a device or FIFO, an unreadable or empty file; videos
(by their first bytes, their suffix or the container FFmpeg finds); text, audio and anything
else that is not an image; more than :data:`MAX_PIXELS` pixels (checked from the header,
before decoding: decompression bombs); fewer than :data:`MIN_IMAGE_SIDE` px on a side or
:data:`MIN_FACE_PX` on the longer one (no room for a face registration can use); truncated or
damaged files; image formats Pillow does not read (FFmpeg names them; re-export as PNG/JPEG).

libtiff, which Pillow decodes compressed TIFFs with, prints its complaints on stderr; they are
silenced for the whole process on first use (Pillow still reports the failure itself), so a
damaged TIFF gives the one line and nothing else.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from studio.errors import InputError

__all__ = [
    "MAX_PIXELS",
    "MIN_FACE_PX",
    "MIN_IMAGE_SIDE",
    "Picture",
    "fit_size",
    "load_image",
    "read_image",
    "read_image_bytes",
]

MIN_FACE_PX = 64  # longer side of the detected face box, in pixels of the (resized) image
MIN_IMAGE_SIDE = 16  # thinner images are refused when read (the crop cannot resample them)
MAX_PIXELS = 100_000_000  # larger images are refused from their header, before decoding


@dataclass(frozen=True)
class Picture:
    """A decoded image: ``rgb`` [H, W, 3] uint8, and ``notes`` the user should know about."""

    rgb: np.ndarray
    notes: tuple[str, ...] = ()


def load_image(path: str | os.PathLike[str], data: bytes | None = None) -> np.ndarray:
    """RGB uint8 [H, W, 3] of an image file (see :func:`read_image`)."""
    return read_image(path, data).rgb


def read_image(path: str | os.PathLike[str], data: bytes | None = None) -> Picture:
    """Decode the image in ``path`` (whose bytes are ``data`` when already read).

    InputError naming the file for anything the module docstring lists as refused.
    """
    p = Path(path).expanduser()
    if data is None:
        data = read_image_bytes(p)
    video = _sniff_video(data)
    if video is not None:
        raise _video_error(p, video)
    _mute_libtiff()
    with warnings.catch_warnings():
        # Pillow warns above its own pixel limit (ours is checked below) and on palettes with
        # transparency (dropped on purpose).
        warnings.simplefilter("ignore")
        im = _open(p, data)
        _check_size(p, *im.size)
        rgb = _decode(p, im)
        animated = _is_animated(im)
    notes = ("the image is an animation: its first frame is used",) if animated else ()
    return Picture(rgb, notes)


def read_image_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an avatar image; InputError when it is missing, a folder, not a regular
    file (a device or FIFO would never end), unreadable or empty."""
    p = Path(path).expanduser()
    try:
        mode = p.stat().st_mode
        data = p.read_bytes() if stat.S_ISREG(mode) else b""
    except OSError as e:
        raise _unreadable(p, e) from None
    if stat.S_ISDIR(mode):
        raise InputError(f"avatar image {p} is a folder: point at an image file")
    if not stat.S_ISREG(mode):
        raise InputError(
            f"avatar image {p} is not a regular file (a device, FIFO or socket): "
            "point at an image file"
        )
    if not data:
        raise InputError(f"avatar image {p} is empty: export or copy the photo again")
    return data


def _unreadable(p: Path, e: OSError) -> InputError:
    if isinstance(e, FileNotFoundError):
        return InputError(f"avatar image {p} does not exist: check the path")
    fix = "check its permissions" if isinstance(e, PermissionError) else "copy it elsewhere"
    return InputError(f"cannot read avatar image {p} ({e.strerror or e}): {fix}")


def fit_size(h: int, w: int, max_size: int) -> tuple[int, int]:
    """Ditto's §5.1 size rule for an avatar's frames: the longer side down to ``max_size``
    (rounded), then both sides floored to even."""
    if max_size > 0 and max(h, w) > max_size:
        if h > w:
            h, w = max_size, int(round(w * max_size / h))
        else:
            h, w = int(round(h * max_size / w)), max_size
    return h - h % 2, w - w % 2


# --- steps of read_image --------------------------------------------------------------------------


def _reason(e: BaseException) -> str:
    """An exception's text on one short line."""
    return " ".join(str(e).split())[:120] or type(e).__name__


def _open(p: Path, data: bytes) -> Image.Image:
    """The image with its header read (nothing decoded yet)."""
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise _not_an_image(p, data) from None
    except Image.DecompressionBombError as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        raise _too_large(p, int(found.group(1)) if found else None) from None
    except Exception as e:  # noqa: BLE001 - a format's plugin raises many types on bad headers
        raise _damaged(p, e) from None


def _check_size(p: Path, w: int, h: int) -> None:
    """Refuse a decompression bomb or an image with no room for a face, from its header."""
    if w * h > MAX_PIXELS:
        raise _too_large(p, w * h, f"{w}x{h} px, ")
    if min(w, h) < MIN_IMAGE_SIDE or max(w, h) < MIN_FACE_PX:
        raise InputError(
            f"{p} is {w}x{h} px: an avatar needs at least {MIN_IMAGE_SIDE} px on each side and "
            f"{MIN_FACE_PX} px on the longer one (a photo with the face well visible)"
        )


def _decode(p: Path, im: Image.Image) -> np.ndarray:
    """The first frame as RGB uint8, EXIF orientation applied."""
    try:
        im.load()
    except MemoryError:
        w, h = im.size
        raise InputError(
            f"{p} ({w}x{h} px) does not fit in memory: resize it to a few megapixels"
        ) from None
    except Exception as e:  # noqa: BLE001 - decoders raise OSError, SyntaxError, ValueError, ...
        raise _damaged(p, e) from None
    try:
        upright = ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001 - a damaged EXIF block: keep the image as stored
        upright = im
    try:
        rgb = _to_rgb(upright)
    except Exception as e:  # noqa: BLE001 - a mode Pillow cannot convert, or damaged data
        raise InputError(
            f"{p} has pixels the studio cannot convert to RGB ({im.mode}: {_reason(e)}): "
            "re-export it as an 8-bit RGB PNG or JPEG"
        ) from None
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InputError(f"{p} decodes to {rgb.shape}: re-export it as an RGB PNG or JPEG")
    return rgb


def _to_rgb(im: Image.Image) -> np.ndarray:
    """RGB uint8 of a loaded image: alpha dropped, 16-bit grey scaled (Pillow would clip)."""
    if im.mode == "I" or im.mode.startswith("I;16"):
        wide = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        grey = ((wide * 255 + 32767) // 65535).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.array(im.convert("RGB"), dtype=np.uint8)


def _is_animated(im: Image.Image) -> bool:
    """Whether more frames follow the first (damage after the first frame counts as none)."""
    try:
        return bool(getattr(im, "is_animated", False))
    except Exception:  # noqa: BLE001 - the first frame decoded; later damage is not ours
        return False


@functools.cache
def _mute_libtiff() -> None:
    """Set libtiff's error and warning handlers (by default: print on stderr) to none."""
    try:
        from PIL import _imaging

        lib = ctypes.CDLL(_imaging.__file__)  # its symbols resolve to the libtiff Pillow uses
        for name in ("TIFFSetErrorHandler", "TIFFSetWarningHandler"):
            setter = getattr(lib, name)
            setter.restype, setter.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
            setter(None)
    except (OSError, AttributeError):  # a Pillow without libtiff, or linked statically
        pass


# --- what a file is when Pillow does not read it --------------------------------------------------

_VIDEO_MAGIC = (
    (4, b"ftyp", "MP4/MOV"),
    (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM"),
    (0, b"FLV", "FLV"),
    (0, b"\x00\x00\x01\xba", "MPEG-PS"),
    (0, b"\x00\x00\x01\xb3", "MPEG"),
)

# Files people mistake for a photo that FFmpeg still opens, and how to tell a real video:
# by its suffix or by the demuxer FFmpeg picked (text files open as "tty" ANSI art).
_VIDEO_SUFFIXES = frozenset(
    ".mp4 .m4v .mov .mkv .webm .avi .flv .wmv .mpg .mpeg .ts .mts .m2ts .3gp .ogv .y4m".split()
)
_VIDEO_FORMATS = frozenset(
    "mov mp4 matroska webm avi flv mpeg mpegts mpegvideo asf ogg h264 hevc m4v "
    "yuv4mpegpipe rm nut ivf 3gp".split()
)


# ISO-BMFF brands of still images (HEIF/AVIF photos share MP4's "ftyp" box).
_STILL_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"})


def _still_iso(data: bytes) -> bool:
    """A HEIF/AVIF photo: an MP4-style header whose brand is a still image's."""
    return data[4:8] == b"ftyp" and data[8:12] in _STILL_BRANDS


def _sniff_video(data: bytes) -> str | None:
    """The container of a video recognised by its first bytes (before anything decodes it;
    a HEIF/AVIF photo's MP4-style header is not a video)."""
    if _still_iso(data):
        return None
    for offset, magic, name in _VIDEO_MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "AVI"
    if not data.startswith(b"GIF") and all(data[i : i + 1] == b"\x47" for i in (0, 188, 376)):
        return "MPEG-TS"
    return None


def _looks_like_text(data: bytes) -> bool:
    """True for a file that is plain text (UTF-8, no NUL bytes in its first 4 kB)."""
    head = data[:4096]
    if not head or b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # a character cut at the 4 kB boundary
    return True


def _probe(p: Path) -> tuple[str, bool] | None:
    """(FFmpeg's container name, whether it holds a picture stream), None when FFmpeg cannot
    open the file either."""
    import av

    try:
        with av.open(str(p)) as container:
            return container.format.name, bool(container.streams.video)
    except Exception:  # noqa: BLE001 - PyAV/FFmpeg raise many types for bad data
        return None


def _not_an_image(p: Path, data: bytes) -> InputError:
    """The refusal of a file Pillow does not identify: an image format FFmpeg recognises by its
    content, then text, then what FFmpeg makes of the rest (sound, video, another format)."""
    fmt, has_picture = _probe(p) or ("", False)
    if has_picture and fmt.endswith("_pipe"):
        return _unsupported_image(p, fmt)
    if _looks_like_text(data):
        return _not_image_error(p, "it holds text")
    if not fmt:
        return _not_image_error(p, "its format is not recognised (a damaged file?)")
    if not has_picture:
        return _not_image_error(p, "it has no picture")
    if p.suffix.lower() in _VIDEO_SUFFIXES or set(fmt.split(",")) & _VIDEO_FORMATS:
        return _video_error(p, fmt)
    if fmt in ("image2", "gif", "apng", "webp"):
        return _unsupported_image(p, fmt)
    return _not_image_error(p, f"FFmpeg reads it as {fmt}")


# --- messages -------------------------------------------------------------------------------------


def _video_error(p: Path, kind: str) -> InputError:
    return InputError(
        f"{p} is a video ({kind}), not a photo: a still image (PNG or JPEG) of the face is "
        "needed here (the Ditto engine also takes a short video as the avatar)"
    )


def _not_image_error(p: Path, why: str) -> InputError:
    return InputError(f"{p} is not an image file (PNG/JPEG/...): {why}; use a photo of the face")


def _unsupported_image(p: Path, fmt: str) -> InputError:
    return InputError(
        f"{p} is damaged or an image format the studio does not read (FFmpeg sees {fmt}): "
        "re-export it as PNG or JPEG"
    )


def _damaged(p: Path, e: BaseException) -> InputError:
    return InputError(
        f"{p} is truncated or damaged ({_reason(e)}): export or download the photo again"
    )


def _too_large(p: Path, pixels: int | None, size: str = "") -> InputError:
    mp = f"{size}{pixels / 1e6:.0f} megapixels" if pixels else "too many pixels"
    return InputError(
        f"{p} is too large ({mp}; at most {MAX_PIXELS // 1_000_000} megapixels, which also "
        "guards against decompression bombs): resize it to a few megapixels"
    )
