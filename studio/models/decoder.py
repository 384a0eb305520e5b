"""Decoder G: the SPADE generator that turns the warped 256x64x64 feature into a 512x512 image.

The state dict is the released ``decoder.pth`` layout (182 keys). Ditto wraps ``conv_0``,
``conv_1`` and ``conv_s`` of every SPADE ResBlock in ``torch.nn.utils.spectral_norm``, so those
convolutions are stored as ``weight_orig`` (parameter), ``weight_u`` and ``weight_v`` (buffers).
:class:`SpectralNormConv2d` keeps exactly that layout without torch's deprecated hook and applies
what eval-mode spectral norm does: ``W = weight_orig / sigma``, ``sigma = u . (W_mat v)``, with no
power iteration.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

INPUT_NAMES = ("feature",)
OUTPUT_NAMES = ("output",)

# A narrow variant with the same key pattern: 32-channel input feature at 16x16 -> 3x128x128.
REDUCED_KWARGS: dict = {
    "max_features": 32,
    "block_expansion": 8,
    "out_channels": 8,
    "spade_hidden": 16,
    "feature_size": 16,
}

NUM_MIDDLE_BLOCKS = 6
_LRELU_SLOPE = 0.2
_IN_EPS = 1e-5
_SN_EPS = 1e-12  # torch's spectral_norm default, used only to normalise the initial u, v


def _graph_capture() -> bool:
    """True while a tracer, exporter or compiler records the forward."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export()


class SpectralNormConv2d(nn.Module):
    """Conv2d whose weight is ``weight_orig / sigma`` (eval-mode ``spectral_norm`` semantics).

    ``weight_u`` and ``weight_v`` are treated as constants in every mode: this is an inference
    port, so torch's training-mode power iteration is deliberately not reproduced. The effective
    weight is cached for eager calls that need no gradient and recomputed whenever one of the
    three tensors is modified in place, reloaded or moved; traced, exported and compiled graphs
    compute it inline.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        padding: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.padding = padding
        # Registration order (bias, weight_orig, then the buffers) is the checkpoint's key order.
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.weight_orig = nn.Parameter(
            torch.empty(out_channels, in_channels, kernel_size, kernel_size)
        )
        self.register_buffer("weight_u", torch.empty(out_channels))
        self.register_buffer("weight_v", torch.empty(in_channels * kernel_size * kernel_size))
        self._cache: tuple[tuple, Tensor] | None = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, power_iterations: int = 20) -> None:
        """Conv2d's default init, then u, v from power iteration so sigma ~ the top singular value.

        Random u, v would give an arbitrary (possibly tiny or negative) sigma; converged ones keep
        a randomly initialised decoder numerically tame.
        """
        self._cache = None
        if self.weight_orig.is_meta:
            return  # a skeleton (models._build): the checkpoint's tensors replace these
        nn.init.kaiming_uniform_(self.weight_orig, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight_orig[0].numel()
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(self.bias, -bound, bound)
        w = self.weight_orig.reshape(self.weight_orig.shape[0], -1)
        u = F.normalize(w.new_empty(w.shape[0]).normal_(), dim=0, eps=_SN_EPS)
        v = F.normalize(w.new_empty(w.shape[1]).normal_(), dim=0, eps=_SN_EPS)
        for _ in range(power_iterations):
            v = F.normalize(w.t() @ u, dim=0, eps=_SN_EPS)
            u = F.normalize(w @ v, dim=0, eps=_SN_EPS)
        self.weight_u.copy_(u)
        self.weight_v.copy_(v)
        self._cache = None

    def compute_weight(self) -> Tensor:
        """The effective conv weight ``weight_orig / (u . (W_mat v))`` (sigma in fp32 at least)."""
        w, u, v = self.weight_orig, self.weight_u, self.weight_v
        w_mat = w.reshape(w.shape[0], -1)
        if w.dtype in (torch.float16, torch.bfloat16):  # no casts at all in fp32 graphs
            w_mat, u, v = w_mat.float(), u.float(), v.float()
        return w / torch.dot(u, torch.mv(w_mat, v))  # a 0-dim sigma keeps w's dtype

    def _cache_key(self) -> tuple | None:
        if torch.is_grad_enabled() and self.weight_orig.requires_grad:
            return None  # keep the graph differentiable
        if _graph_capture():
            return None  # keep the computation visible to tracers and exporters
        try:
            return tuple(
                (t._version, t.data_ptr(), t.dtype, t.device)
                for t in (self.weight_orig, self.weight_u, self.weight_v)
            )
        except RuntimeError:  # inference tensors have no version counter
            return None

    def effective_weight(self) -> Tensor:
        """The weight the convolution uses, from the cache when it is still valid."""
        key = self._cache_key()
        if key is None:
            return self.compute_weight()
        if self._cache is None or self._cache[0] != key:
            # A normal (not inference-mode) tensor, so later eager calls of any kind may use it.
            with torch.inference_mode(False), torch.no_grad():
                self._cache = (key, self.compute_weight())
        return self._cache[1]

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> SpectralNormConv2d:
        self._cache = None  # .to(), .half(), .cuda() ...
        return super()._apply(fn, recurse)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._cache = None
        super()._load_from_state_dict(*args, **kwargs)

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.effective_weight(), self.bias, padding=self.padding)

    @torch.no_grad()
    def to_conv2d(self) -> nn.Conv2d:
        """A plain Conv2d holding the effective weight (for folded exports, not for loading)."""
        o, i, k, _ = self.weight_orig.shape
        w = self.weight_orig
        conv = _FilledConv2d(
            i,
            o,
            k,
            padding=self.padding,
            bias=self.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        conv.weight.copy_(self.compute_weight())
        if self.bias is not None:
            conv.bias.copy_(self.bias)
        return conv.train(self.training)

    def extra_repr(self) -> str:
        o, i, k, _ = self.weight_orig.shape
        return f"{i}, {o}, kernel_size={k}, padding={self.padding}, bias={self.bias is not None}"


class _FilledConv2d(nn.Conv2d):
    """A Conv2d made to be filled at once (a folded weight): no random init to overwrite."""

    def reset_parameters(self) -> None:
        pass


def _up2(x: Tensor) -> Tensor:
    """Nearest 2x upsampling (same indices as resizing to exactly twice the size)."""
    return F.interpolate(x, scale_factor=2.0, mode="nearest")


class SPADE(nn.Module):
    """Parameter-free instance norm modulated per pixel by gamma/beta predicted from the segmap."""

    def __init__(self, norm_channels: int, label_channels: int, hidden: int = 128) -> None:
        super().__init__()
        self.mlp_shared = nn.Sequential(
            nn.Conv2d(label_channels, hidden, kernel_size=3, padding=1), nn.ReLU()
        )
        self.mlp_gamma = nn.Conv2d(hidden, norm_channels, kernel_size=3, padding=1)
        self.mlp_beta = nn.Conv2d(hidden, norm_channels, kernel_size=3, padding=1)

    def forward(self, x: Tensor, segmap: Tensor) -> Tensor:
        """``segmap`` must already be nearest-resized to x's spatial size (the decoder does it)."""
        normalized = F.instance_norm(x, eps=_IN_EPS)
        actv = self.mlp_shared(segmap)
        return normalized * (1 + self.mlp_gamma(actv)) + self.mlp_beta(actv)


class SPADEResBlock(nn.Module):
    """SPADE ResBlock: two SPADE-lrelu-conv stages plus a (learned when fin != fout) shortcut."""

    def __init__(self, fin: int, fout: int, label_channels: int, hidden: int = 128) -> None:
        super().__init__()
        fmid = min(fin, fout)
        self.learned_shortcut = fin != fout
        self.conv_0 = SpectralNormConv2d(fin, fmid, 3, padding=1)
        self.conv_1 = SpectralNormConv2d(fmid, fout, 3, padding=1)
        if self.learned_shortcut:
            self.conv_s = SpectralNormConv2d(fin, fout, 1, bias=False)
        self.norm_0 = SPADE(fin, label_channels, hidden)
        self.norm_1 = SPADE(fmid, label_channels, hidden)
        if self.learned_shortcut:
            self.norm_s = SPADE(fin, label_channels, hidden)

    def forward(self, x: Tensor, seg: Tensor) -> Tensor:
        """``seg`` is the segmap at x's spatial size."""
        x_s = self.conv_s(self.norm_s(x, seg)) if self.learned_shortcut else x
        dx = self.conv_0(F.leaky_relu(self.norm_0(x, seg), _LRELU_SLOPE))
        dx = self.conv_1(F.leaky_relu(self.norm_1(dx, seg), _LRELU_SLOPE))
        return x_s + dx


class Decoder(nn.Module):
    """Ditto/LivePortrait SPADE decoder: feature [B,256,64,64] -> image [B,3,512,512] in 0..1.

    ``spade_hidden`` (128 in the release) and ``feature_size`` (64; only used by
    :meth:`example_inputs`) exist so that narrow test variants can be built.
    """

    INPUT_NAMES = INPUT_NAMES
    OUTPUT_NAMES = OUTPUT_NAMES

    def __init__(
        self,
        upscale: int | None = 2,
        max_features: int = 512,
        block_expansion: int = 64,
        out_channels: int = 64,
        num_down_blocks: int = 2,
        spade_hidden: int = 128,
        feature_size: int = 64,
    ) -> None:
        super().__init__()
        c = min(max_features, block_expansion * 2**num_down_blocks)  # 256
        self.in_channels = c
        self.feature_size = feature_size
        self.upscale = upscale
        self.fc = nn.Conv2d(c, 2 * c, kernel_size=3, padding=1)
        for i in range(NUM_MIDDLE_BLOCKS):
            self.add_module(f"G_middle_{i}", SPADEResBlock(2 * c, 2 * c, c, spade_hidden))
        self.up_0 = SPADEResBlock(2 * c, c, c, spade_hidden)
        self.up_1 = SPADEResBlock(c, out_channels, c, spade_hidden)
        if upscale is None or upscale <= 1:
            self.conv_img: nn.Module = nn.Conv2d(out_channels, 3, kernel_size=3, padding=1)
        else:
            self.conv_img = nn.Sequential(
                nn.Conv2d(out_channels, 3 * upscale * upscale, kernel_size=3, padding=1),
                nn.PixelShuffle(upscale),
            )

    def forward(self, feature: Tensor) -> Tensor:
        """Decode; the input feature, nearest-resized, is the SPADE segmap of every block.

        The segmap is resized once per resolution rather than once per SPADE layer (nearest
        resizing is deterministic, so this equals the reference's per-layer resize).
        """
        seg = feature
        x = self.fc(feature)
        for i in range(NUM_MIDDLE_BLOCKS):
            x = getattr(self, f"G_middle_{i}")(x, seg)
        for block in (self.up_0, self.up_1):
            x, seg = _up2(x), _up2(seg)
            x = block(x, seg)
        return torch.sigmoid(self.conv_img(F.leaky_relu(x, _LRELU_SLOPE)))

    def example_inputs(self, batch: int = 1) -> tuple[Tensor]:
        """Deterministic inputs with the static ONNX shapes (``feature`` [batch,256,64,64]),
        drawn on the weights' device (a GPU engine's are not drawn on the CPU and copied up)."""
        device = self.fc.weight.device
        g = torch.Generator(device).manual_seed(0)
        s = self.feature_size
        return (torch.randn(batch, self.in_channels, s, s, generator=g, device=device),)


def fold_spectral_norm(module: nn.Module) -> nn.Module:
    """A deep copy with every SpectralNormConv2d replaced by its plain-Conv2d equivalent.

    Use it to export graphs whose conv weights are already divided by sigma (no MatMul/Div on
    initializers) or for a hook-free eager module. The copy's state dict has ``weight`` keys, so
    it no longer loads the released ``decoder.pth``: keep the original for loading.
    """
    # each spectral-norm conv copied as its folded conv: its own weights are never cloned
    memo = {id(m): m.to_conv2d() for m in module.modules() if isinstance(m, SpectralNormConv2d)}
    return copy.deepcopy(module, memo)
