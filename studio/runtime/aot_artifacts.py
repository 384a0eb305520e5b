"""Compiled torch engines kept on disk as Inductor's standalone artifacts, where AOTInductor's
packages do not load.

On the GPUs lent here (torch 2.11, CUDA 13) every AOTInductor package crashed the process
loading it (:mod:`studio.runtime.aot_cache`), so each new ``--compile`` process compiled its
engines again through Dynamo, from Inductor's caches (15 s on an H100 for warp + decoder).
``torch._inductor.standalone_compile`` compiles the exported network to what torch.compile
itself runs (Python wrapper code with Triton kernels on a GPU, C++ ones on the CPU) and saves
it; ``CompiledArtifact.load`` gives it back in a new process without tracing the network
again. The weights are inputs of the artifact, not in its file: the engine passes the
network's own, and captures the artifact in a CUDA graph as it does torch.compile's code. As a
package is, each new artifact is loaded and run once (on zeros) in a separate process before
it is kept, so one that would crash its loader never reaches a render.

Each artifact ``<cache>/compiled/aot/<network>-<precision>-b<batch>-<digest>.art`` has a JSON
beside it with its :class:`~studio.runtime.aot_cache.AotKey`, its SHA-256 and the order of its
inputs (weights by name, then the network's inputs), and is checked, built under a file lock
and rebuilt as a package is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from studio.runtime.aot_cache import (
    AotKey,
    Check,
    build_file,
    build_then_load,
    checked_meta,
    package_file,
    refuse_wrong,
    verify_elsewhere,
)

ABSENT = "no compiled artifact yet"
# a new process loads the artifact and runs it on zeros laid out as its inputs (weights too)
_VERIFY = """
import faulthandler, sys, torch
faulthandler.enable()
torch._inductor.config.compile_threads = 1  # its kernels loaded here: no pool of workers
art = torch._inductor.CompiledArtifact.load(path=sys.argv[1], format="binary")
art(*[torch.zeros_like(torch.empty_strided(shape, stride, dtype=dtype, device=device))
      for shape, stride, dtype, device in torch.load(sys.argv[2])])
if torch.cuda.is_available():
    torch.cuda.synchronize()
"""


# what loading a GPU artifact imports: Inductor's loader and what its Python wrapper names
# (Triton, its kernel wrapper); 1-2.6 s of a new process's engine build (H100 profile,
# docs/benchmarks.md), which a caller can import ahead (studio.imports.import_aside)
LOADER_MODULES = (
    "torch._inductor.standalone_compile",
    "torch._inductor.async_compile",
    "torch._inductor.select_algorithm",
    "triton",
    "triton.language",
    "torch._inductor.runtime.triton_heuristics",
)


def _load_file(path: Path) -> Any:
    """The artifact saved at ``path``, its Triton kernels loaded in this process. With more
    than one compile thread Inductor would start its pool of compile workers (a sidecar
    process importing torch) for the first kernel of a new process, only to load every
    kernel from the cache itself while the pool starts; the process's exit handlers then
    wait for that pool to shut down (thought to be much of the 1-2 s ``exit`` of an H100
    render that loaded artifacts)."""
    with torch._inductor.config.patch(compile_threads=1):
        return torch._inductor.CompiledArtifact.load(path=str(path), format="binary")


def artifact_file(cache_dir: str | Path, key: AotKey) -> Path:
    """Where ``key``'s artifact lives (beside its package's place)."""
    return package_file(cache_dir, key).with_suffix(".art")


def _weight(module: nn.Module, name: str) -> torch.Tensor:
    return functools.reduce(getattr, name.split("."), module)


def _bound(art: Any, order: list[str | None], module: nn.Module) -> Callable[..., Any]:
    """``art`` called with ``module``'s weights where ``order`` names one, the caller's
    inputs (in order) where it holds None."""
    weights = [None if name is None else _weight(module, name) for name in order]

    def runner(*args: torch.Tensor) -> Any:
        given = iter(args)
        return art(*[next(given) if w is None else w for w in weights])

    return runner


def load(
    cache_dir: str | Path, key: AotKey, module: nn.Module
) -> tuple[Callable[..., Any] | None, str]:
    """(the artifact bound to ``module``'s weights, "loaded"), or (None, why not: absent,
    stale, corrupt, unloadable, or naming weights the module lacks)."""
    path = artifact_file(cache_dir, key)
    meta, why = checked_meta(path, key, ABSENT)
    if meta is None:
        return None, why
    try:
        order = [None if n is None else str(n) for n in meta["inputs"]]
        art = _load_file(path)
        return _bound(art, order, module), "loaded"
    except (KeyError, TypeError, AttributeError) as e:
        return None, f"{path.name} does not fit this network ({type(e).__name__}: {e})"
    except Exception as e:  # noqa: BLE001 - an artifact that does not load is rebuilt
        return None, f"{path.name} does not load ({type(e).__name__}: {e})"


def build(
    cache_dir: str | Path,
    key: AotKey,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    check: Check | None = None,
) -> tuple[Callable[..., Any], bool]:
    """Export ``module`` on ``example``, compile it standalone and save it as ``key``'s
    artifact (atomically, under its build lock); the artifact bound to ``module``'s weights,
    and whether this call built it (else another process saved it meanwhile). RuntimeError
    where the exported program holds tensors that are not the module's weights (they would
    be missing when loaded), or where ``check`` refuses what the saved artifact computes."""

    def make(partial: Path) -> tuple[dict[str, Any], Callable[..., Any]]:
        with torch.no_grad():
            exported = torch.export.export(module, example)
        user = torch.export.graph_signature.InputKind.USER_INPUT
        order = [
            None if s.kind == user else str(s.target)
            for s in exported.graph_signature.input_specs
        ]
        given = iter(example)
        try:
            args = [next(given) if n is None else _weight(module, n) for n in order]
        except AttributeError as e:
            what = f"{key.network}: its export holds a tensor it cannot name ({e})"
            raise RuntimeError(what) from None
        with torch.no_grad():
            art = torch._inductor.standalone_compile(
                exported.graph_module, args, dynamic_shapes="from_example_inputs"
            )
        art.save(path=str(partial), format="binary")
        specs = [(tuple(t.shape), t.stride(), t.dtype, str(t.device)) for t in args]
        verify_elsewhere(partial, specs, key.network, _VERIFY, "compiled artifact")
        saved = _load_file(partial)
        runner = _bound(saved, order, module)
        refuse_wrong(runner, check, key.network, "compiled artifact")
        return {"inputs": order}, runner

    present = lambda: load(cache_dir, key, module)[0]  # noqa: E731
    return build_file(artifact_file(cache_dir, key), key, present, make)


def load_or_build(
    cache_dir: str | Path,
    key: AotKey,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    build_missing: bool = True,
    check: Check | None = None,
) -> tuple[Callable[..., Any] | None, str]:
    """``key``'s artifact: loaded; else (``build_missing``) built (its outputs checked by
    ``check``), saying why, and loaded; else (None, why not). A network that failed to build
    is remembered and not tried again."""
    runner, why = load(cache_dir, key, module)
    if runner is not None or not build_missing:
        return runner, why
    return build_then_load(
        artifact_file(cache_dir, key),
        key,
        why,
        ABSENT,
        lambda: build(cache_dir, key, module, example, check),
    )
