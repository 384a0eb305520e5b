"""Stitching network S (LivePortrait "retarget_shoulder"): a small MLP that nudges x_d.

Given the source and driving keypoints it predicts a 65-dim delta: 63 per-keypoint offsets plus
one (tx, ty) shift applied to every keypoint. The forward returns the corrected driving
keypoints, like the released ONNX graph (output ``out``).

The released ``stitch_network.pth`` is not a plain state dict: it is LivePortrait's
``{"retarget_shoulder": {...}, "retarget_mouth": {...}, "retarget_eye": {...}}`` with
DDP ``module.`` prefixes; :func:`unwrap_stitch_container` extracts the part Ditto uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from studio.layout import KP_DIMS, NUM_KP

INPUT_NAMES = ("kp_source", "kp_driving")
OUTPUT_NAMES = ("out",)

# A narrow variant with the same key pattern (mlp.{0,2,4,6}) and the same I/O shapes.
REDUCED_KWARGS: dict = {"hidden_sizes": (16, 16, 8)}

CONTAINER_KEY = "retarget_shoulder"
DDP_PREFIX = "module."


def mlp(input_size: int, hidden_sizes: Sequence[int], output_size: int) -> nn.Sequential:
    """LivePortrait's retargeting MLP: Linear/ReLU pairs, then a Linear (keys ``0``, ``2``, ..)."""
    layers: list[nn.Module] = []
    width = input_size
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, output_size))
    return nn.Sequential(*layers)


class StitchNetwork(nn.Module):
    """MLP on concat(x_s, x_d) -> delta [B, 3*K+2]; returns x_d + delta applied as in LivePortrait.

    ``input_size`` must be 2 * 3 * K and ``output_size`` 3 * K + 2 for K keypoints (K = 21).
    """

    INPUT_NAMES = INPUT_NAMES
    OUTPUT_NAMES = OUTPUT_NAMES

    def __init__(
        self,
        input_size: int = 2 * KP_DIMS * NUM_KP,
        hidden_sizes: Sequence[int] = (128, 128, 64),
        output_size: int = KP_DIMS * NUM_KP + 2,
    ) -> None:
        super().__init__()
        if input_size % (2 * KP_DIMS) or output_size != input_size // 2 + 2:
            raise ValueError(
                f"stitch network sizes do not fit K keypoints: input {input_size} must be 6*K "
                f"and output {output_size} must be 3*K + 2"
            )
        self.num_kp = input_size // (2 * KP_DIMS)
        self.mlp = mlp(input_size, hidden_sizes, output_size)

    def delta(self, kp_source: Tensor, kp_driving: Tensor) -> Tensor:
        """The raw MLP output [B, 3*K+2] for keypoints [B, K, 3]."""
        b = kp_source.shape[0]
        return self.mlp(torch.cat([kp_source.reshape(b, -1), kp_driving.reshape(b, -1)], dim=1))

    def forward(self, kp_source: Tensor, kp_driving: Tensor) -> Tensor:
        """Corrected kp_driving [B, K, 3]: + delta[:3K] per keypoint, + delta[3K:3K+2] to x, y."""
        b, k = kp_driving.shape[0], self.num_kp
        d = self.delta(kp_source, kp_driving)
        per_kp = d[:, : KP_DIMS * k].reshape(b, k, KP_DIMS)
        shift_xy0 = F.pad(d[:, KP_DIMS * k : KP_DIMS * k + 2], (0, KP_DIMS - 2))  # (tx, ty, 0)
        return kp_driving + per_kp + shift_xy0.unsqueeze(1)

    def example_inputs(self, batch: int = 1) -> tuple[Tensor, Tensor]:
        """Deterministic inputs with the static ONNX shapes (two [batch, 21, 3] keypoint sets)."""
        g = torch.Generator().manual_seed(0)
        shape = (batch, self.num_kp, KP_DIMS)
        return (0.1 * torch.randn(*shape, generator=g), 0.1 * torch.randn(*shape, generator=g))


def unwrap_stitch_container(obj: Mapping[str, Any]) -> dict[str, Tensor]:
    """The StitchNetwork state dict inside a loaded ``stitch_network.pth``.

    Takes ``obj["retarget_shoulder"]`` and removes every ``"module."`` substring from its keys
    (what Ditto's loader does); the other top-level entries are ignored.
    """
    if not isinstance(obj, Mapping) or CONTAINER_KEY not in obj:
        found = sorted(map(str, obj.keys()))[:8] if isinstance(obj, Mapping) else type(obj).__name__
        raise ValueError(f"stitch checkpoint has no {CONTAINER_KEY!r} entry (found: {found})")
    return {key.replace(DDP_PREFIX, ""): value for key, value in obj[CONTAINER_KEY].items()}


def wrap_stitch_container(
    state_dict: Mapping[str, Tensor], **others: Mapping[str, Tensor]
) -> dict[str, dict[str, Tensor]]:
    """The released container for a state dict: ``{"retarget_shoulder": {"module."+k: v}}``.

    ``others`` (e.g. ``retarget_mouth=..., retarget_eye=...``) are stored the same way; Ditto
    never reads them. Inverse of :func:`unwrap_stitch_container`.
    """
    out = {CONTAINER_KEY: {DDP_PREFIX + k: v for k, v in state_dict.items()}}
    for name, sd in others.items():
        out[name] = {DDP_PREFIX + k: v for k, v in sd.items()}
    return out
