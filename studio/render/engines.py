"""The one place that opens an engine, for the CLI, the GUI's workers and the bench.

:data:`ENGINES` registers each talking-head engine by its package (one line an engine); a
package's face (see :mod:`studio.engines.base`) gives its capabilities without importing
torch, checks a request before any long work, and opens the engine. A new engine is one
package plus one line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from studio.engines.base import Capabilities, Engine, EngineRequest, Prepared, Progress
from studio.errors import OptionError
from studio.settings import RenderSettings

ENGINES: dict[str, str] = {
    "demo": "studio.engines.demo",
    "ditto": "studio.engines.ditto",
}


def engine_package(name: str) -> ModuleType:
    """The face of the engine ``name`` (OptionError for a name not registered)."""
    if name not in ENGINES:
        raise OptionError("--backend", f"unknown engine {name!r} (one of {', '.join(ENGINES)})")
    return importlib.import_module(ENGINES[name])


def capabilities(name: str) -> Capabilities:
    """What the engine ``name`` can do, without opening it."""
    return engine_package(name).CAPABILITIES


def prepare_engine(request: EngineRequest) -> Prepared:
    """Check a request's inputs (checkpoints, avatar, device, precision) before any work."""
    return engine_package(request.settings.backend).prepare(request)


def open_prepared(prepared: Prepared, progress: Progress | None = None) -> Engine:
    """Open the engine of a checked request; ``progress`` sees registration, loading and,
    later, the motion stages."""
    engine = engine_package(prepared.request.settings.backend).open(prepared, progress)
    engine.progress = progress
    return engine


def open_engine(
    settings: RenderSettings,
    checkpoints: str | None = None,
    avatar: str | None = None,
    device: str | None = None,
    *,
    avatar_cache: str | None = None,
    progress: Progress | None = None,
) -> Engine:
    """The engine ``settings.backend`` names, checked and opened."""
    request = EngineRequest(settings, checkpoints, avatar, device, avatar_cache)
    return open_prepared(prepare_engine(request), progress)
