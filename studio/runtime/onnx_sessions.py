"""ONNX Runtime sessions on model files, for the networks that run outside the engines (HuBERT
features, the face models of avatar registration).

Torch-free, and ``onnxruntime`` is imported only when it is asked for. A session is opened once
per version of its file (path, modification time, size) and providers, then kept; a file ONNX
Runtime refuses is an :class:`~studio.errors.InputError` of one line. The messages are the
caller's: what needs ONNX Runtime, and what to do about a bad file.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studio.errors import InputError, StudioError

__all__ = ["import_onnxruntime", "open_session", "providers_for"]


def import_onnxruntime(missing: str) -> Any:
    """The ``onnxruntime`` module; a StudioError saying ``missing`` when it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        raise StudioError(missing) from None
    return onnxruntime


def providers_for(device: Any, missing: str) -> tuple[str, ...]:
    """ONNX Runtime providers for a torch device: CUDA first when asked for and available."""
    ort = import_onnxruntime(missing)
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ("CUDAExecutionProvider", "CPUExecutionProvider")
    return ("CPUExecutionProvider",)


def open_session(path: Path, providers: Sequence[str], missing: str, unreadable: str) -> Any:
    """An ``InferenceSession`` on the existing file ``path``, kept while the file is unchanged.

    ``unreadable`` is the message for a file ONNX Runtime refuses, formatted with ``path``
    and ``reason`` (ONNX Runtime's own words, on one line).
    """
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, tuple(providers))
    return _cached_session(*key, missing, unreadable)


@functools.lru_cache(maxsize=16)
def _cached_session(
    path: str,
    _mtime_ns: int,
    _size: int,
    providers: tuple[str, ...],
    missing: str,
    unreadable: str,
) -> Any:
    ort = import_onnxruntime(missing)
    try:
        return ort.InferenceSession(path, providers=list(providers))
    except Exception as e:  # ORT raises several pybind types for bad files
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise InputError(unreadable.format(path=path, reason=reason)) from None
