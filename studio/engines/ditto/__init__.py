"""The Ditto engine: HuBERT → LMDM motion on the user's checkpoints, rendered by stitching,
warp, decoder and paste-back on the device.

This face is what the registry (:mod:`studio.render.engines`) reads, importable without
torch: the capabilities, the checks of a request and the opening of the engine
(:mod:`studio.engines.ditto.engine`, which loads torch and the networks).
"""

from __future__ import annotations

from studio.engines.base import Capabilities, EngineRequest, Prepared, Progress
from studio.runtime.names import RUNTIMES

CAPABILITIES = Capabilities(
    label="ditto",
    takes_avatar=True,
    needs_checkpoints=True,
    precisions=("auto", "fp32", "bf16", "fp16"),
    cuda_only=frozenset({"fp16"}),
    runtimes=RUNTIMES,
    checked=frozenset({"precision", "runtime", "motion_precision", "compile"}),
    controls=frozenset(
        {
            "emotion",
            "steps",
            "crop_scale",
            "crop_vx",
            "crop_vy",
            "delta_pitch",
            "delta_yaw",
            "delta_roll",
            "frame",
            "video_loop",
            "runtime",
            "compile",
            "memory",
            "batch",
            "precision",
            "motion_precision",
        }
    ),
)


def prepare(request: EngineRequest) -> Prepared:
    """Check the checkpoint folder, then the avatar, then device, runtime and precision."""
    from studio.engines.ditto.engine import prepare as check

    return check(request)


def open(prepared: Prepared, progress: Progress | None = None):  # noqa: A001 - the face's verb
    """Register (or reopen) the avatar and load the networks: the Ditto engine."""
    from studio.engines.ditto.engine import open_prepared

    return open_prepared(prepared, progress)


def check_checkpoints(path: str) -> str:
    """The checkpoint root found in ``path`` when it holds every file an avatar and the engine
    read; InputError naming each missing file and its stage otherwise."""
    from studio.engines.ditto.engine import ALL_ROLES, require
    from studio.models.checkpoints import discover

    found = discover(path)
    require(found, ALL_ROLES)
    return str(found.root)
