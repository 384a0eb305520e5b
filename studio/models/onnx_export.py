"""Export Ditto's networks to ONNX with Ditto's I/O names and static shapes, verified in ORT.

:func:`export_onnx` loads each network present in a checkpoint tree's PyTorch layout and writes
``<out>/<onnx_file>`` (the ``ditto_onnx`` names). Every file is

- traced by the TorchScript exporter (``dynamo=False``: fast, and its graphs for these modules
  are plain; its deprecation notices are silenced) at opset >= 20, the first with 5-D
  ``GridSample``, so the warp network needs no custom plugin,
- static (batch 1, no dynamic axes) and self-contained (weights inline; all six are < 2 GB),
- written atomically: exported into a temporary folder next to the target, checked, verified,
  then renamed into place, so a failed or interrupted export never leaves a partial file,
- verified by running it in ONNX Runtime on fresh random inputs against the torch module
  (fp32 relative L2 per output, default tolerance 1e-4). A file that fails is not installed.

LMDM is exported with ``batch_guidance = False``: the guided step as the reference computes it,
two sequential passes (unconditional, then conditional) rather than one batch of two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from studio.errors import InputError, OptionError, OutputError
from studio.models import NETWORK_NAMES, load_network, network_spec

__all__ = [
    "DEFAULT_OPSET",
    "MIN_OPSET",
    "TOLERANCE",
    "check_opset",
    "export_module",
    "export_onnx",
    "max_opset",
    "random_inputs",
    "verify_onnx",
]

MIN_OPSET = 20  # 5-D GridSample (the warp network's trilinear sampling) needs opset 20
DEFAULT_OPSET = 20
TOLERANCE = 1e-4  # fp32 relative L2, ONNX Runtime vs torch
_TWO_GB = 2**31


def max_opset() -> int:
    """The highest opset the TorchScript exporter of the installed torch can write."""
    try:
        from torch.onnx._constants import ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET as top
    except ImportError:  # pragma: no cover - older/newer torch layouts
        return MIN_OPSET
    return int(top)


def check_opset(opset: int, option: str = "opset") -> int:
    """``opset`` if the exporter can write it and it has 5-D GridSample; OptionError otherwise."""
    top = max_opset()
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= top:
        newest = f"the newest the TorchScript exporter of torch {torch.__version__} writes"
        if top == MIN_OPSET:
            why = f"it is the first with 5-D GridSample and {newest}"
        else:
            why = f"{MIN_OPSET} is the first with 5-D GridSample and {top} is {newest}"
        span = f"{MIN_OPSET}" if top == MIN_OPSET else f"{MIN_OPSET}..{top}"
        raise OptionError(option, f"must be {span}, got {opset}: {why}")
    return opset


def _io_names(module: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """INPUT_NAMES/OUTPUT_NAMES from the class or, failing that, its defining module."""
    owner = sys.modules[type(module).__module__]
    inputs = getattr(module, "INPUT_NAMES", None) or getattr(owner, "INPUT_NAMES", None)
    outputs = getattr(module, "OUTPUT_NAMES", None) or getattr(owner, "OUTPUT_NAMES", None)
    if not inputs or not outputs:
        raise ValueError(f"{type(module).__name__} declares no INPUT_NAMES/OUTPUT_NAMES")
    return tuple(inputs), tuple(outputs)


@contextlib.contextmanager
def _export_mode(module: nn.Module) -> Iterator[None]:
    """Eval mode, no grad, reference guidance for LMDM; restores the module afterwards."""
    was_training = module.training
    guidance = getattr(module, "batch_guidance", None)
    module.eval()
    if guidance is not None:
        module.batch_guidance = False
    try:
        with torch.no_grad():
            yield
    finally:
        if guidance is not None:
            module.batch_guidance = guidance
        module.train(was_training)


@contextlib.contextmanager
def _folded_spectral_norm(module: nn.Module) -> Iterator[None]:
    """Trace the decoder's spectral-norm convolutions with their effective weights as constants.

    Left to itself the tracer records ``weight_orig / (u . W_mat v)`` as graph ops, which the
    TorchScript exporter does not fold: the ONNX file would then hold every such weight twice
    (343 MB instead of 221 MB for the decoder) and recompute sigma on every run. The weights
    are computed once here exactly as eager inference computes them.
    """
    from studio.models.decoder import SpectralNormConv2d

    patched = [m for m in module.modules() if isinstance(m, SpectralNormConv2d)]
    for m in patched:
        weight = m.compute_weight().detach()
        m.effective_weight = lambda weight=weight: weight  # instance attribute shadows the method
    try:
        yield
    finally:
        for m in patched:
            del m.effective_weight


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the TorchScript exporter's deprecation and tracing notices (not errors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*[Cc]onstant folding.*")
        # InstanceNorm has no running stats: "train=True" (input statistics) is its eval mode.
        warnings.filterwarnings("ignore", message=r".*operator 'instance_norm' is set to train.*")
        yield


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def random_inputs(
    names: Sequence[str], example: Sequence[torch.Tensor], seed: int
) -> tuple[torch.Tensor, ...]:
    """Fresh inputs with the shapes/dtypes of ``example``, drawn like real ones by input name.

    ``image`` uniform in 0..1; ``kp_source`` uniform in +-0.6 with ``kp_driving`` near it (as a
    driving frame is near its source: large random motions make trilinear sampling of random
    features ill-conditioned, so that fp32 itself drifts by ~5e-5); integer inputs (LMDM's
    ``time_cond``) uniform over the 1000 diffusion steps; everything else standard normal.
    """
    from studio.layout import DIFFUSION_STEPS

    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, t in zip(names, example, strict=True):
        if not t.dtype.is_floating_point:
            x = torch.randint(0, DIFFUSION_STEPS, t.shape, generator=g, dtype=t.dtype)
        elif name == "image":
            x = torch.rand(t.shape, generator=g, dtype=t.dtype)
        elif name == "kp_source":
            x = (torch.rand(t.shape, generator=g, dtype=t.dtype) * 2 - 1) * 0.6
        elif name == "kp_driving" and "kp_source" in out:
            x = out["kp_source"] + 0.05 * torch.randn(t.shape, generator=g, dtype=t.dtype)
        else:
            x = torch.randn(t.shape, generator=g, dtype=t.dtype)
        out[name] = x.to(t.device)
    return tuple(out.values())


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    num = float(np.linalg.norm(got64 - want64))
    den = float(np.linalg.norm(want64))
    return num / den if den > 0 else num


def _dims(value_info: Any) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _pin_output_shapes(path: Path, shapes: Sequence[tuple[int, ...]]) -> None:
    """Write the traced output shapes where the exporter left symbolic output dimensions.

    The TorchScript exporter loses static shapes through some ops (e.g. ``F.pad``), though the
    graph itself is static; Ditto's graphs declare every output dimension.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    outputs = list(model.graph.output)
    if len(shapes) != len(outputs):
        raise ValueError(f"{path.name}: traced {len(shapes)} outputs, the graph has {len(outputs)}")
    changed = False
    for value, shape in zip(outputs, shapes, strict=True):
        dims = value.type.tensor_type.shape.dim
        if [d.dim_value if d.HasField("dim_value") else None for d in dims] == list(shape):
            continue
        del dims[:]
        for n in shape:
            dims.add().dim_value = n
        changed = True
    if changed:
        onnx.save(model, str(path))


def _check_file(
    path: Path,
    input_names: Sequence[str],
    output_names: Sequence[str],
    example: Sequence[torch.Tensor],
    opset: int,
) -> dict[str, Any]:
    """Structural checks of an exported file; returns its I/O description. ValueError if bad.

    Names in order, input shapes equal to the example's, every dimension static, the default
    domain's opset, and no external data.
    """
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    external = [
        t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    if external:
        raise ValueError(f"{path.name} stores {len(external)} tensors as external data")
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if default_opset < opset:
        raise ValueError(f"{path.name} has opset {default_opset}, asked for {opset}")

    def describe(items: Sequence[Any]) -> list[dict[str, Any]]:
        return [
            {
                "name": v.name,
                "shape": _dims(v),
                "dtype": str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
            }
            for v in items
        ]

    ins, outs = describe(model.graph.input), describe(model.graph.output)
    for what, got, want in (("inputs", ins, input_names), ("outputs", outs, output_names)):
        if [d["name"] for d in got] != list(want):
            raise ValueError(f"{path.name} {what} are {[d['name'] for d in got]}, not {want}")
    for d, t in zip(ins, example, strict=True):
        if d["shape"] != list(t.shape) or d["dtype"] != str(t.dtype).removeprefix("torch."):
            raise ValueError(f"{path.name}: input {d['name']} is {d}, expected {list(t.shape)}")
    for d in outs:
        if not d["shape"] or not all(isinstance(n, int) and n > 0 for n in d["shape"]):
            raise ValueError(f"{path.name}: output {d['name']} has a non-static shape {d['shape']}")
    return {"opset": default_opset, "inputs": ins, "outputs": outs}


def verify_onnx(
    module: nn.Module, path: str | os.PathLike[str], seed: int = 1, runs: int = 1
) -> dict[str, float]:
    """Relative L2 of each ONNX Runtime output against the torch module, on fresh inputs.

    ``runs`` independent input draws; the worst value per output is returned (name -> rel L2).
    """
    import onnxruntime as ort

    input_names, output_names = _io_names(module)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    worst = dict.fromkeys(output_names, 0.0)
    with _export_mode(module):
        example = module.example_inputs(1)
        for run in range(runs):
            inputs = random_inputs(input_names, example, seed + run)
            want = _as_tuple(module(*inputs))
            feed = {n: t.cpu().numpy() for n, t in zip(input_names, inputs, strict=True)}
            got = session.run(list(output_names), feed)
            for name, g, w in zip(output_names, got, want, strict=True):
                if tuple(g.shape) != tuple(w.shape):
                    raise ValueError(f"{name}: ONNX Runtime gave {g.shape}, torch {tuple(w.shape)}")
                worst[name] = max(worst[name], _rel_l2(g, w.cpu().numpy()))
    return worst


def export_module(
    module: nn.Module,
    path: str | os.PathLike[str],
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    seed: int = 1,
) -> dict[str, Any]:
    """Export one studio network module to ``path`` (atomically) and verify it in ORT.

    The module's ``INPUT_NAMES``/``OUTPUT_NAMES`` and ``example_inputs(1)`` give the graph's
    names and static shapes. Returns a record: path, bytes, opset, inputs/outputs (name, shape,
    dtype), export_s, verify_s, parity (output -> rel L2, empty without ``verify``),
    max_rel_l2, ok. When verification fails (``ok`` False, ``error`` set) nothing is written.
    """
    check_opset(opset)
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputError(f"{target} is a folder: give the .onnx file name")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f".{target.stem}.", dir=target.parent))
    except OSError as e:
        raise OutputError(f"cannot write into {target.parent}: {e.strerror or e}") from None
    input_names, output_names = _io_names(module)
    record: dict[str, Any] = {"path": str(target), "onnx_file": target.name}
    try:
        tmp = workdir / target.name
        started = time.perf_counter()
        traced: list[tuple[int, ...]] = []
        handle = module.register_forward_hook(
            lambda _m, _a, out: traced.__setitem__(
                slice(None), [tuple(t.shape) for t in _as_tuple(out)]
            )
        )
        try:
            with _export_mode(module), _folded_spectral_norm(module), _quiet_exporter():
                example = module.example_inputs(1)
                torch.onnx.export(
                    module,
                    example,
                    str(tmp),
                    input_names=list(input_names),
                    output_names=list(output_names),
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
        finally:
            handle.remove()
        files = sorted(p.name for p in workdir.iterdir())
        if files != [tmp.name]:
            raise ValueError(f"the export wrote {files}, expected the single file {tmp.name}")
        _pin_output_shapes(tmp, traced)
        record["export_s"] = time.perf_counter() - started
        size = tmp.stat().st_size
        if size >= _TWO_GB:
            raise ValueError(f"{tmp.name} is {size} bytes, beyond what one ONNX file can hold")
        record.update(_check_file(tmp, input_names, output_names, example, opset))
        record["bytes"] = size
        parity: dict[str, float] = {}
        record["verify_s"] = 0.0
        if verify:
            started = time.perf_counter()
            parity = verify_onnx(module, tmp, seed=seed)
            record["verify_s"] = time.perf_counter() - started
        record["parity"] = parity
        record["max_rel_l2"] = max(parity.values()) if parity else None
        record["verified"] = bool(verify)
        record["tolerance"] = tolerance
        bad = {k: v for k, v in parity.items() if not v <= tolerance}
        record["ok"] = not bad
        if bad:
            worst = ", ".join(f"{k} {v:.3g}" for k, v in bad.items())
            record["error"] = f"ONNX Runtime differs from torch beyond {tolerance:g}: {worst}"
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return record


def _requested(networks: Iterable[str] | str | None) -> list[str] | None:
    if networks is None:
        return None
    items = networks.split(",") if isinstance(networks, str) else list(networks)
    names = [n.strip() for n in items if n and n.strip()]
    by_file = {network_spec(n).onnx_file.removesuffix(".onnx"): n for n in NETWORK_NAMES}
    out = []
    for n in names:
        name = by_file.get(n, n)
        network_spec(name)  # InputError for an unknown name
        if name not in out:
            out.append(name)
    if not out:
        raise InputError(f"no networks named: expected some of {', '.join(NETWORK_NAMES)}")
    return out


def export_onnx(
    checkpoints_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    networks: Iterable[str] | str | None = None,
    opset: int = DEFAULT_OPSET,
    verify: bool = True,
    tolerance: float = TOLERANCE,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Export the networks of a checkpoint tree's PyTorch layout to ``out_dir``.

    ``networks`` (names or ONNX stems, a list or comma-separated; default: every network
    whose ``.pth`` is present) are loaded with :func:`load_network`; explicitly named ones must
    be present. ``progress(stage, done, total)`` is called before each export (stage
    ``"exporting networks: <name>"``) and once all are done. Returns ``{"checkpoints",
    "out_dir", "opset", "ok", "networks": {name: record}}`` with :func:`export_module`'s
    records (plus ``checkpoint`` and ``status``: exported, failed or missing).
    """
    from studio.models.checkpoints import discover

    check_opset(opset)
    wanted = _requested(networks)
    found = discover(checkpoints_dir)
    missing = {
        f.role: f for f in found.missing("pytorch") if f.role in NETWORK_NAMES
    }  # absent or broken .pth files
    if wanted is not None:
        absent = [n for n in wanted if n in missing]
        if absent:
            raise InputError(
                "; ".join(found.describe(missing[n]) for n in absent)
                + f" under {found.root}: cannot export {', '.join(absent)}"
            )
    names = wanted if wanted is not None else [n for n in NETWORK_NAMES if n not in missing]
    if not names:
        raise InputError(
            f"{found.root} holds none of the six network files in ditto_pytorch/models/ "
            f"({', '.join(network_spec(n).checkpoint_file for n in NETWORK_NAMES)})"
        )
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create {out}: {e.strerror or e}") from None
    summary: dict[str, Any] = {
        "checkpoints": str(found.root),
        "out_dir": str(out),
        "opset": opset,
        "networks": {},
    }
    todo = [n for n in NETWORK_NAMES if n in names]
    for name in NETWORK_NAMES:
        if name not in names:
            if wanted is None and name in missing:
                summary["networks"][name] = {
                    "status": "missing",
                    "checkpoint": str(missing[name].path),
                    "ok": True,
                }
            continue
        if progress is not None:
            progress(f"exporting networks: {name}", todo.index(name), len(todo))
        spec = network_spec(name)
        checkpoint = found.path(name, "pytorch")
        module = load_network(name, checkpoint)
        record = export_module(
            module, out / spec.onnx_file, opset=opset, verify=verify, tolerance=tolerance
        )
        record["checkpoint"] = str(checkpoint)
        record["status"] = "exported" if record["ok"] else "failed"
        summary["networks"][name] = record
        del module
    if progress is not None:
        progress("exporting networks", len(todo), len(todo))
    summary["ok"] = all(r["ok"] for r in summary["networks"].values())
    return summary
