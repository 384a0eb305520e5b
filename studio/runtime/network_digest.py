"""What identifies a network for the caches of what is built from it (ONNX exports, compiled
artifacts): the SHA-256 of its weights and the SHA-256 of its code.

The weights' digest covers every parameter and buffer (name, dtype, shape, bytes). Each
tensor is hashed on a pool of threads (hashlib lets go of the interpreter), then the
digests in name order: a full-size render network's 0.4 GB took 0.27 s on one thread of an
H100 machine, on the main thread of every new ``--compile`` process.

The code's digest covers the source files of the network's own classes (every submodule's,
torch's own left to the key's torch version) and of what their modules import from outside
torch: a studio upgrade that changes how a network computes makes its kept exports and
artifacts again, where the weights alone would have served the old code's.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import types
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from studio.paths import code_digest

_WEIGHTS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
_CODE: dict[frozenset[str], str] = {}  # module names -> digest (source does not change in a run)
HASH_THREADS = 8


def weights_sha256(module: nn.Module) -> str:
    """SHA-256 over the module's parameters and buffers (names, dtypes, shapes, bytes),
    device independent; kept per module (the engines of every batch size share one)."""
    known = _WEIGHTS.get(module)
    if known is None:
        known = _WEIGHTS[module] = _hash_weights(module)
    return known


def _hash_weights(module: nn.Module) -> str:
    named = sorted({**dict(module.named_parameters()), **dict(module.named_buffers())}.items())

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


def code_sha256(module: nn.Module) -> str:
    """SHA-256 of the source files that define how ``module`` computes: its submodules'
    classes' files (torch's excepted) and those of what their modules import from their own
    packages (the studio's helpers and constants; the standard library's and other
    installed packages' files are left out)."""
    names = _code_modules(module)
    known = _CODE.get(names)
    if known is None:
        known = _CODE[names] = code_digest(*sorted(_source_files(names)))
    return known


def _code_modules(module: nn.Module) -> frozenset[str]:
    """The names of the modules defining ``module``'s classes, torch's left out."""
    return frozenset(
        type(m).__module__ for m in module.modules() if not _is_torch(type(m).__module__)
    )


def _is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _source_files(names: frozenset[str]) -> set[str]:
    """The files of the modules ``names`` and of the modules of their packages that their
    globals come from."""
    modules = {sys.modules[n] for n in names if n in sys.modules}
    packages = {n.split(".", 1)[0] for n in names}
    for mod in list(modules):
        for value in vars(mod).values():
            origin = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
            if origin is not None and origin.__name__.split(".", 1)[0] in packages:
                modules.add(origin)
    files = set()
    for mod in modules:
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py") and os.path.isfile(path):
            files.add(path)
    return files
