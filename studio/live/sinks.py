"""Where live frames go: an MP4 recording, a virtual camera (and, in :mod:`studio.live.webrtc`,
a browser). Every sink takes frames in order with the audio they show
(:class:`studio.render.stream.LiveFrame`) and never holds the session up for long: slow work
runs on a thread of its own behind a bounded queue."""

from __future__ import annotations

import glob
import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from studio.errors import OutputError, StudioError
from studio.layout import FPS, SAMPLE_RATE

if TYPE_CHECKING:
    from studio.render.stream import LiveFrame

RECORD_QUEUE_FRAMES = 250  # 10 s of frames in flight before the session waits for x264
_STOP = object()


class LiveSink(Protocol):
    """A consumer of live frames."""

    def start(self, width: int, height: int) -> None: ...

    def write(self, frames: Sequence[LiveFrame]) -> None: ...

    def close(self) -> None: ...


class RecordingSink:
    """The session as an MP4 (H.264 + AAC of the audio the frames show), written by
    :class:`~studio.export.video.VideoWriter` on its own thread: atomic (a temporary file
    renamed at :meth:`close`), discarded by :meth:`abort`."""

    def __init__(self, path: str, crf: int = 18, preset: str = "veryfast") -> None:
        from studio.export.video import check_output_path

        self.path = check_output_path(path)
        self.crf, self.preset = crf, preset
        self.frames = 0
        self._writer = None
        self._queue: queue.Queue = queue.Queue(maxsize=RECORD_QUEUE_FRAMES)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="studio-record", daemon=True)

    def start(self, width: int, height: int) -> None:
        from studio.export.video import VideoWriter

        self._writer = VideoWriter(
            self.path, width, height, crf=self.crf, preset=self.preset, audio_rate=SAMPLE_RATE
        )
        self._writer.__enter__()
        self._thread.start()

    def write(self, frames: Sequence[LiveFrame]) -> None:
        if self._error is not None:
            raise self._error
        for frame in frames:
            self._queue.put(frame)

    def _run(self) -> None:
        while (frame := self._queue.get()) is not _STOP:
            if self._error is not None:
                continue
            try:
                self._writer.write(frame.image)
                self._writer.write_audio(frame.audio)
                self.frames += 1
            except BaseException as e:  # noqa: BLE001 - raised again in the session's thread
                self._error = e

    def close(self) -> None:
        """Write what is queued and finalise the file (nothing recorded: no file)."""
        if self._writer is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        writer, self._writer = self._writer, None
        if self._error is not None:
            writer.abort()
            raise self._error
        if self.frames == 0:
            writer.abort()
            return
        writer.close()

    def abort(self) -> None:
        """Drop the recording (its temporary file)."""
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.abort()
            self._thread.join()
            self._writer = None


def loopback_devices() -> list[str]:
    """Video devices made by v4l2loopback (what a virtual camera writes to)."""
    found = []
    for name_file in sorted(glob.glob("/sys/class/video4linux/video*/name")):
        with open(name_file, encoding="utf-8", errors="replace") as fh:
            name = fh.read().strip()
        if "loopback" in name.lower() or name.startswith("Dummy video device"):
            found.append(f"/dev/{Path(name_file).parent.name} ({name})")
    return found


def virtual_camera_status() -> tuple[bool, str]:
    """Whether frames can go to a virtual camera here, and why (not)."""
    try:
        import pyvirtualcam  # noqa: F401
    except ImportError as e:
        return False, f"pyvirtualcam is not installed ({e})"
    devices = loopback_devices()
    if not devices:
        return False, (
            "no v4l2loopback device (load the kernel module: "
            "sudo modprobe v4l2loopback exclusive_caps=1)"
        )
    return True, ", ".join(devices)


class VirtualCameraSink:
    """Frames to a virtual camera (pyvirtualcam on a v4l2loopback device) at 25 fps, for video
    calls; the newest frame is kept when the camera is slower."""

    def __init__(self, device: str | None = None) -> None:
        ok, why = virtual_camera_status()
        if not ok:
            raise StudioError(f"--virtual-camera: not available here: {why}")
        self.device = device
        self._camera = None

    def start(self, width: int, height: int) -> None:
        import pyvirtualcam

        try:
            self._camera = pyvirtualcam.Camera(
                width, height, FPS, fmt=pyvirtualcam.PixelFormat.RGB, device=self.device
            )
        except RuntimeError as e:
            raise OutputError(f"--virtual-camera: could not open the camera ({e})") from None

    def write(self, frames: Sequence[LiveFrame]) -> None:
        if self._camera is not None:
            for frame in frames:
                self._camera.send(np.ascontiguousarray(frame.image))

    def close(self) -> None:
        camera, self._camera = self._camera, None
        if camera is not None:
            camera.close()
