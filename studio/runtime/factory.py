"""The engine factory: one network, one backend, one precision, built (or loaded) here.

Building and calling one (the renderer's warp + decoder, batched, static batch 8)::

    warp = make_engine("warp_network", "torch", device="cuda", checkpoints=ck, batch=8,
                       cuda_graph=True)                 # default fp16 (autocast for warp)
    dec = make_engine("decoder", "tensorrt", "fp16", "cuda", checkpoints=ck, batch=8)
    feat = warp.run({"feature_3d": f_s8, "kp_source": x_s, "kp_driving": x_d})["out"]
    img = dec.run({"feature": feat})["output"]          # [8, 3, 512, 512] fp32, on the GPU

It sits one level above the backends (:mod:`studio.runtime.torch_backend`,
:mod:`studio.runtime.onnxruntime_backend`, :mod:`studio.runtime.tensorrt`), which it imports
only when asked for one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from studio.errors import InputError, OptionError
from studio.runtime.base import BackendUnavailable, EngineBase, default_cache_dir, resolve_device
from studio.runtime.names import RUNTIMES
from studio.runtime.precision import ENGINE_NETWORKS, canonical_network, parse_precision


@dataclass
class EngineRequest:
    """Everything :func:`make_engine` resolved, for messages and caching."""

    network: str
    backend: str
    precision: str
    device: torch.device
    batch: int
    options: dict[str, Any] = field(default_factory=dict)


def _load_module(network: str, module: Any, checkpoints: Any, device: torch.device) -> Any:
    if module is not None:
        return module
    if network == "hubert":
        raise InputError(
            "hubert has no torch module (Ditto ships it as ONNX): use backend onnxruntime or "
            "tensorrt"
        )
    if checkpoints is None:
        raise InputError(f"{network}: give module= or checkpoints= to build a torch engine")
    from studio.models import load_network
    from studio.models.checkpoints import CheckpointSet, discover

    found = checkpoints if isinstance(checkpoints, CheckpointSet) else discover(checkpoints)
    return load_network(network, found.path(network, "pytorch"), device)


def _released_onnx(network: str, checkpoints: Any) -> Path | None:
    """``ditto_onnx/<file>`` (HuBERT: also ``ditto_pytorch/aux_models/``) when present."""
    if checkpoints is None:
        return None
    from studio.models.checkpoints import CheckpointSet, discover

    found = checkpoints if isinstance(checkpoints, CheckpointSet) else discover(checkpoints)
    layouts = ("onnx", "pytorch") if network == "hubert" else ("onnx",)  # HuBERT ships as ONNX
    for layout in layouts:
        try:
            return found.path(network, layout)
        except (InputError, ValueError):
            continue
    return None


def make_engine(
    network: str,
    backend: str = "torch",
    precision: str | None = None,
    device: str | torch.device | None = None,
    *,
    module: Any = None,
    checkpoints: Any = None,
    onnx: str | os.PathLike[str] | None = None,
    engine: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    batch: int = 1,
    cuda_graph: bool = False,
    plugin: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
    **options: Any,
) -> EngineBase:
    """Build the engine for one network.

    ``precision`` None takes the network's default (:data:`DEFAULT_PRECISION`, fp32 where the
    backend cannot run it). The network comes from ``module`` (a studio network module), else
    ``checkpoints`` (a folder or :class:`~studio.models.checkpoints.CheckpointSet`): its
    ``.pth`` for torch; for ONNX Runtime an explicit ``onnx`` file, else the released
    ``ditto_onnx`` file (batch 1, fp32, not the warp network, whose released graph uses the
    GridSample3D plugin op), else an export of the module cached under ``cache_dir``
    (default :func:`default_cache_dir`); for TensorRT an explicit ``engine`` file, else a
    cached build of that ONNX (rebuilt with a message when stale). ``batch`` is the static
    batch size. ``cuda_graph`` captures the engine (CUDA only). ``options`` go to the
    backend's engine class (torch: ``mode``, ``channels_last``, ``compile``, ``io_dtype``).
    """
    name = canonical_network(network)
    if name not in ENGINE_NETWORKS:
        raise InputError(
            f"unknown network {network!r}: expected one of {', '.join(ENGINE_NETWORKS)}"
        )
    if backend not in RUNTIMES:
        raise OptionError(
            "--backend", f"unknown backend {backend!r} (one of {', '.join(RUNTIMES)})"
        )
    if not isinstance(batch, int) or batch < 1:
        raise OptionError("--batch", f"must be a positive integer, got {batch!r}")
    dev = resolve_device(device)
    spec = f"{name}={precision}" if precision else None
    prec = parse_precision(spec, backend, dev).of(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if backend == "torch":
        from studio.runtime.torch_backend import TorchEngine

        mod = _load_module(name, module, checkpoints, dev)
        eng: EngineBase = TorchEngine(name, mod, prec, dev, batch=batch, **options)
    elif backend == "onnxruntime":
        from studio.runtime.onnxruntime_backend import OrtEngine

        path = _onnx_for(name, prec, dev, batch, module, checkpoints, onnx, cache, log)
        eng = OrtEngine(name, path, prec, dev, **options)
    else:
        from studio.runtime.tensorrt.cache import cached_engine, engine_stem
        from studio.runtime.tensorrt.run import TensorRTEngine
        from studio.runtime.tensorrt.support import (
            BuildSettings,
            graph_precision,
            import_tensorrt,
            resolve_typing,
        )

        if engine is not None:
            eng = TensorRTEngine(name, engine, dev, precision=prec, plugin=plugin)
        else:
            settings = options.pop("settings", None) or BuildSettings()
            typing = resolve_typing(settings.typing, str(import_tensorrt().__version__))
            graph = graph_precision(prec, typing)
            path = _onnx_for(
                name, graph, dev, batch, module, checkpoints, onnx, cache, log, plugin is not None
            )
            eng = cached_engine(
                name,
                path,
                prec,
                dev,
                cache / "trt",
                plugin=plugin,
                settings=settings,
                stem=engine_stem(name, batch),
                log=log,
                **options,
            )
    if cuda_graph and not eng.capture():
        raise BackendUnavailable(f"{name}: the {backend} engine cannot capture a CUDA graph here")
    return eng


def _onnx_for(
    name: str,
    graph_precision: str,
    device: torch.device,
    batch: int,
    module: Any,
    checkpoints: Any,
    onnx: Any,
    cache: Path,
    log: Callable[[str], None] | None,
    plugin_ops: bool = False,
) -> Path:
    """The ONNX file an engine runs: ``onnx`` if given; the released ``ditto_onnx`` file when
    it fits (batch 1, an fp32 graph; the warp network's only when its GridSample3D plugin ops
    can run, i.e. ``plugin_ops``); else an export of the module (cached)."""
    if onnx is not None:
        p = Path(onnx).expanduser()
        if not p.is_file():
            raise InputError(f"ONNX file {p} does not exist")
        return p
    released = _released_onnx(name, checkpoints) if module is None else None
    fits = batch == 1 and graph_precision in ("fp32", "tf32")
    if released is not None and fits and (name != "warp_network" or plugin_ops):
        return released
    if name == "hubert":
        if released is None:
            raise InputError("hubert: give onnx= (Ditto's hubert ONNX file) or checkpoints=")
        return released
    from studio.runtime.onnx_cache import export_for_engine

    mod = _load_module(name, module, checkpoints, torch.device("cpu"))
    return export_for_engine(
        name, mod, cache / "onnx", batch=batch, precision=graph_precision, device=device, log=log
    )
