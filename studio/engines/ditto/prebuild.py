"""`studio compile --runtime torch`: build the compiled render engines before any render.

``--compile`` renders run warp + decoder from AOTInductor packages kept in the cache
(:mod:`studio.runtime.aot_cache`), or where this torch cannot load packages, as Inductor's
standalone artifacts (:mod:`studio.runtime.aot_artifacts`); a first render builds what its
batches need. This builds them ahead, the render batch first (what every clip uses), then the
small rungs of short calls, so that the first render of a new machine or of new checkpoints
starts as fast as a later one, and a prebuild stopped early has built the engines that matter
most.
"""

from __future__ import annotations

from typing import Any

import torch

from studio.engines.base import Progress
from studio.engines.ditto.engine import load_networks, plan_memory, render_dtype
from studio.engines.ditto.warp_decode import prebuild_rungs
from studio.errors import OptionError
from studio.models.checkpoints import discover
from studio.runtime.base import resolve_device
from studio.settings import RenderSettings

STAGE = "compiling render engines"


def prebuild(
    checkpoints: str,
    settings: RenderSettings,
    device: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build (or find, verified) the compiled warp + decoder for ``settings``' precision and
    the rungs renders of its batch use (:func:`prebuild_rungs`); a summary."""
    found = discover(checkpoints)  # the folder first: errors in the order a user fixes them
    if not torch.cuda.is_available():  # before --device, whose default (cuda) says less
        raise OptionError(
            "--runtime",
            "torch: compiled render engines run inside CUDA graphs, so they are built on a "
            "CUDA GPU; this machine has none (`studio doctor` says what it has)",
        )
    dev = resolve_device(device)
    if dev.type != "cuda":
        raise OptionError("--device", f"{dev}: compiled render engines are built on cuda[:N]")
    nets = load_networks(found, dev)
    plan = plan_memory(settings.memory, settings.batch, dev, render_dtype(settings.precision, dev))
    engines = nets.warp_decode(settings.precision, True, "torch")
    rungs = prebuild_rungs(plan.batch)
    for i, batch in enumerate(rungs):
        if progress is not None:
            progress(f"{STAGE}: batch {batch}", i, len(rungs))
        engines.engines(batch)
    if progress is not None:
        progress(STAGE, len(rungs), len(rungs))
    return {
        "device": str(dev),
        "precision": engines.describe()["precision"],
        "batches": rungs,
        "packages": engines.describe()["compiled_packages"],
        "folder": str(engines.aot_dir),
    }
