"""Encode on a thread of its own while the caller renders the next frames.

PyAV releases the GIL inside FFmpeg, so libx264 runs beside the render loop instead of after
each batch: the GPU renders batch n+1 while batch n encodes. Frames go through a bounded
queue (the renderer is held back when the encoder falls behind); the first error on the
encoder thread is raised again in the caller at its next ``put`` or at ``finish``.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from studio.export.video import VideoWriter

QUEUE_FRAMES = 48  # frames in flight: about two full render batches
_STOP = object()


class EncoderThread:
    """Feeds ``writer`` from a queue on a daemon thread; ``finish()`` waits for the last frame.

    Frames handed to :meth:`put` must not be modified afterwards (the renderers return fresh
    arrays). Use as a context manager inside the writer's ``with`` block: leaving it on an
    exception stops the thread without waiting for queued frames.
    """

    def __init__(self, writer: VideoWriter, depth: int = QUEUE_FRAMES) -> None:
        self.writer = writer
        self.wait_s = 0.0  # how long the caller waited for the encoder (queue full + finish)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._error: BaseException | None = None
        self._dropping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="studio-encoder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            frame = self._queue.get()
            if frame is _STOP:
                return
            if self._error is not None or self._dropping.is_set():
                continue  # drain: the caller stops at its next put or at finish
            try:
                self.writer.write(frame)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = e

    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, frame: np.ndarray) -> None:
        """Queue one frame (blocks while the queue is full); raises the encoder's error."""
        self._raise_pending()
        t0 = time.perf_counter()
        while True:
            try:
                self._queue.put(frame, timeout=0.05)
                break
            except queue.Full:
                self._raise_pending()
        self.wait_s += time.perf_counter() - t0

    def finish(self) -> None:
        """Wait until every queued frame is encoded; raises the encoder's error."""
        t0 = time.perf_counter()
        self._queue.put(_STOP)
        self._thread.join()
        self.wait_s += time.perf_counter() - t0
        self._raise_pending()

    def stop(self) -> None:
        """Drop what is queued and end the thread (after an error or a cancel)."""
        self._dropping.set()
        self._queue.put(_STOP)
        self._thread.join()

    def __enter__(self) -> EncoderThread:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._thread.is_alive():
            if exc_type is None:
                self.finish()
            else:
                self.stop()
