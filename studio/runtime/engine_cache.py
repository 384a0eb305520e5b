"""The TensorRT engine cache: keys, metadata beside each ``.engine``, staleness decisions.

A serialized TensorRT engine only runs on the GPU model (compute capability) and TensorRT
version it was built with, and only means something for the ONNX file and precision it was
built from. Ditto and FasterLivePortrait users mostly meet this as a deserialisation error;
here every engine the studio builds gets ``<engine>.json`` beside it holding its
:class:`EngineKey` (GPU name and compute capability, TensorRT version, precision, the ONNX
file's SHA-256 and the builder settings) and the engine file's size and SHA-256.
:func:`decide` compares that with the key of the current machine and request and says
``reuse``, ``build`` (nothing there) or ``rebuild`` with the reasons, as a message for the
user, instead of failing.

Everything here is plain Python over JSON (no tensorrt), so it is testable anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from studio.files import write_atomic

__all__ = [
    "ENGINE_FORMAT",
    "CacheDecision",
    "EngineKey",
    "decide",
    "engine_file",
    "file_sha256",
    "metadata_file",
    "read_metadata",
    "stale_reasons",
    "write_metadata",
]

ENGINE_FORMAT = 2  # bump when the studio's build recipe changes what an engine contains
_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class EngineKey:
    """What an engine was built for and from; equal keys mean the engine can be reused."""

    network: str
    precision: str
    onnx_sha256: str
    gpu_name: str
    compute_capability: str  # "9.0"
    tensorrt_version: str
    builder: Mapping[str, Any] = field(default_factory=dict)  # opt level, workspace, plugin...
    format: int = ENGINE_FORMAT

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["builder"] = dict(sorted(dict(self.builder).items()))
        return d

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the key."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineKey:
        return cls(
            network=str(d["network"]),
            precision=str(d["precision"]),
            onnx_sha256=str(d["onnx_sha256"]),
            gpu_name=str(d["gpu_name"]),
            compute_capability=str(d["compute_capability"]),
            tensorrt_version=str(d["tensorrt_version"]),
            builder=dict(d.get("builder") or {}),
            format=int(d.get("format", 0)),
        )


def engine_file(cache_dir: str | os.PathLike[str], stem: str, precision: str) -> Path:
    """``<cache_dir>/<stem>_<precision>.engine`` (Ditto's naming)."""
    return Path(cache_dir).expanduser() / f"{stem}_{precision}.engine"


def metadata_file(engine: str | os.PathLike[str]) -> Path:
    """The JSON beside an engine: ``x.engine`` -> ``x.engine.json``."""
    p = Path(engine)
    return p.with_name(p.name + ".json")


def read_metadata(engine: str | os.PathLike[str]) -> tuple[dict[str, Any] | None, str | None]:
    """(metadata, None), or (None, why it is missing or unreadable)."""
    meta = metadata_file(engine)
    if not meta.is_file():
        return None, f"it has no {meta.name} beside it (not built by the studio, or interrupted)"
    try:
        data = json.loads(meta.read_text())
        EngineKey.from_dict(data["key"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"its {meta.name} is unreadable ({type(e).__name__})"
    if not isinstance(data, dict):
        return None, f"its {meta.name} is unreadable (not an object)"
    return data, None


def _short(sha: str) -> str:
    return sha[:12] if sha else "?"


def stale_reasons(recorded: EngineKey, wanted: EngineKey) -> list[str]:
    """Why an engine built for ``recorded`` cannot serve ``wanted`` (empty: it can)."""
    reasons: list[str] = []
    if (recorded.gpu_name, recorded.compute_capability) != (
        wanted.gpu_name,
        wanted.compute_capability,
    ):
        reasons.append(
            f"it was built on {recorded.gpu_name} (sm {recorded.compute_capability}), "
            f"this GPU is {wanted.gpu_name} (sm {wanted.compute_capability})"
        )
    if recorded.tensorrt_version != wanted.tensorrt_version:
        reasons.append(
            f"it was built with TensorRT {recorded.tensorrt_version}, this is TensorRT "
            f"{wanted.tensorrt_version}"
        )
    if recorded.precision != wanted.precision:
        reasons.append(f"it is {recorded.precision}, {wanted.precision} was asked for")
    if recorded.network != wanted.network:
        reasons.append(f"it is the {recorded.network} engine, not {wanted.network}")
    if recorded.onnx_sha256 != wanted.onnx_sha256:
        reasons.append(
            f"its ONNX file changed (sha256 {_short(recorded.onnx_sha256)}… -> "
            f"{_short(wanted.onnx_sha256)}…)"
        )
    old, new = dict(recorded.builder), dict(wanted.builder)
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed:
        parts = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed)
        reasons.append(f"the builder settings changed ({parts})")
    if recorded.format != wanted.format:
        reasons.append(
            f"the studio's build recipe changed (format {recorded.format} -> {wanted.format})"
        )
    return reasons


@dataclass(frozen=True)
class CacheDecision:
    """``action``: reuse, build (no engine) or rebuild (stale, with ``reasons``)."""

    action: str
    engine: Path
    reasons: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.action == "reuse":
            return f"using the cached engine {self.engine}"
        if self.action == "build":
            return f"building {self.engine.name} (no cached engine)"
        return f"rebuilding {self.engine.name}: " + "; ".join(self.reasons)


def decide(
    engine: str | os.PathLike[str], wanted: EngineKey, verify_bytes: bool = False
) -> CacheDecision:
    """Reuse, build or rebuild ``engine`` for ``wanted``.

    The engine file must exist, have readable metadata with an equal key, and have the
    recorded size (and SHA-256 with ``verify_bytes``); otherwise it is rebuilt, with why.
    """
    path = Path(engine)
    if not path.is_file():
        return CacheDecision("build", path)
    meta, why = read_metadata(path)
    if meta is None:
        return CacheDecision("rebuild", path, (why or "no metadata",))
    recorded = EngineKey.from_dict(meta["key"])
    reasons = stale_reasons(recorded, wanted)
    size = path.stat().st_size
    if meta.get("engine_bytes") is not None and int(meta["engine_bytes"]) != size:
        reasons.append(
            f"the file is {size} bytes, {meta['engine_bytes']} were written (truncated or replaced)"
        )
    elif verify_bytes and meta.get("engine_sha256") and file_sha256(path) != meta["engine_sha256"]:
        reasons.append("the file's SHA-256 differs from the one recorded at build time")
    return CacheDecision("rebuild" if reasons else "reuse", path, tuple(reasons))


def write_metadata(
    engine: str | os.PathLike[str], key: EngineKey, extra: Mapping[str, Any] | None = None
) -> Path:
    """Write ``<engine>.json`` (atomically) with the key, the engine's size and SHA-256."""
    path = Path(engine)
    data: dict[str, Any] = {
        "key": key.to_dict(),
        "key_sha256": key.digest(),
        "engine_bytes": path.stat().st_size,
        "engine_sha256": file_sha256(path),
        **dict(extra or {}),
    }
    meta = metadata_file(path)
    write_atomic(meta, json.dumps(data, indent=2, sort_keys=True))
    return meta
