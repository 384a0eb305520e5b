"""The embedded demo engine: procedural motion and a procedural avatar, no checkpoints.

This face is what the registry (:mod:`studio.render.engines`) reads: its capabilities, the
checks of a request and the opening of the engine (:mod:`studio.engines.demo.engine`).
"""

from __future__ import annotations

from studio.engines.base import Capabilities, EngineRequest, Prepared, Progress
from studio.errors import OptionError

CAPABILITIES = Capabilities(
    label="demo (built-in)",
    takes_avatar=False,
    needs_checkpoints=False,
    precisions=("fp32",),
    why_cpu="the demo engine renders on the CPU in float32",
)


def prepare(request: EngineRequest) -> Prepared:
    """The demo engine takes no checkpoints and no avatar (it draws its own character);
    compile has nothing to act on."""
    if request.checkpoints:
        raise OptionError("--checkpoints", "selects the Ditto engine, not the demo engine")
    if request.avatar:
        raise OptionError("--avatar", "needs --checkpoints DIR (the demo engine has its own)")
    notes = ()
    if request.settings.compile:
        notes = ("--compile is ignored by the demo engine: it has no networks to compile "
                 "(--checkpoints selects Ditto)",)
    return Prepared(request, notes=notes)


def open(prepared: Prepared, progress: Progress | None = None):  # noqa: A001 - the face's verb
    """The demo engine under the request's settings."""
    from studio.engines.demo.engine import DemoEngine

    return DemoEngine(prepared.request.settings)
