"""Write a Ditto checkpoint tree with random weights, in the released file layouts.

Nobody here can download Ditto's weights, so tests and benchmarks use files that have the
released containers, keys, shapes and dtypes but random values, made by the studio's own
modules: ``<root>/ditto_pytorch/models/<checkpoint_file>`` for each network (full size, or the
modules' ``REDUCED_KWARGS`` for speed) and optionally
``<root>/ditto_cfg/v0.4_hubert_cfg_pytorch.pkl``.

The weights are made to exercise what trained weights would: BatchNorm running statistics are
measured on a forward pass (so eval-mode BatchNorm really normalises, not the identity of the
defaults), parameters that PyTorch initialises to a constant (norm scales and shifts, zero
biases, ConvNeXt-V2's GRN) get random values, and the decoder's spectral-norm ``weight_u`` /
``weight_v`` are the converged power-iteration vectors of its own random ``weight_orig``, as
after training.
"""

from __future__ import annotations

import os
import pickle
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from studio.models import NETWORK_NAMES, network_spec, wrap_container

__all__ = ["CFG_FILE", "plausible_cfg", "random_network", "write_checkpoint_tree"]

CFG_FILE = "v0.4_hubert_cfg_pytorch.pkl"

# LivePortrait's other two retargeting MLPs, stored next to retarget_shoulder in its
# stitching_retargeting_module.pth (Ditto never reads them): (input, hidden sizes, output).
_EXTRA_STITCH = {
    "retarget_mouth": (65, (128, 128, 64), 63),
    "retarget_eye": (66, (256, 256, 128, 128, 64), 63),
}
_EXTRA_STITCH_REDUCED = {
    "retarget_mouth": (65, (16, 16, 8), 63),
    "retarget_eye": (66, (16, 16, 8, 8, 8), 63),
}


def _seed_for(seed: int, name: str) -> int:
    """A per-network seed, so one network's weights do not depend on which others are written."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _mlp(sizes: tuple[int, tuple[int, ...], int]) -> nn.Module:
    """An ``mlp.{0,2,..}`` Linear/ReLU stack with the key layout of LivePortrait's MLPs."""
    inp, hidden, out = sizes
    layers: list[nn.Module] = []
    width = inp
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, out))
    holder = nn.Module()
    holder.mlp = nn.Sequential(*layers)
    return holder


@torch.no_grad()
def _randomise_constants(module: nn.Module, gen: torch.Generator) -> None:
    """Give every parameter PyTorch initialised to one constant (ones, zeros) random values."""
    for p in module.parameters():
        first = float(p.flatten()[0])
        constant = bool((p == first).all()) and (p.numel() > 1 or first in (0.0, 1.0))
        if constant:
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.add_(0.1 * noise)


@torch.no_grad()
def _calibrate_batchnorm(module: nn.Module, gen: torch.Generator) -> None:
    """Set BatchNorm running stats to the statistics of one forward, as training would."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average: after one batch, exactly its statistics
    module.train()
    module(*module.example_inputs(1))
    module.eval()
    for m, momentum in zip(norms, saved, strict=True):
        m.momentum = momentum
        m.num_batches_tracked.fill_(int(torch.randint(10_000, 200_000, (1,), generator=gen)))


def random_network(name: str, reduced: bool = False, seed: int = 0, **overrides: Any) -> nn.Module:
    """One network with random weights (see the module docstring), in eval mode, on the CPU.

    Full size has the released shapes; ``reduced`` uses the module's ``REDUCED_KWARGS``;
    ``overrides`` replace constructor keywords (e.g. ``cond_dim`` of a reduced LMDM). The
    global RNG state of the caller is left untouched.
    """
    spec = network_spec(name)
    kwargs = {**(spec.reduced_kwargs if reduced else {}), **overrides}
    s = _seed_for(seed, name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s)
        module = spec.cls(**kwargs)
    gen = torch.Generator().manual_seed(s + 1)
    _randomise_constants(module, gen)
    _calibrate_batchnorm(module, gen)
    return module.eval()


def _container(name: str, module: nn.Module, reduced: bool, seed: int) -> Any:
    sd = module.state_dict()
    if name != "stitch_network":
        return wrap_container(name, sd)
    extra = {}
    sizes = _EXTRA_STITCH_REDUCED if reduced else _EXTRA_STITCH
    for i, (key, shape) in enumerate(sizes.items()):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_seed_for(seed, key) + i)
            extra[key] = _mlp(shape).state_dict()
    return wrap_container(name, sd, **extra)


def plausible_cfg(cond_dim: int = 1103, data_root: str = "./checkpoints") -> dict[str, Any]:
    """A config dict with the structure of Ditto's ``v0.4_hubert_cfg_pytorch.pkl``.

    Plain containers and numbers only (the real values of the released pkl are unknown, so
    this follows ditto-reference.md §4.6 and the code defaults).
    """
    models = f"{data_root}/ditto_pytorch/models"
    aux = f"{data_root}/ditto_pytorch/aux_models"

    def net(file: str) -> dict[str, Any]:
        return {"model_path": f"{models}/{file}", "device": "cuda"}

    def aux_model(file: str) -> dict[str, Any]:
        return {"model_path": f"{aux}/{file}", "device": "cuda", "force_ori_type": True}

    return {
        "base_cfg": {
            "insightface_det_cfg": aux_model("det_10g.onnx"),
            "landmark106_cfg": aux_model("2d106det.onnx"),
            "landmark203_cfg": aux_model("landmark203.onnx"),
            "landmark478_cfg": {
                "blaze_face_model_path": "",
                "face_mesh_model_path": "",
                "task_path": f"{aux}/face_landmarker.task",
                "device": "cuda",
                "force_ori_type": True,
            },
            "appearance_extractor_cfg": net("appearance_extractor.pth"),
            "motion_extractor_cfg": net("motion_extractor.pth"),
            "stitch_network_cfg": net("stitch_network.pth"),
            "warp_network_cfg": net("warp_network.pth"),
            "decoder_cfg": net("decoder.pth"),
            "hubert_cfg": aux_model("hubert_streaming_fix_kv.onnx"),
        },
        "audio2motion_cfg": {
            "model_path": f"{models}/lmdm_v0.4_hubert.pth",
            "device": "cuda",
            "motion_feat_dim": 265,
            "audio_feat_dim": int(cond_dim),
            "seq_frames": 80,
            "use_emo": True,
            "use_sc": True,
            "use_eye_open": True,
            "use_eye_ball": True,
            "w2f_type": "hubert",
        },
        "default_kwargs": {
            "sampling_timesteps": 50,
            "overlap_v2": 10,
            "online_mode": False,
            "smo_k_d": 3,
        },
    }


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        write(tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_checkpoint_tree(
    root: str | os.PathLike[str],
    reduced: bool = False,
    seed: int = 0,
    networks: Iterable[str] | None = None,
    cfg: bool = True,
    lmdm_cond_dim: int | None = None,
) -> Path:
    """Write ``<root>/ditto_pytorch/models/*.pth`` (and the PyTorch cfg pkl); return ``root``.

    ``networks`` (default: all six) picks which files are written; ``cfg`` adds
    ``ditto_cfg/v0.4_hubert_cfg_pytorch.pkl`` whose ``audio_feat_dim`` is the written LMDM's
    condition width. ``lmdm_cond_dim`` overrides LMDM's condition width (a reduced tree with
    1103 makes an LMDM the real condition fits). Full-size files are 0.2-220 MB each (about
    710 MB in all).
    """
    base = Path(root).expanduser()
    names = list(NETWORK_NAMES if networks is None else networks)
    for name in names:
        network_spec(name)  # validate every name before writing anything
    models = base / "ditto_pytorch" / "models"
    for name in names:
        extra = {"cond_dim": lmdm_cond_dim} if name == "lmdm" and lmdm_cond_dim else {}
        module = random_network(name, reduced=reduced, seed=seed, **extra)
        obj = _container(name, module, reduced, seed)
        target = models / network_spec(name).checkpoint_file
        _atomic_write(target, lambda p, obj=obj: torch.save(obj, p))
        del module, obj
    if cfg:
        cond_dim = lmdm_cond_dim or (
            network_spec("lmdm").reduced_kwargs["cond_dim"] if reduced else 1103
        )
        data = pickle.dumps(plausible_cfg(cond_dim), protocol=4)
        _atomic_write(base / "ditto_cfg" / CFG_FILE, lambda p: p.write_bytes(data))
    return base
