"""A clip's analysis while its renderer's engines are built beside it.

Building a renderer's engines (compiled engines loaded from the cache, CUDA graphs captured:
seconds in a new process, minutes on a cold first build) needs only the renderer's batch,
not the clip's motion; the analysis (HuBERT, LMDM) needs only its own networks. So a render
starts the build of its full batch on a thread of its own, on a CUDA stream of its own, while
the motion is made, and then waits only for what the build has left. The build reports no
stage of its own while the analysis shows its stages; what it said last is shown while the
render waits for it, so a long first build still has a named stage with counts.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from studio.audio.io import Audio
from studio.engines.base import Engine, Progress, Renderer
from studio.motion.controls import ControlTracks
from studio.render.pipeline import MotionResult, analyze
from studio.runtime.base import own_stream
from studio.settings import RenderSettings

__all__ = ["AnalysisAndBuild", "analyze_while_building"]

POLL_S = 0.2  # how often the wait for the build passes its latest report on


@dataclass
class AnalysisAndBuild:
    """The clip's motion, its renderer with the engines built, and the build's seconds: its
    own (on its thread) and those the render waited for after the analysis."""

    result: MotionResult
    renderer: Renderer
    build_s: float
    waited_s: float


class _Latest:
    """The last ``progress(stage, done, total)`` the build made, kept for the waiting thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report: tuple[str, int, int] | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        with self._lock:
            self._report = (stage, int(done), int(total))

    def get(self) -> tuple[str, int, int] | None:
        with self._lock:
            return self._report


def _build(renderer: Renderer, frames: int, latest: _Latest, out: Future) -> None:
    started = time.perf_counter()
    try:
        with own_stream():  # finished (synchronized) before the render uses the engines
            renderer.build_engines(frames, latest)
    except BaseException as e:  # noqa: BLE001 - raised again on the render's thread
        out.set_exception(e)
    else:
        out.set_result(time.perf_counter() - started)


def _wait(out: Future, latest: _Latest, progress: Progress | None) -> float:
    """The build's own seconds, once it is done; its latest report passed on meanwhile."""
    shown = None
    while True:
        try:
            return out.result(timeout=POLL_S)
        except FutureTimeout:
            report = latest.get()
            if progress is not None and report is not None and report != shown:
                progress(*report)
                shown = report


def analyze_while_building(
    audio: Audio,
    settings: RenderSettings,
    engine: Engine,
    renderer: Renderer,
    controls: ControlTracks | None = None,
    progress: Progress | None = None,
) -> AnalysisAndBuild:
    """:func:`~studio.render.pipeline.analyze` of the clip while ``renderer`` (``engine``'s for
    ``settings``, used by nothing else meanwhile) builds the engines of a full batch (or of the
    clip's frames, if fewer) on a daemon thread; then the rest the clip's keyframes need,
    reported on ``progress``. An error of either is raised here; a build still running when
    the analysis fails is left to the process's end."""
    latest, built = _Latest(), Future[float]()
    first = max(1, min(int(audio.num_frames), int(renderer.batch)))
    threading.Thread(
        target=_build, args=(renderer, first, latest, built), name="studio-build", daemon=True
    ).start()
    result = analyze(audio, settings, engine, controls)
    t0 = time.perf_counter()
    build_s = _wait(built, latest, progress)
    renderer.build_engines(int(result.plan.keyframes.size), progress)  # what is left, if any
    return AnalysisAndBuild(result, renderer, build_s, time.perf_counter() - t0)
