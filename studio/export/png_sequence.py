"""PNG sequence export: an output named ``NAME.png`` is a folder ``NAME/`` holding
``NAME_000001.png``, ``NAME_000002.png``, … (RGB, or RGBA with straight alpha for a
transparent background) and ``NAME.wav``, the clip's audio as it was read — what a video
editor imports as an image sequence with its sound.

Atomic like the video writer: the frames go to a hidden folder beside the target, which is
renamed onto ``NAME/`` only when everything succeeded (an earlier export in ``NAME/`` is
replaced whole; a folder of anything else is refused, never removed), so a failed or
cancelled export leaves the old folder or none.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from fractions import Fraction
from pathlib import Path

import av
import av.error
import numpy as np

from studio.audio.io import Audio
from studio.errors import Cancelled
from studio.export.video import (
    PNG_SEQUENCE,
    AtomicWriter,
    check_output_path,
    check_sequence_folder,
    partial_path,
    png_folder,
)
from studio.layout import FPS

PNG_COMPRESSION = 3  # zlib level: a 512² RGBA frame in a few ms, a third larger than level 9


class PngSequenceWriter(AtomicWriter):
    """Writes ``NAME/NAME_%06d.png`` and ``NAME/NAME.wav``; the VideoWriter's interface
    (context manager, ``write``, ``abort``, ``frames_written``, ``encode_seconds``)."""

    takes_planes = False
    codec = "png"
    what = "PNG sequence"

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        audio: Audio | None = None,
        fps: int = FPS,
        alpha: bool = False,
    ) -> None:
        target = check_output_path(path)
        if target.suffix.lower() != PNG_SEQUENCE:
            raise ValueError(f"{target.name}: a PNG sequence is named NAME.png")
        self.path = png_folder(target)
        self.name = target.stem
        self.width, self.height, self.fps = int(width), int(height), int(fps)
        self.audio, self.alpha = audio, bool(alpha)
        self.frames_written = 0
        self.encode_seconds = 0.0
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._tmp: Path | None = None
        self._container: av.container.OutputContainer | None = None
        self._state = "new"

    def __enter__(self) -> PngSequenceWriter:
        with self._lock:
            tmp = partial_path(self.path)
            try:
                tmp.mkdir()
                self._tmp = tmp
                out = av.open(str(tmp / f"{self.name}_%06d.png"), mode="w", format="image2")
                stream = out.add_stream("png", rate=self.fps)
                stream.width, stream.height = self.width, self.height
                stream.pix_fmt = "rgba" if self.alpha else "rgb24"
                stream.options = {"compression_level": str(PNG_COMPRESSION)}
                self._container, self._stream = out, stream
            except (av.error.FFmpegError, OSError) as e:
                self._discard_locked()
                raise self._output_error(e) from None
            self._state = "open"
        return self

    def write(self, frame: np.ndarray) -> None:
        """Write one [H, W, 3] RGB frame ([H, W, 4] RGBA with ``alpha``), uint8."""
        arr = np.asarray(frame)
        channels = 4 if self.alpha else 3
        if arr.shape != (self.height, self.width, channels) or arr.dtype != np.uint8:
            raise ValueError(
                f"frame must be uint8 [{self.height}, {self.width}, {channels}], got "
                f"{arr.dtype} {list(arr.shape)}"
            )
        if self._cancel.is_set():
            raise Cancelled(f"the export to '{self.path}' was cancelled")
        with self._lock:
            if self._state != "open":
                raise Cancelled(f"the export to '{self.path}' was cancelled")
            t0 = time.perf_counter()
            try:
                vf = av.VideoFrame.from_ndarray(
                    np.ascontiguousarray(arr), format="rgba" if self.alpha else "rgb24"
                )
                vf.pts, vf.time_base = self.frames_written, Fraction(1, self.fps)
                self._mux(self._stream.encode(vf))
                self.frames_written += 1
            except (av.error.FFmpegError, OSError) as e:
                self._discard_locked()
                raise self._output_error(e) from None
            finally:
                self.encode_seconds += time.perf_counter() - t0

    def _write_audio(self, folder: Path) -> None:
        """The clip's original audio as 16-bit WAV at its own rate and channels."""
        import soundfile as sf

        assert self.audio is not None
        audio = self.audio
        with sf.SoundFile(
            folder / f"{self.name}.wav",
            "w",
            samplerate=int(audio.original_rate),
            channels=audio.channels,
            subtype="PCM_16",
        ) as wav:
            blocks = audio.original_blocks()
            try:
                for block in blocks:
                    wav.write(block)
            finally:
                blocks.close()

    def _finish(self) -> None:
        """The last frames, the WAV, then the folder put in place of an earlier one."""
        assert self._container is not None and self._tmp is not None
        self._mux(self._stream.encode(None))
        self._container.close()
        self._container = None
        if self.audio is not None:
            self._write_audio(self._tmp)
        old = None
        check_sequence_folder(self.path.with_name(self.path.name + PNG_SEQUENCE))  # filled since
        if self.path.exists():
            old = self.path.with_name(f".{self.name}.old-{secrets.token_hex(4)}")
            self.path.rename(old)
        self._tmp.rename(self.path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _remove(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)
