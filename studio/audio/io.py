"""Loading and validating the input speech audio.

Everything downstream (the audio encoder, the motion model, the export) works on
float32 mono at ``layout.SAMPLE_RATE``; the export also keeps the audio as decoded,
at its own rate, so the AAC track is not degraded by a round trip through 16 kHz.

The libraries made for it judge the files: libsndfile (python-soundfile) reads WAV,
RF64, FLAC, Ogg, AIFF, CAF, GSM 6.10 and the other formats it knows, and its header
log says when a file holds less than its header declares; FFmpeg (PyAV) decodes MP3
(libsndfile cuts a VBR MP3 without a Xing header to the length its first frame
suggests and its mpg123 prints notes on stderr; FFmpeg reads it whole, quietly, and
stops at a damaged frame) and everything libsndfile does not read: M4A/AAC, WebM,
Opus in MP4, MKV, and the audio track of a video. soxr resamples (HQ), as librosa,
Ditto's loader, does.

Reads are bounded: a declared length is checked against what the file's size can
hold before anything is allocated, the samples are decoded block by block into one
array, and a decoder that produces more than the size allows is stopped. Audio that
ends early or breaks off in the middle is refused with where it broke, never
silently shortened.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import av.error
import numpy as np
import soundfile as sf
import soxr

from studio.errors import InputError
from studio.layout import FPS, SAMPLE_RATE

MIN_DURATION_S = 0.5
SILENCE_PEAK = 1e-4  # -80 dBFS
RESAMPLE_QUALITY = "HQ"  # soxr's 20-bit quality, librosa's default
MIN_RATE, MAX_RATE = 1000, 768_000  # Hz: outside, the header is broken, not the recording
FORMATS = (
    "WAV, RF64, FLAC, Ogg Vorbis/Opus, MP3, AIFF, CAF, M4A/AAC, WebM, MKV, "
    "or a video with an audio track"
)
_BLOCK_SAMPLES = 1 << 13  # samples per read, all channels: where damage is found, to 0.2 s
_RESAMPLE_BLOCK = 1 << 18  # frames downmixed and resampled at a time
_MAX_FRAMES_PER_BYTE = 8192  # denser than any codec (FLAC constant subframes, Opus DTX)
_LIKELY_FRAMES_PER_BYTE = 64  # speech at 6 kb/s (Opus at 48 kHz); past it the buffer grows
_SHORTFALL_S = 0.1  # less missing than this is encoder padding or container rounding
_UNKNOWN_LENGTH = 2**63 - 1  # libsndfile's frame count when the header gives none
_HEAD_BYTES = 512
_MAX_REASON_CHARS = 120
# libsndfile error codes for "not mine" (Format not recognised, unsupported encoding,
# unimplemented format, WavPack data): FFmpeg gets a turn at the file.
_NOT_SNDFILE = frozenset({1, 4, 18, 78})
# Bits per sample of libsndfile's fixed-rate encodings; formats and encodings not listed
# are compressed and bounded by _MAX_FRAMES_PER_BYTE.
_COMPRESSED_FORMATS = frozenset({"FLAC", "OGG", "MP3"})
_PCM_BITS = {
    "PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32, "FLOAT": 32,
    "DOUBLE": 64, "ULAW": 8, "ALAW": 8, "DPCM_8": 8, "DPCM_16": 16, "IMA_ADPCM": 4,
    "MS_ADPCM": 4, "VOX_ADPCM": 4, "G721_32": 4, "G723_24": 3, "G723_40": 5,
    "NMS_ADPCM_16": 2, "NMS_ADPCM_24": 3, "NMS_ADPCM_32": 4, "GSM610": 65 * 8 / 320,
}  # fmt: skip
# What libsndfile's header log says when a file holds less than its header declares.
_LOG_DATA_SIZE = re.compile(r"^\s*(?:data|SSND|Data Size)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.M)
_LOG_DS64 = re.compile(r"frame count (\d+) does not match value from 'ds64' chunk of (\d+)")
_LOG_OGG_CUT = re.compile(r"end-of-stream", re.I)  # "... lacks an end-of-stream bit" and kin
_LOG_OGG_HOLE = re.compile(r"reports a hole|Corrupted bitstream")
_FFMPEG_FIRST = frozenset({"mp3"})  # FFmpeg's names of formats it decodes before libsndfile
_MPEG_START = re.compile(rb"ID3|\xff[\xe0-\xff]")  # an ID3 tag or an MPEG frame sync
_FILE_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


@dataclass(frozen=True, eq=False)
class Audio:
    """Validated speech audio.

    ``samples`` is float32 mono at ``SAMPLE_RATE`` clipped to [-1, 1] (the model input);
    ``original`` is float32 ``[n, channels]`` at ``original_rate`` as decoded (for the
    AAC track); for 16 kHz mono input the two share memory. ``eq=False``: arrays do
    not compare element-wise, so identity is used.
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
    """Decode an audio file (or a video's audio track), by content, not extension; validate it.

    Raises InputError with a one-sentence message naming the file when it is missing, not
    a regular file (a folder, a FIFO, a device), unreadable, empty, not audio, damaged or
    truncated, too long for memory, too short, silent or non-finite.
    """
    p = Path(path).expanduser()
    name = str(path)
    with _open_regular(p, name) as fh:
        try:
            data, rate = _decode(p, fh, name, os.fstat(fh.fileno()).st_size)
            return _validated(data, rate, name, path=str(p))
        except MemoryError:
            raise InputError(
                f"Audio file '{name}' is too long to load into memory; split it into shorter clips."
            ) from None


def audio_from_array(samples: np.ndarray, rate: int, path: str | None = None) -> Audio:
    """Build an Audio from ``[n]`` or ``[n, channels]`` samples at ``rate`` Hz.

    Float input is taken as is; integer PCM is scaled to [-1, 1]. The same checks as
    ``load_audio`` apply (InputError naming ``path``, or "generated audio").
    """
    name = path if path is not None else "<generated audio>"
    rate_i = int(rate)
    if rate_i != rate:
        raise InputError(f"Audio '{name}' has an invalid sample rate ({rate}); use whole Hz.")
    data = _to_float32(np.asarray(samples))
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2:
        raise InputError(
            f"Audio '{name}' must be shaped [samples] or [samples, channels], "
            f"got {list(data.shape)}."
        )
    _check_stream(name, rate_i, data.shape[1])
    return _validated(np.ascontiguousarray(data), rate_i, name, path=path)


# --- the file ------------------------------------------------------------------


def _open_regular(p: Path, name: str) -> BinaryIO:
    """The file opened for reading, refused up front unless it is a non-empty regular file.

    A FIFO or a device would block or never end; it is recognised before it is read
    (opened non-blocking, and checked again on the open descriptor against a swap).
    """
    try:
        _check_kind(os.stat(p).st_mode, name)
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise InputError(f"Audio file '{name}' does not exist; check the path.") from None
    except PermissionError:
        raise InputError(
            f"Audio file '{name}' cannot be read (permission denied); check its permissions."
        ) from None
    except OSError as e:
        raise InputError(
            f"Audio file '{name}' cannot be read ({e.strerror or e}); check the path."
        ) from None
    fh = os.fdopen(fd, "rb", buffering=0)  # unbuffered: libsndfile reads the same descriptor
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        fh.close()
        _check_kind(st.st_mode, name)
        raise InputError(
            f"Audio file '{name}' is empty (0 bytes); choose a file that contains audio."
        )
    return fh


def _check_kind(mode: int, name: str) -> None:
    """InputError unless ``mode`` is a regular file's."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise InputError(f"Audio path '{name}' is a directory; choose an audio file inside it.")
    kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")
    raise InputError(
        f"Audio path '{name}' is {kind}, not an audio file; save the audio to a file "
        "and give that file's path."
    )


def _decode(p: Path, fh: BinaryIO, name: str, size: int) -> tuple[np.ndarray, int]:
    """``([n, channels] float32, rate)`` decoded by libsndfile or FFmpeg, whichever takes it.

    MPEG audio never reaches libsndfile, even when FFmpeg refuses it: libsndfile's mpg123
    would print its notes on stderr and the CLI promises one line.
    """
    container, why = _open_container(p)
    try:
        fh.seek(0)
        mpeg = _MPEG_START.match(fh.read(4)) is not None
        if not mpeg and (container is None or container.format.name not in _FFMPEG_FIRST):
            try:
                return _read_sndfile(fh, name, size, defer=container is not None)
            except _NotSndfile as e:
                why = e.reason
        if container is None:
            raise _not_audio(fh, name, why)
        return _read_container(container, fh, name, size)
    finally:
        if container is not None:
            container.close()


class _NotSndfile(Exception):
    """libsndfile does not read this format (FFmpeg may)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _read_sndfile(fh: BinaryIO, name: str, size: int, defer: bool) -> tuple[np.ndarray, int]:
    """Decode with libsndfile, judged by it: its errors, its header log, its frame count.

    A stream that declares no length (a FLAC from a live encoder) is left to FFmpeg when
    ``defer``: libsndfile fails at its end, which cannot be told from damage.
    """
    fh.seek(0)
    try:
        # by descriptor: the content decides, never the name (a '.raw' name means RAW)
        f = sf.SoundFile(fh.fileno(), closefd=False)
    except sf.LibsndfileError as e:
        if e.code in _NOT_SNDFILE:
            raise _NotSndfile(_reason(e)) from None
        raise _undecodable(name, _reason(e)) from None
    except (sf.SoundFileError, RuntimeError, TypeError, ValueError) as e:
        raise _undecodable(name, _reason(e)) from None
    with f:
        rate, channels, log = int(f.samplerate), int(f.channels), f.extra_info
        _check_stream(name, rate, channels)
        bits = 0.0 if f.format in _COMPRESSED_FORMATS else _PCM_BITS.get(f.subtype, 0.0)
        known = f.frames if f.frames < _UNKNOWN_LENGTH else None
        if known is None and defer:
            raise _NotSndfile("its length is not declared")
        if known is not None:  # a data chunk cut short: refused before reading
            _check_length(name, known, _logged_length(log, known, bits, channels), rate)
        buf = _Samples(name, rate, channels, size, bits, known)
        try:
            while known is None or buf.n < known:
                want = buf.block if known is None else min(buf.block, known - buf.n)
                got = f.read(want, dtype="float32", always_2d=True)
                buf.append(got)
                if len(got) < want:
                    break
        except (sf.SoundFileError, RuntimeError, ValueError) as e:
            raise _damaged(
                name, f"decoding stopped ({_reason(e)})", buf.n / rate, known, rate
            ) from None
    _check_length(name, buf.n, known, rate)
    if _LOG_OGG_CUT.search(log):
        raise _damaged(name, "the Ogg stream stops before its last page (truncated)", buf.n / rate)
    if _LOG_OGG_HOLE.search(log):
        raise _damaged(name, "pages of the Ogg stream are missing (corrupted bitstream)")
    return buf.result(), rate


def _logged_length(log: str, frames: int, bits: float, channels: int) -> int:
    """Frames the header declares: more than libsndfile's count (what is present) when its
    log says the data chunk is cut short."""
    m = _LOG_DS64.search(log)
    if m:
        return max(frames, int(m[2]))
    m = _LOG_DATA_SIZE.search(log)
    if m is None:
        return frames
    declared_bytes, present_bytes = int(m[1]), int(m[2])
    if declared_bytes in (0, 0xFFFFFFFF) or declared_bytes <= present_bytes:
        return frames  # a streaming writer left the size open: nothing is missing
    if bits:
        return max(frames, int(declared_bytes * 8 / (bits * channels)))
    return frames * declared_bytes // present_bytes if present_bytes else frames


def _open_container(p: Path) -> tuple[av.container.InputContainer | None, str]:
    """The file opened by FFmpeg (which probes its contents), or None and FFmpeg's reason.
    ``file:`` keeps FFmpeg from reading a name as another protocol."""
    try:
        return av.open("file:" + os.path.abspath(p), metadata_errors="ignore"), ""
    except (av.error.FFmpegError, OSError, ValueError, UnicodeError) as e:
        return None, _reason(e)


def _read_container(
    container: av.container.InputContainer, fh: BinaryIO, name: str, size: int
) -> tuple[np.ndarray, int]:
    """Decode the best audio stream with FFmpeg; a decoding error is damage at that point."""
    stream = container.streams.best("audio")
    if stream is None:
        # rawvideo: FFmpeg's guess from a name like '.raw', not a picture
        video = [v.codec_context for v in container.streams.video]
        if any(v is not None and v.name != "rawvideo" for v in video) and not _is_text(fh):
            raise InputError(
                f"Audio file '{name}' has no audio track (it holds only video or pictures); "
                "choose a file with the speech in it."
            )
        raise _not_audio(fh, name, "no audio stream")
    cc = stream.codec_context
    if cc is None:
        raise _undecodable(name, "FFmpeg has no decoder for its audio")
    rate, channels = int(cc.sample_rate or 0), int(cc.channels)
    _check_stream(name, rate, channels)
    length_s, estimated = _container_length(container, stream, size)
    total = None if length_s is None else round(length_s * rate)
    declared = None if estimated else total  # an estimate says nothing of truncation
    buf = _Samples(name, rate, channels, size, 0.0, total)
    try:
        for block in _decoded_blocks(container, stream, name, rate, channels):
            buf.append(block)
    except (av.error.FFmpegError, ValueError) as e:
        raise _damaged(
            name, f"decoding stopped ({_reason(e)})", buf.n / rate, total, rate
        ) from None
    _check_length(name, buf.n, declared, rate)
    return buf.result(), rate


def _decoded_blocks(
    container: av.container.InputContainer,
    stream: av.audio.stream.AudioStream,
    name: str,
    rate: int,
    channels: int,
) -> Iterator[np.ndarray]:
    """``[k, channels]`` float32 blocks of the stream as decoded (planar or packed, any
    sample type); a change of rate or channel count mid-stream is refused."""
    at = 0
    for frame in container.decode(stream):
        arr = frame.to_ndarray()
        k = len(frame.layout.channels)
        if frame.sample_rate != rate or k != channels:
            raise InputError(
                f"Audio file '{name}' changes from {channels} channels at {rate} Hz to {k} at "
                f"{frame.sample_rate} Hz at {at / rate:.1f} s (damaged, or joined from different "
                "recordings); re-export it as one WAV file."
            )
        block = _to_float32(arr.T if frame.format.is_planar else arr.reshape(-1, k))
        at += len(block)
        yield block


def _container_length(
    container: av.container.InputContainer, stream: av.audio.stream.AudioStream, size: int
) -> tuple[float | None, bool]:
    """(the audio's length in seconds as the container declares it or None, whether it is only
    an estimate from the bitrate: a raw MP3 or AAC stream, whose size gives the length)."""
    if stream.duration and stream.time_base:
        length = float(stream.duration * stream.time_base)
    elif tag := stream.metadata.get("DURATION"):  # Matroska/WebM, per track
        try:
            h, m, s = tag.split(":")
            length = int(h) * 3600 + int(m) * 60 + float(s)
        except ValueError:
            return None, True
    elif container.duration and len(container.streams) == len(container.streams.audio):
        length = container.duration / av.time_base
    else:
        return None, True
    if length <= 0:
        return None, True
    bit_rate = stream.codec_context.bit_rate
    return length, bool(bit_rate) and abs(size * 8 / bit_rate - length) <= 0.02 * length


# --- bounded decoding --------------------------------------------------------------


class _Samples:
    """Decoded ``[n, channels]`` float32 audio gathered block by block into one array.

    Sized once from the declared length when the file's size can hold it (no copy at the
    end); grown by half otherwise; never past what ``size`` bytes can hold (``bits`` per
    sample for fixed-rate encodings, else _MAX_FRAMES_PER_BYTE), so a corrupt header or a
    runaway decoder is refused instead of exhausting memory.
    """

    def __init__(
        self, name: str, rate: int, channels: int, size: int, bits: float, declared: int | None
    ) -> None:
        self.name, self.rate, self.channels = name, rate, channels
        if bits:  # 2 % and a block of slack: a codec's last block may be partial (GSM 6.10)
            self.limit = int(size * 8 / (bits * channels) * 1.02) + 1024
        else:
            self.limit = size * _MAX_FRAMES_PER_BYTE
        if declared is not None and declared > self.limit:
            raise InputError(
                f"Audio file '{name}' declares {declared / rate:.1f} s of audio, more than its "
                f"{size} bytes can hold; its header is corrupt: re-export or re-copy it."
            )
        # a compressed file's declared length is believed only as far as speech codecs go
        likely = self.limit if bits else size * _LIKELY_FRAMES_PER_BYTE
        capacity = min(likely, declared if declared is not None else self.limit)
        self.data = np.empty((max(capacity, 1), channels), np.float32)
        self.n = 0
        self.block = max(1, _BLOCK_SAMPLES // channels)

    def append(self, block: np.ndarray) -> None:
        """Add ``[k, channels]`` samples."""
        end = self.n + len(block)
        if end > self.limit:
            raise _damaged(
                self.name, "it decodes to more audio than its size can hold", self.n / self.rate
            )
        if end > len(self.data):
            rows = min(self.limit, max(end, len(self.data) * 3 // 2))
            grown = np.empty((rows, self.channels), np.float32)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : end] = block
        self.n = end

    def result(self) -> np.ndarray:
        """The decoded samples (a view: the unused tail was never touched, so never paged in)."""
        return self.data[: self.n]


def _check_length(name: str, decoded: int, declared: int | None, rate: int) -> None:
    """InputError when less than the declared length is present (beyond rounding)."""
    if declared is not None and (declared - decoded) / rate > _SHORTFALL_S:
        raise _damaged(
            name,
            "the file ends before the length its header declares (truncated)",
            decoded / rate,
            declared,
            rate,
        )


def _check_stream(name: str, rate: int, channels: int) -> None:
    """InputError for a sample rate or channel count no recording has (a broken header)."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InputError(
            f"Audio '{name}' has a sample rate of {rate} Hz, outside {MIN_RATE}-{MAX_RATE} Hz; "
            "its header is corrupt, or re-export it at 16000-48000 Hz."
        )
    if channels < 1:
        raise InputError(f"Audio '{name}' has no channels; its header is corrupt.")


# --- messages ----------------------------------------------------------------------


def _damaged(
    name: str, reason: str, at_s: float | None = None, declared: int | None = None, rate: int = 1
) -> InputError:
    """The one-line error for audio that breaks off: where, of how long, and why."""
    where = ""
    if at_s is not None:
        where = f" at {at_s:.1f} s" + (f" of {declared / rate:.1f} s" if declared else "")
    return InputError(f"Audio file '{name}' is damaged{where}: {reason}; re-export or re-copy it.")


def _undecodable(name: str, reason: str) -> InputError:
    """The one-line error for a file libsndfile recognises but cannot open."""
    return InputError(
        f"Audio file '{name}' could not be decoded ({reason}); it is corrupt, truncated "
        f"or not a format this app reads ({FORMATS})."
    )


def _not_audio(fh: BinaryIO, name: str, reason: str) -> InputError:
    """The one-line error for a file neither libsndfile nor FFmpeg reads as audio."""
    if _is_text(fh):
        return InputError(
            f"Audio file '{name}' is a text file, not audio; choose a recording ({FORMATS})."
        )
    return _undecodable(name, reason)


def _is_text(fh: BinaryIO) -> bool:
    """Whether the file starts as UTF-8 text (a note or a playlist saved as '.wav')."""
    fh.seek(0)
    head = fh.read(_HEAD_BYTES)
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return bool(text.strip()) and all(c.isprintable() or c in "\t\r\n\f" for c in text)


def _reason(e: BaseException) -> str:
    """The library's own short reason (libsndfile's text, FFmpeg's strerror)."""
    text = getattr(e, "error_string", None) or getattr(e, "strerror", None) or str(e)
    text = " ".join(str(text).split()).rstrip(".")
    text = re.sub(r"^Error\s*:\s*", "", text)
    if len(text) > _MAX_REASON_CHARS:
        text = text[: _MAX_REASON_CHARS - 3] + "..."
    return text or type(e).__name__


# --- the model input -----------------------------------------------------------------


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
    """Check decoded ``[n, ch]`` float32 audio and derive the 16 kHz mono model input.

    No temporary as large as ``data`` is made: the extremes are read in place and the
    downmix is resampled block by block; 16 kHz mono input is shared, not copied.
    """
    n = data.shape[0]
    if n == 0 or data.shape[1] == 0:
        raise InputError(f"Audio file '{name}' contains no audio; choose a file with speech in it.")
    hi, lo = float(data.max()), float(data.min())  # NaN and inf show in the extremes
    if not (np.isfinite(hi) and np.isfinite(lo)):
        raise InputError(
            f"Audio file '{name}' contains NaN or infinite samples; re-export it as 16-bit PCM."
        )
    duration = n / rate
    if duration < MIN_DURATION_S:
        raise InputError(
            f"Audio file '{name}' is too short ({duration:.3f} s); "
            f"it must be at least {MIN_DURATION_S} s long."
        )
    if max(hi, -lo) < SILENCE_PEAK:
        raise InputError(
            f"Audio file '{name}' is silent (peak below -80 dBFS); choose a recording with speech."
        )
    peak = max(hi, -lo)
    if rate != SAMPLE_RATE:
        mono = _resampled_mono(data, rate)
    elif data.shape[1] > 1:
        mono = data.mean(axis=1, dtype=np.float32)
    else:  # the model input is the original's one channel: shared unless clipping changes it
        mono = data[:, 0].copy() if peak > 1.0 else data[:, 0]
    if rate != SAMPLE_RATE or peak > 1.0:  # soxr's ringing can pass full scale
        np.clip(mono, -1.0, 1.0, out=mono)
    return Audio(path=path, samples=mono, original=data, original_rate=rate)


def _resampled_mono(data: np.ndarray, rate: int) -> np.ndarray:
    """``[n, ch]`` at ``rate`` -> mono float32 at SAMPLE_RATE (soxr HQ), downmixed and resampled
    a block at a time: no full-rate mono copy of the clip is ever made next to ``data``."""
    n = len(data)
    out = np.empty(round(n * SAMPLE_RATE / rate) + 64, np.float32)  # soxr rounds the length
    stream = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality=RESAMPLE_QUALITY)
    k = 0
    for start in range(0, n, _RESAMPLE_BLOCK):
        block = data[start : start + _RESAMPLE_BLOCK]
        mono = block[:, 0] if block.shape[1] == 1 else block.mean(axis=1, dtype=np.float32)
        y = stream.resample_chunk(np.ascontiguousarray(mono), last=start + _RESAMPLE_BLOCK >= n)
        out[k : k + len(y)] = y
        k += len(y)
    return out[:k]
