"""Ditto's six networks as torch modules that load the released checkpoints unchanged.

:data:`REGISTRY` maps each network name (the same as ``studio.models.checkpoints.NETWORKS``) to
its module class, released checkpoint and ONNX file names, container layout, reduced test
configuration and the released ONNX interface. :func:`load_network` reads a ``.pth`` file the
way Ditto does (through its container, ``strict=True``) and returns the module in eval mode.

Files are read with ``torch.load(weights_only=True)``: a pickle can carry code, so a file that
names any Python object beyond tensors and plain containers is refused, never loaded unsafely.

Constructor sizes. LMDM's condition width always comes from the file. The other sizes are
recognised from the state-dict shapes: the released configuration, or the module's
``REDUCED_KWARGS`` (the narrow variant tests and benchmarks use), whichever matches every key and
shape. Sizes that shapes cannot reveal (LMDM's head count, the static input side of the motion
extractor and decoder) come with the configuration, which is why only known configurations are
recognised. Any other width loads when its constructor keywords are passed explicitly
(``load_network("decoder", p, **kwargs)``); explicit keywords are used as given.
"""

from __future__ import annotations

import importlib
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from studio.errors import InputError

__all__ = [
    "REGISTRY",
    "NETWORK_NAMES",
    "IOSpec",
    "NamedIO",
    "NetworkSpec",
    "load_checkpoint",
    "load_network",
    "network_spec",
    "state_dict_from_container",
    "wrap_container",
]

FLAT = "flat"
MODEL_STATE_DICT = "model_state_dict"
RETARGET_SHOULDER = "retarget_shoulder"
CONTAINERS = (FLAT, MODEL_STATE_DICT, RETARGET_SHOULDER)

_LFS_MAGIC = b"version https://git-lfs.github.com/spec/"
_ZIP_MAGIC = b"PK\x03\x04"
_SHOWN_KEYS = 4  # how many offending keys an error message lists


class NamedIO:
    """``input_names`` and ``output_names`` of anything with named ``inputs`` and ``outputs``
    (a network of the registry, a runtime engine)."""

    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.outputs)


@dataclass(frozen=True)
class IOSpec:
    """One ONNX input or output of the released graph: name, static shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class NetworkSpec(NamedIO):
    """What the studio knows about one of Ditto's networks.

    ``module_path``/``class_name`` locate the torch module (imported on first use, so importing
    this package stays light); ``container`` is how the released ``.pth`` wraps its state dict:
    ``"flat"`` (the file is the state dict), ``"model_state_dict"`` (``file[key]``) or
    ``"retarget_shoulder"`` (``file[key]`` with DDP ``module.`` prefixes).
    """

    name: str
    module_path: str
    class_name: str
    checkpoint_file: str
    onnx_file: str
    container: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]

    @property
    def module(self) -> ModuleType:
        """The Python module defining the network (``studio.models.<name>``)."""
        return importlib.import_module(self.module_path)

    @property
    def cls(self) -> type[nn.Module]:
        """The torch module class."""
        return getattr(self.module, self.class_name)

    @property
    def reduced_kwargs(self) -> dict[str, Any]:
        """Constructor keywords of the narrow variant (same keys, small shapes)."""
        return dict(self.module.REDUCED_KWARGS)

    def presets(self) -> dict[str, dict[str, Any]]:
        """The configurations :func:`load_network` recognises, released first."""
        return {"released": {}, "reduced": self.reduced_kwargs}


def _io(name: str, *shape: int, dtype: str = "float32") -> IOSpec:
    return IOSpec(name, tuple(shape), dtype)


_KP = (1, 21, 3)
_MOTION = (1, 80, 265)

# The released ONNX interface (ditto-reference.md §3.1); LMDM's ``cond`` is [1, 80, C] with
# C = 1103 for the released checkpoint.
REGISTRY: dict[str, NetworkSpec] = {
    spec.name: spec
    for spec in (
        NetworkSpec(
            "appearance_extractor",
            "studio.models.appearance_extractor",
            "AppearanceExtractor",
            "appearance_extractor.pth",
            "appearance_extractor.onnx",
            FLAT,
            (_io("image", 1, 3, 256, 256),),
            (_io("pred", 1, 32, 16, 64, 64),),
        ),
        NetworkSpec(
            "motion_extractor",
            "studio.models.motion_extractor",
            "MotionExtractor",
            "motion_extractor.pth",
            "motion_extractor.onnx",
            FLAT,
            (_io("image", 1, 3, 256, 256),),
            (
                _io("pitch", 1, 66),
                _io("yaw", 1, 66),
                _io("roll", 1, 66),
                _io("t", 1, 3),
                _io("exp", 1, 63),
                _io("scale", 1, 1),
                _io("kp", 1, 63),
            ),
        ),
        NetworkSpec(
            "warp_network",
            "studio.models.warp_network",
            "WarpNetwork",
            "warp_network.pth",
            "warp_network.onnx",
            FLAT,
            (_io("feature_3d", 1, 32, 16, 64, 64), _io("kp_source", *_KP), _io("kp_driving", *_KP)),
            (_io("out", 1, 256, 64, 64),),
        ),
        NetworkSpec(
            "decoder",
            "studio.models.decoder",
            "Decoder",
            "decoder.pth",
            "decoder.onnx",
            FLAT,
            (_io("feature", 1, 256, 64, 64),),
            (_io("output", 1, 3, 512, 512),),
        ),
        NetworkSpec(
            "stitch_network",
            "studio.models.stitch_network",
            "StitchNetwork",
            "stitch_network.pth",
            "stitch_network.onnx",
            RETARGET_SHOULDER,
            (_io("kp_source", *_KP), _io("kp_driving", *_KP)),
            (_io("out", *_KP),),
        ),
        NetworkSpec(
            "lmdm",
            "studio.models.lmdm",
            "LMDM",
            "lmdm_v0.4_hubert.pth",
            "lmdm_v0.4_hubert.onnx",
            MODEL_STATE_DICT,
            (
                _io("x", *_MOTION),
                _io("cond_frame", 1, 265),
                _io("cond", 1, 80, 1103),
                _io("time_cond", 1, dtype="int64"),
            ),
            (_io("pred_noise", *_MOTION), _io("x_start", *_MOTION)),
        ),
    )
}
NETWORK_NAMES: tuple[str, ...] = tuple(REGISTRY)


def network_spec(name: str) -> NetworkSpec:
    """The registry entry for ``name``; InputError naming the valid names otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise InputError(
            f"unknown network {name!r}: expected one of {', '.join(NETWORK_NAMES)}"
        ) from None


# --- files and containers ---------------------------------------------------------------------


def _refused_global(message: str) -> str | None:
    """The dotted name torch's weights-only unpickler refused, if the message names one."""
    m = re.search(r"GLOBAL ([A-Za-z_][\w.]*)", message)
    return m.group(1) if m else None


def _mappable(path: Path) -> bool:
    """Whether ``path`` is a zip whose every entry is stored, as ``torch.save`` writes it:
    a re-compressed archive loads when read but maps to garbage."""
    try:
        with zipfile.ZipFile(path) as archive:
            return all(i.compress_type == zipfile.ZIP_STORED for i in archive.infolist())
    except (OSError, zipfile.BadZipFile):
        return False


def load_checkpoint(path: str | os.PathLike[str], mmap: bool = False) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)`` with clear InputErrors.

    Refuses (never retries unsafely) a file that references Python objects other than tensors
    and plain containers; reports missing, empty, truncated, Git LFS pointer and non-torch files.
    ``mmap`` maps a zip-format file's tensors instead of reading them (for weights that are
    copied to a GPU at once: no second copy in host memory).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError(f"checkpoint {p} does not exist: check the path")
    if p.is_dir():
        raise InputError(f"checkpoint {p} is a folder, not a .pth file")
    try:
        with open(p, "rb") as f:
            head = f.read(len(_LFS_MAGIC))
    except OSError as e:
        raise InputError(f"cannot read checkpoint {p} ({e.strerror or e})") from None
    if not head:
        raise InputError(f"checkpoint {p} is empty: re-download it")
    if head == _LFS_MAGIC:
        raise InputError(
            f"{p} is a Git LFS pointer, not the checkpoint: run `git lfs pull` in the checkout"
        )
    try:
        if mmap and _mappable(p):
            try:
                return torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except Exception:  # noqa: BLE001, S110 - a file system that cannot map: read it
                pass
        return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every failure inside torch.load is a bad file
        message = str(e)
        name = _refused_global(message) if "Weights only load failed" in message else None
        if name is not None:
            raise InputError(
                f"refusing to load {p}: it references the Python object {name}, which a weights "
                f"file never needs (a pickle can run code); only tensors and plain containers "
                f"are accepted"
            ) from None
        if head.startswith(_ZIP_MAGIC):
            why = "it is truncated or corrupt"
        else:
            why = "it is not a PyTorch checkpoint"
        detail = message.strip().splitlines()[0][:120] if message.strip() else type(e).__name__
        raise InputError(f"cannot load {p}: {why} ({detail}); re-download it") from None


def _tensor_dict(obj: Any, what: str, path: Path, spec: NetworkSpec) -> dict[str, torch.Tensor]:
    """``obj`` as a state dict (str -> Tensor); InputError describing what it is otherwise."""
    if not isinstance(obj, Mapping):
        raise InputError(
            f"{path} holds a {type(obj).__name__} where {what} should be a state dict "
            f"(network {spec.name}, released as {spec.checkpoint_file})"
        )
    bad = [str(k) for k, v in obj.items() if not (isinstance(k, str) and torch.is_tensor(v))]
    if bad:
        shown = ", ".join(repr(k) for k in bad[:_SHOWN_KEYS])
        raise InputError(
            f"{path} is not a {spec.name} checkpoint in the released layout: {what} should map "
            f"names to tensors, but {shown} {'is' if len(bad) == 1 else 'are'} not tensors "
            f"({_layout_hint(spec)})"
        )
    return dict(obj)


def _layout_hint(spec: NetworkSpec) -> str:
    if spec.container == FLAT:
        return f"the released {spec.checkpoint_file} is a flat state dict"
    if spec.container == MODEL_STATE_DICT:
        return f"the released {spec.checkpoint_file} is {{'model_state_dict': state dict}}"
    return (
        f"the released {spec.checkpoint_file} is {{'retarget_shoulder': state dict with "
        f"'module.' prefixes, ...}}"
    )


def state_dict_from_container(
    name: str, obj: Any, path: str | os.PathLike[str] = "<checkpoint>"
) -> dict[str, torch.Tensor]:
    """The module state dict inside a loaded file, unwrapped as Ditto's loader does."""
    spec = network_spec(name)
    p = Path(path)
    if spec.container == FLAT:
        return _tensor_dict(obj, "the file", p, spec)
    key = MODEL_STATE_DICT if spec.container == MODEL_STATE_DICT else RETARGET_SHOULDER
    if not isinstance(obj, Mapping) or key not in obj:
        found = (
            ", ".join(repr(k) for k in list(obj)[:_SHOWN_KEYS]) or "none"
            if isinstance(obj, Mapping)
            else f"a {type(obj).__name__}"
        )
        raise InputError(
            f"{p} has no {key!r} entry (top level: {found}): not a {spec.name} checkpoint in "
            f"the released layout ({_layout_hint(spec)})"
        )
    sd = _tensor_dict(obj[key], f"{key!r}", p, spec)
    if spec.container == RETARGET_SHOULDER:
        from studio.models.stitch_network import unwrap_stitch_container

        sd = unwrap_stitch_container({key: sd})
    return sd


def wrap_container(
    name: str, state_dict: Mapping[str, torch.Tensor], **others: Mapping[str, torch.Tensor]
) -> Any:
    """The released file layout for a module state dict (inverse of the unwrapping).

    ``others`` are extra top-level entries, only meaningful for the stitch container
    (``retarget_mouth=..., retarget_eye=...``, stored with ``module.`` prefixes like the main one).
    """
    spec = network_spec(name)
    if others and spec.container != RETARGET_SHOULDER:
        raise ValueError(f"{name}: extra container entries are only stored for stitch_network")
    if spec.container == FLAT:
        return dict(state_dict)
    if spec.container == MODEL_STATE_DICT:
        return {MODEL_STATE_DICT: dict(state_dict)}
    from studio.models.stitch_network import wrap_stitch_container

    return wrap_stitch_container(state_dict, **others)


# --- configurations ---------------------------------------------------------------------------

Signature = dict[str, tuple[int, ...]]
_PRESET_SIGNATURES: dict[tuple[str, str, int], Signature] = {}


def _signature(sd: Mapping[str, torch.Tensor]) -> Signature:
    return {k: tuple(v.shape) for k, v in sd.items()}


def _diff(expected: Signature, found: Signature) -> tuple[list[str], list[str], list[str]]:
    """(missing keys, unexpected keys, 'key: file [..] vs module [..]' shape mismatches)."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [
        f"{k}: file {list(found[k])} vs module {list(s)}"
        for k, s in expected.items()
        if k in found and found[k] != s
    ]
    return missing, unexpected, shapes


def _describe_diff(diff: tuple[list[str], list[str], list[str]]) -> str:
    parts = []
    for label, items in zip(("missing", "unexpected", "wrong shape"), diff, strict=True):
        if items:
            shown = ", ".join(items[:_SHOWN_KEYS]) + (", ..." if len(items) > _SHOWN_KEYS else "")
            parts.append(f"{len(items)} {label} ({shown})")
    return "; ".join(parts)


def _lmdm_cond_dim(spec: NetworkSpec, sd: Mapping[str, torch.Tensor], path: Path) -> int:
    from studio.models.lmdm import cond_dim_from_state_dict

    try:
        return cond_dim_from_state_dict(sd)
    except (KeyError, ValueError) as e:
        raise InputError(
            f"{path} does not fit {spec.name}: {e.args[0] if e.args else e} ({_layout_hint(spec)})"
        ) from None


def _build(spec: NetworkSpec, kwargs: Mapping[str, Any]) -> nn.Module:
    """The module's skeleton on the meta device: its shapes without memory or random init,
    which the file's tensors replace anyway (the decoder's init alone costs seconds)."""
    with torch.device("meta"):
        return spec.cls(**kwargs)


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``t`` in ``ref``'s dtype and dense layout: what copying into ``ref`` would have made."""
    if t.dtype == ref.dtype and t.is_contiguous():
        return t
    return t.to(ref.dtype).contiguous()


def _load_into(
    spec: NetworkSpec, kwargs: Mapping[str, Any], module: nn.Module, sd: Mapping[str, torch.Tensor]
) -> nn.Module:
    """``module`` (a meta skeleton) holding the file's tensors. A module whose non-persistent
    buffers are computed in its constructor (LMDM's tables) is built for real instead, so that
    nothing is left on the meta device."""
    ref = module.state_dict()
    module.load_state_dict({k: _like(v, ref[k]) for k, v in sd.items()}, strict=True, assign=True)
    if any(t.is_meta for t in (*module.parameters(), *module.buffers())):
        module = spec.cls(**kwargs)
        module.load_state_dict(sd, strict=True)
    return module


def _select(
    spec: NetworkSpec, sd: Mapping[str, torch.Tensor], path: Path, cond_dim: int | None
) -> tuple[str, dict[str, Any]]:
    """The recognised configuration whose state-dict shapes equal the file's, and its
    constructor keywords."""
    found = _signature(sd)
    diffs: dict[str, tuple[list[str], list[str], list[str]]] = {}
    for preset, kwargs in spec.presets().items():
        kw = dict(kwargs) if cond_dim is None else {**kwargs, "cond_dim": cond_dim}
        key = (spec.name, preset, cond_dim or 0)
        if key not in _PRESET_SIGNATURES:
            _PRESET_SIGNATURES[key] = _signature(_build(spec, kw).state_dict())
        diff = _diff(_PRESET_SIGNATURES[key], found)
        if not any(diff):
            return preset, kw
        diffs[preset] = diff
    closest = min(diffs, key=lambda p: sum(map(len, diffs[p])))
    raise InputError(
        f"{path} does not fit {spec.name} in the {closest} configuration (nor any other known "
        f"one): {_describe_diff(diffs[closest])}; for other widths pass the constructor "
        f"keywords to load_network"
    )


def _check_finite(tensors: Mapping[str, Any], network: str, path: Path) -> None:
    """InputError naming the first tensor that holds NaN or infinity: a damaged or wrongly
    converted file, which would otherwise fail much later (or render garbage). One read-back
    for all tensors: on a GPU the check runs where the weights already are."""
    floats = {
        k: v
        for k, v in tensors.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()
    }
    # min and max carry any NaN or infinity; one pass, 20x faster than isfinite().all()
    ends = {k: torch.stack(torch.aminmax(v)).float() for k, v in floats.items()}
    if not ends or bool(torch.isfinite(torch.cat(list(ends.values()))).all()):
        return
    key = next(k for k, e in ends.items() if not bool(torch.isfinite(e).all()))
    raise InputError(
        f"{path}: {network} weight {key!r} holds NaN or infinity; the file is "
        "damaged: download it again (`studio doctor --checkpoints DIR` checks a folder)"
    )


def load_network(
    name: str,
    checkpoint_path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    **kwargs: Any,
) -> nn.Module:
    """Load one of Ditto's networks from its released ``.pth`` file, strictly, in eval mode.

    ``name`` is one of :data:`NETWORK_NAMES`. ``kwargs`` are constructor keywords; without them
    the configuration (released or ``REDUCED_KWARGS``) is recognised from the shapes. LMDM's
    ``cond_dim`` always comes from the file. InputError (naming the network and the file) for
    a missing, unsafe, corrupt or non-torch file, a container without its key, and any key or
    shape that does not match.
    """
    spec = network_spec(name)
    path = Path(checkpoint_path).expanduser()
    on_cpu = torch.device(device).type == "cpu"  # a CPU module keeps no file mapped
    sd = state_dict_from_container(name, load_checkpoint(path, mmap=not on_cpu), path)
    if on_cpu:  # elsewhere after the upload, on the device (a cold file is read once)
        _check_finite(sd, spec.name, path)
    cond_dim = _lmdm_cond_dim(spec, sd, path) if name == "lmdm" else None
    if kwargs:
        if cond_dim is not None and kwargs.get("cond_dim", cond_dim) != cond_dim:
            raise InputError(
                f"{path} has LMDM condition width {cond_dim}, but cond_dim={kwargs['cond_dim']} "
                f"was given: leave cond_dim out, it is read from the file"
            )
        kw = dict(kwargs) if cond_dim is None else {**kwargs, "cond_dim": cond_dim}
        try:
            module = _build(spec, kw)
        except (TypeError, ValueError) as e:
            raise InputError(f"cannot build {spec.name} with {kw}: {e}") from None
        diff = _diff(_signature(module.state_dict()), _signature(sd))
        if any(diff):
            raise InputError(
                f"{path} does not fit {spec.name} built with {kw}: {_describe_diff(diff)}"
            )
    else:
        _, kw = _select(spec, sd, path, cond_dim)
        module = _build(spec, kw)
    try:
        module = _load_into(spec, kw, module, sd)
    except RuntimeError as e:  # pragma: no cover - the shape check above catches these first
        raise InputError(f"{path} does not load into {spec.name}: {e}") from None
    module = module.to(device).eval()
    if not on_cpu:
        _check_finite(module.state_dict(), spec.name, path)
    return module
