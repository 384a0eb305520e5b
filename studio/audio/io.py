"""Loading and validating the input speech audio.

Everything downstream (the audio encoder, the motion model) works on float32 mono at
``layout.SAMPLE_RATE``; the export encodes the audio as decoded, at its own rate, so the
AAC track is not degraded by a round trip through 16 kHz. Memory follows the 16 kHz mono
input, not the file: a file is decoded a block at a time into the model input, and the
original is decoded again, block by block, when the export asks for it
(:meth:`Audio.original_blocks`); it is never held whole.

The libraries made for it judge the files: libsndfile (python-soundfile) reads WAV,
RF64, FLAC, Ogg, AIFF, CAF, GSM 6.10 and the other formats it knows, and its header
log says when a file holds less than its header declares; FFmpeg (PyAV) decodes MP3
(libsndfile cuts a VBR MP3 without a Xing header to the length its first frame
suggests and its mpg123 prints notes on stderr; FFmpeg reads it whole, quietly, and
stops at a damaged frame) and everything libsndfile does not read: M4A/AAC, WebM,
Opus in MP4, MKV, and the audio track of a video. soxr resamples (HQ), as librosa,
Ditto's loader, does.

Reads are bounded: a declared length is checked against what the file's size can
hold before anything is allocated, the samples are decoded block by block (each one
downmixed and resampled, then let go), and a decoder that produces more than the size
allows is stopped. Audio that ends early or breaks off in the middle is refused with
where it broke, never silently shortened.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import stat
from collections.abc import Generator, Iterator
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
_RESAMPLE_BLOCK = 1 << 18  # frames of an array downmixed and resampled at a time
_ARRAY_BLOCK = 1 << 16  # frames of an array's original per block handed to the export
_SPARE_KEPT = 1 << 12  # spare model-input samples left in place at the end of a load
_MAX_FRAMES_PER_BYTE = 8192  # denser than any codec (FLAC constant subframes, Opus DTX)
_LIKELY_FRAMES_PER_BYTE = 64  # speech at 6 kb/s (Opus at 48 kHz); past it the buffer grows
_GUESS_S = 600  # seconds expected of a file that declares no length; past it the buffer grows
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


@dataclass(frozen=True)
class OriginalFile:
    """What a loaded file's original is read again from: the file, its layout, and its size
    and modification time when it was loaded (a file changed since is refused, not read)."""

    path: str
    channels: int
    frames: int
    size: int
    mtime_ns: int


@dataclass(frozen=True, eq=False)
class Audio:
    """Validated speech audio.

    ``samples`` is float32 mono at ``SAMPLE_RATE`` clipped to [-1, 1] (the model input).
    The original, float32 ``[n, channels]`` at ``original_rate`` as decoded (for the AAC
    track), is ``source`` itself for audio given as an array (16 kHz mono shares memory
    with ``samples``); a loaded file keeps no copy of it, only an :class:`OriginalFile` to
    decode it again from: read it with :meth:`original_blocks`. ``eq=False``: arrays do not
    compare element-wise, so identity is used.
    """

    path: str | None
    samples: np.ndarray
    source: np.ndarray | OriginalFile
    original_rate: int

    @property
    def duration_s(self) -> float:
        """Duration of ``samples`` in seconds."""
        return len(self.samples) / SAMPLE_RATE

    @property
    def num_frames(self) -> int:
        """Video frames needed to cover the audio: ceil(len * FPS / SAMPLE_RATE), exactly."""
        return -(-len(self.samples) * FPS // SAMPLE_RATE)

    @property
    def channels(self) -> int:
        """Channels of the original."""
        src = self.source
        return src.channels if isinstance(src, OriginalFile) else src.shape[1]

    @property
    def original(self) -> np.ndarray:
        """The whole original, ``[n, channels]`` float32 at ``original_rate``.

        Costly for a loaded file: decoded again into a new array (23 MB a minute at 48 kHz
        stereo), so prefer :meth:`original_blocks`. InputError as for that method.
        """
        src = self.source
        if not isinstance(src, OriginalFile):
            return src
        out = np.empty((src.frames, src.channels), np.float32)
        at = 0
        blocks = self.original_blocks()
        try:
            for block in blocks:
                if at + len(block) > src.frames:
                    raise _changed(src.path)
                out[at : at + len(block)] = block
                at += len(block)
        finally:
            blocks.close()
        return out

    def original_blocks(self) -> Generator[np.ndarray, None, None]:
        """The original as ``[k, channels]`` float32 blocks at ``original_rate``, in order.

        Views of ``source`` for audio given as an array; for a loaded file, a fresh decode a
        block at a time by the loader's own decoders. The file is opened now: InputError
        when it changed since it was loaded (size or modification time), or if it turns out
        so while read. ``close()`` the generator when stopping early.
        """
        src = self.source
        if not isinstance(src, OriginalFile):
            return _slices(src, _ARRAY_BLOCK)
        blocks = _reread(src, self.original_rate)
        next(blocks)  # the empty first block: the file is open, unchanged and decoding
        return blocks


def load_audio(path: str | os.PathLike) -> Audio:
    """Decode an audio file (or a video's audio track), by content, not extension; validate it.

    The 16 kHz mono model input is built a block at a time as the file decodes; the original
    is not kept (see :meth:`Audio.original_blocks`). Raises InputError with a one-sentence
    message naming the file when it is missing, not a regular file (a folder, a FIFO, a
    device), unreadable, empty, not audio, damaged or truncated, too long for memory, too
    short, silent or non-finite.
    """
    p = Path(path).expanduser()
    name = str(path)
    with _open_regular(p, name) as fh:
        st = os.fstat(fh.fileno())
        try:
            with _decoding(p, fh, name, st.st_size) as dec:
                values, mono = _Values(), _Mono(dec.rate, dec.channels, dec.expected)
                for block in dec.blocks:
                    values.add(block)
                    mono.add(block)
            values.check(name, dec.rate, dec.channels)
            samples = mono.result()
        except MemoryError:
            raise InputError(
                f"Audio file '{name}' is too long to load into memory; split it into shorter clips."
            ) from None
    source = OriginalFile(str(p), dec.channels, values.n, st.st_size, st.st_mtime_ns)
    return Audio(path=str(p), samples=samples, source=source, original_rate=dec.rate)


def declared_seconds(path: str | os.PathLike) -> float | None:
    """The audio's length as its header (libsndfile) or container (FFmpeg) declares it,
    without decoding; None where the file cannot be opened or declares none. For estimates
    made before a file is loaded (a batch's time left, the frames its engines will render).
    Only a non-empty regular file is opened (:func:`_open_regular`): a FIFO never blocks it."""
    p = Path(path)
    try:
        fh = _open_regular(p, p.name)
    except InputError:
        return None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        try:
            info = sf.info(fh)
            if info.samplerate > 0 and info.frames > 0:
                return float(info.frames) / float(info.samplerate)
        except (RuntimeError, OSError, ValueError):  # LibsndfileError: FFmpeg's format
            pass
    container, _ = _open_container(p)
    if container is None:
        return None
    with container:
        stream = container.streams.best("audio")  # the stream load_audio decodes
        if stream is None:
            return None
        return _container_length(container, stream, size)[0]


def audio_from_array(samples: np.ndarray, rate: int, path: str | None = None) -> Audio:
    """Build an Audio from ``[n]`` or ``[n, channels]`` samples at ``rate`` Hz.

    Float input is taken as is; integer PCM is scaled to [-1, 1]. The same checks as
    ``load_audio`` apply (InputError naming ``path``, or "generated audio"). The array
    (as float32 ``[n, channels]``) is kept as the original.
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
    data = np.ascontiguousarray(data)
    values = _Values()
    values.add(data)  # the extremes read in place: no temporary as large as the clip
    peak = values.check(name, rate_i, data.shape[1])
    if rate_i == SAMPLE_RATE and data.shape[1] == 1 and peak <= 1.0:
        mono = data[:, 0]  # the model input is the original's one channel: shared
    else:
        builder = _Mono(rate_i, data.shape[1], len(data))
        for block in _slices(data, _RESAMPLE_BLOCK):
            builder.add(block)
        mono = builder.result()
    return Audio(path=path, samples=mono, source=data, original_rate=rate_i)


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


@dataclass(frozen=True)
class _Decoded:
    """A file being decoded: its rate and channels, the frames to expect (to size the model
    input) and its ``[k, channels]`` float32 blocks, checked as they come (bounded, damage)
    and at their end (truncation)."""

    rate: int
    channels: int
    expected: int
    blocks: Iterator[np.ndarray]


@contextlib.contextmanager
def _decoding(p: Path, fh: BinaryIO, name: str, size: int) -> Iterator[_Decoded]:
    """The file decoded by libsndfile or FFmpeg, whichever takes it; the one decode path of
    loading and of reading the original again.

    MPEG audio never reaches libsndfile, even when FFmpeg refuses it: libsndfile's mpg123
    would print its notes on stderr and the CLI promises one line.
    """
    container, why = _open_container(p)
    try:
        fh.seek(0)
        mpeg = _MPEG_START.match(fh.read(4)) is not None
        if not mpeg and (container is None or container.format.name not in _FFMPEG_FIRST):
            try:
                f = _open_sndfile(fh, name, defer=container is not None)
            except _NotSndfile as e:
                why = e.reason
            else:
                with f:
                    yield _sndfile_decoded(f, name, size)
                return
        if container is None:
            raise _not_audio(fh, name, why)
        yield _container_decoded(container, fh, name, size)
    finally:
        if container is not None:
            container.close()


class _NotSndfile(Exception):
    """libsndfile does not read this format (FFmpeg may)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _open_sndfile(fh: BinaryIO, name: str, defer: bool) -> sf.SoundFile:
    """The file opened by libsndfile, judged by it: its errors, its rate and channels.

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
    try:
        _check_stream(name, int(f.samplerate), int(f.channels))
        if f.frames >= _UNKNOWN_LENGTH and defer:
            raise _NotSndfile("its length is not declared")
    except BaseException:
        f.close()
        raise
    return f


def _sndfile_decoded(f: sf.SoundFile, name: str, size: int) -> _Decoded:
    """libsndfile's decode of ``f``; a data chunk its header log says is cut short is refused
    before reading."""
    rate, channels, log = int(f.samplerate), int(f.channels), f.extra_info
    bits = 0.0 if f.format in _COMPRESSED_FORMATS else _PCM_BITS.get(f.subtype, 0.0)
    known = f.frames if f.frames < _UNKNOWN_LENGTH else None
    if known is not None:
        _check_length(name, known, _logged_length(log, known, bits, channels), rate)
    bound = _Bound(name, rate, channels, size, bits, known)
    return _Decoded(rate, channels, bound.expected, _sndfile_blocks(f, name, log, bound, known))


def _sndfile_blocks(
    f: sf.SoundFile, name: str, log: str, bound: _Bound, known: int | None
) -> Iterator[np.ndarray]:
    """``f``'s samples a block at a time; then its length and its Ogg log judged."""
    rate = bound.rate
    while known is None or bound.n < known:
        want = bound.block if known is None else min(bound.block, known - bound.n)
        try:
            got = f.read(want, dtype="float32", always_2d=True)
        except (sf.SoundFileError, RuntimeError, ValueError) as e:
            raise _damaged(
                name, f"decoding stopped ({_reason(e)})", bound.n / rate, known, rate
            ) from None
        bound.add(len(got))
        if len(got):
            yield got
        if len(got) < want:
            break
    _check_length(name, bound.n, known, rate)
    if _LOG_OGG_CUT.search(log):
        raise _damaged(
            name, "the Ogg stream stops before its last page (truncated)", bound.n / rate
        )
    if _LOG_OGG_HOLE.search(log):
        raise _damaged(name, "pages of the Ogg stream are missing (corrupted bitstream)")


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


# undecodable tags are skipped, not fatal (PyAV 19 dropped the option: it decodes tags with
# surrogateescape, so they never raise)
_OPEN_OPTIONS = {"metadata_errors": "ignore"} if int(av.__version__.split(".")[0]) < 19 else {}


def _open_container(p: Path) -> tuple[av.container.InputContainer | None, str]:
    """The file opened by FFmpeg (which probes its contents), or None and FFmpeg's reason.
    ``file:`` keeps FFmpeg from reading a name as another protocol."""
    try:
        return av.open("file:" + os.path.abspath(p), **_OPEN_OPTIONS), ""
    except (av.error.FFmpegError, OSError, ValueError, UnicodeError) as e:
        return None, _reason(e)


def _container_decoded(
    container: av.container.InputContainer, fh: BinaryIO, name: str, size: int
) -> _Decoded:
    """FFmpeg's decode of the best audio stream."""
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
    bound = _Bound(name, rate, channels, size, 0.0, total)
    decoded = _decoded_blocks(container, stream, name, rate, channels)
    return _Decoded(rate, channels, bound.expected, _container_blocks(decoded, bound, declared))


def _container_blocks(
    decoded: Iterator[np.ndarray], bound: _Bound, declared: int | None
) -> Iterator[np.ndarray]:
    """``decoded`` counted against ``bound`` (a decoding error is damage at that point), then
    its length judged."""
    name, rate = bound.name, bound.rate
    while True:
        try:
            block = next(decoded, None)
        except (av.error.FFmpegError, ValueError) as e:
            raise _damaged(
                name, f"decoding stopped ({_reason(e)})", bound.n / rate, bound.declared, rate
            ) from None
        if block is None:
            break
        bound.add(len(block))
        yield block
    _check_length(name, bound.n, declared, rate)


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


class _Bound:
    """The frames decoded so far, never past what ``size`` bytes can hold (``bits`` per
    sample for fixed-rate encodings, else _MAX_FRAMES_PER_BYTE), so a corrupt header or a
    runaway decoder is refused instead of exhausting memory; and the frames to expect."""

    def __init__(
        self, name: str, rate: int, channels: int, size: int, bits: float, declared: int | None
    ) -> None:
        self.name, self.rate, self.declared = name, rate, declared
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
        guess = declared if declared is not None else min(self.limit, rate * _GUESS_S)
        self.expected = min(likely, guess)
        self.n = 0
        self.block = max(1, _BLOCK_SAMPLES // channels)

    def add(self, frames: int) -> None:
        """Count ``frames`` more; InputError past the limit."""
        if self.n + frames > self.limit:
            raise _damaged(
                self.name, "it decodes to more audio than its size can hold", self.n / self.rate
            )
        self.n += frames


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


def _changed(name: str) -> InputError:
    """The one-line error for a loaded file that changed before its original was read again."""
    return InputError(f"Audio file '{name}' changed since it was loaded; open it again.")


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


class _Values:
    """The running values the checks read: frames, extremes (NaN and inf show in them)."""

    def __init__(self) -> None:
        self.n, self.hi, self.lo, self.finite = 0, 0.0, 0.0, True

    def add(self, block: np.ndarray) -> None:
        """Take ``[k, channels]`` samples into account (read in place)."""
        if block.size == 0:
            return
        hi, lo = float(block.max()), float(block.min())
        self.finite = self.finite and bool(np.isfinite(hi) and np.isfinite(lo))
        self.hi, self.lo = max(self.hi, hi), min(self.lo, lo)
        self.n += len(block)

    def check(self, name: str, rate: int, channels: int) -> float:
        """InputError for audio that is empty, non-finite, too short or silent; the peak."""
        if self.n == 0 or channels == 0:
            raise InputError(
                f"Audio file '{name}' contains no audio; choose a file with speech in it."
            )
        if not self.finite:
            raise InputError(
                f"Audio file '{name}' contains NaN or infinite samples; re-export it as 16-bit PCM."
            )
        duration = self.n / rate
        if duration < MIN_DURATION_S:
            raise InputError(
                f"Audio file '{name}' is too short ({duration:.3f} s); "
                f"it must be at least {MIN_DURATION_S} s long."
            )
        peak = max(self.hi, -self.lo)
        if peak < SILENCE_PEAK:
            raise InputError(
                f"Audio file '{name}' is silent (peak below -80 dBFS); choose a recording with "
                "speech."
            )
        return peak


class _Mono:
    """The model input built a block at a time: ``[k, channels]`` blocks at ``rate`` are
    downmixed and resampled (soxr HQ, streamed: the same samples as resampling the whole
    clip at once) into one float32 array at SAMPLE_RATE, sized from ``expected`` frames."""

    def __init__(self, rate: int, channels: int, expected: int) -> None:
        self.channels = channels
        self.resampler = None
        if rate != SAMPLE_RATE:
            self.resampler = soxr.ResampleStream(
                rate, SAMPLE_RATE, 1, dtype="float32", quality=RESAMPLE_QUALITY
            )
        self.out = np.empty(round(expected * SAMPLE_RATE / rate) + 64, np.float32)
        self.k = 0

    def add(self, block: np.ndarray) -> None:
        """Downmix and resample ``[k, channels]`` samples onto the end."""
        if len(block) == 0:
            return
        mono = block[:, 0] if self.channels == 1 else block.mean(axis=1, dtype=np.float32)
        if self.resampler is not None:
            mono = self.resampler.resample_chunk(np.ascontiguousarray(mono))
        self._put(mono)

    def result(self) -> np.ndarray:
        """The model input, clipped to [-1, 1] (soxr's ringing and float files pass it)."""
        if self.resampler is not None:
            self._put(self.resampler.resample_chunk(np.zeros(0, np.float32), last=True))
        out, self.out = self.out, np.empty(0, np.float32)
        if len(out) - self.k > _SPARE_KEPT:
            out.resize(self.k, refcheck=False)  # realloc: no copy, the unused tail given back
        else:  # a few spare samples (the length was declared): kept, no realloc, which numpy
            out = out[: self.k]  # >= 2.5 counts twice under tracemalloc while it runs
        return np.clip(out, -1.0, 1.0, out=out)

    def _put(self, y: np.ndarray) -> None:
        end = self.k + len(y)
        if end > len(self.out):  # more than expected: grown in place by realloc where it can
            self.out.resize(max(end, len(self.out) * 3 // 2), refcheck=False)
        self.out[self.k : end] = y
        self.k = end


# --- the original, read again --------------------------------------------------------


def _slices(data: np.ndarray, frames: int) -> Generator[np.ndarray, None, None]:
    """``data`` as views of ``frames`` rows at a time."""
    for start in range(0, len(data), frames):
        yield data[start : start + frames]


def _reread(f: OriginalFile, rate: int) -> Generator[np.ndarray, None, None]:
    """The loaded file decoded again block by block, the way it was loaded.

    The first block is empty, yielded once the file is open, found unchanged since it was
    loaded and its decoding started; InputError when it changed (before, or while read).
    """
    p = Path(f.path)
    with _open_regular(p, f.path) as fh:
        _check_unchanged(f, fh)
        with _decoding(p, fh, f.path, f.size) as dec:
            if (dec.rate, dec.channels) != (rate, f.channels):
                raise _changed(f.path)
            yield np.empty((0, f.channels), np.float32)
            n = 0
            for block in dec.blocks:
                n += len(block)
                yield block
        if n != f.frames:
            raise _changed(f.path)
        _check_unchanged(f, fh)


def _check_unchanged(f: OriginalFile, fh: BinaryIO) -> None:
    """InputError when the open file's size or modification time differ from ``f``'s."""
    st = os.fstat(fh.fileno())
    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
        raise _changed(f.path)
