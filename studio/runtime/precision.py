"""The precision policy, and what each backend can run on this machine.

:func:`parse_precision`: ``"lmdm=fp16,decoder=fp16"`` overrides the defaults of the released
set (:data:`DEFAULT_PRECISION`: HuBERT, LMDM and the motion extractor fp32, the rest fp16); a
bare ``"fp16"`` sets every network. A precision named explicitly that the backend cannot run
on the device is an :class:`~studio.errors.OptionError` naming the option; a default it
cannot run falls back to fp32 (noted in :attr:`PrecisionPlan.notes`).
:func:`precision_support` asks the machine (modules present, CUDA capability, ONNX Runtime's
providers) without importing any backend's engine code.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from studio.errors import OptionError
from studio.runtime.base import BackendUnavailable
from studio.runtime.names import RUNTIMES

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
_PRECISION_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}

# The released set (ditto-reference.md §3.1, §7.2): fp32 for HuBERT, LMDM and the motion
# extractor, fp16 for the rest.
DEFAULT_PRECISION: dict[str, str] = {
    "appearance_extractor": "fp16",
    "motion_extractor": "fp32",
    "warp_network": "fp16",
    "decoder": "fp16",
    "stitch_network": "fp16",
    "lmdm": "fp32",
    "hubert": "fp32",
}
ENGINE_NETWORKS: tuple[str, ...] = tuple(DEFAULT_PRECISION)
# ONNX/engine file stems and short names accepted wherever a network is named.
NETWORK_ALIASES = {
    "lmdm_v0.4_hubert": "lmdm",
    "hubert_streaming_fix_kv": "hubert",
    "warp": "warp_network",
    "stitch": "stitch_network",
    "stitching": "stitch_network",
}
INSTALL_HINTS = {
    "onnxruntime": "pip install 'talkinghead-studio[onnx]'",
    "tensorrt": "pip install 'talkinghead-studio[trt]' on a machine with an NVIDIA GPU",
}


# --- what runs here -------------------------------------------------------------------------------


def import_backend(module: str) -> Any:
    """The backend's module (``onnxruntime``, ``tensorrt``), imported now; BackendUnavailable
    with the install hint when it does not import."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        raise BackendUnavailable(
            f"{module} is not importable ({type(e).__name__}: {e}): {INSTALL_HINTS[module]}"
        ) from None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _cuda_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _ort_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return []
    return list(ort.get_available_providers())


def precision_support(backend: str, device: str | torch.device) -> dict[str, str | None]:
    """Each precision -> None when ``backend`` can run it on ``device``, else the reason.

    A backend that cannot run on the device at all gives its reason for every precision.
    """
    dev = torch.device(device)
    if backend not in RUNTIMES:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(RUNTIMES)}")
    quant = "fp8 and int8 run only in TensorRT, through ModelOpt Q/DQ"
    cc = _cuda_capability(dev)
    if backend == "tensorrt" and not _has_module("tensorrt"):
        why = f"tensorrt is not importable: {INSTALL_HINTS['tensorrt']}"
        if dev.type == "cuda" and cc is None:
            why = f"torch sees no CUDA GPU here, and {why}"
        return dict.fromkeys(PRECISIONS, why)
    if dev.type == "cuda" and cc is None:
        return dict.fromkeys(PRECISIONS, "torch sees no CUDA GPU here")
    out: dict[str, str | None] = {}
    if backend == "torch":
        if dev.type == "cpu":
            out = {
                "fp32": None,
                "tf32": "TF32 is a math mode of NVIDIA GPUs (Ampere and newer)",
                "fp16": "torch on the CPU lacks fp16 kernels for these networks; use bf16 or fp32",
                "bf16": None,
            }
        else:
            assert cc is not None
            out = {
                "fp32": None,
                "tf32": None if cc[0] >= 8 else f"TF32 needs compute capability 8.0+, not {cc}",
                "fp16": None,
                "bf16": None
                if torch.cuda.is_bf16_supported()
                else "this GPU has no bf16 support in torch",
            }
        out.update({"fp8": quant, "int8": quant})
        return out
    if backend == "onnxruntime":
        providers = _ort_providers()
        if not providers:
            return dict.fromkeys(
                PRECISIONS, f"onnxruntime is not importable: {INSTALL_HINTS['onnxruntime']}"
            )
        if dev.type == "cuda" and "CUDAExecutionProvider" not in providers:
            return dict.fromkeys(
                PRECISIONS,
                "ONNX Runtime has no CUDAExecutionProvider here (pip install onnxruntime-gpu)",
            )
        if dev.type == "cpu":
            cpu_only = "ONNX Runtime runs these graphs in fp32 on the CPU"
            out = {"fp32": None, "tf32": cpu_only, "fp16": cpu_only, "bf16": cpu_only}
        else:
            out = {
                "fp32": None,
                "tf32": None,
                "fp16": None,  # through a half-precision export, GridSample kept fp32
                "bf16": "ONNX Runtime's CUDA provider lacks bf16 kernels for these graphs",
            }
        out.update({"fp8": quant, "int8": quant})
        return out
    # tensorrt
    if dev.type != "cuda":
        return dict.fromkeys(PRECISIONS, "TensorRT runs only on NVIDIA GPUs (device cuda)")
    assert cc is not None
    modelopt = _has_module("modelopt")
    no_modelopt = "needs ModelOpt Q/DQ: pip install nvidia-modelopt[onnx]"
    return {
        "fp32": None,
        "tf32": None if cc[0] >= 8 else f"TF32 needs compute capability 8.0+, not {cc}",
        "fp16": None,
        "bf16": None if cc[0] >= 8 else f"bf16 needs compute capability 8.0+, not {cc}",
        "fp8": (no_modelopt if not modelopt else None)
        if cc >= (8, 9)
        else f"fp8 needs compute capability 8.9+ (Ada, Hopper), not {cc[0]}.{cc[1]}",
        "int8": no_modelopt if not modelopt else None,
    }


# --- precision parsing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecisionPlan:
    """The precision of every network, which were given explicitly, and fallbacks taken."""

    by_network: dict[str, str]
    explicit: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()

    def of(self, network: str) -> str:
        return self.by_network[canonical_network(network)]

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.by_network.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": dict(self.by_network),
            "explicit": sorted(self.explicit),
            "notes": list(self.notes),
        }


def canonical_network(name: str) -> str:
    n = name.strip()
    return NETWORK_ALIASES.get(n, n)


def _canonical_precision(p: str) -> str:
    q = p.strip().lower()
    return _PRECISION_ALIASES.get(q, q)


def parse_precision(
    spec: str | Mapping[str, str] | None = None,
    backend: str | None = None,
    device: str | torch.device | None = None,
    option: str = "--precision",
    networks: tuple[str, ...] = ENGINE_NETWORKS,
) -> PrecisionPlan:
    """``"lmdm=fp16,decoder=fp16"`` (or a mapping, or a bare ``"fp16"`` for every network)
    over :data:`DEFAULT_PRECISION`.

    OptionError (naming ``option``) for an unknown network, an unknown precision, a network
    given twice, or, when ``backend`` and ``device`` are given, an explicit precision that
    backend cannot run there (with the reason). Unsupported defaults fall back to fp32.
    """
    if spec is None:
        items: list[tuple[str | None, str]] = []
    elif isinstance(spec, Mapping):
        items = [(str(k), str(v)) for k, v in spec.items()]
    else:
        items = []
        for part in str(spec).split(","):
            if not part.strip():
                continue
            if "=" in part:
                k, _, v = part.partition("=")
                items.append((k, v))
            else:
                items.append((None, part))
    chosen: dict[str, str] = {}
    base: str | None = None
    for key, value in items:
        p = _canonical_precision(value)
        if p not in PRECISIONS:
            where = f"{key.strip()}={value.strip()}" if key is not None else value.strip()
            raise OptionError(
                option,
                f"{where}: unknown precision {value.strip()!r} (one of {', '.join(PRECISIONS)})",
            )
        if key is None:
            if base is not None:
                raise OptionError(option, f"two precisions for every network ({base}, {p})")
            base = p
            continue
        name = canonical_network(key)
        if name not in networks:
            raise OptionError(
                option,
                f"{key.strip()}={value.strip()}: unknown network {key.strip()!r} "
                f"(one of {', '.join(networks)})",
            )
        if name in chosen:
            raise OptionError(option, f"{name} is given twice ({chosen[name]}, {p})")
        chosen[name] = p
    explicit = set(chosen) | (set(networks) if base is not None else set())
    plan = {n: chosen.get(n, base or DEFAULT_PRECISION[n]) for n in networks}
    notes: list[str] = []
    if backend is not None and device is not None:
        support = precision_support(backend, device)
        for n, p in plan.items():
            why = support.get(p)
            if why is None:
                continue
            if n in explicit:
                raise OptionError(
                    option, f"{n}={p}: {backend} on {torch.device(device)} cannot run {p} ({why})"
                )
            if support.get("fp32") is None:
                notes.append(f"{n}: default {p} not available on {backend}/{device} ({why}); fp32")
                plan[n] = "fp32"
    return PrecisionPlan(plan, frozenset(explicit), tuple(notes))


# --- the machine report ---------------------------------------------------------------------------


def _devices() -> list[torch.device]:
    devs = [torch.device("cpu")]
    if torch.cuda.is_available():
        devs += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devs


def backends_report() -> dict[str, Any]:
    """Per backend and device kind: usable or why not, and the usable precisions.

    ``{"torch": {"cpu": {...}, "cuda": {...}}, "onnxruntime": {...}, "tensorrt": {...}}``, each
    leaf ``{"usable", "reason", "precisions": [...], "unsupported": {precision: reason}}``.
    """
    cuda = torch.device("cuda", 0)
    report: dict[str, Any] = {}
    for backend in RUNTIMES:
        report[backend] = {}
        kinds = ("cuda",) if backend == "tensorrt" else ("cpu", "cuda")
        for kind in kinds:
            dev = torch.device("cpu") if kind == "cpu" else cuda
            support = precision_support(backend, dev)
            usable = [p for p, why in support.items() if why is None]
            reasons = {p: why for p, why in support.items() if why is not None}
            common = set(reasons.values())
            entry: dict[str, Any] = {
                "usable": bool(usable),
                "reason": None
                if usable
                else (common.pop() if len(common) == 1 else "no precision"),
                "precisions": usable,
                "unsupported": reasons,
            }
            if backend == "onnxruntime" and _ort_providers():
                entry["providers"] = _ort_providers()
            report[backend][kind] = entry
    report["defaults"] = dict(DEFAULT_PRECISION)
    return report
