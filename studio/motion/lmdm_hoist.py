"""LMDM's window step: the per-window constants, computed once for every DDIM step of a
window, and the guided step that uses them (the numerics of the product's fast path; running
it under a precision, compiled and captured, is :mod:`studio.motion.fast_lmdm`).

Within a window only the noisy motion changes from one step to the next. What depends on the
step's time and the branch's condition alone, and not on the motion, is computed for all T
steps before the loop in a few batched matmuls: the FiLM scales and shifts of every decoder
layer, the cross-attention keys and values of the memory (condition tokens plus the step's two
time tokens), and the ``cond_frame`` half of the input projection. A step then runs only the
layers that see the motion: the self-attention, the cross-attention query and output, and the
feed-forward, with the self-attention's q, k (of the rotated tokens) and v (of the plain ones)
in one matmul: 50 matmuls a step instead of 98 (time embedding and condition encoder already
out of the loop). The constants themselves take 3 matmuls a window, every layer's
projections stacked (:class:`StackedProjections`).

The arithmetic is :meth:`LMDM.guided_x0` with batched guidance, regrouped, and the guidance
is its :func:`~studio.models.lmdm.guide`; the results agree to float rounding (tested
against it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from studio.layout import MOTION_DIM
from studio.models.lmdm import LMDM, DecoderLayer, guide
from studio.runtime.base import sdpa_backend

# Width multiple of aligned half-type kernels (16 bytes): the 265-wide motion would otherwise
# put the input projection and the final layer on unaligned GEMMs.
ALIGN = 8


def aligned_width(width: int, multiple: int = ALIGN) -> int:
    """``width`` rounded up to a multiple of ``multiple``."""
    return -(-width // multiple) * multiple


__all__ = [
    "ALIGN",
    "StackedProjections",
    "WindowConstants",
    "aligned_width",
    "constants_of_condition",
    "guided_x0_step",
    "stacked_projections",
    "window_constants",
]


@dataclass
class WindowConstants:
    """The motion-independent tensors of a window, for steps 0..T-1 and branches (null, cond).

    ``films[i]`` holds layer i's (1 + scale, shift) of its three FiLMs, each [T, 2, 1, d];
    ``keys[i]``/``values[i]`` its cross-attention keys/values [T, 2, heads, 82, d/heads];
    ``input_bias`` is the input projection of ``cond_frame`` plus its bias, [1, 1, d];
    ``projections`` the model's stacked and aligned weights the step uses as well.
    """

    films: list[tuple[Tensor, ...]]
    keys: list[Tensor]
    values: list[Tensor]
    input_bias: Tensor
    projections: StackedProjections

    @property
    def steps(self) -> int:
        return int(self.keys[0].shape[0])

    def at(self, step: int) -> WindowConstants:
        """Step ``step``'s constants alone (views, leading axis 1): call the step function with
        index 0, so that a compiled step is traced once for every step of the window."""

        def cut(value: Any) -> Any:
            if isinstance(value, Tensor):
                return value[step : step + 1]
            return type(value)(cut(v) for v in value)

        return replace(self, films=cut(self.films), keys=cut(self.keys), values=cut(self.values))


def _split_heads(t: Tensor, heads: int) -> Tensor:
    b, n, d = t.shape
    return t.reshape(b, n, heads, d // heads).transpose(1, 2)


@dataclass
class StackedProjections:
    """Every decoder layer's motion-independent projections stacked into one weight each, so
    that a window's constants take 3 matmuls instead of 40: the 24 FiLM linears (all of the
    same Mish(t)), and the 8 cross-attention key and 8 value projections (all of the same
    memory); and the input projection's two halves and the final layer, in half types
    zero-padded to an aligned width of the motion (the 265-wide GEMMs otherwise run on
    unaligned kernels; fp32 GEMMs do not gain from it, and the padding costs a copy)."""

    film_weight: Tensor  # [layers * 3 * 2d, d]
    film_bias: Tensor
    key_weight: Tensor  # [layers * d, d]
    key_bias: Tensor
    value_weight: Tensor
    value_bias: Tensor
    motion_weight: Tensor  # [d, 265 aligned]: the noisy motion's half
    frame_weight: Tensor  # [d, 265 aligned]: the cond_frame's half
    final_weight: Tensor  # [265 aligned, d]: the final layer, zero rows after 265
    final_bias: Tensor


def _motion_multiple(dtype: torch.dtype) -> int:
    """The width multiple of the motion GEMMs: :data:`ALIGN` in half types, none in fp32."""
    return ALIGN if dtype.itemsize < 4 else 1


def _aligned_columns(weight: Tensor) -> Tensor:
    width = aligned_width(weight.shape[1], _motion_multiple(weight.dtype))
    return F.pad(weight, (0, width - weight.shape[1])).contiguous()


def _aligned_rows(weight: Tensor) -> Tensor:
    """Zero rows appended up to the aligned width (works for a bias as well)."""
    pad = aligned_width(weight.shape[0], _motion_multiple(weight.dtype)) - weight.shape[0]
    return F.pad(weight, (0, 0) * (weight.ndim - 1) + (0, pad)).contiguous()


def _aligned_motion(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., 265] cast to ``weight``'s dtype and zero-padded to its (aligned) width."""
    x = x.to(weight.dtype)
    pad = weight.shape[-1] - x.shape[-1]
    return F.pad(x, (0, pad)) if pad else x


def stacked_projections(model: LMDM) -> StackedProjections:
    """The :class:`StackedProjections` of ``model`` (copies, in its dtype and device: make
    them again after changing the model's weights)."""
    layers = model.seqTransDecoder.stack
    d = model.latent_dim
    films = [f.block[1] for layer in layers for f in (layer.film1, layer.film2, layer.film3)]
    attns = [layer.multihead_attn for layer in layers]
    proj = model.input_projection.weight
    final = model.final_layer
    with torch.no_grad():
        return StackedProjections(
            torch.cat([f.weight for f in films]),
            torch.cat([f.bias for f in films]),
            torch.cat([a.in_proj_weight[d : 2 * d] for a in attns]),
            torch.cat([a.in_proj_bias[d : 2 * d] for a in attns]),
            torch.cat([a.in_proj_weight[2 * d :] for a in attns]),
            torch.cat([a.in_proj_bias[2 * d :] for a in attns]),
            _aligned_columns(proj[:, :MOTION_DIM]),
            _aligned_columns(proj[:, MOTION_DIM:]),
            _aligned_rows(final.weight),
            _aligned_rows(final.bias),
        )


def window_constants(
    model: LMDM,
    cond_frame: Tensor,
    cond_tokens: Tensor,
    cond_hidden: Tensor,
    t_vecs: Tensor,
    time_tokens: Tensor,
    stacked: StackedProjections | None = None,
) -> WindowConstants:
    """Constants for T steps: ``cond_frame`` [1, 265]; ``cond_tokens`` [2, S, d] and
    ``cond_hidden`` [2, d] of (null, cond); ``t_vecs`` [T, d], ``time_tokens`` [T, 2, d]
    from :meth:`LMDM.time_embedding` of the T timesteps; ``stacked`` from
    :func:`stacked_projections` (made here when not given)."""
    stacked = stacked or stacked_projections(model)
    layers = model.seqTransDecoder.stack
    steps, d = t_vecs.shape
    t = (t_vecs[:, None, :] + cond_hidden[None]).reshape(steps * 2, d)
    cond_part = cond_tokens[None].expand(steps, -1, -1, -1)
    time_part = time_tokens[:, None].expand(-1, 2, -1, -1)
    memory = torch.cat((cond_part, time_part), dim=-2).reshape(steps * 2, -1, d)
    memory = model.norm_cond(memory)
    rotated = model.rotary(memory)
    film = F.linear(F.mish(t), stacked.film_weight, stacked.film_bias)
    film = film.reshape(steps, 2, len(layers), 3, 2, 1, d)  # (step, branch, layer, film, s/s)
    scales, shifts = film[:, :, :, :, 0] + 1, film[:, :, :, :, 1]
    keys_all = F.linear(rotated, stacked.key_weight, stacked.key_bias)  # [2T, M, layers * d]
    values_all = F.linear(memory, stacked.value_weight, stacked.value_bias)
    films, keys, values = [], [], []
    for i, layer in enumerate(layers):
        films.append(tuple(x for f in range(3) for x in (scales[:, :, i, f], shifts[:, :, i, f])))
        heads = layer.multihead_attn.num_heads
        k = _split_heads(keys_all[..., i * d : (i + 1) * d], heads)
        v = _split_heads(values_all[..., i * d : (i + 1) * d], heads)
        keys.append(k.reshape(steps, 2, *k.shape[1:]))
        values.append(v.reshape(steps, 2, *v.shape[1:]))
    proj = model.input_projection
    frame = _aligned_motion(cond_frame, stacked.frame_weight)
    bias = F.linear(frame, stacked.frame_weight, proj.bias)
    return WindowConstants(films, keys, values, bias[:, None, :], stacked)


def constants_of_condition(
    model: LMDM,
    cond_frame: Tensor,
    cond: Tensor,
    times: Tensor,
    stacked: StackedProjections | None = None,
    sdpa: str = "auto",
) -> WindowConstants:
    """:func:`window_constants` of a window's raw condition: ``cond_frame`` [1, 265], ``cond``
    [1, S, C] and the T timesteps ``times`` [T] (null and conditional branches): everything a
    window computes once, the condition encoder and the time embeddings included. ``sdpa``
    names the condition encoder's attention backend, as in :func:`guided_x0_step`."""
    with sdpa_backend(sdpa):
        tokens, hidden = model.encode_condition(cond)
    null_tokens, null_hidden = model.null_condition(1)
    t_vecs, t_tokens = model.time_embedding(times)
    return window_constants(
        model,
        cond_frame,
        torch.cat((null_tokens, tokens)),
        torch.cat((null_hidden, hidden)),
        t_vecs,
        t_tokens,
        stacked,
    )


def _layer_step(layer: DecoderLayer, x: Tensor, film: tuple[Tensor, ...], k: Tensor, v: Tensor):
    scale1, shift1, scale2, shift2, scale3, shift3 = film
    sa = layer.self_attn
    d, n = sa.dim, x.shape[1]
    h = layer.norm1(x)
    # q, k of the rotated tokens and v of the plain ones in one matmul (rows stacked): one
    # launch instead of two for twice the (tiny) FLOPs; the H200 has to confirm the trade
    y = F.linear(torch.cat((layer.rotary(h), h), dim=1), sa.in_proj_weight, sa.in_proj_bias)
    q_s, k_s, v_s = (
        _split_heads(p, sa.num_heads)
        for p in (y[:, :n, :d], y[:, :n, d : 2 * d], y[:, n:, 2 * d :])
    )
    out = F.scaled_dot_product_attention(q_s, k_s, v_s).transpose(1, 2).reshape(x.shape)
    x = x + (scale1 * sa.out_proj(out) + shift1)
    attn = layer.multihead_attn
    q = F.linear(layer.rotary(layer.norm2(x)), attn.in_proj_weight[:d], attn.in_proj_bias[:d])
    out = F.scaled_dot_product_attention(_split_heads(q, attn.num_heads), k, v)
    out = attn.out_proj(out.transpose(1, 2).reshape(x.shape))
    x = x + (scale2 * out + shift2)
    h = layer.linear2(F.gelu(layer.linear1(layer.norm3(x))))
    return x + (scale3 * h + shift3)


def _embed_step_motion(x: Tensor, stacked: StackedProjections, input_bias: Tensor) -> Tensor:
    """Input tokens [2, S, d] (both branches) of the noisy motion x [1, S, 265]: the aligned
    motion half of the input projection plus the window's ``input_bias``."""
    weight = stacked.motion_weight
    tokens = F.linear(_aligned_motion(x, weight), weight) + input_bias
    return tokens.expand(2, -1, -1)


def _guided_output(h: Tensor, stacked: StackedProjections) -> Tensor:
    """The final layer (aligned) of both branches' tokens [2, S, d] (null first), guided in
    fp32 (:func:`~studio.models.lmdm.guide`): x0 [1, S, 265]."""
    both = F.linear(h, stacked.final_weight, stacked.final_bias)[..., :MOTION_DIM]
    return guide(both[:1], both[1:])


def guided_x0_step(
    model: LMDM, x: Tensor, consts: WindowConstants, step: int, sdpa: str = "auto"
) -> Tensor:
    """Guided x0 [1, S, 265] in fp32 of x [1, S, 265] at step index ``step`` (a Python int,
    so a captured graph holds fixed views of the constants). ``sdpa`` names the attention
    backend inside the function, where a compiled step sees (and guards) it."""
    with sdpa_backend(sdpa):
        h = _embed_step_motion(x, consts.projections, consts.input_bias)
        for i, layer in enumerate(model.seqTransDecoder.stack):
            film = tuple(f[step] for f in consts.films[i])
            h = _layer_step(layer, h, film, consts.keys[i][step], consts.values[i][step])
        return _guided_output(h, consts.projections)
