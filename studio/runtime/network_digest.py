"""What identifies a network for the caches of what is built from it (ONNX exports, compiled
artifacts): the SHA-256 of its weights and the SHA-256 of its code.

The weights' digest covers every parameter and buffer (name, dtype, shape, bytes). Each
tensor is hashed on a pool of threads (hashlib lets go of the interpreter), then the
digests in name order: a full-size render network's 0.4 GB took 0.27 s on one thread of an
H100 machine, on the main thread of every new ``--compile`` process.

The code's digest covers the source files of the network's own classes (every submodule's:
a precision adapter's, a rewritten layer's; torch's own are the key's torch version) and of
the modules that build the file, with every module of their packages that these import,
directly or not (helpers, constants, the grid sampling a package is exported with). A studio
upgrade that changes what a network computes then makes its kept exports and artifacts
again, where the weights alone would have served what the old code built. The files are
read when a process first keys a network.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import ModuleSpec
from pathlib import Path

import torch
from torch import nn

from studio.paths import code_digest

_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_CODE: dict[frozenset[str], str] = {}  # root modules -> digest (read once in a process)
_READ: dict[str, tuple[str | None, tuple[str, ...]]] = {}  # module -> (file, its imports)
HASH_THREADS = 8


def weights_sha256(module: nn.Module) -> str:
    """SHA-256 over the module's parameters and buffers (names, dtypes, shapes, bytes),
    device independent; kept per module (the engines of every batch size share one): a
    module keyed is not changed in place afterwards."""
    known = _WEIGHTS.get(module)
    if known is None:
        known = _WEIGHTS[module] = _hash_weights(module)
    return known


def _hash_weights(module: nn.Module) -> str:
    named = sorted({**dict(module.named_parameters()), **dict(module.named_buffers())}.items())
    for device in {t.device for _, t in named if t.is_cuda}:  # the pool copies on its own
        torch.cuda.current_stream(device).synchronize()  # streams: what is queued lands first

    def one(item: tuple[str, torch.Tensor]) -> bytes:
        name, t = item
        h = hashlib.sha256(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        data = t.detach().reshape(-1).contiguous()
        if data.numel():
            h.update(data.cpu().view(torch.uint8).numpy())
        return h.digest()

    workers = max(1, min(HASH_THREADS, os.cpu_count() or 1, len(named)))
    with ThreadPoolExecutor(workers, thread_name_prefix="weights-sha256") as pool:
        digests = list(pool.map(one, named))
    return hashlib.sha256(b"".join(digests)).hexdigest()


def code_sha256(module: nn.Module, *builders: str) -> str:
    """SHA-256 of the source that defines what is built from ``module``: the modules of its
    submodules' classes (torch's excepted) and of ``builders`` (the modules that build the
    file), with every module of their packages that they import, directly or not."""
    roots = frozenset((*_code_modules(module), *builders))
    known = _CODE.get(roots)
    if known is None:
        known = _CODE[roots] = code_digest(*_source_files(roots))
    return known


def _code_modules(module: nn.Module) -> frozenset[str]:
    """The names of the modules defining ``module``'s classes, torch's left out."""
    return frozenset(
        type(m).__module__ for m in module.modules() if not _is_torch(type(m).__module__)
    )


def _is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _source_files(roots: frozenset[str]) -> list[str]:
    """The files of the modules ``roots`` and of every module of their top-level packages they
    import (any ``import`` statement, a function's included), transitively; in path order."""
    packages = {n.split(".", 1)[0] for n in roots}
    files: dict[str, str | None] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in files:
            files[name], imports = _read(name)
            todo += [m for m in imports if m.split(".", 1)[0] in packages]
    return sorted({f for f in files.values() if f})


def _read(name: str) -> tuple[str | None, tuple[str, ...]]:
    """(module ``name``'s file or None, the modules its source imports); once a process."""
    known = _READ.get(name)
    if known is None:
        spec = _spec(name)
        origin = spec.origin if spec is not None else None
        if spec is None or not origin or not os.path.isfile(origin):
            known = (None, ())
        else:
            known = (origin, tuple(_imported(spec)) if origin.endswith(".py") else ())
        _READ[name] = known
    return known


def _spec(name: str) -> ModuleSpec | None:
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        return module.__spec__
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def _imported(spec: ModuleSpec) -> set[str]:
    """The modules of ``spec``'s own top-level package that its source imports: ``import
    a.b``, ``from a import b`` (``a``, and ``a.b`` where that is a module), relative imports
    resolved; read with a pattern, not parsed (a tenth of the time; a docstring's example
    import only adds a file)."""
    text = Path(str(spec.origin)).read_text(encoding="utf-8", errors="replace")
    package = spec.name if spec.submodule_search_locations else spec.name.rpartition(".")[0]
    names: set[str] = set()
    for found in _IMPORT.finditer(text):
        if found["plain"]:
            names.update(n.split(" as ")[0].strip() for n in found["plain"].split(","))
            continue
        dots = len(found["base"]) - len(found["base"].lstrip("."))
        base = found["base"].lstrip(".")
        if dots:
            parent = package.split(".")[: len(package.split(".")) - dots + 1]
            base = ".".join([*parent, *([base] if base else [])])
        names.add(base)
        listed = re.sub(r"#[^\n]*|[()\\]", " ", found["names"]).split(",")
        names.update(f"{base}.{n.split(' as ')[0].strip()}" for n in listed if n.strip())
    top = spec.name.split(".", 1)[0]
    ours = {n for n in names if n.split(".", 1)[0] == top}
    return {n for n in ours if n in sys.modules or _spec(n) is not None}


_IMPORT = re.compile(
    r"^[ \t]*(?:import[ \t]+(?P<plain>[\w.]+(?:[ \t]+as[ \t]+\w+)?"
    r"(?:[ \t]*,[ \t]*[\w.]+(?:[ \t]+as[ \t]+\w+)?)*)"
    r"|from[ \t]+(?P<base>\.*[\w.]*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#]*))",
    re.MULTILINE,
)
