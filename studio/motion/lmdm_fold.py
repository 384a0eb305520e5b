"""LMDM's window step with the attention projections folded into keys and values.

On top of :mod:`studio.motion.lmdm_hoist`'s per-window constants, the linear maps around each
attention are folded into the attention itself, so that a decoder layer runs 6 kernels of
matrix work a step (2 projections, 2 attentions, 2 feed-forward matmuls) instead of 9:

- cross-attention: a head's score is ``(h W_qj^T + b_qj) . k_j = [h, 1] . [k_j W_qj, k_j b_qj]``,
  so the query projection moves into the window's keys (one extra query channel of ones
  carries the bias) and the output projection into its values (``v_j W_oj^T``); the query is
  the rotated, normalised motion itself, shared by every head (width d + padding);
- self-attention: the value and output projections of a head are one [d, d] map
  (``W_oj W_vj``), so the values come out of one matmul already projected, and the output
  projection disappears; ``W_o b_v + b_o`` is a constant.

The heads' outputs are summed (the sum the output projection would do), which the FiLM and
residual that follow absorb. Attention with unequal or wide head sizes runs on PyTorch's
memory-efficient kernel on CUDA (it takes any width divisible by 8). The arithmetic is
:func:`studio.motion.lmdm_hoist.guided_x0_step` regrouped; results agree to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from studio.models.lmdm import LMDM, DecoderLayer
from studio.motion.lmdm_hoist import (
    StackedProjections,
    WindowConstants,
    aligned_width,
    embed_step_motion,
    guided_output,
    step_slices,
)
from studio.runtime.base import sdpa_backend

__all__ = ["FoldedConstants", "FoldedWeights", "fold_window", "folded_weights", "folded_x0_step"]


@dataclass
class FoldedWeights:
    """Per-layer self-attention maps of a model: values projected straight to the output.

    ``value_out[i]`` [heads * d, d] gives a head's projected values in one matmul;
    ``value_bias[i]`` [d] is ``W_o b_v + b_o``.
    """

    value_out: list[Tensor]
    value_bias: list[Tensor]


@dataclass
class FoldedConstants:
    """A window's constants with the cross-attention projections folded in.

    ``keys[i]`` [T, 2, heads, M, d'] are ``[k_j W_qj, k_j b_qj, 0...]`` (d' = d + 1 padded by
    :func:`~studio.motion.lmdm_hoist.aligned_width`); ``values[i]`` [T, 2, heads, M, d] are
    ``v_j W_oj^T``; ``films``, ``input_bias`` and ``projections`` as in
    :class:`WindowConstants`.
    """

    films: list[tuple[Tensor, ...]]
    keys: list[Tensor]
    values: list[Tensor]
    input_bias: Tensor
    projections: StackedProjections
    head_dim: int
    query_tail: Tensor  # [1, 1, d' - d]: the ones channel and the padding of the query

    @property
    def steps(self) -> int:
        return int(self.keys[0].shape[0])

    def at(self, step: int) -> FoldedConstants:
        """Step ``step``'s constants alone, as :meth:`WindowConstants.at`."""
        return replace(self, **step_slices(self, step))


def _heads_of(weight: Tensor, heads: int) -> Tensor:
    """Rows of a [d, d] projection split per head: [heads, d/heads, d]."""
    return weight.reshape(heads, weight.shape[0] // heads, weight.shape[1])


@torch.no_grad()
def folded_weights(
    model: LMDM, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> FoldedWeights:
    """The self-attention value/output maps of every layer, computed in fp32, then cast and
    moved (default: the model's dtype and device)."""
    value_out, value_bias = [], []
    for layer in model.seqTransDecoder.stack:
        attn = layer.self_attn
        d, heads = attn.dim, attn.num_heads
        w = attn.in_proj_weight.float()
        b = attn.in_proj_bias.float()
        w_o = attn.out_proj.weight.float()
        w_v = _heads_of(w[2 * d :], heads)  # [H, dh, d]
        w_o_heads = w_o.reshape(d, heads, d // heads).permute(1, 0, 2)  # [H, d_out, dh]
        maps = torch.einsum("hoc,hci->hoi", w_o_heads, w_v)  # [H, d_out, d_in]
        like = {"dtype": dtype or attn.in_proj_weight.dtype, "device": device or w.device}
        value_out.append(maps.reshape(heads * d, d).to(**like))
        bias = w_o @ b[2 * d :] + attn.out_proj.bias.float()
        value_bias.append(bias.to(**like))
    return FoldedWeights(value_out, value_bias)


def fold_window(model: LMDM, consts: WindowConstants) -> FoldedConstants:
    """Fold each layer's cross-attention query and output projections into the window's
    keys [T, 2, H, M, dh] and values of ``consts``."""
    keys, values = [], []
    for i, layer in enumerate(model.seqTransDecoder.stack):
        attn = layer.multihead_attn
        d, heads = attn.dim, attn.num_heads
        w, b = attn.in_proj_weight, attn.in_proj_bias
        k, v = consts.keys[i], consts.values[i]
        w_q = _heads_of(w[:d], heads)  # [H, dh, d]
        b_q = b[:d].reshape(heads, d // heads)  # [H, dh]
        key = torch.einsum("tbhmc,hci->tbhmi", k, w_q)
        key_bias = torch.einsum("tbhmc,hc->tbhm", k, b_q)[..., None]
        pad = aligned_width(d + 1) - d - 1
        parts = [key, key_bias]
        if pad:
            parts.append(key_bias.new_zeros(*key_bias.shape[:-1], pad))
        keys.append(torch.cat(parts, dim=-1))
        w_o = attn.out_proj.weight.reshape(d, heads, d // heads)  # [d_out, H, dh]
        values.append(torch.einsum("tbhmc,ohc->tbhmo", v, w_o))
    layer0 = model.seqTransDecoder.stack[0].multihead_attn
    tail = keys[0].new_zeros(1, 1, keys[0].shape[-1] - layer0.dim)
    tail[..., 0] = 1
    return FoldedConstants(
        consts.films,
        keys,
        values,
        consts.input_bias,
        consts.projections,
        layer0.dim // layer0.num_heads,
        tail,
    )


def _layer_step(
    layer: DecoderLayer,
    x: Tensor,
    film: tuple[Tensor, ...],
    key: Tensor,
    value: Tensor,
    value_out: Tensor,
    value_bias: Tensor,
    consts: FoldedConstants,
) -> Tensor:
    scale1, shift1, scale2, shift2, scale3, shift3 = film
    sa = layer.self_attn
    d, heads = sa.dim, sa.num_heads
    b, n, _ = x.shape
    h = layer.norm1(x)
    q, k = F.linear(layer.rotary(h), sa.in_proj_weight[: 2 * d], sa.in_proj_bias[: 2 * d]).chunk(
        2, dim=-1
    )
    v = F.linear(h, value_out).reshape(b, n, heads, d).transpose(1, 2)
    q = q.reshape(b, n, heads, d // heads).transpose(1, 2)
    k = k.reshape(b, n, heads, d // heads).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v).sum(dim=1) + value_bias
    x = x + (scale1 * out + shift1)
    query = layer.rotary(layer.norm2(x))
    query = torch.cat((query, consts.query_tail.expand(b, n, -1)), dim=-1)
    query = query[:, None].expand(-1, heads, -1, -1)
    out = F.scaled_dot_product_attention(query, key, value, scale=consts.head_dim**-0.5)
    out = out.sum(dim=1)
    x = x + (scale2 * (out + layer.multihead_attn.out_proj.bias) + shift2)
    h = layer.linear2(F.gelu(layer.linear1(layer.norm3(x))))
    return x + (scale3 * h + shift3)


def folded_x0_step(
    model: LMDM,
    x: Tensor,
    consts: FoldedConstants,
    weights: FoldedWeights,
    step: int,
    sdpa: str = "auto",
) -> Tensor:
    """Guided x0 [1, S, 265] in fp32 of x [1, S, 265] at step index ``step`` (a Python int);
    ``sdpa`` as in :func:`~studio.motion.lmdm_hoist.guided_x0_step`."""
    with sdpa_backend(sdpa):
        h = embed_step_motion(x, consts.projections, consts.input_bias)
        for i, layer in enumerate(model.seqTransDecoder.stack):
            h = _layer_step(
                layer,
                h,
                tuple(f[step] for f in consts.films[i]),
                consts.keys[i][step],
                consts.values[i][step],
                weights.value_out[i],
                weights.value_bias[i],
                consts,
            )
        return guided_output(h, consts.projections)
