"""The embedded demo engine: procedural motion and a procedural avatar, no checkpoints.

This face is what the registry (:mod:`studio.render.engines`) reads: its capabilities, the
checks of a request and the opening of the engine (:mod:`studio.engines.demo.engine`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from studio.engines.base import Capabilities, EngineRequest, Prepared, Progress
from studio.errors import OptionError

CAPABILITIES = Capabilities(
    label="demo (built-in)",
    takes_avatar=False,
    needs_checkpoints=False,
    precisions=("fp32",),
    why_cpu="the demo engine renders on the CPU in float32",
    checked=frozenset({"compile"}),
)


def demo_audio_path() -> Path:
    """The built-in demo speech (16 kHz mono WAV shipped with the package): every engine's
    speech when none is given. Here, not beside the engine, so that a command reading it
    does not import the engine's motion (SciPy's signal module: 1 s on a GPU machine)."""
    return Path(str(resources.files("studio.resources") / "demo" / "speech.wav"))


def prepare(request: EngineRequest) -> Prepared:
    """The demo engine takes no checkpoints and no avatar (it draws its own character);
    ``--device`` is checked as every engine checks it, though the demo renders on the CPU;
    compile has nothing to act on."""
    if request.checkpoints:
        raise OptionError("--checkpoints", "selects the Ditto engine, not the demo engine")
    if request.avatar:
        raise OptionError("--avatar", "needs --checkpoints DIR (the demo engine has its own)")
    notes = _device_notes(request.device)
    if request.settings.compile:
        notes += (
            "--compile is ignored by the demo engine: it has no networks to compile "
            "(--checkpoints selects Ditto)",
        )
    return Prepared(request, notes=notes)


def _device_notes(device: str | None) -> tuple[str, ...]:
    """``--device`` through :func:`studio.runtime.base.resolve_device` (InputError for a name
    that is not a device, or a GPU that is not there); a note that a GPU goes unused. Torch is
    imported only when a device is named."""
    if device is None or device == "auto":
        return ()
    from studio.runtime.base import resolve_device

    if resolve_device(device).type == "cpu":
        return ()
    return (f"--device {device} is not used by the demo engine: it renders on the CPU",)


def open(prepared: Prepared, progress: Progress | None = None):  # noqa: A001 - the face's verb
    """The demo engine under the request's settings."""
    from studio.engines.demo.engine import DemoEngine

    return DemoEngine(prepared.request.settings)
