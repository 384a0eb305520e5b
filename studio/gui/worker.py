"""Background work for the GUI: engines and motion (cached), frame rendering, each on a QThread.

The workers own no widgets. Requests arrive as queued signals carrying plain data
(paths, RenderSettings, MotionResult, engine objects); results go back the same way. Every
request carries a *generation*: a newer request supersedes older ones, which stop at their
next check (a render batch is well under a second of work) and say so.

Engines: the motion worker builds them (the Ditto engine registers the avatar and loads the
networks, seconds of work, so never on the GUI thread) and sends each MotionResult together
with the engine that made it; the window hands that same engine object to the render worker
with every render and export request, so frames always come from the engine that made the
motion.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, QThread, Signal, SignalInstance, Slot

from studio.audio.io import Audio, load_audio
from studio.engines.base import EngineRequest
from studio.engines.demo import demo_audio_path
from studio.errors import Cancelled, StudioError
from studio.motion.controls import ControlTracks
from studio.render.engines import (
    ENGINES,
    capabilities,
    engine_package,
    open_prepared,
    prepare_engine,
)
from studio.render.pipeline import (
    InbetweenSample,
    MotionResult,
    frame_shape,
    generate,
    iter_frames,
    postprocess,
    start_video,
)
from studio.settings import RenderSettings

PREVIEW_BATCH = 4  # keyframes per render call: small, so a cancel lands within ~50 ms
FRAME_CHUNK = 6  # frames per signal: keeps the GUI's event queue short while rendering
T = TypeVar("T")


@dataclass(frozen=True)
class MotionJob:
    """Compute motion for an audio file with these settings.

    ``settings.backend`` names the engine; ``checkpoints`` (the folder) and ``avatar`` (an
    image, or a registered avatar folder) go to an engine that needs them; it is opened on
    first use (:func:`studio.render.engines.open_prepared`) and kept.
    """

    generation: int
    audio_path: str | None  # None = the demo speech
    settings: RenderSettings
    checkpoints: str | None = None
    avatar: str | None = None
    controls: ControlTracks | None = None  # keyed directions (studio.motion.controls)


@dataclass(frozen=True)
class ExportJob:
    """Write an MP4 of this motion with these settings, rendered by ``engine`` (the engine
    that made ``result``).

    ``known``: the preview's frames (None where not rendered) when the preview was rendered
    from this motion with identical settings; those are encoded, not rendered again.
    """

    result: MotionResult
    settings: RenderSettings
    path: str
    engine: Any
    known: tuple | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the motion worker built: for the status bar and the export dialog."""

    backend: str
    device: str
    serial: int  # a new number for every engine built
    description: str  # one line (the avatar, for an engine that animates one)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointCheck:
    """The result of checking a checkpoint folder (on the motion worker)."""

    requested: str  # the folder asked about
    path: str  # the checkpoint root found (the folder itself when the check failed)
    ok: bool
    message: str = ""
    details: str = ""
    cuda: bool = False  # whether torch sees a CUDA GPU (fp16 is offered only then)
    runtimes: dict[str, str | None] = field(default_factory=dict)  # name -> why not (None: ok)


def _details() -> str:
    return traceback.format_exc(limit=8)


def _attempt(
    job: Callable[[], T],
    failure: Callable[[Exception], str],
    generation: int,
    failed: SignalInstance,
    cancelled: SignalInstance | None = None,
) -> T | None:
    """``job()``, or None once the reason it did not finish is sent: ``cancelled`` for a
    cancel (where given), ``failed`` with a StudioError's one line or, for anything else,
    ``failure(e)`` and the traceback (shown in a dialog: the app stays usable)."""
    try:
        return job()
    except Exception as e:  # noqa: BLE001 - every failure is reported, none ends the thread
        if isinstance(e, Cancelled) and cancelled is not None:
            cancelled.emit(generation)
        elif isinstance(e, StudioError):
            failed.emit(generation, str(e), "")
        else:
            failed.emit(generation, failure(e), _details())
    return None


class Cancellation:
    """Generation-based cancellation shared between the GUI thread and a worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancel_upto = -1

    def cancel_upto(self, generation: int) -> None:
        """Cancel every job whose generation is <= ``generation`` (callable from any thread)."""
        with self._lock:
            self._cancel_upto = max(self._cancel_upto, generation)

    def is_cancelled(self, generation: int) -> bool:
        with self._lock:
            return generation <= self._cancel_upto


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (False without torch). Imports torch: not on the GUI."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def runtime_reasons() -> dict[str, str | None]:
    """Which render runtimes can run on the default device: name -> None, or why not."""
    import torch

    from studio.runtime.precision import precision_support
    from studio.settings import RUNTIMES

    dev = torch.device("cuda" if cuda_available() else "cpu")
    return {name: precision_support(name, dev).get("fp32") for name in RUNTIMES}


def checkpoint_engines() -> list[str]:
    """The registered engines that run on a checkpoint folder."""
    return [name for name in ENGINES if capabilities(name).needs_checkpoints]


def check_checkpoints(path: str) -> CheckpointCheck:
    """Whether ``path`` holds every file the engines that need checkpoints read (each engine
    checks its own files)."""
    root = path
    try:
        for name in checkpoint_engines():
            root = engine_package(name).check_checkpoints(path)
    except StudioError as e:
        return CheckpointCheck(path, path, False, _one_line(str(e)), str(e), cuda_available())
    return CheckpointCheck(path, root, True, cuda=cuda_available(), runtimes=runtime_reasons())


def _one_line(message: str) -> str:
    """The first line of a message, shortened for a dialog's title text."""
    line = message.splitlines()[0] if message else ""
    return line if len(line) <= 400 else line[:397] + "…"


class MotionWorker(QObject):
    """Opens engines, loads audio and computes motion.

    The generated motion is cached per audio, seed and what the engine says its motion depends
    on (:meth:`~studio.engines.base.Engine.motion_key`: for Ditto the emotion and sampling
    steps): smoothing and cadence edits re-run only the post-processing.
    """

    audioLoaded = Signal(int, object)  # generation, Audio
    motionReady = Signal(int, object, object)  # generation, MotionResult, engine that made it
    failed = Signal(int, str, str)  # generation, message, details
    engineProgress = Signal(int, str, int, int)  # generation, stage, done, total (a build)
    motionProgress = Signal(int, str, int, int)  # generation, stage, done, total (HuBERT, LMDM)
    engineReady = Signal(int, object)  # generation, EngineInfo (a new engine was built)
    engineFailed = Signal(int, str, str)  # generation, message, details (back to demo)
    engineCancelled = Signal(int)  # generation
    checkpointsChecked = Signal(object)  # CheckpointCheck

    def __init__(self) -> None:
        super().__init__()
        self.cancellation = Cancellation()
        self.build_cancellation = Cancellation()  # only Esc or a changed engine stop a build
        self._engine: tuple[tuple, Any, EngineInfo] | None = None  # key, engine, info
        self._serial = 0
        self._audio: dict[tuple, Audio] = {}
        self._motion: dict[tuple, tuple] = {}
        self.generate_calls = 0  # how often the motion generator really ran
        self.engine_builds = 0  # how often an engine with inputs (checkpoints, avatar) opened

    def _load(self, path: str | None) -> Audio:
        p = str(path) if path else str(demo_audio_path())
        try:
            key = (os.path.abspath(p), os.path.getmtime(p), os.path.getsize(p))
        except OSError:
            key = (p, None, None)
        if key not in self._audio:
            self._audio = {key: load_audio(p)}  # keep one clip
        return self._audio[key]

    @Slot(str)
    def check(self, path: str) -> None:
        """Check a checkpoint folder; answers with ``checkpointsChecked``."""
        try:
            result = check_checkpoints(path)
        except Exception as e:  # noqa: BLE001 - reported, the app stays usable
            result = CheckpointCheck(path, path, False, f"Cannot check {path}: {e}", _details())
        self.checkpointsChecked.emit(result)

    def _engine_key(self, job: MotionJob) -> tuple:
        """The engine and the files it opens on (path, size, mtime: a changed file reopens)."""
        caps = capabilities(job.settings.backend)
        files = []
        inputs = ((caps.needs_checkpoints, job.checkpoints), (caps.takes_avatar, job.avatar))
        for wanted, p in inputs:
            if not wanted or not p:
                files.append(None)
                continue
            try:
                st = os.stat(p)
                files.append((os.path.abspath(p), st.st_size, st.st_mtime_ns))
            except OSError:
                files.append((os.path.abspath(p), None, None))
        s = job.settings
        framing = (s.crop_scale, s.crop_vx, s.crop_vy) if caps.honours("crop_scale") else ()
        return (s.backend, *files, framing)  # a new framing registers the avatar again

    def _open(self, job: MotionJob) -> tuple[Any, EngineInfo]:
        """The job's engine: kept from an earlier job, or opened now (registering an avatar
        and loading networks take seconds to minutes: progress and Esc apply)."""
        key = self._engine_key(job)
        if self._engine is not None and self._engine[0] == key:
            return self._engine[1], self._engine[2]
        self._engine = None  # one engine at a time: let the old networks go
        gen = job.generation
        caps = capabilities(job.settings.backend)
        heavy = caps.needs_checkpoints or caps.takes_avatar  # opening it is real work

        def step(stage: str, done: int, total: int) -> None:
            if self.build_cancellation.is_cancelled(gen):
                raise Cancelled()
            if heavy:
                self.engineProgress.emit(gen, stage, done, total)

        request = EngineRequest(
            job.settings,
            job.checkpoints if caps.needs_checkpoints else None,
            job.avatar if caps.takes_avatar else None,
        )
        if heavy:
            step("checking the engine's files", 0, 1)
        engine = open_prepared(prepare_engine(request), step)
        self._serial += 1
        described = engine.describe()
        info = EngineInfo(
            engine.name,
            str(described.get("device", "CPU")),
            self._serial,
            str(described.get("summary", caps.label)),
            tuple(described.get("notes", ()) or ()),
        )
        self._engine = (key, engine, info)
        if heavy:
            self.engine_builds += 1
            self.engineReady.emit(gen, info)
        return engine, info

    @Slot(object)
    def compute(self, job: MotionJob) -> None:
        if self.cancellation.is_cancelled(job.generation):
            return
        gen = job.generation
        s = job.settings
        opened = _attempt(
            lambda: self._open(job),
            lambda e: f"The {capabilities(s.backend).label} engine could not start: {e}",
            gen,
            self.engineFailed,
            self.engineCancelled,
        )
        if opened is None:
            return
        base, info = opened
        engine = base.with_settings(s)
        engine.progress = lambda stage, d, n: self.motionProgress.emit(gen, stage, d, n)
        ident = (info.serial, engine.motion_key(s))
        if self.cancellation.is_cancelled(gen):
            return
        _attempt(
            lambda: self._motion_for(gen, job, engine, ident),
            lambda e: f"Motion failed: {e}",
            gen,
            self.failed,
        )

    def _motion_for(self, gen: int, job: MotionJob, engine: Any, ident: tuple) -> None:
        """Load the audio, generate its motion (kept per audio, seed and engine) and send the
        post-processed result, unless cancelled by then."""
        s = job.settings
        audio = self._load(job.audio_path)
        self.audioLoaded.emit(gen, audio)
        emotion = job.controls.motion_key() if job.controls else ()
        key = (id(audio), s.seed, ident, emotion)
        if key not in self._motion:
            self.generate_calls += 1
            self._motion = {key: generate(engine, audio, s.seed, job.controls)}
        phon, raw, timings = self._motion[key]
        if self.cancellation.is_cancelled(gen):
            return
        source = engine.source_motion(audio.num_frames, s)
        result = postprocess(audio, phon, raw, s, timings, job.controls, source)
        self.motionReady.emit(gen, result, engine)


def describe_renderer(engine: Any, renderer: Any) -> dict[str, Any]:
    """Backend, device, precision (and runtime, memory where they apply) really used."""
    return {"backend": engine.name, "memory": "", **renderer.describe()}


class RenderWorker(QObject):
    """Renders preview frames and exports MP4s with the engine each request names."""

    framesReady = Signal(int, int, object)  # generation, first index, list of HxWx3 uint8
    progress = Signal(int, str, int, int)  # generation, stage, done, total
    renderDone = Signal(int, object)  # generation, stats dict
    exportDone = Signal(str, object)  # path, report dict
    cancelled = Signal(int)  # generation
    failed = Signal(int, str, str)  # generation, message, details

    EXPORT_GENERATION = -1  # exports are not preview generations

    def __init__(self) -> None:
        super().__init__()
        self.cancellation = Cancellation()
        self._renderer_cache: tuple[tuple, Any, Any] | None = None  # key, engine, renderer
        self._export_cancel = threading.Event()

    def _reported(self, generation: int, what: str, job: Callable[[], T]) -> T | None:
        """``job()``, or None once its cancel or failure (``"<what> failed: ..."``) is sent."""
        return _attempt(
            job, lambda e: f"{what} failed: {e}", generation, self.failed, self.cancelled
        )

    def _renderer(self, engine: Any, settings: RenderSettings) -> Any:
        """The engine's renderer for ``settings``: kept while what it depends on is unchanged."""
        key = (id(engine), engine.renderer_key(settings))
        cached = self._renderer_cache
        if cached is None or cached[0] != key:
            # The engine stays referenced with its renderer, so the id in the key stays unique.
            self._renderer_cache = cached = (key, engine, engine.renderer(settings))
        return cached[2]

    @Slot(int, object, object, object)
    def render(
        self,
        generation: int,
        result: MotionResult,
        settings: RenderSettings,
        engine: Any,
    ) -> None:
        if self.cancellation.is_cancelled(generation):
            self.cancelled.emit(generation)
            return
        stats: dict = {}
        t0 = time.perf_counter()
        renderer = self._reported(
            generation,
            "Rendering",
            lambda: self._preview(generation, result, engine, settings, stats),
        )
        if renderer is None:
            return
        wall = time.perf_counter() - t0
        h, w = frame_shape(renderer)
        self.renderDone.emit(
            generation,
            {
                "frames": result.num_frames,
                "rendered_frames": int(result.plan.keyframes.size),
                "render_ms": stats.get("render_s", 0.0) * 1000.0,
                "wall_ms": wall * 1000.0,
                "fps": result.num_frames / max(wall, 1e-9),
                "frame_hw": (h, w),
                "inbetween_psnr": stats.get("inbetween_psnr"),
                **describe_renderer(engine, renderer),
            },
        )

    def _preview(
        self,
        generation: int,
        result: MotionResult,
        engine: Any,
        settings: RenderSettings,
        stats: dict,
    ) -> Any:
        """Render the preview frames, sent in chunks of FRAME_CHUNK; the renderer used."""
        renderer = self._renderer(engine, settings)

        def said(stage: str, done: int, total: int) -> None:
            self.progress.emit(generation, stage, done, total)

        frames = iter_frames(
            result,
            renderer,
            batch=PREVIEW_BATCH,
            cancel=lambda: self.cancellation.is_cancelled(generation),
            progress=said,
            stats=stats,
        )
        measured = InbetweenSample(result, renderer)
        chunk: list = []
        start = 0
        for i, img in enumerate(frames):
            chunk.append(img)
            measured.keep(i, img)
            if len(chunk) == FRAME_CHUNK:
                self.framesReady.emit(generation, start, chunk)
                start, chunk = start + len(chunk), []
        if chunk:
            self.framesReady.emit(generation, start, chunk)
        psnr = measured.psnr(said)
        if psnr is not None:  # what cadence costs in picture
            stats["inbetween_psnr"] = psnr
        return renderer

    def cancel_export(self) -> None:
        """Stop a running export (callable from any thread); nothing is left on disk."""
        self._export_cancel.set()

    @Slot(object)
    def export(self, job: ExportJob) -> None:
        self._export_cancel.clear()
        report = self._reported(self.EXPORT_GENERATION, "Export", lambda: self._export(job))
        if report is not None:
            self.exportDone.emit(job.path, report)

    def _export(self, job: ExportJob) -> dict:
        """Post-process the motion with the export's settings and write the MP4; the report."""
        gen = self.EXPORT_GENERATION
        result = postprocess(
            job.result.audio,
            job.result.phon,
            job.result.raw,
            job.settings,
            job.result.timings_ms,
            job.result.controls,
            job.engine.source_motion(job.result.audio.num_frames, job.settings),
        )
        return start_video(
            result,
            self._renderer(job.engine, job.settings),
            job.path,
            job.settings,
            cancel=self._export_cancel.is_set,
            progress=lambda s, d, n: self.progress.emit(gen, "export", d, n),
            known=job.known,
        ).finish()


def start_in_thread(worker: QObject, name: str) -> QThread:
    """Move ``worker`` to a new named QThread and start it."""
    thread = QThread()
    thread.setObjectName(name)
    worker.moveToThread(thread)
    thread.finished.connect(worker.deleteLater)  # destroyed in its own thread, not at exit
    thread.start()
    return thread


def export_settings(
    settings: RenderSettings,
    size: int,
    crf: int,
    preset: str | None = None,
    fps: str | None = None,
    codec: str | None = None,
    background: str | None = None,
    hw_encode: bool | None = None,
) -> RenderSettings:
    """The settings an export runs with: the preview's, with the dialog's size, quality,
    encoder speed, frame rate, codec, background and hardware encoding."""
    return settings.replace(
        size=size,
        crf=crf,
        preset=preset or settings.preset,
        fps=fps or settings.fps,
        codec=codec or settings.codec,
        background=background or settings.background,
        hw_encode=settings.hw_encode if hw_encode is None else bool(hw_encode),
    )


def default_export_path(audio_path: str | None) -> str:
    """A sensible first suggestion for the export file name."""
    stem = Path(audio_path).stem if audio_path else "demo"
    return str(Path.home() / f"{stem}_talking_head.mp4")
