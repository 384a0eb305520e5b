"""What the installed TensorRT can do and what a build asks of it: the lazy import, version
parsing and feature checks, strong or weak typing and the precision flags that go with it, the
builder settings, and the CUDA device check. The floor of the TensorRT backend: it knows no
plugin, builder or runner, so every other module of the package can lean on it.

``tensorrt`` is imported lazily: importing any module of this package works without it, and
every entry point that needs it raises :class:`~studio.runtime.base.BackendUnavailable` with
the install hint (:func:`import_tensorrt`).

- ``create_network(flags)`` (:func:`network_flags`): ``1 << STRONGLY_TYPED`` on TensorRT 10 for
  strong typing; 0 on TensorRT 11, whose networks are always strongly typed and whose
  ``STRONGLY_TYPED`` flag is deprecated and ignored (NvInfer Python docstrings of 11.1);
  ``EXPLICIT_BATCH`` is never set (ignored since 10.0, gone in 11).
- Precision. ``typing="strong"`` (the default, and the only mode of TensorRT 11, which removed
  ``BuilderFlag.FP16``/``BF16``/``INT8``/``FP8`` and the precision-constraint flags; source:
  the TensorRT 10.x -> 11.x migration guide, "Removed Python APIs") builds a
  ``NetworkDefinitionCreationFlag.STRONGLY_TYPED`` network from a typed graph: for fp16/bf16
  the half export of :mod:`studio.runtime.onnx_cache` (fp32 I/O, GridSample kept fp32); no
  precision flag is set ("use explicit quantization with strong typing; precision-control build
  flags are not required and should not be specified", TensorRT's explicit-quantization page).
  ``typing="weak"`` (TensorRT 10 only; its flags are deprecated since 10.12) takes the fp32
  graph with ``BuilderFlag.FP16``/``BF16`` and ``OBEY_PRECISION_CONSTRAINTS``, every GridSample
  layer pinned to fp32 (:func:`~studio.runtime.tensorrt.plugins.pin_grid_sample_fp32`), as
  Ditto's build does (:func:`precision_flags`). ``fp32`` clears the TF32 flag (on by default:
  strict fp32); ``tf32`` sets it.
- 3-D GridSample is native on TensorRT >= 11.2 (:func:`native_grid_sample_3d`; source:
  TensorRT 11.2.1 release notes, "GridSample 3D support: Extends GridSample from 2D-only to 3D
  (rank-5 input) with FP32, FP16, and BF16", and the NVIDIA/TensorRT v11.2 release, "Added
  support for ... 5D GridSample operators" in the ONNX parser); older versions need the plugin
  (:mod:`studio.runtime.tensorrt.plugins`).
- Dynamic inputs (HuBERT's ``input_values``) get an optimization profile (Ditto's: min
  [1, 3240], opt [1, 6480], max [1, 12960]): :data:`DEFAULT_PROFILES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from studio.errors import OptionError
from studio.runtime.base import BackendUnavailable
from studio.runtime.engine_cache import file_sha256
from studio.runtime.precision import import_backend

__all__ = [
    "DEFAULT_PROFILES",
    "BuildSettings",
    "cuda_device",
    "graph_precision",
    "import_tensorrt",
    "native_grid_sample_3d",
    "network_flags",
    "parse_version",
    "precision_flags",
    "resolve_typing",
    "tensorrt_version",
    "weak_typing_available",
]

NATIVE_GRID_SAMPLE_3D = (11, 2)
ALWAYS_STRONG = (11,)  # TensorRT 11: every network strongly typed, STRONGLY_TYPED ignored
OPT_LEVELS = range(0, 6)
# Ditto's HuBERT profile (scripts/cvt_onnx_to_trt.py): min, opt, max.
DEFAULT_PROFILES: dict[str, dict[str, tuple[tuple[int, ...], ...]]] = {
    "hubert": {"input_values": ((1, 3240), (1, 6480), (1, 12960))},
}


def import_tensorrt() -> Any:
    """The ``tensorrt`` module; BackendUnavailable with the install hint when it is missing."""
    return import_backend("tensorrt")


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


def cuda_device(device: str | torch.device | None) -> torch.device:
    """``device`` (default ``cuda``) resolved; BackendUnavailable unless it is a CUDA GPU."""
    from studio.runtime.base import resolve_device

    dev = resolve_device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise BackendUnavailable("TensorRT runs only on NVIDIA GPUs: use --device cuda[:N]")
    return dev
