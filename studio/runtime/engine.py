"""One Engine protocol for every backend, per-network precision, and the engine factory.

An :class:`Engine` runs one network with static, named inputs and outputs
(:class:`TensorSpec`: name, shape, dtype), on tensors that already live on its device:
``engine.run({"feature": f})`` returns ``{"output": img}`` without host copies or host
syncs. Batch size is part of the static shapes (``make_engine(..., batch=B)``); an engine
built for batch 8 takes exactly [8, ...] inputs.

Building and calling one (the renderer's warp + decoder, batched, static batch 8)::

    warp = make_engine("warp_network", "torch", device="cuda", checkpoints=ck, batch=8,
                       cuda_graph=True)                 # default fp16 (autocast for warp)
    dec = make_engine("decoder", "tensorrt", "fp16", "cuda", checkpoints=ck, batch=8)
    feat = warp.run({"feature_3d": f_s8, "kp_source": x_s, "kp_driving": x_d})["out"]
    img = dec.run({"feature": feat})["output"]          # [8, 3, 512, 512] fp32, on the GPU

A last, partial batch must be padded to the static batch (and the padding dropped after).

Output tensors may be engine-owned, persistent buffers (CUDA-graph replays, TensorRT, ONNX
Runtime on CUDA): they are overwritten by the next ``run``. Clone what you keep across runs.

Backends (:data:`BACKENDS`): ``torch`` (:mod:`studio.runtime.torch_engine`), ``onnxruntime``
(:mod:`studio.runtime.ort_engine`) and ``tensorrt`` (:mod:`studio.runtime.tensorrt_engine`).

Precision (:func:`parse_precision`): ``"lmdm=fp16,decoder=fp16"`` overrides the defaults of
the released set (:data:`DEFAULT_PRECISION`: HuBERT, LMDM and the motion extractor fp32, the
rest fp16); a bare ``"fp16"`` sets every network. A precision named explicitly that the
backend cannot run on the device is an :class:`~studio.errors.OptionError` naming the
option; a default it cannot run falls back to fp32 (noted in :attr:`PrecisionPlan.notes`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from studio.errors import InputError, OptionError, StudioError
from studio.settings import RUNTIMES

__all__ = [
    "BACKENDS",
    "DEFAULT_PRECISION",
    "ENGINE_NETWORKS",
    "PRECISIONS",
    "BackendUnavailable",
    "Engine",
    "EngineBase",
    "PrecisionPlan",
    "TensorSpec",
    "backends_report",
    "capture_cuda_graph",
    "default_cache_dir",
    "make_engine",
    "parse_precision",
    "precision_support",
    "resolve_device",
    "sdpa_backend",
    "torch_dtype",
]

BACKENDS = RUNTIMES  # torch, onnxruntime, tensorrt (named in studio.settings for the options)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
_PRECISION_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

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


class BackendUnavailable(StudioError):
    """A backend (or one of its features) cannot run here; the message says why and what to do."""


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``torch.float32``/``"tensor(float)"``-style names -> torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    text = str(name).removeprefix("torch.").removeprefix("tensor(").removesuffix(")")
    table = {
        "float": torch.float32,
        "float32": torch.float32,
        "float16": torch.float16,
        "half": torch.float16,
        "bfloat16": torch.bfloat16,
        "double": torch.float64,
        "float64": torch.float64,
        "int64": torch.int64,
        "int32": torch.int32,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
    }
    try:
        return table[text]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


@dataclass(frozen=True)
class TensorSpec:
    """One engine input or output; a dimension of -1 is dynamic (HuBERT's sample count)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def problem(self, t: Any, device: torch.device) -> str | None:
        """Why ``t`` cannot be fed as this input (None when it fits). Host metadata only."""
        if not isinstance(t, Tensor):
            return f"{self.name} must be a torch.Tensor, got {type(t).__name__}"
        shape = tuple(t.shape)
        if len(shape) != len(self.shape) or any(
            want >= 0 and got != want for got, want in zip(shape, self.shape, strict=True)
        ):
            want = "x".join("N" if d < 0 else str(d) for d in self.shape)
            return f"{self.name} must be [{want}], got {list(shape)}"
        if t.dtype != self.dtype:
            both_int = not t.dtype.is_floating_point and not self.dtype.is_floating_point
            if not both_int:
                return f"{self.name} must be {_dtype_name(self.dtype)}, got {_dtype_name(t.dtype)}"
        if t.device.type != device.type or (
            device.type == "cuda" and (t.device.index or 0) != (device.index or 0)
        ):
            return f"{self.name} is on {t.device}, the engine runs on {device}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": _dtype_name(self.dtype)}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@runtime_checkable
class Engine(Protocol):
    """What compute code calls: static named I/O, run on device tensors, optional capture."""

    name: str
    backend: str
    precision: str
    device: torch.device
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Outputs by name for inputs by name (device tensors; no host copies or syncs)."""
        ...

    def capture(self) -> bool:
        """Capture a CUDA graph with static buffers; False when the engine cannot."""
        ...


class EngineBase:
    """Shared plumbing: I/O specs, feed validation, static input buffers, description."""

    backend = "base"

    def __init__(
        self,
        name: str,
        precision: str,
        device: torch.device,
        inputs: tuple[TensorSpec, ...],
        outputs: tuple[TensorSpec, ...],
    ) -> None:
        self.name = name
        self.precision = precision
        self.device = device
        self.inputs = inputs
        self.outputs = outputs
        self.static_inputs: dict[str, Tensor] | None = None  # set once captured

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)

    @property
    def batch(self) -> int:
        """The static batch size (leading dimension of the first input)."""
        return self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1

    @property
    def captured(self) -> bool:
        return self.static_inputs is not None

    def check_feed(self, feed: Mapping[str, Tensor]) -> None:
        """ValueError naming the first missing, unexpected or mismatched input."""
        missing = [s.name for s in self.inputs if s.name not in feed]
        extra = [k for k in feed if k not in self.input_names]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(missing)}")
            if extra:
                parts.append(f"unexpected {', '.join(extra)}")
            raise ValueError(
                f"{self.name} ({self.backend}): {'; '.join(parts)} "
                f"(inputs are {', '.join(self.input_names)})"
            )
        for s in self.inputs:
            why = s.problem(feed[s.name], self.device)
            if why is not None:
                raise ValueError(f"{self.name} ({self.backend}): {why}")

    def _fill_static(self, feed: Mapping[str, Tensor]) -> None:
        """Copy the feed into the static input buffers (skipped for the buffers themselves)."""
        assert self.static_inputs is not None
        for name, buf in self.static_inputs.items():
            t = feed[name]
            if t.data_ptr() != buf.data_ptr():
                buf.copy_(t)

    def __call__(self, **feed: Tensor) -> dict[str, Tensor]:
        return self.run(feed)

    def run(self, feed: Mapping[str, Tensor]) -> dict[str, Tensor]:  # pragma: no cover
        raise NotImplementedError

    def capture(self) -> bool:
        return False

    def example_feed(self, seed: int = 0) -> dict[str, Tensor]:
        """Random inputs of the static shapes on the engine's device, drawn like real ones."""
        from studio.models.onnx_export import random_inputs

        example = [torch.zeros(s.shape, dtype=s.dtype) for s in self.inputs]
        drawn = random_inputs(self.input_names, example, seed)
        return {n: t.to(self.device) for n, t in zip(self.input_names, drawn, strict=True)}

    def describe(self) -> dict[str, Any]:
        return {
            "network": self.name,
            "backend": self.backend,
            "precision": self.precision,
            "device": str(self.device),
            "captured": self.captured,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} {self.precision} on {self.device}"
            f"{' (graph)' if self.captured else ''}>"
        )


def capture_cuda_graph(
    fn: Callable[[], Any], warmup: int = 3, context: Callable[[], Any] | None = None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``fn`` into a CUDA graph: warm-up on a side stream, then one capture.

    ``fn`` must read only static buffers (filled with ``copy_`` before each replay) and must
    not synchronize with the host. ``context()`` (e.g. no_grad + autocast) wraps both the
    warm-up and the capture. Returns (graph, fn's output, which replays overwrite).
    """
    ctx = context or contextlib.nullcontext
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), ctx():
        for _ in range(max(1, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with ctx(), torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


# --- devices -------------------------------------------------------------------------------


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None/"auto": the first CUDA GPU when torch sees one, else the CPU; InputError for a GPU
    that is not there."""
    if device is None or device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"device {device!r} is not a device: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device} was asked for, but torch sees no CUDA GPU here")
        index = dev.index or 0
        if index >= torch.cuda.device_count():
            raise InputError(
                f"device {device}: torch sees {torch.cuda.device_count()} GPU(s) (cuda:0..)"
            )
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise InputError(f"device {device}: only cpu and cuda devices are supported")
    return dev


def default_cache_dir() -> Path:
    """Where exported ONNX files and engines are cached (``$STUDIO_ENGINE_CACHE`` wins)."""
    env = os.environ.get("STUDIO_ENGINE_CACHE")
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "talkinghead-studio" / "engines"


# --- precision support ------------------------------------------------------------------------


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
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKENDS)}")
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


# --- precision parsing ------------------------------------------------------------------------


@dataclass(frozen=True)
class PrecisionPlan:
    """The precision of every network, which were given explicitly, and fallbacks taken."""

    by_network: dict[str, str]
    explicit: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()

    def of(self, network: str) -> str:
        return self.by_network[_canonical_network(network)]

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.by_network.items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": dict(self.by_network),
            "explicit": sorted(self.explicit),
            "notes": list(self.notes),
        }


def _canonical_network(name: str) -> str:
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
        name = _canonical_network(key)
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


# --- the machine report ------------------------------------------------------------------------


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
    for backend in BACKENDS:
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


# --- the factory ----------------------------------------------------------------------------


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
    name = _canonical_network(network)
    if name not in ENGINE_NETWORKS:
        raise InputError(
            f"unknown network {network!r}: expected one of {', '.join(ENGINE_NETWORKS)}"
        )
    if backend not in BACKENDS:
        raise OptionError(
            "--backend", f"unknown backend {backend!r} (one of {', '.join(BACKENDS)})"
        )
    if not isinstance(batch, int) or batch < 1:
        raise OptionError("--batch", f"must be a positive integer, got {batch!r}")
    dev = resolve_device(device)
    spec = f"{name}={precision}" if precision else None
    prec = parse_precision(spec, backend, dev).of(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if backend == "torch":
        from studio.runtime.torch_engine import TorchEngine

        mod = _load_module(name, module, checkpoints, dev)
        eng: EngineBase = TorchEngine(name, mod, prec, dev, batch=batch, **options)
    elif backend == "onnxruntime":
        from studio.runtime.ort_engine import OrtEngine

        path = _onnx_for(name, prec, dev, batch, module, checkpoints, onnx, cache, log)
        eng = OrtEngine(name, path, prec, dev, **options)
    else:
        from studio.runtime.tensorrt_engine import (
            BuildSettings,
            TensorRTEngine,
            cached_engine,
            engine_stem,
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


def sdpa_backend(name: str) -> contextlib.AbstractContextManager[None]:
    """Scaled-dot-product attention restricted to one backend ("flash", "efficient", "cudnn",
    "math"), or PyTorch's own choice ("auto", no restriction: whatever is in force around the
    call). Entered inside a compiled function, a named choice is part of its trace: compiled
    code made under one backend is not reused under another (a context around the call would
    be, silently)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    if name not in names:
        raise ValueError(f"unknown SDPA backend {name!r}; expected auto or one of {sorted(names)}")
    return sdpa_kernel([names[name]])


@contextlib.contextmanager
def math_mode(precision: str, device: torch.device) -> Iterator[None]:
    """TF32 on for ``tf32``, off for everything else (strict fp32), on CUDA; restored after."""
    if device.type != "cuda":
        yield
        return
    on = precision == "tf32"
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
