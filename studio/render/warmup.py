"""The render engines built beside the clip's analysis.

A new ``--compile`` process spends seconds before its first frame making its render engines
ready (compiled files loaded, warmed up, captured in CUDA graphs) and seconds analysing the
clip (HuBERT, the LMDM). The two need nothing of each other: the engine of the full render
batch, the one every clip of a batch's frames or more renders with, is built on a thread while
the analysis runs (on a CUDA stream of its own), and the render waits for it only where the
analysis ended first. A failure there is said and the build tried again in turn, as before.
The render command does it for the torch runtime (ONNX Runtime's and TensorRT's engines are
built in turn, where their exports and builds are shown as they go).
"""

from __future__ import annotations

import logging
import threading
import time

from studio.engines.base import Progress, Renderer

_log = logging.getLogger(__name__)


class BuildBeside:
    """``renderer``'s full-batch engines built on a thread, started where ``enabled`` and the
    clip's ``frames`` fill at least one batch (a shorter clip's batch is known after the
    analysis: nothing starts). :meth:`wait` before the render; ``seconds``: the thread's own
    time."""

    def __init__(self, renderer: Renderer, frames: int, enabled: bool = True) -> None:
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if enabled and frames >= renderer.batch > 0:
            self._thread = threading.Thread(
                target=self._build, args=(renderer,), name="studio-build-engines", daemon=True
            )
            self._thread.start()

    def _build(self, renderer: Renderer) -> None:
        from studio.runtime.base import own_stream

        start = time.perf_counter()
        try:
            with own_stream():
                renderer.build_engines(renderer.batch)
        except BaseException as e:  # noqa: BLE001 - said in wait(), and built again in turn
            self._error = e
        finally:
            self.seconds = time.perf_counter() - start

    def wait(self, progress: Progress | None = None) -> None:
        """Until the thread is done (the wait shown as the stage "building engines"); its
        failure as a warning (the caller builds in turn)."""
        if self._thread is None:
            return
        if progress is not None and self._thread.is_alive():
            from studio.engines.ditto.engine import STAGE_ENGINES

            progress(STAGE_ENGINES, 0, 1)
        self._thread.join()
        if self._error is not None:
            e = self._error
            _log.warning(
                "building the render engines beside the analysis failed (%s: %s); "
                "building them now",
                type(e).__name__,
                e,
            )
