"""3-D GridSample below TensorRT 11.2: whether a build needs the GridSample3D plugin, loading
the plugin library, rewriting an ONNX graph's 5-D ``GridSample`` nodes into plugin nodes, and
pinning GridSample layers to fp32 in weakly typed builds. Kept apart because all of it exists
only for this one operator and one user-supplied library.

The plugin is Ditto's ``libgrid_sample_3d_plugin.so`` (user-supplied), loaded before parsing and
before deserializing (:func:`load_plugin`). TensorRT knows two kinds of plugin library
(trtexec's README, "Using your own Plugin"): statically registered ones
(``REGISTER_TENSORRT_PLUGIN``, registered when the library is loaded: this plugin, whose README
loads it with ctypes ``RTLD_GLOBAL``) and dynamically registered ones exporting ``getCreators``
(or the deprecated ``getPluginCreators``), which ``IPluginRegistry.load_library`` registers. The
library is not put in ``plugins_to_serialize``: that list is for version-compatible engines only
(NvInfer.h ``setPluginsToSerialize``), and an engine carrying host code would need
``Runtime.engine_host_code_allowed``. The plugin is V2 (``IPluginV2DynamicExt``), deprecated but
still run by TensorRT 11 (its Python migration guide). Our exports carry standard 5-D
``GridSample`` nodes; for the plugin they are rewritten to ``GridSample3D`` nodes with the int
attributes ``interpolation_mode``, ``padding_mode``, ``align_corners`` (all 0: trilinear, zeros,
False), the fields the public GridSample3D plugin's creator reads
(SeanWangJS/grid-sample3d-trt-plugin, plugin name ``GridSample3D`` version ``1``).

Weak typing pins every GridSample layer (native or plugin) to fp32 with ``layer.precision`` and
``set_output_type`` (both deprecated in 10.12 and removed in 11), as Ditto's build does
(:func:`pin_grid_sample_fp32`).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from studio.errors import InputError
from studio.files import write_atomic
from studio.runtime.tensorrt.support import native_grid_sample_3d

__all__ = [
    "PLUGIN_OP",
    "has_op",
    "load_plugin",
    "pin_grid_sample_fp32",
    "plugin_entry_points",
    "plugin_needed",
    "rewrite_grid_sample_for_plugin",
]

PLUGIN_OP = "GridSample3D"
# Entry points of a dynamically registered plugin library (trtexec README); getPluginCreators
# is the deprecated spelling.
PLUGIN_ENTRY_POINTS = ("getCreators", "getPluginCreators")

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


def plugin_needed(network: str, onnx_path: Path, version: str) -> bool:
    """The warp network needs the plugin below TensorRT 11.2, or when its graph has plugin ops."""
    if network != "warp_network":
        return False
    return not native_grid_sample_3d(version) or has_op(onnx_path, PLUGIN_OP)


def has_op(path: Path, op: str) -> bool:
    """Whether the graph of ``path`` holds an ``op`` node (its weights are not loaded)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(n.op_type == op for n in model.graph.node)


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
