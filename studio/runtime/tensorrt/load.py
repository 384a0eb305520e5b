"""The loader: a serialized engine file -> a deserialized ``ICudaEngine`` (with the plugin
library loaded first, where the engine needs it), or :class:`EngineLoadError` when TensorRT
refuses the file. Apart from the runner as Polygraphy keeps ``EngineFromBytes`` apart from
``TrtRunner``: the cache catches the refusal and rebuilds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from studio.errors import InputError
from studio.runtime.base import BackendUnavailable
from studio.runtime.tensorrt.plugins import load_plugin

__all__ = ["EngineLoadError", "deserialize_engine"]


class EngineLoadError(BackendUnavailable):
    """TensorRT refused to deserialize an engine file (other GPU/version, or corrupt)."""


def deserialize_engine(
    trt: Any,
    path: Path,
    device: torch.device,
    plugin: str | os.PathLike[str] | None = None,
) -> tuple[Any, Any, Any]:
    """``(logger, runtime, engine)`` for the engine file ``path`` on ``device``; the logger and
    the runtime must outlive the engine. InputError when the file does not exist,
    EngineLoadError when TensorRT cannot deserialize it."""
    if not path.is_file():
        raise InputError(f"TensorRT engine {path} does not exist")
    logger = trt.Logger(trt.Logger.ERROR)
    trt.init_libnvinfer_plugins(logger, "")
    if plugin is not None:
        load_plugin(trt, plugin)
    with torch.cuda.device(device):
        runtime = trt.Runtime(logger)
        try:
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            why = ""
        except Exception as e:  # noqa: BLE001 - some versions raise instead of returning None
            engine, why = None, f": {e}"
        if engine is None:
            raise EngineLoadError(
                f"TensorRT {trt.__version__} cannot deserialize {path.name} (built for "
                f"another GPU or TensorRT version, or damaged){why}"
            )
    return logger, runtime, engine
