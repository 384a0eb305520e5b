"""The engine cache: the one entry point that yields a current engine for an ONNX file
(:func:`cached_engine`), building it only when the cached one is missing or stale
(:func:`ensure_engine`), and Ditto's engine file names (:func:`engine_stem`).

The engine file's metadata (:mod:`studio.runtime.engine_cache`) decides reuse, build or rebuild
(stale GPU, TensorRT version, precision, ONNX or builder settings, truncated file, or a file
TensorRT refuses to deserialize), with a message that says why and what a build costs. A
build holds :func:`studio.paths.build_lock`: two processes on a cold cache build an engine once,
the second finding it current once the first is done.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from studio.paths import build_lock
from studio.runtime.engine_cache import CacheDecision, decide, engine_file
from studio.runtime.tensorrt.build import build_engine, engine_key
from studio.runtime.tensorrt.load import EngineLoadError
from studio.runtime.tensorrt.run import TensorRTEngine
from studio.runtime.tensorrt.support import BuildSettings, cuda_device, import_tensorrt

_log = logging.getLogger(__name__)

__all__ = ["cached_engine", "engine_stem", "ensure_engine"]


def engine_stem(network: str, batch: int = 1) -> str:
    """Ditto's engine stem (``lmdm_v0.4_hubert``), with ``_b<batch>`` for batches above 1."""
    from studio.models import REGISTRY

    stem = REGISTRY[network].onnx_file.removesuffix(".onnx") if network in REGISTRY else network
    return stem if batch == 1 else f"{stem}_b{batch}"


def ensure_engine(
    network: str,
    onnx_path: str | os.PathLike[str],
    precision: str,
    device: str | torch.device | None,
    cache_dir: str | os.PathLike[str],
    settings: BuildSettings | None = None,
    stem: str | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> tuple[Path, CacheDecision, BuildSettings]:
    """Make sure ``<cache_dir>/<stem>_<precision>.engine`` is a current build of ``onnx_path``.

    Reuses it when its metadata matches this GPU, TensorRT, precision, ONNX file and builder
    settings; otherwise (re)builds it, saying why and how large the file will be through
    ``log`` (default: the ``logging`` module at INFO, which the CLI shows on stderr; never
    stdout, which carries the commands' results). The timing cache defaults to
    ``<cache_dir>/timing.cache``. Returns (engine path, the decision, the settings used).
    """
    trt = import_tensorrt()
    say = log or _log.info
    dev = cuda_device(device)
    base = settings or BuildSettings()
    cache = Path(cache_dir).expanduser()
    if base.timing_cache is None:
        base = replace(base, timing_cache=str(cache / "timing.cache"))
    base.validate()
    path = engine_file(cache, stem or engine_stem(network), precision)
    key = engine_key(network, onnx_path, precision, dev, base, str(trt.__version__))
    decision = decide(path, key)
    if force and decision.action == "reuse":
        decision = CacheDecision("rebuild", path, ("asked to (--force)",))
    if decision.action == "reuse":
        return path, decision, base
    # one build per engine at a time: a second process waits, then finds the first's engine
    # current (unless --force, which rebuilds once more, as asked)
    with build_lock(path, path.name):
        if not force:
            decision = decide(path, key)
        if decision.action != "reuse":
            say(f"{decision.message} ({_build_note(onnx_path)})")
            build_engine(network, onnx_path, path, precision, dev, base, say)
    return path, decision, base


def _build_note(onnx_path: str | os.PathLike[str]) -> str:
    """What a build will cost, said before it starts: the engine is about as large as the
    weights of its ONNX graph, built once and cached; a build takes minutes."""
    try:
        size = Path(onnx_path).stat().st_size
    except OSError:
        return "for TensorRT, once; a build takes minutes"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"for TensorRT, ≈ {size / scale:.0f} {unit}, once; a build takes minutes"
    return "for TensorRT, once; a build takes minutes"


def cached_engine(
    network: str,
    onnx_path: str | os.PathLike[str],
    precision: str,
    device: str | torch.device | None,
    cache_dir: str | os.PathLike[str],
    plugin: str | os.PathLike[str] | None = None,
    settings: BuildSettings | None = None,
    stem: str | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
) -> TensorRTEngine:
    """The runner for ``onnx_path``'s engine in ``cache_dir``, built or rebuilt as needed.

    A stale engine (other GPU, TensorRT version, precision, ONNX, builder settings, or a
    damaged file) and one TensorRT refuses to deserialize are rebuilt, saying why via ``log``.
    """
    say = log or _log.info
    base = settings or BuildSettings()
    if plugin is not None and base.plugin is None:
        base = replace(base, plugin=str(plugin))
    path, _, base = ensure_engine(
        network, onnx_path, precision, device, cache_dir, base, stem, force, say
    )
    try:
        return TensorRTEngine(network, path, device, precision, base.plugin)
    except EngineLoadError as e:
        with build_lock(path, path.name):
            say(f"rebuilding {path.name}: {e}")
            build_engine(network, onnx_path, path, precision, device, base, say)
        return TensorRTEngine(network, path, device, precision, base.plugin)
