"""Loading and validating the input speech audio.

Everything downstream (the audio encoder, the motion model, the export) works on
float32 mono at ``layout.SAMPLE_RATE``; the export also keeps the audio as decoded,
at its own rate, so the AAC track is not degraded by a round trip through 16 kHz.

libsndfile is lenient with broken files (a WAV truncated inside its data chunk
reads silently as a shorter file), so the headers that declare a length (RIFF/RF64
'data' chunk, FLAC STREAMINFO) are parsed here and checked against the decoded data.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from studio.errors import InputError
from studio.layout import FPS, SAMPLE_RATE

MIN_DURATION_S = 0.5
SILENCE_PEAK = 1e-4  # -80 dBFS
RESAMPLE_WINDOW = ("kaiser", 8.0)  # less aliasing than resample_poly's default (5.0)
_MAX_REASON_CHARS = 120
_PROBE_BLOCK = 4096
_DECODE_ERRORS = (sf.SoundFileError, RuntimeError, ValueError, EOFError)


@dataclass(frozen=True, eq=False)
class Audio:
    """Validated speech audio.

    ``samples`` is float32 mono at ``SAMPLE_RATE`` clipped to [-1, 1] (the model input);
    ``original`` is float32 ``[n, channels]`` at ``original_rate`` as decoded (for the
    AAC track). ``eq=False``: arrays do not compare element-wise, so identity is used.
    """

    path: str | None
    samples: np.ndarray
    original: np.ndarray
    original_rate: int

    @property
    def duration_s(self) -> float:
        """Duration of ``samples`` in seconds."""
        return len(self.samples) / SAMPLE_RATE

    @property
    def num_frames(self) -> int:
        """Video frames needed to cover the audio: ceil(len * FPS / SAMPLE_RATE), exactly."""
        return -(-len(self.samples) * FPS // SAMPLE_RATE)


def load_audio(path: str | os.PathLike) -> Audio:
    """Decode any file libsndfile reads (by content, not extension) and validate it.

    Raises InputError with a one-sentence message naming the file when it is missing,
    unreadable, empty, not audio, corrupt, truncated, too short, silent or non-finite.
    """
    p = Path(path).expanduser()
    name = str(path)
    if not p.exists():
        raise InputError(f"Audio file '{name}' does not exist; check the path.")
    if p.is_dir():
        raise InputError(f"Audio path '{name}' is a directory; choose an audio file inside it.")
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise InputError(
                    f"Audio file '{name}' is empty (0 bytes); choose a file that contains audio."
                )
            flac_total = _check_header(fh, size, name)
    except PermissionError:
        raise InputError(
            f"Audio file '{name}' cannot be read (permission denied); check its permissions."
        ) from None
    except OSError as e:
        raise InputError(
            f"Audio file '{name}' cannot be read ({e.strerror or e}); check the file."
        ) from None

    try:
        with sf.SoundFile(str(p)) as f:
            rate = int(f.samplerate)
            data = f.read(dtype="float32", always_2d=True)
        decoded = len(data)
    except _DECODE_ERRORS as e:
        probe = _decodable_frames(p) if flac_total is not None else None
        if probe is None or probe[0] >= flac_total:
            raise InputError(
                f"Audio file '{name}' could not be decoded ({_reason(e)}); it is corrupt, "
                "truncated or not an audio format this app reads (WAV, FLAC, OGG, MP3)."
            ) from None
        decoded, rate = probe
    if flac_total is not None and decoded < flac_total:
        raise InputError(
            f"Audio file '{name}' is truncated: its FLAC header declares {flac_total / rate:.3f} s "
            f"of audio but only {decoded / rate:.3f} s could be decoded; re-export or re-copy it."
        )
    return _validated(data, rate, name, path=str(p))


def audio_from_array(samples: np.ndarray, rate: int, path: str | None = None) -> Audio:
    """Build an Audio from ``[n]`` or ``[n, channels]`` samples at ``rate`` Hz.

    Float input is taken as is; integer PCM is scaled to [-1, 1]. The same checks as
    ``load_audio`` apply (InputError naming ``path``, or "generated audio").
    """
    name = path if path is not None else "<generated audio>"
    rate_i = int(rate)
    if rate_i != rate or rate_i <= 0:
        raise InputError(f"Audio '{name}' has an invalid sample rate ({rate}); use a positive Hz.")
    data = _to_float32(np.asarray(samples))
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2:
        raise InputError(
            f"Audio '{name}' must be shaped [samples] or [samples, channels], "
            f"got {list(data.shape)}."
        )
    return _validated(np.ascontiguousarray(data), rate_i, name, path=path)


# --- internals ---------------------------------------------------------------


def _to_float32(x: np.ndarray) -> np.ndarray:
    """Integer PCM -> float in [-1, 1); floats are cast to float32."""
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32, copy=False)
    if x.dtype == np.uint8:
        return (x.astype(np.float32) - 128.0) / 128.0
    if np.issubdtype(x.dtype, np.signedinteger):
        return (x.astype(np.float64) / float(2 ** (8 * x.dtype.itemsize - 1))).astype(np.float32)
    raise InputError(f"Audio samples of type {x.dtype} are not supported; use float32 or int16.")


def _validated(data: np.ndarray, rate: int, name: str, path: str | None) -> Audio:
    """Check decoded ``[n, ch]`` float32 audio and derive the 16 kHz mono model input."""
    n = data.shape[0]
    if n == 0 or data.shape[1] == 0:
        raise InputError(f"Audio file '{name}' contains no audio; choose a file with speech in it.")
    if not np.isfinite(data).all():
        raise InputError(
            f"Audio file '{name}' contains NaN or infinite samples; re-export it as 16-bit PCM."
        )
    duration = n / rate
    if duration < MIN_DURATION_S:
        raise InputError(
            f"Audio file '{name}' is too short ({duration:.3f} s); "
            f"it must be at least {MIN_DURATION_S} s long."
        )
    if float(np.max(np.abs(data))) < SILENCE_PEAK:
        raise InputError(
            f"Audio file '{name}' is silent (peak below -80 dBFS); choose a recording with speech."
        )
    mono = data.mean(axis=1, dtype=np.float64) if data.shape[1] > 1 else data[:, 0]
    if rate != SAMPLE_RATE:
        ratio = Fraction(SAMPLE_RATE, rate)
        mono = resample_poly(
            np.asarray(mono, dtype=np.float64),
            ratio.numerator,
            ratio.denominator,
            window=RESAMPLE_WINDOW,
        )
    samples = np.clip(mono, -1.0, 1.0).astype(np.float32)
    return Audio(path=path, samples=samples, original=data, original_rate=rate)


def _decodable_frames(path: Path) -> tuple[int, int] | None:
    """(frames decodable before the first error, rate) by reading in blocks; None if unopenable."""
    count = 0
    try:
        with sf.SoundFile(str(path)) as f:
            rate = int(f.samplerate)
            try:
                while True:
                    block = f.read(_PROBE_BLOCK, dtype="float32", always_2d=True)
                    count += len(block)
                    if len(block) < _PROBE_BLOCK:
                        break
            except _DECODE_ERRORS:
                pass
    except _DECODE_ERRORS:
        return None
    return count, rate


def _reason(e: BaseException) -> str:
    """libsndfile's own short reason, without the 'Error opening <path>:' prefix."""
    text = getattr(e, "error_string", None) or str(e) or type(e).__name__
    text = " ".join(str(text).split()).rstrip(".")
    text = re.sub(r"^Error\s*:\s*", "", text)
    if "does not exist" in text or "not a regular file" in text:
        # libsndfile's words when no decoder takes the bytes of a file that does exist
        text = "no decoder recognises its contents"
    if len(text) > _MAX_REASON_CHARS:
        text = text[: _MAX_REASON_CHARS - 3] + "..."
    return text or type(e).__name__


def _check_header(fh: BinaryIO, size: int, name: str) -> int | None:
    """Raise InputError for a WAV whose 'data' chunk is cut short; return FLAC's total frames.

    The FLAC total (None when not declared) is compared with the decoded frames later.
    Headers we cannot parse are left to libsndfile to judge.
    """
    head = fh.read(12)
    if head[:4] in (b"RIFF", b"RIFX", b"RF64") and head[8:12] == b"WAVE":
        missing = _riff_truncation(fh, size, head[:4])
        if missing is not None:
            declared_s, present_s = missing
            raise InputError(
                f"Audio file '{name}' is truncated: its WAV header declares {declared_s:.3f} s "
                f"of audio but only {present_s:.3f} s is present; re-export or re-copy the file."
            )
        return None
    fh.seek(0)
    return _flac_total(fh)


def _riff_truncation(fh: BinaryIO, size: int, magic: bytes) -> tuple[float, float] | None:
    """Walk the RIFF chunks; (declared s, present s) when the 'data' chunk is cut short."""
    endian = ">" if magic == b"RIFX" else "<"
    byte_rate = 0
    ds64_data: int | None = None
    offset = 12
    while offset + 8 <= size:
        fh.seek(offset)
        cid, csize = struct.unpack(endian + "4sI", fh.read(8))
        body = offset + 8
        if cid == b"ds64" and csize >= 16:
            _, ds64_data = struct.unpack("<QQ", fh.read(16))
        elif cid == b"fmt " and csize >= 16:
            _, _, _, byte_rate = struct.unpack(endian + "HHII", fh.read(12))
        elif cid == b"data":
            declared = csize
            if magic == b"RF64" and csize == 0xFFFFFFFF and ds64_data is not None:
                declared = ds64_data
            if declared in (0, 0xFFFFFFFF):
                return None  # streaming writers leave the size open: nothing to check
            present = max(size - body, 0)
            if present >= declared:
                return None
            rate = byte_rate if byte_rate > 0 else 1
            return declared / rate, present / rate
        offset = body + csize + (csize & 1)
    return None


def _flac_total(fh: BinaryIO) -> int | None:
    """Total samples from FLAC STREAMINFO (after an optional ID3v2 tag); None if unknown."""
    head = fh.read(10)
    start = 0
    if head[:3] == b"ID3" and len(head) == 10:
        tag = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
        start = 10 + tag + (10 if head[5] & 0x10 else 0)
    fh.seek(start)
    block = fh.read(4 + 4 + 34)
    if len(block) < 42 or block[:4] != b"fLaC" or (block[4] & 0x7F) != 0:
        return None
    total = int.from_bytes(block[8 + 10 : 8 + 18], "big") & ((1 << 36) - 1)
    return total or None  # 0: the encoder did not know the length
