"""LMDM: Ditto's latent motion diffusion network (the MotionDecoder), checkpoint-compatible.

The module's ``state_dict()`` has exactly the keys, shapes, dtypes and order of the
released ``lmdm_v0.4_hubert.pth`` ``model_state_dict`` (no ``model.`` prefix), so
that file loads with ``load_state_dict(strict=True)``. One rotary embedding is
shared by the top level, the condition encoder and every decoder layer, which is
why ``rotary.freqs`` appears under 11 keys.

:meth:`LMDM.forward` is one DDIM step's network call as exported to ONNX
(``x, cond_frame, cond, time_cond -> pred_noise, x_start``), classifier-free
guidance included. :meth:`LMDM.ddim_sample` runs the reference sampler through
:mod:`studio.models.diffusion`, replayable from given noises. :func:`guide` is the
guidance combination every LMDM path calls (this forward, the runtime's engines through
it, and the fast window step of :mod:`studio.motion.lmdm_hoist`).

The step runs in the dtype of the module's weights: a half-type copy (the runtime's
precision policy) gets its inputs cast to that type, while guidance and the noise
prediction are combined in fp32; in fp32 every cast is skipped (nothing extra is traced).

Op order follows the reference exactly: rotary on the full token vectors before
the attention in-projection (queries and keys only), pre-LN blocks, exact GELU,
FiLM with Mish, ``t_vec += cond_hidden``, memory = LayerNorm(cond tokens + two
time tokens), final Linear -> x0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from studio.layout import DIFFUSION_STEPS, GUIDANCE_WEIGHT, MOTION_DIM, SEQ_FRAMES
from studio.models.diffusion import (
    DDIMSchedule,
    DeviceDDIM,
    alphas_cumprod,
    draw_noises,
    make_schedule,
    noise_tables,
    predict_noise_from_start,
)

__all__ = [
    "INPUT_NAMES",
    "LMDM",
    "OUTPUT_NAMES",
    "REDUCED_KWARGS",
    "RELEASED_COND_DIM",
    "cast_to",
    "cond_dim_from_state_dict",
    "guide",
]

INPUT_NAMES = ("x", "cond_frame", "cond", "time_cond")
OUTPUT_NAMES = ("pred_noise", "x_start")

RELEASED_COND_DIM = 1103  # hubert 1024 + emo 8 + eye_open 2 + eye_ball 6 + sc 63
TIME_TOKENS = 2  # to_time_tokens emits two memory tokens
MEMORY_TOKENS = SEQ_FRAMES + TIME_TOKENS  # 82: cond tokens then time tokens
ROTARY_BASE = 10000.0
TIME_EMBED_BASE = 10000.0

# Same key structure as the released network, small shapes: for fast tests.
REDUCED_KWARGS: dict[str, int] = {
    "cond_dim": 37,
    "latent_dim": 64,
    "ff_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_encoder_layers": 2,
}

_COND_WEIGHT_KEY = "cond_projection.weight"
_CONTAINER_KEY = "model_state_dict"


def cond_dim_from_state_dict(state_dict: Mapping[str, Any]) -> int:
    """Condition width C from ``cond_projection.weight`` [latent, C].

    Accepts the flat state dict or the released container ``{"model_state_dict": ...}``.
    """
    sd = state_dict.get(_CONTAINER_KEY, state_dict)
    if _COND_WEIGHT_KEY not in sd:
        raise KeyError(f"not an LMDM state dict: {_COND_WEIGHT_KEY!r} is missing")
    weight = sd[_COND_WEIGHT_KEY]
    if weight.dim() != 2:
        raise ValueError(f"{_COND_WEIGHT_KEY} must be 2-D, got {list(weight.shape)}")
    return int(weight.shape[1])


def cast_to(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``; ``t`` itself when it already is (so no cast is traced or compiled)."""
    return t if t.dtype == dtype else t.to(dtype)


def guide(uncond: Tensor, conditioned: Tensor) -> Tensor:
    """Classifier-free guidance, combined in fp32: uncond + (cond - uncond) * GUIDANCE_WEIGHT."""
    uncond, conditioned = cast_to(uncond, torch.float32), cast_to(conditioned, torch.float32)
    return uncond + (conditioned - uncond) * GUIDANCE_WEIGHT


def _refresh_after_load(module: RotaryEmbedding, _incompatible: Any) -> None:
    module.refresh_tables()


class RotaryEmbedding(nn.Module):
    """Interleaved-pair rotary embedding over the full feature width.

    ``freqs`` (f_i = 1 / base^(2i/dim)) is the persistent buffer of the checkpoint.
    The cos/sin tables for positions 0..max_len-1 are non-persistent and rebuilt
    from ``freqs`` after every ``load_state_dict``; a sequence of length L uses the
    first L rows, so every sequence is numbered from 0.
    """

    def __init__(self, dim: int, max_len: int = MEMORY_TOKENS) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary width must be even, got {dim}")
        self.max_len = max_len
        # host constants even under a meta default device (see models._build)
        exponents = torch.arange(0, dim, 2, device="cpu").float() / dim
        self.register_buffer("freqs", 1.0 / (ROTARY_BASE**exponents))
        self.register_buffer("cos", torch.empty(max_len, dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_len, dim), persistent=False)
        self.refresh_tables()
        self.register_load_state_dict_post_hook(_refresh_after_load)

    @torch.no_grad()
    def refresh_tables(self) -> None:
        """Recompute the cos/sin tables from ``freqs`` (in its dtype and on its device)."""
        pos = torch.arange(self.max_len, device=self.freqs.device, dtype=self.freqs.dtype)
        angles = (pos[:, None] * self.freqs[None, :]).repeat_interleave(2, dim=-1)
        self.cos = angles.cos()
        self.sin = angles.sin()

    def forward(self, x: Tensor) -> Tensor:
        """Rotate pairs (2i, 2i+1) of x [..., L, dim] by angle p * f_i, p = 0..L-1."""
        length = x.shape[-2]
        if not torch.jit.is_tracing() and length > self.max_len:
            raise ValueError(f"rotary tables cover {self.max_len} positions, got {length}")
        even, odd = x[..., 0::2], x[..., 1::2]
        partner = torch.stack((-odd, even), dim=-1).flatten(-2)
        return x * self.cos[:length] + partner * self.sin[:length]


class MultiheadAttention(nn.Module):
    """Batch-first multi-head attention with nn.MultiheadAttention's packed parameter layout.

    ``in_proj_weight`` [3d, d] holds the q, k, v projections in that order. No masks,
    no dropout. When the query and key inputs are the same tensor (self-attention on
    rotated tokens), q and k are projected in one matmul.
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.dim = dim
        self.num_heads = num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)
        nn.init.zeros_(self.out_proj.bias)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.reshape(b, n, self.num_heads, self.dim // self.num_heads).transpose(1, 2)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """query [B, Lq, d], key/value [B, Lk, d] -> [B, Lq, d]."""
        d, w, b = self.dim, self.in_proj_weight, self.in_proj_bias
        if query is key:
            q, k = F.linear(query, w[: 2 * d], b[: 2 * d]).chunk(2, dim=-1)
        else:
            q = F.linear(query, w[:d], b[:d])
            k = F.linear(key, w[d : 2 * d], b[d : 2 * d])
        v = F.linear(value, w[2 * d :], b[2 * d :])
        out = F.scaled_dot_product_attention(self._heads(q), self._heads(k), self._heads(v))
        bsz, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(bsz, length, d))


class EncoderLayer(nn.Module):
    """Pre-LN transformer encoder layer with rotary self-attention (the condition encoder)."""

    def __init__(self, dim: int, num_heads: int, ff_size: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(dim, num_heads)
        self.linear1 = nn.Linear(dim, ff_size)
        self.linear2 = nn.Linear(ff_size, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.rotary = rotary

    def forward(self, x: Tensor) -> Tensor:
        """x [B, L, d] -> [B, L, d]."""
        h = self.norm1(x)
        qk = self.rotary(h)
        x = x + self.self_attn(qk, qk, h)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class FiLM(nn.Module):
    """Mish -> Linear(d, 2d) of the time vector, split into (scale, shift)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Mish(), nn.Linear(dim, 2 * dim))

    def forward(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """t [B, d] -> scale, shift, each [B, 1, d]."""
        scale, shift = self.block(t)[:, None, :].chunk(2, dim=-1)
        return scale, shift


def _modulate(h: Tensor, scale_shift: tuple[Tensor, Tensor]) -> Tensor:
    scale, shift = scale_shift
    return (scale + 1) * h + shift


class DecoderLayer(nn.Module):
    """Pre-LN decoder layer: self-attn, cross-attn to memory, feed-forward, each FiLM-modulated."""

    def __init__(self, dim: int, num_heads: int, ff_size: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(dim, num_heads)
        self.multihead_attn = MultiheadAttention(dim, num_heads)
        self.linear1 = nn.Linear(dim, ff_size)
        self.linear2 = nn.Linear(ff_size, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.film1 = FiLM(dim)
        self.film2 = FiLM(dim)
        self.film3 = FiLM(dim)
        self.rotary = rotary

    def forward(self, x: Tensor, memory: Tensor, memory_rotated: Tensor, t: Tensor) -> Tensor:
        """x [B, S, d]; memory [B, M, d] and its rotary form (keys); t [B, d]."""
        h = self.norm1(x)
        qk = self.rotary(h)
        x = x + _modulate(self.self_attn(qk, qk, h), self.film1(t))
        h = self.norm2(x)
        x = x + _modulate(
            self.multihead_attn(self.rotary(h), memory_rotated, memory), self.film2(t)
        )
        h = self.linear2(F.gelu(self.linear1(self.norm3(x))))
        return x + _modulate(h, self.film3(t))


class DecoderStack(nn.Module):
    """The decoder layers (``seqTransDecoder.stack.*``); the memory is rotated once for all."""

    def __init__(self, layers: list[DecoderLayer], rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.stack = nn.ModuleList(layers)
        self._rotary = [rotary]  # a plain list: no extra state-dict keys

    def forward(self, x: Tensor, memory: Tensor, t: Tensor) -> Tensor:
        """x [B, S, d], memory [B, M, d], t [B, d] -> [B, S, d]."""
        memory_rotated = self._rotary[0](memory)
        for layer in self.stack:
            x = layer(x, memory, memory_rotated, t)
        return x


class SinusoidalTimeEmbedding(nn.Module):
    """Integer timestep -> [sin(t f_i), cos(t f_i)], f_i = exp(-i ln(base) / (half - 1))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        half = dim // 2
        step = math.log(TIME_EMBED_BASE) / (half - 1)
        # a constant, made on the host even under a meta default device (see models._build)
        freqs = torch.exp(torch.arange(half, device="cpu") * -step)
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, time_cond: Tensor) -> Tensor:
        """time_cond [B] (integer) -> [B, dim] float."""
        angles = time_cond.to(self.freqs.dtype)[:, None] * self.freqs[None, :]
        return torch.cat((angles.sin(), angles.cos()), dim=-1)


class LMDM(nn.Module):
    """Ditto's MotionDecoder with the step interface of the exported LMDM.

    Defaults are the released sizes. ``batch_guidance`` (default True) runs the
    unconditional and conditional passes as one batch of 2B; False runs them one
    after the other as the reference does. Both agree to float rounding.
    """

    def __init__(
        self,
        cond_dim: int = RELEASED_COND_DIM,
        latent_dim: int = 512,
        ff_size: int = 1024,
        num_layers: int = 8,
        num_heads: int = 8,
        num_encoder_layers: int = 2,
    ) -> None:
        super().__init__()
        d = latent_dim
        self.latent_dim = d
        self.batch_guidance = True

        # Registration order fixes the state-dict order of the released file.
        self.null_cond_embed = nn.Parameter(torch.empty(1, SEQ_FRAMES, d))
        self.null_cond_hidden = nn.Parameter(torch.empty(1, d))
        if not self.null_cond_embed.is_meta:  # a skeleton (models._build) draws nothing
            with torch.no_grad():  # the same numbers torch.randn draws
                self.null_cond_embed.normal_()
                self.null_cond_hidden.normal_()
        self.rotary = RotaryEmbedding(d)
        self.time_mlp = nn.Sequential(SinusoidalTimeEmbedding(d), nn.Linear(d, 4 * d), nn.Mish())
        self.to_time_cond = nn.Sequential(nn.Linear(4 * d, d))
        self.to_time_tokens = nn.Sequential(
            nn.Linear(4 * d, TIME_TOKENS * d), nn.Unflatten(-1, (TIME_TOKENS, d))
        )
        self.norm_cond = nn.LayerNorm(d)
        self.input_projection = nn.Linear(2 * MOTION_DIM, d)
        self.cond_encoder = nn.Sequential(
            *(EncoderLayer(d, num_heads, ff_size, self.rotary) for _ in range(num_encoder_layers))
        )
        self.cond_projection = nn.Linear(cond_dim, d)
        self.non_attn_cond_projection = nn.Sequential(
            nn.LayerNorm(d), nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d)
        )
        self.seqTransDecoder = DecoderStack(
            [DecoderLayer(d, num_heads, ff_size, self.rotary) for _ in range(num_layers)],
            self.rotary,
        )
        self.final_layer = nn.Linear(d, MOTION_DIM)

        self.register_buffer("alphas_cumprod", alphas_cumprod(), persistent=False)
        self.register_buffer("noise_tables", noise_tables(self.alphas_cumprod), persistent=False)
        self._schedules: dict[int, DDIMSchedule] = {}

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any], **kwargs: int) -> LMDM:
        """Build with the checkpoint's cond width and load it strictly (flat or container).

        ``kwargs`` give the other sizes (default: released); ``cond_dim`` always comes
        from the checkpoint.
        """
        sd = state_dict.get(_CONTAINER_KEY, state_dict)
        model = cls(**{**kwargs, "cond_dim": cond_dim_from_state_dict(sd)})
        model.load_state_dict(sd, strict=True)
        return model.eval()

    @property
    def cond_dim(self) -> int:
        """Width C of the per-frame condition."""
        return self.cond_projection.in_features

    @property
    def device(self) -> torch.device:
        """Device of the parameters."""
        return self.final_layer.weight.device

    # --- the pieces of one pass --------------------------------------------------

    def embed_motion(self, x: Tensor, cond_frame: Tensor) -> Tensor:
        """x [B, S, 265] with cond_frame [B, 265] repeated per frame -> tokens [B, S, d]."""
        frames = cond_frame[:, None, :].expand(-1, x.shape[1], -1)
        return self.input_projection(torch.cat((x, frames), dim=-1))

    def time_embedding(self, time_cond: Tensor) -> tuple[Tensor, Tensor]:
        """time_cond [B] -> (t_vec [B, d] before the cond_hidden add, time tokens [B, 2, d])."""
        hidden = self.time_mlp(time_cond)
        return self.to_time_cond(hidden), self.to_time_tokens(hidden)

    def encode_condition(self, cond: Tensor) -> tuple[Tensor, Tensor]:
        """cond [B, S, C] -> (encoded cond tokens [B, S, d], pooled cond_hidden [B, d])."""
        tokens = self.cond_encoder(self.cond_projection(cond))
        return tokens, self.non_attn_cond_projection(tokens.mean(dim=-2))

    def null_condition(self, batch: int) -> tuple[Tensor, Tensor]:
        """The learned unconditional replacements: tokens [B, S, d], hidden [B, d]."""
        return (
            self.null_cond_embed.expand(batch, -1, -1),
            self.null_cond_hidden.expand(batch, -1),
        )

    def decode(
        self,
        tokens: Tensor,
        t_vec: Tensor,
        time_tokens: Tensor,
        cond_tokens: Tensor,
        cond_hidden: Tensor,
    ) -> Tensor:
        """Motion tokens + time + condition -> x0 prediction [B, S, 265]."""
        t = t_vec + cond_hidden
        memory = self.norm_cond(torch.cat((cond_tokens, time_tokens), dim=-2))
        return self.final_layer(self.seqTransDecoder(tokens, memory, t))

    def single_pass(
        self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor, drop_cond: bool
    ) -> Tensor:
        """One unguided pass (the reference forward with cond_drop_prob 1 or 0) -> x0.

        With ``drop_cond`` the condition encoder is skipped: its output would be
        replaced by the null embeddings anyway, so the result is identical.
        """
        tokens = self.embed_motion(x, cond_frame)
        t_vec, time_tokens = self.time_embedding(time_cond)
        if drop_cond:
            cond_tokens, cond_hidden = self.null_condition(x.shape[0])
        else:
            cond_tokens, cond_hidden = self.encode_condition(cond)
        return self.decode(tokens, t_vec, time_tokens, cond_tokens, cond_hidden)

    # --- the step interface ---------------------------------------------------------

    def guided_x0(self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor) -> Tensor:
        """Classifier-free guided x0 in fp32 (:func:`guide`).

        The network runs in its weights' dtype: ``x``, ``cond_frame`` and ``cond`` are cast
        to it, and the time, null and condition terms to the motion tokens' dtype (which
        autocast may lower while the weights stay fp32). In fp32 no cast happens.
        """
        time_cond = self._check_inputs(x, cond_frame, cond, time_cond)
        batch = x.shape[0]
        dtype = self.input_projection.weight.dtype
        tokens = self.embed_motion(cast_to(x, dtype), cast_to(cond_frame, dtype))
        dt = tokens.dtype
        t_vec, time_tokens = [cast_to(t, dt) for t in self.time_embedding(time_cond)]
        null_tokens, null_hidden = [cast_to(t, dt) for t in self.null_condition(batch)]
        encoded = self.encode_condition(cast_to(cond, dtype))
        cond_tokens, cond_hidden = [cast_to(t, dt) for t in encoded]
        if self.batch_guidance:
            both = self.decode(
                torch.cat((tokens, tokens)),
                torch.cat((t_vec, t_vec)),
                torch.cat((time_tokens, time_tokens)),
                torch.cat((null_tokens, cond_tokens)),
                torch.cat((null_hidden, cond_hidden)),
            )
            return guide(both[:batch], both[batch:])
        uncond = self.decode(tokens, t_vec, time_tokens, null_tokens, null_hidden)
        conditioned = self.decode(tokens, t_vec, time_tokens, cond_tokens, cond_hidden)
        return guide(uncond, conditioned)

    def forward(
        self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One DDIM step's network call: (pred_noise, x_start), each [B, 80, 265] fp32.

        x [B, 80, 265], cond_frame [B, 265], cond [B, 80, C], time_cond [B] int64. The noise
        prediction reads ``x`` in fp32: give it in fp32 to a half-type copy as well.
        """
        time_cond = self._check_inputs(x, cond_frame, cond, time_cond)
        x_start = self.guided_x0(x, cond_frame, cond, time_cond)
        fp32 = torch.float32
        tables = cast_to(self.noise_tables, fp32)
        pred_noise = predict_noise_from_start(cast_to(x, fp32), time_cond, x_start, tables)
        return pred_noise, x_start

    def _check_inputs(
        self, x: Tensor, cond_frame: Tensor, cond: Tensor, time_cond: Tensor
    ) -> Tensor:
        """Validate shapes (skipped while tracing: static there) and return time_cond as int64."""
        if time_cond.dtype.is_floating_point or time_cond.dtype == torch.bool:
            raise TypeError(f"time_cond must be an integer tensor, got {time_cond.dtype}")
        time_cond = time_cond if time_cond.dtype == torch.int64 else time_cond.long()
        if torch.jit.is_tracing():
            return time_cond
        b = x.shape[0]
        expected = {
            "x": (x, (b, SEQ_FRAMES, MOTION_DIM)),
            "cond_frame": (cond_frame, (b, MOTION_DIM)),
            "cond": (cond, (b, SEQ_FRAMES, self.cond_dim)),
            "time_cond": (time_cond, (b,)),
        }
        for name, (tensor, shape) in expected.items():
            if tuple(tensor.shape) != shape:
                raise ValueError(f"{name} must be {list(shape)}, got {list(tensor.shape)}")
        return time_cond

    def example_inputs(self, batch: int = 1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Deterministic inputs with the ONNX static shapes and dtypes (time_cond int64)."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(batch, SEQ_FRAMES, MOTION_DIM, generator=g)
        cond_frame = torch.randn(batch, MOTION_DIM, generator=g)
        cond = torch.randn(batch, SEQ_FRAMES, self.cond_dim, generator=g)
        time_cond = torch.full((batch,), DIFFUSION_STEPS - 1, dtype=torch.int64)
        return tuple(t.to(self.device) for t in (x, cond_frame, cond, time_cond))

    # --- sampling -------------------------------------------------------------------

    def schedule(self, steps: int) -> DDIMSchedule:
        """The DDIM schedule for ``steps`` (cached per step count)."""
        if steps not in self._schedules:
            self._schedules[steps] = make_schedule(steps)
        return self._schedules[steps]

    @torch.no_grad()
    def ddim_sample(
        self,
        kp_cond: Tensor,
        aud_cond: Tensor,
        steps: int,
        x_T: Tensor | None = None,
        noises: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """The reference DDIM sampler for one window -> motion [B, 80, 265].

        kp_cond [B, 265] or [265]; aud_cond [B, 80, C] or [80, C]. x_T [B, 80, 265] and
        noises [steps - 1, B, 80, 265] are drawn with ``draw_noises`` (from ``generator``)
        when not given, so a run is replayed exactly by passing the same tensors.
        Runs on the module's device with no host sync inside the loop (DeviceDDIM).
        """
        dev = self.device
        kp = kp_cond if kp_cond.dim() == 2 else kp_cond[None]
        aud = aud_cond if aud_cond.dim() == 3 else aud_cond[None]
        kp = kp.to(dev, torch.float32)
        aud = aud.to(dev, torch.float32)
        shape = (kp.shape[0], SEQ_FRAMES, MOTION_DIM)
        sched = self.schedule(steps)
        if x_T is None or noises is None:
            drawn_x, drawn_noises = draw_noises(sched, shape, generator, dev)
            x_T = drawn_x if x_T is None else x_T
            noises = drawn_noises if noises is None else noises
        x_T = x_T.to(dev, torch.float32)
        if tuple(x_T.shape) != shape:
            raise ValueError(f"x_T must be {list(shape)}, got {list(x_T.shape)}")
        sampler = DeviceDDIM(sched, shape, noises, dev)

        def denoise(x: Tensor, time_cond: Tensor) -> tuple[Tensor, Tensor]:
            return self(x, kp, aud, time_cond)

        return sampler.sample(denoise, x_T)
