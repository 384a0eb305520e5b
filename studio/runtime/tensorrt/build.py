"""The builder: an ONNX file -> a serialized TensorRT engine with its cache metadata
(:func:`build_engine`), and the cache key such a build is filed under (:func:`engine_key`).
TensorRT 10.x and 11.x Python API; a loader in Polygraphy's sense, apart from the runner.

- ``trt.Builder`` -> ``create_network(flags)`` -> ``trt.OnnxParser.parse_from_file``; parser
  errors are collected and raised, never ignored (Ditto's script prints and carries on). The
  flags and the precision policy come from :mod:`studio.runtime.tensorrt.support`.
- ``IBuilderConfig``: ``builder_optimization_level`` (0..5, default 5 as in Ditto's
  build), ``set_memory_pool_limit(MemoryPoolType.WORKSPACE, bytes)``, an ``ITimingCache``
  loaded from and saved back to a file (``create_timing_cache`` / ``set_timing_cache`` /
  ``get_timing_cache().serialize()``), optional ``HardwareCompatibilityLevel.AMPERE_PLUS``.
- fp8/int8 graphs are quantized first (:mod:`studio.runtime.tensorrt.quantize`), then, where
  TensorRT has no 3-D GridSample, rewritten for the plugin
  (:mod:`studio.runtime.tensorrt.plugins`).
- Dynamic inputs get the optimization profiles of
  :class:`~studio.runtime.tensorrt.support.BuildSettings`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from studio.files import write_atomic
from studio.runtime.base import BackendUnavailable
from studio.runtime.engine_cache import EngineKey, file_sha256, write_metadata
from studio.runtime.tensorrt.plugins import (
    PLUGIN_OP,
    has_op,
    load_plugin,
    pin_grid_sample_fp32,
    plugin_needed,
    rewrite_grid_sample_for_plugin,
)
from studio.runtime.tensorrt.quantize import quantize_onnx
from studio.runtime.tensorrt.support import (
    BuildSettings,
    cuda_device,
    import_tensorrt,
    network_flags,
    precision_flags,
    resolve_typing,
)

__all__ = ["build_engine", "engine_key"]


def _device_facts(device: torch.device) -> tuple[str, str]:
    props = torch.cuda.get_device_properties(device)
    return props.name, f"{props.major}.{props.minor}"


def engine_key(
    network: str,
    onnx_path: str | os.PathLike[str],
    precision: str,
    device: torch.device,
    settings: BuildSettings,
    trt_version: str,
) -> EngineKey:
    """The cache key of a build of ``onnx_path`` on ``device`` with this TensorRT."""
    typing = resolve_typing(settings.typing, trt_version)
    gpu, cc = _device_facts(device)
    plugin_used = plugin_needed(network, Path(onnx_path), trt_version)
    return EngineKey(
        network=network,
        precision=precision,
        onnx_sha256=file_sha256(onnx_path),
        gpu_name=gpu,
        compute_capability=cc,
        tensorrt_version=trt_version,
        builder=settings.key_fields(network, typing, plugin_used),
    )


def build_engine(
    network: str,
    onnx_path: str | os.PathLike[str],
    engine_path: str | os.PathLike[str],
    precision: str,
    device: str | torch.device | None = None,
    settings: BuildSettings | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build ``engine_path`` (atomically, with its metadata JSON) from ``onnx_path``.

    Returns the metadata written. BackendUnavailable when tensorrt, ModelOpt (fp8/int8) or
    the plugin (warp network on TensorRT < 11.2) is missing; RuntimeError when the parser or
    the builder fails (with TensorRT's messages).
    """
    trt = import_tensorrt()
    settings = (settings or BuildSettings()).validate()
    say = log or (lambda _m: None)
    dev = cuda_device(device)
    version = str(trt.__version__)
    typing = resolve_typing(settings.typing, version)
    onnx_in = Path(onnx_path).expanduser()
    target = Path(engine_path).expanduser()
    key = engine_key(network, onnx_in, precision, dev, settings, version)
    work = target.with_name(f".{target.name}.work")
    work.mkdir(parents=True, exist_ok=True)
    try:
        pinned = _build(trt, network, onnx_in, target, precision, dev, settings, typing, work, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {
        "onnx": str(Path(onnx_path).expanduser()),
        "grid_sample_fp32_layers": pinned,
        "plugin": str(settings.plugin) if plugin_needed(network, onnx_in, version) else None,
    }
    write_metadata(target, key, meta)
    return {"key": key.to_dict(), **meta}


def _build(
    trt: Any,
    network: str,
    onnx_in: Path,
    target: Path,
    precision: str,
    dev: torch.device,
    settings: BuildSettings,
    typing: str,
    work: Path,
    say: Callable[[str], None],
) -> list[str]:
    """The build itself; returns the names of the layers pinned to fp32."""
    version = str(trt.__version__)
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    plugin_used = plugin_needed(network, onnx_in, version)
    if plugin_used and settings.plugin is None:
        why = (
            f"{onnx_in.name} uses the {PLUGIN_OP} plugin op"
            if has_op(onnx_in, PLUGIN_OP)
            else f"TensorRT {version} has no 3-D GridSample (native from 11.2)"
        )
        raise BackendUnavailable(
            f"{why}: pass --plugin PATH to the GridSample3D plugin library "
            "(Ditto's libgrid_sample_3d_plugin.so)"
        )
    if precision in ("fp8", "int8"):
        # Before the plugin rewrite: ModelOpt calibrates in ONNX Runtime, which knows GridSample
        # but not the plugin op.
        onnx_in = quantize_onnx(
            onnx_in, work / f"{onnx_in.stem}.{precision}.onnx", precision, settings.calibration, say
        )
    if plugin_used:
        assert settings.plugin is not None
        load_plugin(trt, settings.plugin)
        rewritten = work / f"{onnx_in.stem}.plugin.onnx"
        if rewrite_grid_sample_for_plugin(onnx_in, rewritten):
            say(f"{network}: 5-D GridSample -> {PLUGIN_OP} plugin nodes ({rewritten.name})")
            onnx_in = rewritten
    with torch.cuda.device(dev):
        builder = trt.Builder(logger)
        strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        net = builder.create_network(network_flags(typing, version, strongly))
        parser = trt.OnnxParser(net, logger)
        if not parser.parse_from_file(str(onnx_in)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise RuntimeError(
                f"TensorRT {version} cannot parse {onnx_in.name}: " + "; ".join(errors[:5])
            )
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
        config.builder_optimization_level = settings.opt_level
        if settings.hardware_compat and torch.cuda.get_device_capability(dev)[0] >= 8:
            config.hardware_compatibility_level = trt.HardwareCompatibilityLevel.AMPERE_PLUS
        tf32 = getattr(trt.BuilderFlag, "TF32", None)
        if tf32 is not None:
            if precision == "tf32":
                config.set_flag(tf32)
            else:
                config.clear_flag(tf32)
        pinned: list[str] = []
        flags = precision_flags(precision, typing)
        for flag in flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        if flags:
            pinned = pin_grid_sample_fp32(trt, net)
        _add_profiles(builder, config, net, settings.profiles.get(network, {}))
        cache_path = Path(settings.timing_cache).expanduser() if settings.timing_cache else None
        blob = cache_path.read_bytes() if cache_path is not None and cache_path.is_file() else b""
        timing = config.create_timing_cache(blob) if blob else None
        if timing is None or not _attach(config, timing):
            if blob:
                say(f"{cache_path}: timing cache from another GPU/TensorRT, starting a new one")
            _attach(config, config.create_timing_cache(b""))
        say(
            f"building {target.name} (TensorRT {version}, {typing}ly typed, {precision}, "
            f"opt level {settings.opt_level}, workspace {settings.workspace_gb:g} GiB)"
        )
        serialized = builder.build_serialized_network(net, config)
        if serialized is None:
            raise RuntimeError(f"TensorRT could not build {target.name} (see its log above)")
        write_atomic(target, bytes(serialized), make_parents=True)
        if cache_path is not None:
            write_atomic(
                cache_path, bytes(config.get_timing_cache().serialize()), make_parents=True
            )
    return pinned


def _attach(config: Any, cache: Any) -> bool:
    """``set_timing_cache`` without accepting a mismatched cache; False when refused."""
    try:
        ok = config.set_timing_cache(cache, ignore_mismatch=False)
    except Exception:  # noqa: BLE001 - a cache from another version may raise
        return False
    return ok is not False


def _add_profiles(
    builder: Any, config: Any, net: Any, profiles: Mapping[str, tuple[tuple[int, ...], ...]]
) -> None:
    dynamic = []
    for i in range(net.num_inputs):
        t = net.get_input(i)
        if any(d < 0 for d in tuple(t.shape)):
            dynamic.append(t.name)
    if not dynamic:
        return
    missing = [n for n in dynamic if n not in profiles]
    if missing:
        raise RuntimeError(f"dynamic inputs {missing} need an optimization profile")
    profile = builder.create_optimization_profile()
    for name in dynamic:
        lo, opt, hi = profiles[name]
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
