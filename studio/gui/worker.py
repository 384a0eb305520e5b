"""Background work for the GUI: motion (cached) and frame rendering, each on its own QThread.

The workers own no widgets. Requests arrive as queued signals carrying plain data
(paths, RenderSettings, MotionResult); results go back the same way. Every request
carries a *generation*: a newer request supersedes older ones, which stop at their
next check (a render batch is well under a second of work) and say so.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from studio.audio.io import Audio, load_audio
from studio.errors import Cancelled, StudioError
from studio.render.demo import DemoEngine, demo_audio_path
from studio.render.pipeline import (
    MotionResult,
    generate,
    iter_frames,
    postprocess,
    render_video,
)
from studio.settings import RenderSettings

PREVIEW_BATCH = 4  # keyframes per render call: small, so a cancel lands within ~50 ms
FRAME_CHUNK = 6  # frames per signal: keeps the GUI's event queue short while rendering


@dataclass(frozen=True)
class MotionJob:
    """Compute motion for an audio file with these settings."""

    generation: int
    audio_path: str | None  # None = the demo speech
    settings: RenderSettings


@dataclass(frozen=True)
class ExportJob:
    """Write an MP4 of this motion with these settings."""

    result: MotionResult
    settings: RenderSettings
    path: str


def _details() -> str:
    return traceback.format_exc(limit=8)


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


class MotionWorker(QObject):
    """Loads audio and computes motion; the generated motion is cached per (audio, seed)."""

    audioLoaded = Signal(int, object)  # generation, Audio
    motionReady = Signal(int, object)  # generation, MotionResult
    failed = Signal(int, str, str)  # generation, message, details

    def __init__(self) -> None:
        super().__init__()
        self.cancellation = Cancellation()
        self.engine = DemoEngine()
        self._audio: dict[tuple, Audio] = {}
        self._motion: dict[tuple, tuple] = {}
        self.generate_calls = 0  # how often the motion generator really ran

    def _load(self, path: str | None) -> Audio:
        p = str(path) if path else str(demo_audio_path())
        try:
            key = (os.path.abspath(p), os.path.getmtime(p), os.path.getsize(p))
        except OSError:
            key = (p, None, None)
        if key not in self._audio:
            self._audio = {key: load_audio(p)}  # keep one clip
        return self._audio[key]

    @Slot(object)
    def compute(self, job: MotionJob) -> None:
        if self.cancellation.is_cancelled(job.generation):
            return
        try:
            audio = self._load(job.audio_path)
            self.audioLoaded.emit(job.generation, audio)
            key = (id(audio), job.settings.seed, self.engine.name)
            if key not in self._motion:
                self.generate_calls += 1
                self._motion = {key: generate(self.engine, audio, job.settings.seed)}
            phon, raw, timings = self._motion[key]
            if self.cancellation.is_cancelled(job.generation):
                return
            result = postprocess(audio, phon, raw, job.settings, timings)
            self.motionReady.emit(job.generation, result)
        except StudioError as e:
            self.failed.emit(job.generation, str(e), "")
        except Exception as e:  # noqa: BLE001 - shown in a dialog, the app stays usable
            self.failed.emit(job.generation, f"Motion failed: {e}", _details())


class RenderWorker(QObject):
    """Renders preview frames and exports MP4s."""

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
        self.engine = DemoEngine()
        self._renderers: dict[int, object] = {}
        self._export_cancel = threading.Event()

    def _renderer(self, size: int):
        if size not in self._renderers:
            self._renderers = {size: self.engine.renderer(size)}
        return self._renderers[size]

    @Slot(int, object, int)
    def render(self, generation: int, result: MotionResult, size: int) -> None:
        if self.cancellation.is_cancelled(generation):
            self.cancelled.emit(generation)
            return
        stats: dict = {}
        t0 = time.perf_counter()
        try:
            frames = iter_frames(
                result,
                self._renderer(size),
                batch=PREVIEW_BATCH,
                cancel=lambda: self.cancellation.is_cancelled(generation),
                progress=lambda s, d, n: self.progress.emit(generation, s, d, n),
                stats=stats,
            )
            chunk: list = []
            start = 0
            for img in frames:
                chunk.append(img)
                if len(chunk) == FRAME_CHUNK:
                    self.framesReady.emit(generation, start, chunk)
                    start, chunk = start + len(chunk), []
            if chunk:
                self.framesReady.emit(generation, start, chunk)
        except Cancelled:
            self.cancelled.emit(generation)
            return
        except Exception as e:  # noqa: BLE001
            self.failed.emit(generation, f"Rendering failed: {e}", _details())
            return
        wall = time.perf_counter() - t0
        self.renderDone.emit(
            generation,
            {
                "frames": result.num_frames,
                "rendered_frames": int(result.plan.keyframes.size),
                "render_ms": stats.get("render_s", 0.0) * 1000.0,
                "wall_ms": wall * 1000.0,
                "fps": result.num_frames / max(wall, 1e-9),
            },
        )

    def cancel_export(self) -> None:
        """Stop a running export (callable from any thread); nothing is left on disk."""
        self._export_cancel.set()

    @Slot(object)
    def export(self, job: ExportJob) -> None:
        self._export_cancel.clear()
        gen = self.EXPORT_GENERATION
        try:
            result = postprocess(
                job.result.audio,
                job.result.phon,
                job.result.raw,
                job.settings,
                job.result.timings_ms,
            )
            report = render_video(
                result,
                self._renderer(job.settings.size),
                job.path,
                job.settings,
                cancel=self._export_cancel.is_set,
                progress=lambda s, d, n: self.progress.emit(gen, "export", d, n),
            )
        except Cancelled:
            self.cancelled.emit(gen)
            return
        except StudioError as e:
            self.failed.emit(gen, str(e), "")
            return
        except Exception as e:  # noqa: BLE001
            self.failed.emit(gen, f"Export failed: {e}", _details())
            return
        self.exportDone.emit(job.path, report)


def start_in_thread(worker: QObject, name: str) -> QThread:
    """Move ``worker`` to a new named QThread and start it."""
    thread = QThread()
    thread.setObjectName(name)
    worker.moveToThread(thread)
    thread.finished.connect(worker.deleteLater)  # destroyed in its own thread, not at exit
    thread.start()
    return thread


def export_settings(settings: RenderSettings, size: int, crf: int) -> RenderSettings:
    """The settings an export runs with: the preview's, with the dialog's size and quality."""
    return replace(settings, size=size, crf=crf).validate()


def default_export_path(audio_path: str | None) -> str:
    """A sensible first suggestion for the export file name."""
    stem = Path(audio_path).stem if audio_path else "demo"
    return str(Path.home() / f"{stem}_talking_head.mp4")
