"""Video export with PyAV: MP4 (H.264, HEVC or AV1 + AAC), WebM (VP9 + Opus) and QuickTime
(ProRes 4444 + PCM), the last two with an alpha channel when the frames carry one.

The writer is atomic: it encodes into a hidden temporary file next to the target and
renames it onto the target only when everything succeeded, so a failed, cancelled or
crashed export never leaves a half-written file or damages an existing one.

Colour: RGB frames are converted to BT.709 limited range and the stream is tagged so,
which is what players assume for HD and what browsers/Qt assume for untagged H.264.

Audio: the original (``Audio.original_blocks``: the input file decoded again a block at
a time, never held whole) is encoded at its own rate when the container's audio codec takes
it (AAC's standard rates, any rate for PCM; Opus is always 48 kHz), otherwise resampled to
48000 Hz. Mono and stereo are kept; more than two channels are averaged to mono, because
libsndfile gives no channel map to build a correct stereo downmix from. The audio is read and
interleaved with the video as frames arrive (one decoded block held at a time), and the rest
is written at close, so the track lasts as long as the audio.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import av.error
import numpy as np
from av.audio.stream import AudioStream
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter
from av.video.stream import VideoStream

from studio.audio.io import Audio
from studio.errors import Cancelled, OptionError, OutputError
from studio.files import check_file_name
from studio.layout import FPS

AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)
AAC_FALLBACK_RATE = 48000
AAC_FRAME_SIZE = 1024
OPUS_FRAME_SIZE = 960  # 20 ms at 48 kHz
X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)
# codec -> (PyAV encoder, what it is for people); x264's speed presets map onto each
ENCODERS = {"h264": ("libx264", "H.264"), "hevc": ("libx265", "HEVC"), "av1": ("libsvtav1", "AV1")}
SVT_PRESETS = dict(zip(X264_PRESETS, (12, 11, 10, 9, 8, 7, 6, 4, 2, 1), strict=True))
# codec -> its hardware encoder (NVIDIA's NVENC), used with ``hardware=True`` where it opens;
# x264's presets map onto NVENC's p1 (fastest) .. p7 (best)
HARDWARE_ENCODERS = {"h264": "h264_nvenc", "hevc": "hevc_nvenc", "av1": "av1_nvenc"}
NVENC_PRESETS = dict(zip(X264_PRESETS, (1, 1, 2, 3, 4, 5, 6, 7, 7, 7), strict=True))


@functools.cache
def hardware_encoder(codec: str) -> tuple[str | None, str]:
    """(the hardware encoder of ``codec``, "") where one opens here, else (None, why not):
    built into PyAV's FFmpeg is not enough, NVENC needs an NVIDIA GPU and its driver, so a
    small frame is encoded to find out."""
    name = HARDWARE_ENCODERS.get(codec)
    if name is None:
        return None, f"{codec} has no hardware encoder here"
    try:
        cc = av.CodecContext.create(name, "w")
    except (av.error.FFmpegError, ValueError) as e:
        return None, f"this PyAV build has no {name} ({' '.join(str(e).split())[:80]})"
    cc.width, cc.height, cc.pix_fmt = 256, 256, "yuv420p"
    cc.time_base = Fraction(1, FPS)
    try:
        frame = av.VideoFrame(256, 256, "yuv420p")
        list(cc.encode(frame))
        list(cc.encode(None))
    except (av.error.FFmpegError, OSError, ValueError) as e:
        reason = " ".join(str(getattr(e, "strerror", None) or e).split())[:80]
        return None, f"{name} does not open ({reason}): no NVIDIA GPU encoder"
    return name, ""


def hardware_note(codec: str) -> str:
    """What ``--hw-encode`` does here for an MP4 of ``codec``: "" when its hardware encoder
    opens, else the note that the software encoder runs instead, and why."""
    found, why = hardware_encoder(codec)
    if found is not None:
        return ""
    return f"--hw-encode: {why}; {ENCODERS[codec][0]} encodes on the CPU"


@dataclass(frozen=True)
class Container:
    """An output file type: its muxer, its video encoder (None: the ``codec`` setting's),
    pixel formats without and with alpha (None: no alpha), its audio encoder and the rates
    that encoder takes as they are (None: any)."""

    muxer: str
    label: str
    codec: str | None  # its video codec's short name (None: the ``codec`` setting's)
    video: str | None
    pix_fmt: str
    alpha_pix_fmt: str | None
    audio: str
    audio_rates: tuple[int, ...] | None


CONTAINERS = {
    ".mp4": Container("mp4", "MP4", None, None, "yuv420p", None, "aac", AAC_RATES),
    ".webm": Container(
        "webm", "WebM (VP9)", "vp9", "libvpx-vp9", "yuv420p", "yuva420p", "libopus", (48000,)
    ),
    ".mov": Container(
        "mov",
        "QuickTime (ProRes 4444)",
        "prores",
        "prores_ks",
        "yuv422p10le",
        "yuva444p10le",
        "pcm_s16le",
        None,
    ),
}
PNG_SEQUENCE = ".png"  # an output named NAME.png is a folder NAME/ of PNG frames and the audio
OUTPUT_SUFFIXES = (*CONTAINERS, PNG_SEQUENCE)
ALPHA_SUFFIXES = tuple(k for k, c in CONTAINERS.items() if c.alpha_pix_fmt) + (PNG_SEQUENCE,)
_AVCOL_BT709 = 1  # AVColorPrimaries / AVColorTransferCharacteristic / AVColorSpace value
_AVCOL_RANGE_MPEG = 1
_AUDIO_CHUNK = 1 << 16  # samples per AudioFrame handed to the resampler, at most


def encoder_available(codec: str) -> bool:
    """Whether this PyAV build can encode ``codec`` (:data:`ENCODERS`)."""
    try:
        av.codec.Codec(ENCODERS[codec][0], "w")
    except (KeyError, ValueError, av.error.FFmpegError):
        return False
    return True


def check_output_path(path: str | os.PathLike) -> Path:
    """Validate an export target before any rendering; return it resolved.

    Raises OutputError when the path is a directory, does not end in one of
    :data:`OUTPUT_SUFFIXES`, has a file name longer than the file system takes ("file name too
    long"), or its folder is missing, not a folder, or not writable (checked by creating a
    probe file, which also works for root and read-only mounts). A symlink is followed: the
    path returned is the file written. A ``.png`` output is a folder of frames named after it
    (:func:`png_folder`): a file already there is an error.
    """
    p = Path(path).expanduser()
    check_file_name(p, "--out")  # first: the system refuses even to look up a longer name
    if p.is_dir():
        raise OutputError(
            f"Output path '{path}' is a directory; give a file name such as '{p / 'video.mp4'}'."
        )
    if p.suffix.lower() not in OUTPUT_SUFFIXES:
        raise OutputError(
            f"Output file '{path}' must end in .mp4, .webm, .mov or .png (a PNG sequence); "
            f"use a name such as '{p.stem or 'video'}.mp4'."
        )
    p = p.resolve()
    folder = p.parent
    if not folder.exists():
        raise OutputError(
            f"Output folder '{folder}' for '{p.name}' does not exist; create it or choose another."
        )
    if not folder.is_dir():
        raise OutputError(
            f"Output folder '{folder}' for '{p.name}' is not a folder; choose another location."
        )
    if p.suffix.lower() == PNG_SEQUENCE:
        check_sequence_folder(p)
    probe = folder / f".studio-probe-{secrets.token_hex(4)}"  # short: any legal name passes
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as e:
        raise OutputError(
            f"Output folder '{folder}' for '{p.name}' is not writable ({e.strerror or e}); "
            "choose another folder or fix its permissions."
        ) from None
    os.close(fd)
    os.unlink(probe)
    return p


def partial_path(target: str | os.PathLike) -> Path:
    """Where an export to ``target`` (a file, or a PNG sequence's folder) is written before it
    is renamed into place: ``.STEM.partial-TOKEN`` plus the file's type, hidden beside it;
    the stem cut so that a 255-byte name stays legal."""
    p = Path(target)
    stem = os.fsdecode(os.fsencode(p.stem if p.suffix else p.name)[:200])
    return p.with_name(f".{stem}.partial-{secrets.token_hex(4)}{p.suffix.lower()}")


def is_partial_of(name: str, target: str | os.PathLike) -> bool:
    """Whether the file or folder ``name`` is one :func:`partial_path` gives for ``target``."""
    fresh = partial_path(target).name
    head, tail = fresh.split(".partial-", 1)
    pattern = rf"{re.escape(head)}\.partial-[0-9a-f]{{8}}{re.escape(tail[8:])}"
    return re.fullmatch(pattern, name) is not None


# what file browsers leave in a folder they showed (a PNG sequence's, opened from the studio)
SYSTEM_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini", ".directory"})


def check_sequence_folder(path: str | os.PathLike) -> None:
    """OutputError unless the folder a PNG sequence ``NAME.png`` goes to is absent or holds
    only an earlier export of it (``NAME_000001.png``…, ``NAME.wav``, and what a file browser
    adds, :data:`SYSTEM_FILES`), which the new one replaces whole: a folder of anything else
    is never removed. (An input inside it, its own ``NAME.wav``, is the caller's check.)"""
    p = Path(path)
    folder = png_folder(p)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise OutputError(
            f"'{folder}' is a file; a PNG sequence '{p.name}' is written to a folder of that "
            "name: choose another name."
        )
    own = re.compile(rf"{re.escape(folder.name)}(_\d+\.png|\.wav)", re.IGNORECASE)
    try:
        others = sorted(
            e.name
            for e in folder.iterdir()
            if not (own.fullmatch(e.name) and e.is_file())
            and e.name not in SYSTEM_FILES
            and not e.name.startswith("._")  # macOS's resource forks on other disks
        )
    except OSError as e:
        raise OutputError(f"cannot read the folder '{folder}': {e.strerror or e}") from None
    if others:
        raise OutputError(
            f"'{folder}' holds {others[0]!r}, not only an earlier PNG sequence '{p.name}', which "
            "would replace the folder whole: choose another name or empty the folder."
        )


def png_folder(path: str | os.PathLike) -> Path:
    """The folder a ``NAME.png`` output is written to: ``NAME/`` beside it."""
    p = Path(path)
    return p.with_name(p.stem)


def written_path(path: str | os.PathLike) -> Path:
    """What an export to ``path`` leaves on disk: the file, or a PNG sequence's folder."""
    p = Path(path)
    return png_folder(p) if p.suffix.lower() == PNG_SEQUENCE else p


def check_alpha_output(path: str | os.PathLike, alpha: bool) -> None:
    """OutputError when frames with alpha would go to a file type without it (MP4)."""
    suffix = Path(path).suffix.lower()
    if alpha and suffix not in ALPHA_SUFFIXES:
        raise OutputError(
            f"'{Path(path).name}': {suffix or 'this file type'} has no alpha channel for a "
            "transparent background; write .webm (VP9), .mov (ProRes 4444) or .png (a PNG "
            "sequence), or choose a green or blue background."
        )


class AtomicWriter:
    """What every export writer shares: a context manager that commits on a normal exit and
    discards on an exception, ``abort()`` from any thread, and one-line write errors. A writer
    sets ``path``, ``_lock``, ``_cancel`` and ``_state`` and has ``write``, ``_commit_locked``
    and ``_discard_locked``."""

    what = "video"  # for its messages
    path: Path
    frames_written: int
    encode_seconds: float
    _lock: threading.Lock
    _cancel: threading.Event
    _state: str
    _container: av.container.OutputContainer | None
    _tmp: Path | None  # the hidden file or folder written until the commit

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        """Commit the output when the block ended normally, else discard it."""
        with self._lock:
            if self._state != "open":
                return None
            if exc_type is not None:
                self._discard_locked()
                return None
            self._commit_locked()
        return None

    def write(self, frame: np.ndarray) -> None:
        raise NotImplementedError

    def write_many(self, frames: np.ndarray | Iterable[np.ndarray]) -> None:
        """Encode a [N, H, W, C] array or any iterable of frames, in order."""
        for frame in frames:
            self.write(frame)

    def abort(self) -> None:
        """Discard the export now (cancel): delete what was written, keep the target."""
        self._cancel.set()
        with self._lock:
            if self._state in ("new", "open"):
                self._discard_locked()

    def close(self) -> None:
        """Commit without a ``with`` block (``__exit__`` does the same)."""
        self.__exit__(None, None, None)

    def _commit_locked(self) -> None:
        """Finish the output and put it in place (:meth:`_finish`); any failure discards it,
        a write error becomes an OutputError."""
        t0 = time.perf_counter()
        try:
            if self.frames_written == 0:
                raise OutputError(
                    f"No {self.what} frames were rendered for '{self.path}'; nothing was written."
                )
            try:
                self._finish()
            except (av.error.FFmpegError, OSError, RuntimeError) as e:
                raise self._output_error(e) from None
        except BaseException:
            self._discard_locked()
            raise
        finally:
            self.encode_seconds += time.perf_counter() - t0
        self._tmp = None
        self._state = "committed"

    def _finish(self) -> None:
        """Flush the encoders, close the container and move ``_tmp`` onto ``path``."""
        raise NotImplementedError

    def _discard_locked(self) -> None:
        """Close the container (ignoring its errors) and delete what was written."""
        self._state = "discarded"
        self._release()
        container, self._container = self._container, None
        if container is not None:
            with contextlib.suppress(Exception):  # already failing; the output goes anyway
                container.close()
        tmp, self._tmp = self._tmp, None
        if tmp is not None:
            self._remove(tmp)

    def _release(self) -> None:
        """Let go of what the writer reads besides its container (nothing by default)."""

    def _remove(self, tmp: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()

    def _mux(self, packets: list[av.Packet]) -> None:
        assert self._container is not None
        for packet in packets:
            self._container.mux(packet)

    def _output_error(self, e: BaseException) -> OutputError:
        reason = " ".join(str(getattr(e, "strerror", None) or e).split()).rstrip(".")
        return OutputError(
            f"Could not write the {self.what} '{self.path}' ({reason}); "
            "check the free disk space and the folder's permissions, then export again."
        )


class VideoWriter(AtomicWriter):
    """Atomic video writer (:data:`CONTAINERS`, by the target's suffix); use as a context
    manager.

    ``write`` takes [H, W, 3] uint8 RGB frames, or [H, W, 4] RGBA (straight alpha) when opened
    with ``alpha`` (WebM and QuickTime). Leaving the ``with`` block normally
    commits (renames the temporary file onto the target); an exception discards the
    temporary file and propagates. ``abort()`` (safe to call from another thread, e.g.
    a cancel button) discards at once; later ``write`` calls raise Cancelled.
    """

    # Set by _open / _open_audio.
    _vstream: VideoStream
    _reformatter: VideoReformatter
    _astream: AudioStream
    _resampler: av.AudioResampler
    _audio_layout: str
    _audio_rate_in: int

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        audio: Audio | None = None,
        crf: int = 18,
        preset: str = "medium",
        fps: int = FPS,
        audio_rate: int | None = None,
        codec: str = "h264",
        alpha: bool = False,
        hardware: bool = False,
    ) -> None:
        for label, value in (("width", width), ("height", height)):
            if int(value) != value or value <= 0 or value % 2:
                raise ValueError(f"{label} must be a positive even number (yuv420p), got {value}")
        if int(fps) != fps or fps <= 0:
            raise ValueError(f"fps must be a positive integer, got {fps}")
        if int(crf) != crf or not 0 <= crf <= 51:
            raise OptionError("crf", f"must be an integer from 0 to 51, got {crf}.")
        if preset not in X264_PRESETS:
            raise OptionError(
                "preset", f"must be one of {', '.join(X264_PRESETS)}; got {preset!r}."
            )
        if audio is not None and audio_rate is not None:
            raise ValueError("give the clip's audio or a rate for audio written as it comes")
        if audio_rate is not None and int(audio_rate) not in AAC_RATES:
            raise ValueError(f"audio_rate must be one of {AAC_RATES}, got {audio_rate}")
        self.path = check_output_path(path)
        self.container = CONTAINERS.get(self.path.suffix.lower())  # type: ignore[assignment]
        if self.container is None:
            raise ValueError(f"{self.path.name}: a PNG sequence is written by PngSequenceWriter")
        check_alpha_output(self.path, alpha)
        if codec not in ENCODERS:
            raise OptionError("codec", f"must be one of {', '.join(ENCODERS)}; got {codec!r}.")
        if self.container.video is None and not encoder_available(codec):  # MP4's own
            raise OptionError(
                "codec",
                f"{codec}: this PyAV build has no {ENCODERS[codec][0]} encoder (`studio doctor` "
                "lists the encoders); choose h264",
            )
        self.alpha = bool(alpha)
        self.codec = self.container.codec or codec
        # the video encoder: the container's own, the codec's hardware one where asked for
        # and it opens here (else the software one, and ``note`` says why), or the software one
        self.note = ""
        self.encoder = self.container.video or ENCODERS[self.codec][0]
        if hardware and self.container.video is None:
            self.note = hardware_note(self.codec)
            if not self.note:
                self.encoder = HARDWARE_ENCODERS[self.codec]
        self.audio_rate = None if audio_rate is None else int(audio_rate)
        self.width, self.height, self.fps = int(width), int(height), int(fps)
        self.audio, self.crf, self.preset = audio, int(crf), preset
        self.frames_written = 0
        self.encode_seconds = 0.0
        self._lock = threading.Lock()
        self._cancel = threading.Event()  # set first by abort() so a busy writer yields the lock
        self._container: av.container.OutputContainer | None = None
        self._tmp: Path | None = None
        self._state = "new"  # new -> open -> committed | discarded
        self._audio_blocks: Generator[np.ndarray, None, None] | None = None  # the original
        self._audio_block = np.empty((0, 1), np.float32)  # its part not yet encoded
        self._audio_mix = False  # more than two channels: averaged to mono
        self._audio_pos = 0

    # --- context manager ------------------------------------------------------

    def __enter__(self) -> VideoWriter:
        with self._lock:
            if self._state != "new":
                raise RuntimeError("a VideoWriter can only be opened once")
            t0 = time.perf_counter()
            try:
                self._open()
            except BaseException:
                self._discard_locked()
                raise
            finally:
                self.encode_seconds += time.perf_counter() - t0
        return self

    # --- public API -------------------------------------------------------------

    def write(self, frame: np.ndarray) -> None:
        """Encode one [H, W, 3] uint8 RGB frame ([H, W, 4] RGBA with ``alpha``), or one
        already in yuv420p planes ([H * 3 / 2, W], BT.709 limited range:
        :func:`studio.export.yuv.rgb_to_yuv420p`). ValueError on a wrong shape or dtype."""
        arr = np.asarray(frame)
        channels = 4 if self.alpha else 3
        planar = self.takes_planes and arr.shape == (self.height * 3 // 2, self.width)
        if arr.shape != (self.height, self.width, channels) and not planar:
            kind = "RGBA" if self.alpha else "RGB"
            raise ValueError(
                f"frame must be [{self.height}, {self.width}, {channels}] {kind} or "
                f"[{self.height * 3 // 2}, {self.width}] yuv420p, got {list(arr.shape)}"
            )
        if arr.dtype != np.uint8:
            raise ValueError(f"frame must be uint8, got {arr.dtype}")
        with self._encoding():
            vf = self._video_frame(np.ascontiguousarray(arr), planar)
            vf.pts = self.frames_written
            vf.time_base = Fraction(1, self.fps)
            self._mux(self._vstream.encode(vf))
            self.frames_written += 1
            if self._audio_blocks is not None:
                self._feed_audio(self.frames_written * self._audio_rate_in // self.fps)

    @contextlib.contextmanager
    def _encoding(self) -> Iterator[None]:
        """Around one encode: the cancel and open checks, the lock, the time it took; a write
        error discards the file and becomes an OutputError."""
        if self._cancel.is_set():
            raise Cancelled(f"the export to '{self.path}' was cancelled")
        with self._lock:
            self._require_open()
            t0 = time.perf_counter()
            try:
                yield
            except (av.error.FFmpegError, OSError) as e:
                self._discard_locked()
                raise self._output_error(e) from None
            finally:
                self.encode_seconds += time.perf_counter() - t0

    def _video_frame(self, arr: np.ndarray, planar: bool) -> av.VideoFrame:
        if planar:
            vf = av.VideoFrame.from_ndarray(arr, format="yuv420p")
            vf.colorspace, vf.color_range = Colorspace.ITU709, ColorRange.MPEG
            return vf
        return self._reformatter.reformat(
            av.VideoFrame.from_ndarray(arr, format="rgba" if self.alpha else "rgb24"),
            format=self._vstream.pix_fmt,
            dst_colorspace=Colorspace.ITU709,
            src_color_range=ColorRange.JPEG,
            dst_color_range=ColorRange.MPEG,
        )

    def write_audio(self, samples: np.ndarray) -> None:
        """Encode the next mono float32 samples at ``audio_rate`` (a live recording: the
        audio comes with its frames instead of from a clip). ValueError without that rate."""
        if self.audio_rate is None:
            raise ValueError("write_audio() needs a VideoWriter opened with audio_rate")
        x = np.asarray(samples, np.float32).reshape(-1, 1)
        with self._encoding():
            for start in range(0, len(x), _AUDIO_CHUNK):
                self._encode_audio(x[start : start + _AUDIO_CHUNK])

    @property
    def takes_planes(self) -> bool:
        """Whether :meth:`write` takes yuv420p planes (the stream's own format)."""
        return self.pix_fmt == "yuv420p"

    @property
    def pix_fmt(self) -> str:
        """The video stream's pixel format."""
        return (self.container.alpha_pix_fmt if self.alpha else None) or self.container.pix_fmt

    @property
    def temp_path(self) -> Path | None:
        """The temporary file being written (None before open and after commit/discard)."""
        return self._tmp

    # --- internals ----------------------------------------------------------------

    def _require_open(self) -> None:
        if self._state == "discarded":
            raise Cancelled(f"the export to '{self.path}' was cancelled")
        if self._state != "open":
            raise RuntimeError("use VideoWriter as a context manager (with VideoWriter(...) as w)")

    def _open(self) -> None:
        tmp = partial_path(self.path)
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except OSError as e:
            raise self._output_error(e) from None
        os.close(fd)
        self._tmp = tmp
        self._state = "open"
        try:
            c = self.container
            options = {"movflags": "+faststart"} if c.muxer in ("mp4", "mov") else {}
            out = av.open(str(tmp), mode="w", format=c.muxer, options=options)
            self._container = out
            vs = out.add_stream(self.encoder, rate=self.fps)
            vs.width, vs.height, vs.pix_fmt = self.width, self.height, self.pix_fmt
            vs.time_base = Fraction(1, self.fps)
            cc = vs.codec_context
            cc.color_primaries = cc.color_trc = cc.colorspace = _AVCOL_BT709
            cc.color_range = _AVCOL_RANGE_MPEG
            vs.options = self._encoder_options(cc)
            self._vstream = vs
            self._reformatter = VideoReformatter()
            if self.audio is not None:
                self._open_audio(out, self.audio)
            elif self.audio_rate is not None:
                self._add_audio_stream(out, self.audio_rate, 1)
        except (av.error.FFmpegError, OSError) as e:
            raise self._output_error(e) from None

    def _encoder_options(self, cc: av.codec.context.CodecContext) -> dict[str, str]:
        """The encoder's options for the quality (CRF) and speed (x264's preset names)."""
        if self.codec == "hevc":
            cc.codec_tag = "hvc1"  # the tag Apple's players want for HEVC in MP4
        if self.encoder in HARDWARE_ENCODERS.values():  # NVENC: constant quality by cq
            speed = f"p{NVENC_PRESETS[self.preset]}"
            cq = round(self.crf * 63 / 51) if self.codec == "av1" else self.crf  # AV1: 0..63
            return {"preset": speed, "rc": "vbr", "cq": str(cq), "b": "0"}
        if self.codec == "vp9":  # VP9: constant quality (CRF 0..63, b:v 0), cpu-used for speed
            speed = max(0, min(8, 8 - X264_PRESETS.index(self.preset)))
            crf = str(round(self.crf * 63 / 51))
            return {"crf": crf, "b": "0", "deadline": "good", "cpu-used": str(speed), "row-mt": "1"}
        if self.codec == "prores":  # ProRes: 4444 with alpha, else 422 HQ; quality by profile
            cc.codec_tag = "ap4h" if self.alpha else "apch"
            return {"profile": "4" if self.alpha else "3", "vendor": "apl0"}
        if self.codec == "h264":
            # x264's frame threads (one per core) scale where its default slices do not.
            cc.thread_type, cc.thread_count = "FRAME", 0
            return {"crf": str(self.crf), "preset": self.preset}
        if self.codec == "hevc":
            return {"crf": str(self.crf), "preset": self.preset, "x265-params": "log-level=error"}
        # SVT-AV1: CRF 0..63 (x264's 18, visually lossless, is about its 22), presets 0..13;
        # its banner and notes on stderr only for errors (a user's SVT_LOG still wins)
        os.environ.setdefault("SVT_LOG", "1")
        return {"crf": str(round(self.crf * 63 / 51)), "preset": str(SVT_PRESETS[self.preset])}

    def _open_audio(self, out: av.container.OutputContainer, audio: Audio) -> None:
        """Add the AAC stream and open the original (InputError if its file changed)."""
        self._add_audio_stream(out, int(audio.original_rate), audio.channels)
        self._audio_blocks = audio.original_blocks()

    def _add_audio_stream(
        self, out: av.container.OutputContainer, rate_in: int, channels: int
    ) -> None:
        """The container's audio stream for ``channels`` of audio at ``rate_in`` Hz, and its
        resampler (to the encoder's sample format, rate and frame size)."""
        stereo = channels == 2
        self._audio_mix = channels > 2
        self._audio_layout = "stereo" if stereo else "mono"
        self._audio_rate_in = int(rate_in)
        rates = self.container.audio_rates
        rate = self._audio_rate_in
        if rates is not None and rate not in rates:
            rate = AAC_FALLBACK_RATE
        astream = out.add_stream(self.container.audio, rate=rate, layout=self._audio_layout)
        cc = astream.codec_context
        if self.container.audio == "aac":  # the native AAC encoder caps at 6 bits a sample
            cc.bit_rate = min(96_000, 6 * rate) * (2 if stereo else 1)
        elif self.container.audio == "libopus":
            cc.bit_rate = 64_000 * (2 if stereo else 1)
        self._astream = astream
        formats = cc.codec.audio_formats
        frame_size = {"aac": AAC_FRAME_SIZE, "libopus": OPUS_FRAME_SIZE}.get(self.container.audio)
        self._resampler = av.AudioResampler(
            format=formats[0].name if formats else "fltp",
            layout=self._audio_layout,
            rate=rate,
            frame_size=frame_size,
        )

    def _feed_audio(self, upto: int | None) -> None:
        """Encode the original from the cursor up to sample ``upto`` or its end (None), reading
        its blocks as they are needed."""
        assert self._audio_blocks is not None
        while upto is None or self._audio_pos < upto:
            if not len(self._audio_block):
                block = next(self._audio_blocks, None)
                if block is None:
                    return
                self._audio_block = block
            want = _AUDIO_CHUNK if upto is None else min(_AUDIO_CHUNK, upto - self._audio_pos)
            chunk, self._audio_block = self._audio_block[:want], self._audio_block[want:]
            self._encode_audio(chunk)

    def _encode_audio(self, chunk: np.ndarray) -> None:
        """Encode ``[k, channels]`` float32 samples at the cursor (more than two: averaged)."""
        if self._audio_mix:
            chunk = chunk.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
        packed = np.ascontiguousarray(chunk, dtype=np.float32).reshape(1, -1)
        af = av.AudioFrame.from_ndarray(packed, format="flt", layout=self._audio_layout)
        af.sample_rate = self._audio_rate_in
        af.pts = self._audio_pos
        af.time_base = Fraction(1, self._audio_rate_in)
        self._audio_pos += len(chunk)
        for rf in self._resampler.resample(af):
            self._mux(self._astream.encode(rf))

    def _close_audio(self) -> None:
        """Let go of the original's reader (its file) and what was left of its block."""
        blocks, self._audio_blocks = self._audio_blocks, None
        self._audio_block = self._audio_block[:0]
        if blocks is not None:
            blocks.close()

    def _finish(self) -> None:
        self._mux(self._vstream.encode(None))
        has_audio = self._audio_blocks is not None or self.audio_rate is not None
        if self._audio_blocks is not None:
            self._feed_audio(None)
            self._close_audio()
        if has_audio:
            for rf in self._resampler.resample(None):
                self._mux(self._astream.encode(rf))
            self._mux(self._astream.encode(None))
        assert self._container is not None and self._tmp is not None
        self._container.close()
        self._container = None
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self.path)

    def _release(self) -> None:
        self._close_audio()
