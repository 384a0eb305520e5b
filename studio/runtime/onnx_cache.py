"""ONNX files made for engines: any static batch, fp32 or half precision, cached by content.

:func:`export_for_engine` exports a studio network module through
:func:`studio.models.onnx_export.export_module` (atomic write, structural checks, and for
fp32 the ONNX Runtime parity check) wrapped in a
:class:`~studio.runtime.torch_backend.PrecisionAdapter`, so that

- the graph's static batch is ``batch`` (Ditto's files are batch 1),
- ``precision`` fp16/bf16 gives a *typed* half graph with fp32 inputs and outputs, Cast nodes
  at the boundaries and every GridSample kept fp32 (what a strongly typed TensorRT network
  needs, since TensorRT 11 has no FP16 builder flag), traced from the torch engine's ``cast``
  policy. Half graphs are not verified in ONNX Runtime (its CPU provider lacks most half
  kernels); the TensorRT build checks them.

The file name carries a key over the network, batch, precision, opset, torch version, the
SHA-256 of the module's weights and that of the code of the network and of its export
(:mod:`studio.runtime.network_digest`), so a changed checkpoint or a studio upgrade that
changes the graph is exported anew and an unchanged one is reused. Beside each file its
SHA-256 is recorded (``NAME.onnx.sha256``): a kept file that is not the one written (damaged
on disk, cut short) is said and exported again, never run. Concurrent processes export a
file once: the export holds :func:`studio.paths.build_lock`, and a process that waited for it
finds the file made.

Before an export writes a file (hundreds of MB for the full-size warp network) it says so,
with the size estimated from the network's parameters, through ``log`` when the caller
passes one, else the ``logging`` module (logger ``studio.runtime.onnx_cache``, INFO), which
the CLI shows on stderr. :func:`export_purpose` names the runtime the file is for.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from studio.errors import OutputError
from studio.files import write_atomic
from studio.paths import build_lock
from studio.runtime.engine_cache import file_sha256
from studio.runtime.network_digest import code_sha256, weights_sha256

__all__ = [
    "EXPORT_FORMAT",
    "estimated_onnx_bytes",
    "export_for_engine",
    "export_notice",
    "export_purpose",
    "onnx_cache_key",
]

EXPORT_FORMAT = 2  # bump when the exported graph changes for the same inputs (2: SHA-256 kept)
SUM_SUFFIX = ".sha256"  # beside an export: the SHA-256 of the file as it was written
_log = logging.getLogger(__name__)
_PURPOSE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "onnx_export_purpose", default=None
)


@contextlib.contextmanager
def export_purpose(runtime: str) -> Iterator[None]:
    """Inside: export notices say the files are for ``runtime`` ("ONNX Runtime", "TensorRT").

    The engine factory exports for either runtime through the same call; the caller that
    knows which one runs sets it here rather than threading a label through every layer.
    """
    token = _PURPOSE.set(runtime)
    try:
        yield
    finally:
        _PURPOSE.reset(token)


_HALF_BYTES = {"fp16": 2, "bf16": 2}


def estimated_onnx_bytes(module: nn.Module, precision: str = "fp32") -> int:
    """About how large the exported file is: the weights and buffers at the graph's precision
    (floating tensors at 2 bytes for a half graph, others as stored); the graph itself is small
    beside them."""
    total = 0
    for t in module.state_dict().values():
        size = t.element_size()
        if t.is_floating_point():
            size = _HALF_BYTES.get(precision, 4)
        total += t.numel() * size
    return total


def _human(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}" if n >= 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def export_notice(
    network: str, size: int, folder: Path, purpose: str | None = None, detail: str = ""
) -> str:
    """The line said before an export writes a file, e.g. "exporting warp_network to ONNX for
    ONNX Runtime (≈ 180 MB, once; batch 4, fp32) into ~/.cache/…/onnx"."""
    what = f"for {purpose} " if purpose else ""
    extra = f"; {detail}" if detail else ""
    return f"exporting {network} to ONNX {what}(≈ {_human(size)}, once{extra}) into {folder}"


def onnx_cache_key(
    network: str,
    digest: str,
    batch: int,
    precision: str,
    opset: int,
    cls: str,
    code: str,
) -> str:
    """A short key over everything that changes the exported file (``digest``: the weights',
    ``code``: the network's source, :mod:`studio.runtime.network_digest`)."""
    fields = {
        "format": EXPORT_FORMAT,
        "network": network,
        "class": cls,
        "code": code,
        "weights": digest,
        "batch": batch,
        "precision": precision,
        "opset": opset,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def export_for_engine(
    network: str,
    module: nn.Module,
    out_dir: str | os.PathLike[str],
    batch: int = 1,
    precision: str = "fp32",
    device: torch.device | str | None = None,
    opset: int | None = None,
    verify: bool = True,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The cached ONNX file of ``module`` for an engine (exported when absent); its path.

    ``device`` is where the export traces (default: the module's); half graphs trace best
    on CUDA (on the CPU 3-D average pooling is kept fp32 as well, having no half kernels).
    ``tf32`` exports the fp32 graph (TF32 is a math mode, not a graph property). fp8/int8
    export the fp16 graph, which the TensorRT builder then quantizes.
    RuntimeError when verification fails (nothing is written then).
    """
    from studio.models.onnx_export import DEFAULT_OPSET, export_module
    from studio.runtime.torch_backend import PrecisionAdapter

    graph_precision = {"tf32": "fp32", "fp8": "fp16", "int8": "fp16"}.get(precision, precision)
    opset = DEFAULT_OPSET if opset is None else opset
    key = onnx_cache_key(
        network,
        weights_sha256(module),
        batch,
        graph_precision,
        opset,
        type(module).__name__,
        code_sha256(module, __name__),  # the network's code and the export's
    )
    from studio.models import REGISTRY

    stem = REGISTRY[network].onnx_file.removesuffix(".onnx") if network in REGISTRY else network
    out = Path(out_dir).expanduser()
    target = out / f"{stem}.b{batch}.{graph_precision}.{key}.onnx"
    if _unusable(target) is None:
        return target
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot create the engine cache {out}: {e.strerror or e}") from None
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = next((p.device for p in module.parameters()), torch.device("cpu"))
    # one export per file at a time: a second process waits, then finds the first's file
    with build_lock(target, f"{network}'s ONNX file"):
        why = _unusable(target)
        if why is None:
            return target
        if why:  # there, but not what was written: never run it
            _log.warning("%s: exporting it again", why)
            target.unlink(missing_ok=True)
        size = estimated_onnx_bytes(module, graph_precision)
        detail = f"batch {batch}, {graph_precision}"
        (log or _log.info)(export_notice(network, size, out, _PURPOSE.get(), detail))
        adapter = _BatchedAdapter(PrecisionAdapter(network, module, graph_precision, dev), batch)
        half = graph_precision != "fp32"
        record: dict[str, Any] = export_module(
            adapter.eval(), target, opset=opset, verify=verify and not half
        )
        if record["ok"]:
            write_atomic(_sum_file(target), file_sha256(target) + "\n")
    if not record["ok"]:
        raise RuntimeError(f"{network}: {record.get('error', 'export failed')}")
    return target


def _sum_file(target: Path) -> Path:
    return target.with_name(target.name + SUM_SUFFIX)


def _unusable(target: Path) -> str | None:
    """Why the kept export ``target`` cannot be run: "" when there is none; None when it is
    the file that was written (its SHA-256 the one recorded)."""
    if not target.is_file():
        return ""
    try:
        recorded = _sum_file(target).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return f"{target.name}: its recorded SHA-256 is missing or unreadable"
    if file_sha256(target) != recorded:
        return f"{target.name} is corrupt (its SHA-256 is not the one recorded)"
    return None


class _BatchedAdapter(nn.Module):
    """An adapter whose ``example_inputs`` have a fixed batch (the exporter asks for 1)."""

    def __init__(self, adapter: nn.Module, batch: int) -> None:
        super().__init__()
        self.adapter = adapter
        self.batch = batch
        self.INPUT_NAMES = adapter.INPUT_NAMES
        self.OUTPUT_NAMES = adapter.OUTPUT_NAMES

    def example_inputs(self, batch: int = 1) -> tuple[torch.Tensor, ...]:
        return self.adapter.example_inputs(self.batch)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.adapter(*inputs)
