"""The live loop: a source feeds a :class:`~studio.render.stream.LiveSession`, its frames go
to the sinks.

Three ways to feed, by the source:

- a live source (microphone, pipe, socket, browser) is read on a thread of its own and fed on
  the wall clock, a chunk every 20 ms; when it has nothing (the speaker paused, the TTS
  program is thinking) silence is fed, so the head keeps breathing and blinking;
- a file with ``realtime`` is fed at the pace it plays;
- a file without it is fed as fast as the session takes it, on a
  :class:`~studio.render.stream.ReplayClock` (latency still measured as live).

Stopping (``stop`` set, Ctrl-C in the caller, the end of the input or ``duration_s``) ends
the session cleanly: the frames still in the lookahead are made and every sink is closed,
so a recording is finalised.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from studio.layout import SAMPLE_RATE
from studio.live.sinks import LiveSink
from studio.live.sources import chunk_samples
from studio.render.stream import LiveFrame, LiveSession, ReplayClock

Status = Callable[[dict[str, Any]], None]


def session_clock(source: Any, realtime: bool) -> Callable[[], float]:
    """The clock a session fed by ``source`` runs on: wall time when the audio comes at its
    own pace (live, or a file in ``realtime``), else a :class:`ReplayClock`."""
    return time.perf_counter if (source.live or realtime) else ReplayClock()


class _Reader:
    """A live source read on its own thread into a buffer the loop takes from."""

    def __init__(self, source: Any) -> None:
        self.buffer: collections.deque[np.ndarray] = collections.deque()
        self.buffered = 0
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(source,), daemon=True)
        self._thread.start()

    def _run(self, source: Any) -> None:
        try:
            for chunk in source.chunks():
                with self._lock:
                    self.buffer.append(np.asarray(chunk, np.float32))
                    self.buffered += len(chunk)
        except BaseException as e:  # noqa: BLE001 - raised again in the loop
            self.error = e
        finally:
            self.ended.set()

    def take(self, n: int) -> tuple[np.ndarray, int]:
        """Up to ``n`` buffered samples, then silence up to ``n``; and how many were real."""
        out = np.zeros(n, np.float32)
        got = 0
        with self._lock:
            while got < n and self.buffer:
                head = self.buffer[0]
                k = min(n - got, len(head))
                out[got : got + k] = head[:k]
                got += k
                if k == len(head):
                    self.buffer.popleft()
                else:
                    self.buffer[0] = head[k:]
            self.buffered -= got
        return out, got

    @property
    def drained(self) -> bool:
        return self.ended.is_set() and self.buffered == 0


def run_live(
    session: LiveSession,
    source: Any,
    sinks: Sequence[LiveSink],
    realtime: bool = False,
    stop: threading.Event | None = None,
    duration_s: float | None = None,
    on_frames: Callable[[list[LiveFrame]], None] | None = None,
    on_status: Status | None = None,
    status_every_s: float = 1.0,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Feed ``session`` from ``source`` until the input ends, ``stop`` is set or
    ``duration_s`` of audio went in; frames to every sink (started here, then ``on_start``;
    closed at the end, also on Ctrl-C). Returns the session's report plus ``idle_s`` (the
    silence fed in the input's gaps)."""
    stop = stop or threading.Event()
    width, height = session.frame_size
    started: list[LiveSink] = []
    idle = 0
    last_status = time.perf_counter()
    limit = None if duration_s is None else int(round(duration_s * SAMPLE_RATE))

    def deliver(frames: list[LiveFrame]) -> None:
        nonlocal last_status
        if frames:
            for sink in started:
                sink.write(frames)
            if on_frames is not None:
                on_frames(frames)
        if on_status is not None and time.perf_counter() - last_status >= status_every_s:
            last_status = time.perf_counter()
            on_status(status_of(session))

    def room(n: int) -> int:
        return n if limit is None else max(0, min(n, limit - session.received_samples))

    try:
        for sink in sinks:
            sink.start(width, height)
            started.append(sink)
        if on_start is not None:
            on_start()
        if source.live:
            idle = _feed_live(session, source, stop, room, deliver)
        else:
            _feed_file(session, source, realtime, stop, room, deliver)
        deliver(session.finish())
    finally:
        source.close()
        errors = []
        for sink in started:
            try:
                sink.close()
            except BaseException as e:  # noqa: BLE001 - every sink is closed; first error wins
                errors.append(e)
        if errors and not isinstance(errors[0], KeyboardInterrupt):
            raise errors[0]
    report = session.report()
    report["idle_s"] = round(idle / SAMPLE_RATE, 3)
    return report


def _feed_file(
    session: LiveSession,
    source: Any,
    realtime: bool,
    stop: threading.Event,
    room: Callable[[int], int],
    deliver: Callable[[list[LiveFrame]], None],
) -> None:
    clock = session.clock
    start = time.perf_counter()
    fed = 0
    for chunk in source.chunks():
        n = room(len(chunk))
        if stop.is_set() or n == 0:
            return
        chunk = chunk[:n]
        if realtime:
            wait = start + fed / SAMPLE_RATE - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        if isinstance(clock, ReplayClock):
            clock.arrive(len(chunk))
        fed += len(chunk)
        deliver(session.feed(chunk))


def _feed_live(
    session: LiveSession,
    source: Any,
    stop: threading.Event,
    room: Callable[[int], int],
    deliver: Callable[[list[LiveFrame]], None],
) -> int:
    """Feed on the wall clock; returns the samples of silence fed where the source had none."""
    reader = _Reader(source)
    step = chunk_samples()
    start = time.perf_counter()
    fed = idle = 0
    while not stop.is_set():
        if reader.error is not None:
            raise reader.error
        if reader.drained:
            return idle
        due = int((time.perf_counter() - start) * SAMPLE_RATE)
        n = room(due - fed)
        if due - fed > 0 and n == 0:
            return idle
        if n >= step:
            chunk, real = reader.take(n)
            idle += n - real
            fed += n
            deliver(session.feed(chunk))
        else:
            time.sleep((step - (due - fed)) / SAMPLE_RATE)
    return idle


def status_of(session: LiveSession) -> dict[str, Any]:
    """A few live figures for a status line (ms)."""
    s = session.stats
    recent = s.latencies_s.values()[-250:].tolist()
    return {
        "audio_s": round(session.received_s, 2),
        "frames": s.frames,
        "latency_ms": round(recent[-1] * 1000.0, 1) if recent else None,
        "latency_p95_ms": round(float(np.percentile(recent, 95)) * 1000.0, 1) if recent else None,
        "late_frames": s.late_frames,
        "time_to_first_frame_ms": None
        if s.first_frame_s is None
        else round(s.first_frame_s * 1000.0, 1),
    }


def status_line(status: dict[str, Any]) -> str:
    """One line of :func:`status_of`'s figures."""
    lat = status["latency_ms"]
    p95 = status["latency_p95_ms"]
    text = f"live {status['audio_s']:.1f} s, {status['frames']} frames"
    if lat is not None:
        text += f", latency {lat:.0f} ms (p95 {p95:.0f} ms), late {status['late_frames']}"
    return text
