"""TensorRT engines: a builder (ONNX -> serialized engine) and a runner, split as Polygraphy
splits loaders from runners. ``tensorrt`` is imported lazily: importing this module works
without it, and every entry point that needs it raises
:class:`~studio.runtime.base.BackendUnavailable` with the install hint.

Builder (:func:`build_engine`, TensorRT 10.x and 11.x Python API):

- ``trt.Builder`` -> ``create_network(flags)`` -> ``trt.OnnxParser.parse_from_file``; parser
  errors are collected and raised, never ignored (Ditto's script prints and carries on).
  ``flags`` (:func:`network_flags`): ``1 << STRONGLY_TYPED`` on TensorRT 10 for strong typing;
  0 on TensorRT 11, whose networks are always strongly typed and whose ``STRONGLY_TYPED`` flag is
  deprecated and ignored (NvInfer Python docstrings of 11.1); ``EXPLICIT_BATCH`` is never set
  (ignored since 10.0, gone in 11).
- ``IBuilderConfig``: ``builder_optimization_level`` (0..5, default 5 as in Ditto's
  build), ``set_memory_pool_limit(MemoryPoolType.WORKSPACE, bytes)``, an ``ITimingCache``
  loaded from and saved back to a file (``create_timing_cache`` / ``set_timing_cache`` /
  ``get_timing_cache().serialize()``), optional ``HardwareCompatibilityLevel.AMPERE_PLUS``.
- Precision. ``typing="strong"`` (the default, and the only mode of TensorRT 11, which removed
  ``BuilderFlag.FP16``/``BF16``/``INT8``/``FP8`` and the precision-constraint flags; source:
  the TensorRT 10.x -> 11.x migration guide, "Removed Python APIs") builds a
  ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` network from a typed graph: for fp16/bf16
  the half export of :mod:`studio.runtime.onnx_cache` (fp32 I/O, GridSample kept fp32); no
  precision flag is set ("use explicit quantization with strong typing; precision-control build
  flags are not required and should not be specified", TensorRT's explicit-quantization page).
  ``typing="weak"`` (TensorRT 10 only; its flags are deprecated since 10.12) takes the fp32
  graph with ``BuilderFlag.FP16``/``BF16`` and ``OBEY_PRECISION_CONSTRAINTS``, every GridSample
  layer (native or plugin) pinned to fp32 (``layer.precision`` and ``set_output_type``, both
  deprecated in 10.12 and removed in 11), as Ditto's build does (:func:`precision_flags`).
  ``fp32`` clears the TF32 flag (on by default: strict fp32); ``tf32`` sets it.
- FP8/INT8: explicit quantization only, through ModelOpt's ONNX PTQ
  (``modelopt.onnx.quantization.quantize``, Q/DQ nodes, GridSample excluded), when
  ``modelopt`` imports; random calibration data unless ``calibration`` (an ``.npz`` of input
  arrays) is given. Quantization runs on the standard-op graph, before the plugin rewrite, so
  ModelOpt's ONNX Runtime calibration never meets the plugin op. Weakly typed Q/DQ builds set
  ``INT8`` (int8) and ``FP16``; never ``BuilderFlag.FP8``, which only enables plugins with FP8
  I/O and is refused with ``HardwareCompatibilityLevel.AMPERE_PLUS`` (NvInfer.h, 10.16).
- 3-D GridSample: native on TensorRT >= 11.2 (source: TensorRT 11.2.1 release notes, "GridSample
  3D support: Extends GridSample from 2D-only to 3D (rank-5 input) with FP32, FP16, and BF16",
  and the NVIDIA/TensorRT v11.2 release, "Added support for ... 5D GridSample operators" in the
  ONNX parser). Older versions need the GridSample3D plugin library (Ditto's
  ``libgrid_sample_3d_plugin.so``, user-supplied), loaded before parsing and before
  deserializing (:func:`load_plugin`). TensorRT knows two kinds of plugin library (trtexec's
  README, "Using your own Plugin"): statically registered ones (``REGISTER_TENSORRT_PLUGIN``,
  registered when the library is loaded: this plugin, whose README loads it with ctypes
  ``RTLD_GLOBAL``) and dynamically registered ones exporting ``getCreators`` (or the deprecated
  ``getPluginCreators``), which ``IPluginRegistry.load_library`` registers. The library is not
  put in ``plugins_to_serialize``: that list is for version-compatible engines only (NvInfer.h
  ``setPluginsToSerialize``), and an engine carrying host code would need
  ``Runtime.engine_host_code_allowed``. The plugin is V2 (``IPluginV2DynamicExt``), deprecated
  but still run by TensorRT 11 (its Python migration guide). Our exports carry
  standard 5-D ``GridSample`` nodes; for the plugin they are rewritten to ``GridSample3D``
  nodes with the int attributes ``interpolation_mode``, ``padding_mode``, ``align_corners``
  (all 0: trilinear, zeros, False), the fields the public GridSample3D plugin's creator reads
  (SeanWangJS/grid-sample3d-trt-plugin, plugin name ``GridSample3D`` version ``1``).
- Dynamic inputs (HuBERT's ``input_values``) get an optimization profile (Ditto's: min
  [1, 3240], opt [1, 6480], max [1, 12960]).

Runner (:class:`TensorRTEngine`): ``trt.Runtime.deserialize_cuda_engine``, one execution
context, persistent torch device buffers for every I/O tensor bound once with
``set_tensor_address`` (an input given as a contiguous tensor of the engine's dtype is bound
by pointer instead of copied), ``execute_async_v3`` on ``torch.cuda.current_stream()`` unless
that is a default stream: "using default stream may lead to performance issues due to
additional cudaDeviceSynchronize() calls" (``enqueueV3`` in NvInferRuntime.h), so the engine
then enqueues on a stream of its own, ordered with the caller's by device-side waits. A CUDA
graph of the context (:meth:`TensorRTEngine.capture`) follows trtexec's recipe: one eager
enqueue first (deferred initialisation must not be captured), capture on a non-default stream,
and eager execution kept when the enqueue fails under capture (an engine may hold operations
that capture does not permit).

Cache (:func:`cached_engine`): the engine file's metadata (:mod:`studio.runtime.engine_cache`)
decides reuse, build or rebuild (stale GPU, TensorRT version, precision, ONNX or builder
settings, truncated file, or a file TensorRT refuses to deserialize), with a message.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from studio.errors import InputError, OptionError
from studio.files import write_atomic
from studio.runtime.base import BackendUnavailable, EngineBase, TensorSpec, capture_cuda_graph
from studio.runtime.engine_cache import (
    CacheDecision,
    EngineKey,
    decide,
    engine_file,
    file_sha256,
    write_metadata,
)
from studio.runtime.precision import INSTALL_HINTS

_log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_PROFILES",
    "BuildSettings",
    "EngineLoadError",
    "TensorRTEngine",
    "build_engine",
    "cached_engine",
    "engine_key",
    "engine_stem",
    "ensure_engine",
    "graph_precision",
    "import_tensorrt",
    "load_plugin",
    "native_grid_sample_3d",
    "network_flags",
    "parse_version",
    "plugin_entry_points",
    "precision_flags",
    "rewrite_grid_sample_for_plugin",
    "tensorrt_version",
    "uses_side_stream",
    "weak_typing_available",
]

NATIVE_GRID_SAMPLE_3D = (11, 2)
ALWAYS_STRONG = (11,)  # TensorRT 11: every network strongly typed, STRONGLY_TYPED ignored
PLUGIN_OP = "GridSample3D"
# Entry points of a dynamically registered plugin library (trtexec README); getPluginCreators
# is the deprecated spelling.
PLUGIN_ENTRY_POINTS = ("getCreators", "getPluginCreators")
# CUDA's default-stream handles: 0 (legacy, torch's default), cudaStreamLegacy, cudaStreamPerThread.
DEFAULT_STREAM_HANDLES = (0, 1, 2)
OPT_LEVELS = range(0, 6)
# Ditto's HuBERT profile (scripts/cvt_onnx_to_trt.py): min, opt, max.
DEFAULT_PROFILES: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "hubert": {"input_values": ((1, 3240), (1, 6480), (1, 12960))},
}


class EngineLoadError(BackendUnavailable):
    """TensorRT refused to deserialize an engine file (other GPU/version, or corrupt)."""


def import_tensorrt() -> Any:
    """The ``tensorrt`` module; BackendUnavailable with the install hint when it is missing."""
    try:
        import tensorrt as trt
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        raise BackendUnavailable(
            f"tensorrt is not importable ({type(e).__name__}: {e}); install it with "
            f"{INSTALL_HINTS['tensorrt']}"
        ) from None
    return trt


def tensorrt_version() -> str | None:
    try:
        return str(import_tensorrt().__version__)
    except BackendUnavailable:
        return None


def parse_version(text: str) -> tuple[int, ...]:
    """``"10.8.0.43"`` -> (10, 8, 0, 43); non-numeric parts end the tuple."""
    out = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits or digits != part:
            if digits and part.startswith(digits):
                out.append(int(digits))
            break
        out.append(int(digits))
    return tuple(out)


def native_grid_sample_3d(version: str) -> bool:
    """TensorRT >= 11.2 builds 5-D GridSample itself (see the module docstring)."""
    return parse_version(version)[:2] >= NATIVE_GRID_SAMPLE_3D


def weak_typing_available(version: str) -> bool:
    """TensorRT 11 removed the weak-typing precision flags; 10.x still has them."""
    return parse_version(version)[:1] < (11,)


def network_flags(typing: str, version: str, strongly_typed_bit: int | None) -> int:
    """``create_network`` flags: the STRONGLY_TYPED bit for strong typing on TensorRT 10 only.

    TensorRT 11 networks are always strongly typed and its STRONGLY_TYPED flag is deprecated
    and ignored, so 0 is passed there (no deprecation warning); weak typing passes 0 on 10.x.
    """
    if typing != "strong" or strongly_typed_bit is None:
        return 0
    if parse_version(version)[:1] >= ALWAYS_STRONG:
        return 0
    return 1 << int(strongly_typed_bit)


def precision_flags(precision: str, typing: str) -> tuple[str, ...]:
    """The ``BuilderFlag`` names a build sets for ``precision`` (TF32 aside).

    Strongly typed networks take their types from the graph and set none. Weak typing (TensorRT
    10) enables the reduced precision and obeys the per-layer constraints that keep GridSample
    fp32; Q/DQ graphs add INT8 for int8, and both keep FP16 for the layers ModelOpt leaves in
    half. ``BuilderFlag.FP8`` only enables plugins with FP8 I/O, so it is never set.
    """
    if typing != "weak" or precision in ("fp32", "tf32"):
        return ()
    wanted = {"fp16": ("FP16",), "bf16": ("BF16",), "int8": ("INT8", "FP16"), "fp8": ("FP16",)}
    if precision not in wanted:
        raise OptionError("--precision", f"TensorRT cannot build {precision!r}")
    return (*wanted[precision], "OBEY_PRECISION_CONSTRAINTS")


def uses_side_stream(stream_handle: int) -> bool:
    """True for a default-stream handle, on which enqueueV3 adds device syncs (TensorRT's
    warning), so the runner enqueues on a stream of its own instead."""
    return int(stream_handle) in DEFAULT_STREAM_HANDLES


def graph_precision(precision: str, typing: str) -> str:
    """The precision of the ONNX graph a build needs: half graphs for strongly typed half
    engines, fp32 otherwise (weak typing, fp32/tf32, and fp8/int8, which ModelOpt quantizes)."""
    if typing == "strong" and precision in ("fp16", "bf16"):
        return precision
    return "fp32"


def resolve_typing(typing: str, version: str) -> str:
    """``auto`` -> ``strong``; ``weak`` on TensorRT 11 is an OptionError."""
    if typing not in ("auto", "strong", "weak"):
        raise OptionError("--typing", f"must be auto, strong or weak, got {typing!r}")
    if typing == "weak" and not weak_typing_available(version):
        raise OptionError(
            "--typing",
            f"weak typing (BuilderFlag.FP16 etc.) was removed in TensorRT 11; this is {version}",
        )
    return "strong" if typing == "auto" else typing


@dataclass(frozen=True)
class BuildSettings:
    """Builder settings; all but ``timing_cache`` and ``calibration`` enter the cache key."""

    opt_level: int = 5
    workspace_gb: float = 8.0
    typing: str = "auto"
    hardware_compat: bool = False
    plugin: str | None = None
    timing_cache: str | None = None
    calibration: str | None = None
    profiles: Mapping[str, Mapping[str, tuple[tuple[int, ...], ...]]] = field(
        default_factory=lambda: dict(DEFAULT_PROFILES)
    )

    def validate(self) -> BuildSettings:
        """OptionError naming the option for a bad value; self otherwise."""
        if not isinstance(self.opt_level, int) or self.opt_level not in OPT_LEVELS:
            raise OptionError("--opt-level", f"must be 0..5, got {self.opt_level!r}")
        if not (isinstance(self.workspace_gb, (int, float)) and 0 < self.workspace_gb <= 1024):
            raise OptionError("--workspace-gb", f"must be > 0 (GiB), got {self.workspace_gb!r}")
        if self.typing not in ("auto", "strong", "weak"):
            raise OptionError("--typing", f"must be auto, strong or weak, got {self.typing!r}")
        if self.plugin is not None and not Path(self.plugin).expanduser().is_file():
            raise OptionError("--plugin", f"{self.plugin} does not exist (the GridSample3D .so)")
        if self.calibration is not None and not Path(self.calibration).expanduser().is_file():
            raise OptionError("--calibration", f"{self.calibration} does not exist (an .npz)")
        return self

    @property
    def workspace_bytes(self) -> int:
        return int(self.workspace_gb * 2**30)

    def key_fields(self, network: str, typing: str, plugin_used: bool) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "opt_level": self.opt_level,
            "workspace_bytes": self.workspace_bytes,
            "typing": typing,
            "hardware_compat": "ampere_plus" if self.hardware_compat else None,
            "plugin_sha256": file_sha256(Path(self.plugin).expanduser())
            if plugin_used and self.plugin
            else None,
        }
        if network in self.profiles:
            fields["profiles"] = {
                k: [list(s) for s in v] for k, v in self.profiles[network].items()
            }
        return fields


# --- plugins and graph rewrites -------------------------------------------------------------

_LOADED_PLUGINS: dict[str, Any] = {}


def plugin_entry_points(library: Any) -> list[str]:
    """The dynamic-registration entry points ``library`` (a ``ctypes.CDLL``) exports."""
    return [name for name in PLUGIN_ENTRY_POINTS if hasattr(library, name)]


def _dlopen(path: str) -> Any:
    """Open a shared library with its symbols global, as plugin libraries need."""
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def load_plugin(trt: Any, path: str | os.PathLike[str]) -> Any:
    """Load a plugin library once per process so TensorRT's registry knows its creators.

    The library is opened with ``RTLD_GLOBAL``, which runs the static registrars of
    ``REGISTER_TENSORRT_PLUGIN`` libraries (Ditto's GridSample3D plugin); a library exporting
    the dynamic-registration entry points is also handed to ``IPluginRegistry.load_library``,
    the documented loader for those.
    """
    p = str(Path(path).expanduser().resolve())
    if p in _LOADED_PLUGINS:
        return _LOADED_PLUGINS[p]
    if not Path(p).is_file():
        raise InputError(f"plugin library {p} does not exist")
    try:
        library = _dlopen(p)
    except OSError as e:
        raise InputError(f"cannot load the plugin library {p}: {e}") from None
    if plugin_entry_points(library):
        # None means "a creator of this library is already registered" (the registry's
        # docstring): loaded before by someone else, so nothing is missing.
        trt.get_plugin_registry().load_library(p)
    _LOADED_PLUGINS[p] = library
    return library


def _rank_of(model: Any, name: str) -> int | None:
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.name == name and v.type.tensor_type.HasField("shape"):
            return len(v.type.tensor_type.shape.dim)
    return None


def rewrite_grid_sample_for_plugin(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> int:
    """Turn the 5-D ``GridSample`` nodes of ``src`` into ``GridSample3D`` plugin nodes in
    ``dst``; returns how many were rewritten (0: ``dst`` is not written)."""
    import onnx
    from onnx import helper

    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    count = 0
    for node in model.graph.node:
        if node.op_type != "GridSample" or _rank_of(model, node.input[0]) != 5:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        mode = attrs.get("mode", b"linear")
        padding = attrs.get("padding_mode", b"zeros")
        if mode not in (b"linear", b"bilinear") or padding != b"zeros":
            raise ValueError(f"{node.name}: the GridSample3D plugin path supports linear/zeros")
        del node.attribute[:]
        node.op_type = PLUGIN_OP
        node.domain = ""
        node.attribute.extend(
            [
                helper.make_attribute("interpolation_mode", 0),
                helper.make_attribute("padding_mode", 0),
                helper.make_attribute("align_corners", int(attrs.get("align_corners", 0))),
            ]
        )
        if "GridSample" not in node.name:
            node.name = f"{node.name}/GridSample"
        count += 1
    if count:
        write_atomic(Path(dst), model.SerializeToString(), make_parents=True)
    return count


def _plugin_needed(network: str, onnx_path: Path, version: str) -> bool:
    """The warp network needs the plugin below TensorRT 11.2, or when its graph has plugin ops."""
    if network != "warp_network":
        return False
    return not native_grid_sample_3d(version) or _has_op(onnx_path, PLUGIN_OP)


def _has_op(path: Path, op: str) -> bool:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == op for n in model.graph.node)


def quantize_onnx(
    src: Path, dst: Path, precision: str, calibration: str | None, log: Callable[[str], None]
) -> Path:
    """Q/DQ-quantize ``src`` for fp8/int8 with ModelOpt into ``dst`` (GridSample excluded)."""
    try:
        from modelopt.onnx.quantization import quantize
    except Exception as e:  # noqa: BLE001
        raise BackendUnavailable(
            f"{precision} needs ModelOpt's ONNX quantization ({type(e).__name__}: {e}): "
            "pip install 'nvidia-modelopt[onnx]'"
        ) from None
    import numpy as np
    import onnx

    if calibration is not None:
        with np.load(Path(calibration).expanduser()) as z:
            data = {k: z[k] for k in z.files}
    else:
        from studio.models.onnx_export import random_inputs
        from studio.runtime.base import torch_dtype

        model = onnx.load(str(src), load_external_data=False)
        from onnx.helper import tensor_dtype_to_np_dtype

        names, example = [], []
        for v in model.graph.input:
            shape = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
            dtype = torch_dtype(str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))
            names.append(v.name)
            example.append(torch.zeros(shape, dtype=dtype))
        data = {n: t.numpy() for n, t in zip(names, random_inputs(names, example, 0), strict=True)}
        log(f"{src.name}: {precision} calibration on random inputs (give --calibration for real)")
    kwargs: dict[str, Any] = {
        "onnx_path": str(src),
        "quantize_mode": precision,
        "calibration_data": data,
        "op_types_to_exclude": ["GridSample", PLUGIN_OP],
        "output_path": str(dst),
    }
    try:
        quantize(**kwargs, op_types_to_exclude_fp16=["GridSample"])
    except TypeError:  # an older ModelOpt without op_types_to_exclude_fp16
        quantize(**kwargs)
    return dst


def pin_grid_sample_fp32(trt: Any, network: Any) -> list[str]:
    """Set fp32 precision and output types on every GridSample layer (native or plugin)."""
    pinned = []
    grid = getattr(trt.LayerType, "GRID_SAMPLE", None)
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if (grid is not None and layer.type == grid) or "GridSample" in layer.name:
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)
            pinned.append(layer.name)
    return pinned


# --- the builder -----------------------------------------------------------------------------


def _device_facts(device: torch.device) -> tuple[str, str]:
    props = torch.cuda.get_device_properties(device)
    return props.name, f"{props.major}.{props.minor}"


def _cuda_device(device: str | torch.device | None) -> torch.device:
    from studio.runtime.base import resolve_device

    dev = resolve_device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise BackendUnavailable("TensorRT runs only on NVIDIA GPUs: use --device cuda[:N]")
    return dev


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
    plugin_used = _plugin_needed(network, Path(onnx_path), trt_version)
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
    dev = _cuda_device(device)
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
        "plugin": str(settings.plugin) if _plugin_needed(network, onnx_in, version) else None,
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
    plugin_used = _plugin_needed(network, onnx_in, version)
    if plugin_used and settings.plugin is None:
        why = (
            f"{onnx_in.name} uses the {PLUGIN_OP} plugin op"
            if _has_op(onnx_in, PLUGIN_OP)
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


# --- the runner ------------------------------------------------------------------------------


def _torch_dtypes(trt: Any) -> dict[Any, torch.dtype]:
    table = {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "int32": torch.int32,
        "int64": torch.int64,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
        "fp8": torch.float8_e4m3fn,
    }
    return {getattr(trt, k): v for k, v in table.items() if hasattr(trt, k)}


class TensorRTEngine(EngineBase):
    """A serialized TensorRT engine as an :class:`~studio.runtime.base.Engine` (CUDA)."""

    backend = "tensorrt"

    def __init__(
        self,
        name: str,
        engine_path: str | os.PathLike[str],
        device: str | torch.device | None = None,
        precision: str | None = None,
        plugin: str | os.PathLike[str] | None = None,
    ) -> None:
        trt = import_tensorrt()
        dev = _cuda_device(device)
        self.name = name  # for messages before EngineBase.__init__ runs
        self.path = Path(engine_path).expanduser()
        if not self.path.is_file():
            raise InputError(f"TensorRT engine {self.path} does not exist")
        self._logger = trt.Logger(trt.Logger.ERROR)
        trt.init_libnvinfer_plugins(self._logger, "")
        if plugin is not None:
            load_plugin(trt, plugin)
        with torch.cuda.device(dev):
            self._runtime = trt.Runtime(self._logger)
            try:
                engine = self._runtime.deserialize_cuda_engine(self.path.read_bytes())
                why = ""
            except Exception as e:  # noqa: BLE001 - some versions raise instead of returning None
                engine, why = None, f": {e}"
            if engine is None:
                raise EngineLoadError(
                    f"TensorRT {trt.__version__} cannot deserialize {self.path.name} (built for "
                    f"another GPU or TensorRT version, or damaged){why}"
                )
            self._engine = engine
            self._context = engine.create_execution_context()
        dtypes = _torch_dtypes(trt)
        inputs, outputs = [], []
        self._dynamic: set[str] = set()
        for i in range(engine.num_io_tensors):
            n = engine.get_tensor_name(i)
            shape = tuple(int(d) for d in engine.get_tensor_shape(n))
            spec = TensorSpec(n, shape, dtypes[engine.get_tensor_dtype(n)])
            if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT:
                if any(d < 0 for d in shape):
                    self._dynamic.add(n)
                    opt = tuple(int(d) for d in engine.get_tensor_profile_shape(n, 0)[1])
                    self._set_input_shape(n, opt)
                inputs.append(spec)
            else:
                outputs.append(spec)
        super().__init__(name, precision or "?", dev, tuple(inputs), tuple(outputs))
        self._buffers: dict[str, Tensor] = {}
        self._bound: dict[str, int] = {}
        for s in self.inputs:
            shape = tuple(self._context.get_tensor_shape(s.name))
            self._buffers[s.name] = torch.empty(shape, dtype=s.dtype, device=dev)
            self._bind(s.name, self._buffers[s.name])
        self._allocate_outputs()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._side: torch.cuda.Stream | None = None

    def _set_input_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """``set_input_shape``, whose False (a shape outside the profile) becomes an error."""
        if not self._context.set_input_shape(name, shape):
            raise ValueError(
                f"{self.name}: TensorRT refused shape {shape} for {name} "
                "(outside the engine's optimization profile)"
            )

    def _bind(self, name: str, t: Tensor) -> None:
        ptr = t.data_ptr()
        if self._bound.get(name) != ptr:
            if not self._context.set_tensor_address(name, ptr):
                raise RuntimeError(f"{self.name}: TensorRT refused the address of {name}")
            self._bound[name] = ptr

    def _allocate_outputs(self) -> None:
        for s in self.outputs:
            shape = tuple(int(d) for d in self._context.get_tensor_shape(s.name))
            buf = self._buffers.get(s.name)
            if buf is None or tuple(buf.shape) != shape:
                self._buffers[s.name] = torch.empty(shape, dtype=s.dtype, device=self.device)
                self._bind(s.name, self._buffers[s.name])

    @property
    def buffers(self) -> dict[str, Tensor]:
        """The persistent I/O buffers (write inputs into them to skip every copy)."""
        return dict(self._buffers)

    def _execute(self, stream: int) -> None:
        if not self._context.execute_async_v3(stream):
            raise RuntimeError(f"{self.name}: TensorRT execute_async_v3 failed")

    def _enqueue(self, borrowed: tuple[Tensor, ...] = ()) -> None:
        """``execute_async_v3`` on the caller's stream, or on the engine's own stream ordered
        both ways with it when the caller's is a default stream; ``borrowed`` (caller tensors
        bound by pointer) are then recorded on that stream so their memory outlives the read."""
        current = torch.cuda.current_stream(self.device)
        if not uses_side_stream(current.cuda_stream):
            self._execute(current.cuda_stream)
            return
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(current)
        self._execute(self._side.cuda_stream)
        current.wait_stream(self._side)
        for t in borrowed:
            t.record_stream(self._side)

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        self.check_feed(feed)
        reshaped = False
        borrowed = []
        for s in self.inputs:
            t = feed[s.name]
            if s.name in self._dynamic and tuple(self._buffers[s.name].shape) != tuple(t.shape):
                if self._graph is not None:
                    raise ValueError(f"{self.name}: a captured engine has fixed input shapes")
                self._set_input_shape(s.name, tuple(t.shape))
                self._buffers[s.name] = torch.empty(t.shape, dtype=s.dtype, device=self.device)
                reshaped = True
            buf = self._buffers[s.name]
            if self._graph is None and t.dtype == s.dtype and t.is_contiguous():
                self._bind(s.name, t)  # by pointer: no copy
                borrowed.append(t)
            else:
                if t.data_ptr() != buf.data_ptr():
                    buf.copy_(t)
                self._bind(s.name, buf)
        if reshaped:
            self._allocate_outputs()
        if self._graph is not None:
            self._graph.replay()
        else:
            self._enqueue(tuple(borrowed))
        return {s.name: self._buffers[s.name] for s in self.outputs}

    def capture(self, warmup: int = 1) -> bool:
        """CUDA graph of the context over the persistent buffers (static shapes only).

        False, with eager execution kept, for dynamic shapes and for engines whose enqueue
        fails under stream capture (trtexec falls back the same way).
        """
        if self._graph is not None:
            return True
        if self._dynamic:
            return False
        for s in self.inputs:
            self._bind(s.name, self._buffers[s.name])
        with torch.cuda.device(self.device):
            self._enqueue()  # the first enqueue does deferred setup that must not be captured
            torch.cuda.current_stream(self.device).synchronize()
            try:
                self._graph, _ = capture_cuda_graph(self._enqueue, warmup)
            except Exception:  # noqa: BLE001 - not capturable: stay eager
                self._graph = None
                torch.cuda.synchronize(self.device)
                return False
        self.static_inputs = {s.name: self._buffers[s.name] for s in self.inputs}
        return True


# --- the cache -------------------------------------------------------------------------------


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
    dev = _cuda_device(device)
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
        say(f"rebuilding {path.name}: {e}")
        build_engine(network, onnx_path, path, precision, device, base, say)
        return TensorRTEngine(network, path, device, precision, base.plugin)
