"""A clip's analysis while its renderer's engines are built beside it (the render command)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from studio.audio.io import audio_from_array
from studio.engines.demo.avatar import DemoAvatar
from studio.engines.demo.engine import DemoEngine
from studio.render.build_aside import analyze_while_building
from studio.render.pipeline import analyze
from studio.settings import RenderSettings


class _Building(DemoAvatar):
    """The demo avatar whose engine build takes a while, reports, and is recorded."""

    def __init__(self, settings: RenderSettings, hold: threading.Event | None, fail: bool) -> None:
        super().__init__(settings.size)
        self.batch = 16
        self.builds: list[tuple[str, int]] = []
        self.hold, self.fail = hold, fail

    def build_engines(self, frames: int, progress=None) -> None:
        self.builds.append((threading.current_thread().name, int(frames)))
        if len(self.builds) > 1:
            return  # the render's own call: everything is built
        if progress is not None:
            progress("building engines: torch, batch 16", 0, 1)
        if self.hold is not None:
            self.hold.wait(10.0)
        if self.fail:
            raise RuntimeError("no room for the engines")


class _Engine(DemoEngine):
    def __init__(self, hold: threading.Event | None = None, fail: bool = False) -> None:
        super().__init__()
        self.hold, self.fail, self.made = hold, fail, []

    def renderer(self, settings: RenderSettings) -> DemoAvatar:
        self.made.append(_Building(settings, self.hold, self.fail))
        return self.made[-1]


def _audio(seconds: float):
    t = np.arange(int(16000 * seconds)) / 16000
    speech = 0.3 * np.sin(2 * np.pi * 180 * t) * (np.sin(2 * np.pi * 3 * t) > 0)
    return audio_from_array(speech.astype(np.float32), 16000)


def test_the_full_batch_is_built_on_its_own_thread_and_the_motion_is_the_same() -> None:
    settings = RenderSettings(stride="1", size=64)
    engine = _Engine()
    done = analyze_while_building(_audio(2.4), settings, engine, engine.renderer(settings))
    want = analyze(_audio(2.4), settings, DemoEngine())
    np.testing.assert_array_equal(done.result.smoothed, want.smoothed)
    assert done.renderer is engine.made[0]
    (aside, first), (main, rest) = done.renderer.builds
    assert aside == "studio-build" and first == 16  # the renderer's batch: 60 frames > 16
    assert main == threading.current_thread().name and rest == want.plan.keyframes.size
    assert done.build_s >= 0 and done.waited_s >= 0


def test_a_clip_shorter_than_a_batch_builds_its_own_frames() -> None:
    engine, settings = _Engine(), RenderSettings(size=64)
    done = analyze_while_building(_audio(0.6), settings, engine, engine.renderer(settings))
    assert done.renderer.builds[0] == ("studio-build", 15)  # 0.6 s at 25 fps


def test_the_wait_shows_the_builds_last_stage() -> None:
    hold = threading.Event()
    calls: list[tuple[str, int, int]] = []

    def progress(stage: str, done: int, total: int) -> None:
        calls.append((stage, done, total))
        if stage.startswith("building"):  # shown while the render waits: let the build end
            threading.Timer(0.3, hold.set).start()

    t0 = time.perf_counter()
    engine, settings = _Engine(hold), RenderSettings(size=64)
    renderer = engine.renderer(settings)
    done = analyze_while_building(_audio(1.0), settings, engine, renderer, progress=progress)
    assert ("building engines: torch, batch 16", 0, 1) in calls
    assert done.waited_s >= 0.25 and time.perf_counter() - t0 < 8.0


def test_a_failed_build_is_the_renders_error() -> None:
    with pytest.raises(RuntimeError, match="no room for the engines"):
        engine, settings = _Engine(fail=True), RenderSettings(size=64)
        analyze_while_building(_audio(1.0), settings, engine, engine.renderer(settings))
