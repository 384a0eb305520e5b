"""The live composition: audio arrives in chunks, frames leave as soon as they exist.

The same stages as a clip (:mod:`studio.render.pipeline`), each run incrementally with a
bounded lookahead: phonetics (:class:`~studio.audio.phonetics.PhoneticStream`) and the
engine's motion (:meth:`~studio.engines.base.Engine.motion_stream`) side by side on the same
audio, then cadence and pose smoothing (:class:`~studio.motion.stream.PostStream`), then the
engine's renderer (keyframes rendered, in-betweens blended as in a clip). Every frame leaves
as a :class:`LiveFrame` tagged with its index, the audio it shows, when that audio arrived and
when the frame was ready.

A session owns no thread: a source feeds it (:mod:`studio.live.sources`), sinks take its
frames. Its clock stamps arrivals and readiness; a file fed as fast as possible uses a
:class:`ReplayClock`, which gives each chunk the arrival time a live source would (the end
of its audio) and adds the real compute time, so latency means the same as live.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from studio.audio.phonetics import PhoneticStream
from studio.engines.base import LATENCIES, Engine, Renderer
from studio.errors import OptionError
from studio.layout import DEFAULT_SAMPLING_STEPS, FPS, SAMPLE_RATE, SAMPLES_PER_FRAME
from studio.motion.stream import PostChunk, PostStream
from studio.render.pipeline import make_inbetween
from studio.settings import RenderSettings

# DDIM steps of a live session unless the user chose some: the clip's default (50) makes an
# LMDM window every frame cost ~100 ms on an H200, 4 steps ~4 ms (docs/benchmarks.md).
LIVE_STEPS = 4
# Audio-to-frame latency a frame may take before it counts as late, per latency setting (s).
LATE_AFTER_S = {"low": 0.2, "balanced": 0.3, "smooth": 0.6}


def live_settings(settings: RenderSettings, steps_chosen: bool = False) -> RenderSettings:
    """The settings a live session runs: the clip's default sampling steps become
    :data:`LIVE_STEPS` unless the user chose them (``steps_chosen``)."""
    if steps_chosen or settings.steps != DEFAULT_SAMPLING_STEPS:
        return settings
    return settings.replace(steps=LIVE_STEPS)


@dataclass(frozen=True)
class LiveFrame:
    """One frame of a live session.

    ``audio``: the 640 samples (16 kHz mono) the frame shows, for sinks that play sound with
    the picture. ``arrival_s``: when the audio at the frame's timestamp (its last sample)
    arrived; ``fed_s``: when the chunk whose processing produced the frame arrived;
    ``ready_s``: when the frame existed. All on the session's clock, from its start.
    """

    index: int
    image: np.ndarray  # [H, W, 3] uint8
    audio: np.ndarray  # [SAMPLES_PER_FRAME] float32
    arrival_s: float
    fed_s: float
    ready_s: float

    @property
    def audio_time_s(self) -> float:
        """Where the frame is on the audio's timeline."""
        return self.index / FPS

    @property
    def latency_s(self) -> float:
        """Audio-to-frame latency: ready time minus the arrival of the audio it shows."""
        return self.ready_s - self.arrival_s

    @property
    def wait_s(self) -> float:
        """The algorithmic part of the latency: waiting for the audio after the frame's."""
        return self.fed_s - self.arrival_s

    @property
    def compute_s(self) -> float:
        """The compute part: from the arrival of the chunk that produced it to ready."""
        return self.ready_s - self.fed_s


class ReplayClock:
    """Live time for a file fed as fast as possible: a chunk 'arrives' when its audio ends
    (or when the previous chunk's work is done, if that is later), and work takes the real
    time it takes. Call :meth:`arrive` before feeding each chunk."""

    def __init__(self) -> None:
        self._audio_s = 0.0
        self._start = 0.0  # the current chunk's start on this clock
        self._real = time.perf_counter()

    def arrive(self, samples: int) -> None:
        """``samples`` more have arrived: the clock jumps to their end if it is behind."""
        self._audio_s += samples / SAMPLE_RATE
        self._start = max(self._audio_s, self())
        self._real = time.perf_counter()

    def __call__(self) -> float:
        return self._start + (time.perf_counter() - self._real)


class Ring:
    """The last ``capacity`` float values in a preallocated float32 array: a session's
    figures take the same memory in its first minute and its tenth hour."""

    def __init__(self, capacity: int) -> None:
        self._data = np.zeros(int(capacity), np.float32)
        self._count = 0

    def append(self, value: float) -> None:
        self._data[self._count % self._data.size] = value
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self._data.size)

    def values(self) -> np.ndarray:
        """The kept values, oldest first."""
        n, cap = len(self), self._data.size
        if self._count <= cap:
            return self._data[:n].copy()
        start = self._count % cap
        return np.concatenate([self._data[start:], self._data[:start]])


FRAMES_KEPT = 90000  # an hour of frames' figures for the percentiles


@dataclass
class LiveStats:
    """What a session measured, in fixed memory (each figure for the last hour of frames)."""

    first_frame_s: float | None = None  # wall time from the session's start to frame 0
    frames: int = 0
    late_frames: int = 0
    latencies_s: Ring = field(default_factory=lambda: Ring(FRAMES_KEPT))
    waits_s: Ring = field(default_factory=lambda: Ring(FRAMES_KEPT))
    frame_compute_s: Ring = field(default_factory=lambda: Ring(FRAMES_KEPT))
    chunk_compute_s: Ring = field(default_factory=lambda: Ring(2 * FRAMES_KEPT))
    stage_s: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))

    def add(self, frame: LiveFrame, late_after_s: float) -> None:
        self.frames += 1
        self.latencies_s.append(frame.latency_s)
        self.waits_s.append(frame.wait_s)
        self.frame_compute_s.append(frame.compute_s)
        if frame.latency_s > late_after_s:
            self.late_frames += 1


def percentiles_ms(values: Ring) -> dict[str, float | None]:
    """p50, p95 and max of seconds, in ms (None when there are none)."""
    a = values.values().astype(np.float64) * 1000.0
    if not a.size:
        return {"p50": None, "p95": None, "max": None}
    p50, p95 = np.percentile(a, [50, 95])
    return {
        "p50": round(float(p50), 2),
        "p95": round(float(p95), 2),
        "max": round(float(a.max()), 2),
    }


class LiveSession:
    """A live talking head: :meth:`feed` 16 kHz mono samples, get the frames that exist.

    ``clock`` (seconds) stamps arrivals and readiness: the wall clock for a live source, a
    :class:`ReplayClock` for a file fed faster than real time. Time to the first frame is
    always wall time from the session's construction (engines already open and warm).
    """

    def __init__(
        self,
        engine: Engine,
        settings: RenderSettings,
        latency: str = "balanced",
        clock: Callable[[], float] = time.perf_counter,
        keep_motion: bool = False,
    ) -> None:
        if latency not in LATENCIES:
            raise OptionError(
                "--latency", f"must be one of {', '.join(LATENCIES)}; got {latency!r}"
            )
        self.engine, self.settings, self.latency, self.clock = engine, settings, latency, clock
        self.late_after_s = LATE_AFTER_S[latency]
        self.phonetics = PhoneticStream()
        self.motion = engine.motion_stream(settings.seed, latency)
        self.post = PostStream(
            settings.stride, settings.cadence, settings.smoothing, latency=latency
        )
        self.renderer: Renderer = engine.renderer(settings)
        self.stats = LiveStats()
        self._wall0 = time.perf_counter()
        self._t0 = clock()
        self._received = 0  # samples fed so far
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()
        self._audio = np.zeros(0, np.float32)  # samples from frame self._audio_frame on
        self._audio_frame = 0
        self._keys: dict[int, np.ndarray] = {}  # rendered keyframes still needed
        self._key_rows: dict[int, np.ndarray] = {}  # and their motion rows (for in-betweens)
        self._prepared = False
        self._finished = False
        # keep_motion (measurements): the engine's rows and the smoothed rows, as they came
        self.raw_rows: list[np.ndarray] | None = [] if keep_motion else None
        self.post_rows: list[np.ndarray] | None = [] if keep_motion else None

    @property
    def lookahead_frames(self) -> int:
        """Frames of audio after a frame that the settings make it wait for: phonetics and
        the motion side by side (a motion that reads the phonetics after them), cadence and
        smoothing after both."""
        phon = self.phonetics.lookahead_frames
        motion = self.motion.lookahead_frames
        if getattr(self.motion, "reads_phonetics", False):
            motion += phon
        return max(phon, motion) + self.post.lookahead_frames

    @property
    def frame_size(self) -> tuple[int, int]:
        """(width, height) of the frames."""
        return self.engine.frame_size(self.settings)

    @property
    def received_samples(self) -> int:
        """Samples of audio fed so far."""
        return self._received

    @property
    def received_s(self) -> float:
        """Seconds of audio fed so far."""
        return self._received / SAMPLE_RATE

    def feed(self, samples: np.ndarray) -> list[LiveFrame]:
        """Take the next samples (float32 mono, 16 kHz, values in [-1, 1]); the frames that
        became ready, in order."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        x = np.clip(np.asarray(samples, np.float32).reshape(-1), -1.0, 1.0)
        now = self.clock() - self._t0
        self._received += x.size
        self._arrivals.append((self._received, now))
        self._audio = np.concatenate([self._audio, x])
        t = time.perf_counter()
        phon = self.phonetics.push(x)
        self._stage("phonetics", t)
        t = time.perf_counter()
        rows = self._kept(self.motion.push(x, phon))
        self._stage("motion", t)
        t = time.perf_counter()
        chunk = self.post.push(rows, phon)
        self._stage("post", t)
        frames = self._render(chunk, now)
        self.stats.chunk_compute_s.append(self.clock() - self._t0 - now)
        return frames

    def finish(self) -> list[LiveFrame]:
        """The audio has ended: the remaining frames (the last ones read silence past it)."""
        if self._finished:
            return []
        self._finished = True
        now = self.clock() - self._t0
        phon = self.phonetics.finish()
        rows = self._kept(self.motion.push(np.zeros(0, np.float32), phon))
        tail = self._kept(self.motion.finish())
        rows = np.concatenate([rows, tail]) if len(rows) else tail
        first = self.post.push(rows, phon)
        frames = self._render(first, now)
        frames += self._render(self.post.finish(), now)
        return frames

    def report(self) -> dict[str, Any]:
        """The session's measurements (the report's ``live`` block): ms unless named."""
        s = self.stats
        return {
            "latency_setting": self.latency,
            "frames": s.frames,
            "audio_s": round(self.received_s, 3),
            "time_to_first_frame_ms": None
            if s.first_frame_s is None
            else round(s.first_frame_s * 1000.0, 2),
            "lookahead_frames": self.lookahead_frames,
            "algorithmic_latency_ms": round(self.lookahead_frames * 1000.0 / FPS, 1),
            "latency_ms": percentiles_ms(s.latencies_s),
            "wait_ms": percentiles_ms(s.waits_s),
            "compute_ms": percentiles_ms(s.frame_compute_s),
            "compute_per_chunk_ms": percentiles_ms(s.chunk_compute_s),
            "late_after_ms": self.late_after_s * 1000.0,
            "late_frames": s.late_frames,
            "stage_ms": {k: round(v * 1000.0, 1) for k, v in self._stages().items()},
            "kinematics": self.post.kinematics(),
        }

    # --- internals -----------------------------------------------------------------

    def _stages(self) -> dict[str, float]:
        """Seconds per stage; the motion split as the engine's stream splits it."""
        stages = dict(self.stats.stage_s)
        for name, seconds in getattr(self.motion, "timings_s", {}).items():
            stages[f"motion.{name}"] = seconds
        return stages

    def _stage(self, name: str, t0: float) -> None:
        self.stats.stage_s[name] += time.perf_counter() - t0

    def _kept(self, rows: np.ndarray) -> np.ndarray:
        if self.raw_rows is not None and len(rows):
            self.raw_rows.append(np.array(rows, np.float32))
        return rows

    def _render(self, chunk: PostChunk, fed: float) -> list[LiveFrame]:
        """Render the chunk's keyframes and make its frames (in-betweens blended)."""
        if not len(chunk):
            return []
        if self.post_rows is not None:
            self.post_rows.append(np.array(chunk.motion, np.float32))
        t = time.perf_counter()
        keys = chunk.indices[chunk.keyframe]
        if keys.size:
            rows = chunk.motion[chunk.keyframe]
            if not self._prepared:
                self.renderer.prepare(rows[:1])  # frame 0 is the relative-driving reference
                self._prepared = True
            images = self.renderer.render_batch(rows, keys)
            self._keys.update(zip(keys.tolist(), images, strict=True))
            self._key_rows.update(zip(keys.tolist(), rows, strict=True))
        frames = []
        for i, index in enumerate(chunk.indices.tolist()):
            frames.append(self._frame(index, self._image(chunk, i), fed))
        oldest = int(chunk.prev_key[-1])
        for k in [k for k in self._keys if k < oldest]:
            del self._keys[k], self._key_rows[k]
        self._stage("render", t)
        return frames

    def _image(self, chunk: PostChunk, i: int) -> np.ndarray:
        """Frame ``i`` of the chunk: its keyframe's render, or the in-between of two."""
        prev_k, next_k = int(chunk.prev_key[i]), int(chunk.next_key[i])
        w = float(chunk.weight[i])
        if w == 0.0:
            return self._keys[prev_k]
        rows = np.stack([self._key_rows[prev_k], self._key_rows[next_k], chunk.motion[i]])
        keys = (prev_k, next_k, int(chunk.indices[i]))
        return make_inbetween(self.renderer, self._keys[prev_k], self._keys[next_k], rows, w, keys)

    def _frame(self, index: int, image: np.ndarray, fed: float) -> LiveFrame:
        now = self.clock() - self._t0
        frame = LiveFrame(index, image, self._frame_audio(index), self._arrival_of(index), fed, now)
        if self.stats.first_frame_s is None:
            self.stats.first_frame_s = time.perf_counter() - self._wall0
        self.stats.add(frame, self.late_after_s)
        return frame

    def _frame_audio(self, index: int) -> np.ndarray:
        """The frame's 640 samples (zeros past the audio); earlier samples are let go."""
        start = (index - self._audio_frame) * SAMPLES_PER_FRAME
        out = np.zeros(SAMPLES_PER_FRAME, np.float32)
        part = self._audio[start : start + SAMPLES_PER_FRAME]
        out[: part.size] = part
        drop = (index + 1 - self._audio_frame) * SAMPLES_PER_FRAME
        self._audio = self._audio[drop:]
        self._audio_frame = index + 1
        return out

    def _arrival_of(self, index: int) -> float:
        """When the audio of frame ``index`` (its last sample) arrived; frames past the end of
        the audio count from its last chunk."""
        need = min((index + 1) * SAMPLES_PER_FRAME, self._received)
        while len(self._arrivals) > 1 and self._arrivals[0][0] < need:
            self._arrivals.popleft()  # frames come in order: earlier entries are done
        return self._arrivals[0][1]


def warm_up(engine: Engine, settings: RenderSettings, latency: str = "balanced") -> None:
    """Run a throwaway session over half a second of silence, so that the first frame of the
    real one is not the first of the process (kernels loaded, graphs captured, caches filled)."""
    session = LiveSession(engine, settings, latency)
    session.feed(np.zeros(SAMPLE_RATE // 2, np.float32))
    session.finish()
