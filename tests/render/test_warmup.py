"""The full batch's render engines are built on a thread while the clip is analysed
(studio.render.warmup): started only where the clip fills a batch, beside the caller's work,
and a failure there is said, not raised (the caller builds in turn)."""

from __future__ import annotations

import logging
import threading

from studio.engines.base import Renderer
from studio.render.warmup import BuildBeside


class Recording(Renderer):
    def __init__(self, batch: int, fail: bool = False) -> None:
        super().__init__(64, batch)
        self.fail = fail
        self.analysed = threading.Event()
        self.built: list[tuple[int, str, bool]] = []

    def build_engines(self, frames: int, progress=None) -> None:
        # held until the caller's analysis has gone on: in turn, this would wait in vain
        went_on = self.analysed.wait(timeout=10)
        self.built.append((frames, threading.current_thread().name, went_on))
        if self.fail:
            raise RuntimeError("out of engines")


def test_the_full_batch_is_built_on_a_thread_while_the_caller_goes_on() -> None:
    r = Recording(batch=8)
    beside = BuildBeside(r, frames=20)
    r.analysed.set()  # the analysis, in the caller's thread
    beside.wait()
    assert r.built == [(8, "studio-build-engines", True)]
    assert beside.seconds > 0


def test_a_clip_shorter_than_a_batch_starts_nothing() -> None:
    r = Recording(batch=32)
    beside = BuildBeside(r, frames=31)
    r.analysed.set()
    beside.wait()
    assert r.built == [] and beside.seconds == 0.0


def test_a_failure_beside_the_analysis_is_said_not_raised(caplog) -> None:
    r = Recording(batch=4, fail=True)
    beside = BuildBeside(r, frames=4)
    r.analysed.set()
    with caplog.at_level(logging.WARNING):
        beside.wait()
    assert "out of engines" in caplog.text and "building them now" in caplog.text


def test_not_enabled_starts_nothing() -> None:
    r = Recording(batch=2)
    beside = BuildBeside(r, frames=10, enabled=False)
    r.analysed.set()
    beside.wait()
    assert r.built == []
