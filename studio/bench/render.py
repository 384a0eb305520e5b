"""The ``render`` bench suite: warp network + decoder throughput per batch, precision and path.

The real modules of :mod:`studio.models` with random weights
(:func:`studio.fixtures.random_tree.random_network`; the released sizes, or ``reduced`` for
smoke runs) render batches of frames the way :mod:`studio.engines.ditto.engine` does: one avatar's
f_s expanded to the batch, per-frame source and driving keypoints, warp then decode.

Paths (``<kind>_<precision>``):

- ``eager_fp32``: the modules as loaded (spectral-norm decoder layout, cached weights), fp32
  with TF32 off for matmuls *and* cuDNN convolutions. Its images are the accuracy reference.
- ``eager_*``: a copy with the decoder's spectral norm folded into plain convolutions
  (:func:`studio.models.decoder.fold_spectral_norm`) under a precision policy: ``tf32``
  (fp32 weights, TF32 math), ``fp16``/``bf16`` (weights and inputs cast), or
  ``fp16-autocast``/``bf16-autocast`` (fp32 weights under ``torch.autocast``, which keeps
  grid sampling in fp32: what the Ditto engine runs on a GPU).
- ``channels_last_*``: the same with every 4-D weight in channels-last layout (the decoder and
  the warp network's 2-D convolutions; its 3-D part stays contiguous).
- ``graph_*`` (CUDA): warp + decode captured once per batch size into a CUDA graph with static
  input buffers and replayed, in whichever layout was faster eager at the largest batch.
- ``compiled_graph_*`` (CUDA, ``compile=True``): the same with warp + decode through
  ``torch.compile`` (Inductor kernels inside our graph); ``compiled_graph_channels_last_*``
  forces the channels-last weights there (eager pays for its layout changes, Inductor may
  fuse them).
- ``padded_*`` / ``compiled_graph_padded_*`` / ``compiled_graph_padded_cl3d_*``: every
  convolution whose channel counts are not a multiple of :data:`PAD_MULTIPLE` zero-padded to
  one (:func:`studio.models.channel_pad.pad_conv_channels`: the dense-motion mask 142 -> 22,
  the hourglass's first and last convolutions, the occlusion head 2272 -> 1; exact), the
  ``cl3d`` one with the 3-D weights in channels-last-3d as well.
- ``compiled_graph_split_*`` / ``compiled_graph_split_padded_*``: the warp network's 7x7x7
  mask convolution as one 2-D convolution over depth slices
  (:func:`studio.models.depth_split.split_deep_conv3d`; exact), without and with padding.

Each point: warm-up, then the median of repeats (CUDA events at the run boundaries; by
default enough repeats for about ``target_ms`` of timed work, 3..20), rotating over
``input_sets`` distinct (f_s, x_s, x_d) sets, with the GPU's L2 cache flushed before each run.
Throughput is frames/s and ms/frame; the FLOP floor is FLOPs per frame (counted at the run's
shapes with ``FlopCounterMode``; for the released sizes the manifest's
``networks.warp_network.flops.forward_total + networks.decoder.flops.forward_total`` =
1.234 TFLOP) over the rate of a large matmul of the same precision measured in the same run.
Accuracy: cosine similarity and relative L2 of each path's images to ``eager_fp32`` on the
same inputs and batch, worst over the input sets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from studio.bench.report import (
    compare,
    fmt,
    fmt_cos,
    int_list,
    is_ok,
    table,
    worst,
    write_outputs,
)
from studio.bench.timing import (
    Timing,
    capture_graph,
    device_facts,
    git_commit,
    kernel_profile,
    matmul_tf32,
    measure,
    synchronize,
    utc_now,
)
from studio.fixtures.random_tree import random_network
from studio.models import network_spec
from studio.models.channel_pad import TENSOR_CORE_MULTIPLE, pad_conv_channels
from studio.models.decoder import fold_spectral_norm
from studio.models.depth_split import split_deep_conv3d
from studio.models.warp_network import FEATURE_SIZE

__all__ = [
    "DEFAULT_BATCHES",
    "MANIFEST_KEYS",
    "PRECISIONS",
    "PUBLISHED",
    "TARGETS",
    "Precision",
    "RenderPath",
    "WarpDecode",
    "count_flops",
    "main",
    "manifest_flops",
    "plan_paths",
    "run_render_suite",
    "save_plots",
    "to_markdown",
]

DEFAULT_BATCHES: tuple[int, ...] = (1, 4, 8, 16, 32)
MAX_BATCH = 256
ACCURATE_COSINE = 0.999  # a fast path counts as accurate at or above this cosine to fp32 eager
MIN_REPEATS, MAX_REPEATS = 3, 20
PAD_MULTIPLE = TENSOR_CORE_MULTIPLE  # channel multiple of the padded paths
TARGET_MS = 1000.0  # timed work per point when repeats are chosen automatically
COMPILE_MODE = "default"

PUBLISHED: dict[str, Any] = {
    "source": "Ditto reference, RTX 5090 laptop GPU, TensorRT 10.15",
    "clip_frames": 165,
    "warp_decode_ms": 2180.0,  # the whole 165-frame clip
    "warp_decode_fps": 165 / 2.180,
    "render_loop_fps": 71.1,
    "flops_per_frame_tflop": 1.234,
}
TARGETS: dict[str, Any] = {"render_loop_fps": 300.0, "side": 512}

MANIFEST_NAME = "ditto_state_dicts.json"
MANIFEST_KEYS: dict[str, str] = {
    "warp_network": "networks.warp_network.flops.forward_total",
    "decoder": "networks.decoder.flops.forward_total",
}
# The manifest's values at those keys, for machines that have no ../shared checkout (the
# device machine): used only when the file is not found, and then said so in the result.
_MANIFEST_COPY: dict[str, int] = {"warp_network": 342_071_443_456, "decoder": 891_574_812_672}


# --- precisions and paths ------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """Compute dtype and policy: ``fp32`` (weights fp32), ``cast`` (weights and inputs in
    dtype) or ``autocast`` (fp32 weights under ``torch.autocast``); TF32 for fp32 math."""

    name: str
    dtype: str
    mode: str
    tf32: bool = False

    @property
    def torch_dtype(self) -> torch.dtype:
        """The compute dtype as a torch dtype."""
        return getattr(torch, self.dtype)


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "float32", "fp32"),
        Precision("tf32", "float32", "fp32", tf32=True),
        Precision("fp16", "float16", "cast"),
        Precision("bf16", "bfloat16", "cast"),
        Precision("fp16-autocast", "float16", "autocast"),
        Precision("bf16-autocast", "bfloat16", "autocast"),
    )
}
CUDA_PRECISIONS = tuple(PRECISIONS)
CPU_PRECISIONS = ("fp32",)  # add bf16-autocast by hand; fp16 and bf16 casts lack CPU kernels


@dataclass(frozen=True)
class RenderPath:
    """One measured path: precision, weight layout, CUDA graph, torch.compile."""

    name: str
    precision: str
    layout: str = "contiguous"  # | "channels_last" | "channels_last_3d" | "auto" (faster eager)
    pad: int = 0  # conv channels padded to this multiple (studio.models.channel_pad), 0: as is
    split: bool = False  # deep 3-D convolutions over depth slices (studio.models.depth_split)
    graph: bool = False
    compile: bool = False
    reference: bool = False


def _tag(precision: str) -> str:
    return precision.replace("-", "_")


def plan_paths(precisions: Sequence[str], device: str, compile: bool = False) -> list[RenderPath]:
    """The paths for these precisions on this device, ``eager_fp32`` (the reference) first.

    On CUDA, fp32 runs only as the reference (``tf32`` is the fast fp32 path); every other
    precision gets eager, channels-last and graph paths (and compiled graphs with ``compile``).
    On the CPU: eager and channels-last per precision.
    """
    cuda = torch.device(device).type == "cuda"
    paths = [RenderPath("eager_fp32", "fp32", reference=True)]
    for name in precisions:
        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
        t = _tag(name)
        if name != "fp32":
            paths.append(RenderPath(f"eager_{t}", name))
        if name != "fp32" or not cuda:
            paths.append(RenderPath(f"channels_last_{t}", name, layout="channels_last"))
        if cuda and name != "fp32":
            paths.append(RenderPath(f"graph_{t}", name, layout="auto", graph=True))
            if compile:
                paths.append(
                    RenderPath(f"compiled_graph_{t}", name, layout="auto", graph=True, compile=True)
                )
                paths.append(  # Inductor may fuse the layout changes eager pays for
                    RenderPath(
                        f"compiled_graph_channels_last_{t}",
                        name,
                        layout="channels_last",
                        graph=True,
                        compile=True,
                    )
                )
                for pad, tag in ((0, ""), (PAD_MULTIPLE, "_padded")):
                    paths.append(  # the 7x7x7 mask as a 2-D convolution over depth slices
                        RenderPath(
                            f"compiled_graph_split{tag}_{t}",
                            name,
                            pad=pad,
                            split=True,
                            graph=True,
                            compile=True,
                        )
                    )
                for layout, tag in (("contiguous", ""), ("channels_last_3d", "_cl3d")):
                    paths.append(  # tensor-core friendly channel counts, in either layout
                        RenderPath(
                            f"compiled_graph_padded{tag}_{t}",
                            name,
                            layout=layout,
                            pad=PAD_MULTIPLE,
                            graph=True,
                            compile=True,
                        )
                    )
        if name != "fp32":
            paths.append(RenderPath(f"padded_{t}", name, pad=PAD_MULTIPLE))
    return paths


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """TF32 for matmuls and cuDNN convolutions (the latter defaults to on in PyTorch)."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        with matmul_tf32(enabled):
            yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def _channels_last(module: nn.Module, three_d: bool = False) -> nn.Module:
    """Every 4-D parameter and buffer in channels-last layout, in place (5-D ones too, in
    channels-last-3d, with ``three_d``)."""
    formats = {4: torch.channels_last, **({5: torch.channels_last_3d} if three_d else {})}
    with torch.no_grad():
        for m in module.modules():
            for tensors in (m._parameters, m._buffers):
                for t in tensors.values():
                    if t is not None and t.dim() in formats:
                        t.data = t.data.contiguous(memory_format=formats[t.dim()])
    return module


class WarpDecode:
    """Warp network + decoder under one precision policy and weight layout.

    ``reference`` uses the modules as given (no copy); otherwise the warp network is copied,
    the decoder is copied with its spectral norm folded, and both are cast / re-laid-out.
    Calling it renders one batch: f_s [1, C, D, H, W] (expanded to the batch), x_s and x_d
    [B, K, 3] -> images [B, 3, 8H, 8W].
    """

    def __init__(
        self,
        warp: nn.Module,
        decoder: nn.Module,
        precision: Precision,
        device: torch.device | str,
        layout: str = "contiguous",
        reference: bool = False,
        compile: bool = False,
        compile_mode: str = COMPILE_MODE,
        pad: int = 0,
        split: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.precision = precision
        self.layout = layout
        if reference:
            self.warp, self.decoder = warp, decoder
        else:
            self.warp = copy.deepcopy(warp)
            self.decoder = fold_spectral_norm(decoder)
            if precision.mode == "cast":
                self.warp.to(precision.torch_dtype)
                self.decoder.to(precision.torch_dtype)
            if split:  # both networks are this path's own copies: rewritten in place
                self.warp = split_deep_conv3d(self.warp, inplace=True)
            if pad:
                self.warp = pad_conv_channels(self.warp, pad, inplace=True)
                self.decoder = pad_conv_channels(self.decoder, pad, inplace=True)
            if layout in ("channels_last", "channels_last_3d"):
                _channels_last(self.warp, three_d=layout == "channels_last_3d")
                _channels_last(self.decoder)
        self.warp.eval().requires_grad_(False)
        self.decoder.eval().requires_grad_(False)
        cast = precision.mode == "cast"
        self.input_dtype = precision.torch_dtype if cast else torch.float32
        self._core: Callable[[Tensor, Tensor, Tensor], Tensor] = self.forward
        if compile:
            self._core = torch.compile(self.forward, mode=compile_mode, dynamic=False)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """no_grad + TF32 flags (CUDA) + autocast (``cache_enabled=False``: graph-capturable)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if self.device.type == "cuda":
                stack.enter_context(_tf32(self.precision.tf32))
            if self.precision.mode == "autocast":
                stack.enter_context(
                    torch.autocast(
                        self.device.type, dtype=self.precision.torch_dtype, cache_enabled=False
                    )
                )
            yield

    def forward(self, f_s: Tensor, x_s: Tensor, x_d: Tensor) -> Tensor:
        """Warp then decode (no context)."""
        b = x_d.shape[0]
        feature = self.warp(f_s.expand(b, *f_s.shape[1:]), x_s, x_d)
        return self.decoder(feature)

    def __call__(self, f_s: Tensor, x_s: Tensor, x_d: Tensor) -> Tensor:
        with self.context():
            return self._core(f_s, x_s, x_d)

    def cast_inputs(self, f_s: Tensor, x_s: Tensor, x_d: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs in this path's input dtype (copies only where the dtype differs)."""
        dt = self.input_dtype
        return f_s.to(dt), x_s.to(dt), x_d.to(dt)


# --- FLOPs, matmul rate, inputs -----------------------------------------------------------------


def count_flops(warp: nn.Module, decoder: nn.Module, size: int = FEATURE_SIZE) -> dict[str, Any]:
    """FLOPs of one frame (batch 1, f_s maps ``size``²) per network, counted on meta copies.

    FlopCounterMode, the manifest's convention: 2 FLOPs per multiply-add; convolutions and
    matmuls counted, grid sampling, norms and elementwise work not.
    """
    w = copy.deepcopy(warp).to("meta")
    d = fold_spectral_norm(decoder).to("meta")
    f_s, x_s, x_d = (t.to("meta") for t in _example(w, 1, size))
    with torch.no_grad():
        with FlopCounterMode(display=False) as fw:
            feature = w(f_s, x_s, x_d)
        with FlopCounterMode(display=False) as fd:
            image = d(feature)
    return {
        "warp_network": int(fw.get_total_flops()),
        "decoder": int(fd.get_total_flops()),
        "per_frame": int(fw.get_total_flops() + fd.get_total_flops()),
        "feature": list(feature.shape[1:]),
        "output": list(image.shape[1:]),
    }


def _manifest_candidates() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    return [
        root / "shared" / "reference" / MANIFEST_NAME,
        root.parent / "shared" / "reference" / MANIFEST_NAME,
        Path("/work/shared/reference") / MANIFEST_NAME,
    ]


def manifest_flops(path: str | Path | None = None) -> dict[str, Any]:
    """Warp and decoder FLOPs per frame at :data:`MANIFEST_KEYS` of the reference manifest.

    Looks in ``shared/reference`` beside or above the checkout unless ``path`` is given; when
    no file is found, the values copied from it into this module are returned (``read_from``
    says which).
    """
    candidates = [Path(path)] if path else _manifest_candidates()
    out: dict[str, Any] = {"keys": dict(MANIFEST_KEYS)}
    for cand in candidates:
        if cand.is_file():
            data = json.loads(cand.read_text())
            for name, key in MANIFEST_KEYS.items():
                node: Any = data
                for part in key.split("."):
                    node = node[part]
                out[name] = int(node)
            out["read_from"] = str(cand)
            break
    else:
        out.update(_MANIFEST_COPY)
        out["read_from"] = "copy in studio.bench.render (manifest file not found here)"
    out["per_frame"] = out["warp_network"] + out["decoder"]
    return out


def matmul_rate(
    precision: Precision, device: torch.device, n: int, repeats: int, warmup: int = 2
) -> dict[str, Any]:
    """TFLOP/s of an n x n x n matmul in the precision's dtype (TF32 as the precision says)."""
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, n, generator=g).to(device, precision.torch_dtype)
    b = torch.randn(n, n, generator=g).to(device, precision.torch_dtype)
    c = torch.empty_like(a)
    ctx = _tf32(precision.tf32) if device.type == "cuda" else contextlib.nullcontext()
    with ctx, torch.no_grad():
        t = measure(lambda: torch.mm(a, b, out=c), device=device, repeats=repeats, warmup=warmup)
    return {
        "dtype": precision.dtype,
        "tf32": precision.tf32,
        "n": n,
        "median_ms": t.median_ms,
        "tflops": 2.0 * n**3 / (t.median_ms / 1e3) / 1e12,
    }


def _example(
    warp: nn.Module, batch: int, size: int = FEATURE_SIZE
) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded f_s [1, C, D, size, size] and keypoint pairs [batch, K, 3] (on the CPU)."""
    g = torch.Generator().manual_seed(batch)
    f_s = torch.randn(1, warp.reshape_channel, warp.reshape_depth, size, size, generator=g)
    x_s = (torch.rand(batch, warp.num_kp, 3, generator=g) * 2 - 1) * 0.6
    x_d = x_s + 0.05 * torch.randn(batch, warp.num_kp, 3, generator=g)
    return f_s, x_s, x_d


@dataclass
class _Inputs:
    """Rotating input sets on the device: one f_s per set, keypoint pairs per batch and set."""

    f_s: list[Tensor]
    x_s: dict[int, list[Tensor]]
    x_d: dict[int, list[Tensor]]

    @property
    def count(self) -> int:
        return len(self.f_s)

    def batch(self, b: int) -> list[tuple[Tensor, Tensor, Tensor]]:
        return [(self.f_s[k], self.x_s[b][k], self.x_d[b][k]) for k in range(self.count)]


def _make_inputs(
    warp: nn.Module, batches: Sequence[int], sets: int, size: int, seed: int, device: torch.device
) -> _Inputs:
    g = torch.Generator().manual_seed(seed + 17)
    c, d, k = warp.reshape_channel, warp.reshape_depth, warp.num_kp
    f_s = [torch.randn(1, c, d, size, size, generator=g).to(device) for _ in range(sets)]
    x_s: dict[int, list[Tensor]] = {}
    x_d: dict[int, list[Tensor]] = {}
    for b in batches:
        src = [(torch.rand(b, k, 3, generator=g) * 2 - 1) * 0.6 for _ in range(sets)]
        x_s[b] = [s.to(device) for s in src]
        x_d[b] = [(s + 0.05 * torch.randn(b, k, 3, generator=g)).to(device) for s in src]
    return _Inputs(f_s, x_s, x_d)


class _CacheFlush:
    """Overwrites a buffer twice the GPU's L2 size (untimed, before each run); no-op on CPU."""

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.buf: Tensor | None = None
        if enabled and device.type == "cuda":
            props = torch.cuda.get_device_properties(device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
            self.buf = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)

    @property
    def bytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * 4

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf.zero_()


# --- measuring -------------------------------------------------------------------------------


def _timed(
    fn: Callable[[], object],
    setup: Callable[[int], None],
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
) -> Timing:
    """``measure`` with the given repeats, or enough for about ``target_ms`` (3..20)."""
    if repeats is not None:
        return measure(fn, device=device, repeats=repeats, warmup=warmup, setup=setup)
    probe = measure(fn, device=device, repeats=1, warmup=warmup, setup=setup)
    reps = math.ceil(target_ms / max(probe.median_ms, 1e-3))
    reps = max(MIN_REPEATS, min(MAX_REPEATS, reps))
    return measure(fn, device=device, repeats=reps, warmup=0, setup=setup)


def _point(timing: Timing, batch: int, flops: int, rate_tflops: float | None) -> dict[str, Any]:
    ms = timing.median_ms
    fps = batch / (ms / 1e3) if ms > 0 else math.inf
    tflops = flops * fps / 1e12
    rec = {
        **timing.to_dict(),
        "fps": fps,
        "ms_per_frame": ms / batch,
        "tflops": tflops,
        "matmul_tflops": rate_tflops,
        "floor_ms_per_frame": flops / (rate_tflops * 1e12) * 1e3 if rate_tflops else None,
        "floor_fraction": tflops / rate_tflops if rate_tflops else None,
    }
    return rec


class _Runner:
    """How one batch of a path is run: ``setup(i)`` (untimed) then ``fn()``; ``render(k)``
    returns a copy of the images of input set ``k``."""

    def __init__(
        self,
        wd: WarpDecode,
        sets: list[tuple[Tensor, Tensor, Tensor]],
        graph: bool,
        flush: _CacheFlush,
    ) -> None:
        self.wd, self.sets, self.flush = wd, sets, flush
        self.k = 0
        self.graph: Any = None
        self.out: Tensor | None = None
        self.static: list[Tensor] | None = None
        if graph:  # static input buffers, filled before each replay
            static = self.static = [t.clone() for t in sets[0]]
            self.setup(0)
            self.graph, self.out = capture_graph(lambda: wd(*static))

    def setup(self, i: int) -> None:
        self.k = i % len(self.sets)
        if self.static is not None:
            for dst, src in zip(self.static, self.sets[self.k], strict=True):
                dst.copy_(src)
        self.flush()

    def fn(self) -> object:
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return self.wd(*self.sets[self.k])

    def render(self, k: int) -> Tensor:
        self.setup(k)
        if self.out is not None:
            self.out.fill_(float("nan"))  # every element must be rewritten by the replay
        out = self.fn()
        assert isinstance(out, Tensor)
        return out.clone()


def _run_batch(
    runner: _Runner,
    batch: int,
    ref: list[Tensor] | None,
    flops: int,
    rate: float | None,
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
    reference: bool = False,
) -> tuple[dict[str, Any], list[Tensor]]:
    """One (path, batch) point: timing, throughput, FLOP floor, accuracy against ``ref``
    (``reference``: against a second run of itself); (point, the reference images)."""
    n = len(runner.sets)
    timing = _timed(runner.fn, runner.setup, device, repeats, warmup, target_ms)
    images = [runner.render(k) for k in range(n)]
    point = _point(timing, batch, flops, rate)
    if reference:  # the reference, against a second run of itself
        ref, images = images, [runner.render(k) for k in range(n)]
    if ref is not None:
        point.update(worst([compare(a, r) for a, r in zip(images, ref, strict=True)]))
    else:
        point.update(cosine=None, rel_l2=None, finite=None, accuracy="no reference at this batch")
    point["status"] = "ok"
    return point, images if ref is None else ref


def _run_path(
    spec: RenderPath,
    wd: WarpDecode,
    inputs: _Inputs,
    batches: Sequence[int],
    refs: dict[int, list[Tensor]] | None,
    flops: int,
    rate: float | None,
    flush: _CacheFlush,
    device: torch.device,
    repeats: int | None,
    warmup: int,
    target_ms: float,
) -> tuple[dict[str, Any], dict[int, list[Tensor]]]:
    """Time one path at every batch; (record, the images per batch and set when ``refs`` is
    None: the reference path)."""
    out_images: dict[int, list[Tensor]] = {}
    per_batch: dict[str, Any] = {}
    for b in batches:
        try:
            sets = [wd.cast_inputs(*s) for s in inputs.batch(b)]
            runner = _Runner(wd, sets, spec.graph, flush)
            point, images = _run_batch(
                runner,
                b,
                None if refs is None else refs.get(b),
                flops,
                rate,
                device,
                repeats,
                warmup,
                target_ms,
                reference=refs is None,
            )
            per_batch[str(b)] = point
            if refs is None:
                out_images[b] = images
            del runner, sets, images
        except Exception as e:  # out of memory at a large batch, a missing kernel, ...
            synchronize(device)
            per_batch[str(b)] = {"status": "error", "reason": _reason(e)}
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
    ok = [r for r in per_batch.values() if is_ok(r)]
    rec: dict[str, Any] = {"status": "ok" if ok else "error", "batches": per_batch}
    if not ok:
        rec["reason"] = next(iter(per_batch.values()))["reason"] if per_batch else "no batches"
    return rec, out_images


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _path_settings(spec: RenderPath, precision: Precision, layout: str) -> dict[str, Any]:
    weights = precision.dtype if precision.mode == "cast" else "float32"
    return {
        **asdict(spec),
        "layout": layout,
        "dtype": precision.dtype,
        "mode": precision.mode,
        "tf32": precision.tf32,
        "weights": weights,
        "decoder": "as loaded (spectral-norm layout)" if spec.reference else "spectral norm folded",
        "graph": "warp+decode captured per batch size, static buffers" if spec.graph else False,
    }


# --- the suite -----------------------------------------------------------------------------


def run_render_suite(
    device: str = "cuda",
    batches: Sequence[int] = DEFAULT_BATCHES,
    precisions: Sequence[str] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    reduced: bool = False,
    feature_size: int = FEATURE_SIZE,
    seed: int = 0,
    input_sets: int = 3,
    compile: bool = False,
    compile_mode: str = COMPILE_MODE,
    paths: Sequence[str] | None = None,
    matmul_size: int | None = None,
    target_ms: float = TARGET_MS,
    cudnn_benchmark: bool = True,
    flush_cache: bool = True,
    manifest: str | Path | None = None,
    profile: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure warp+decode per path and batch; a JSON-ready dict (see the module docstring).

    ``precisions`` None: all of :data:`PRECISIONS` on CUDA, fp32 on the CPU. ``paths`` limits
    the paths run (``eager_fp32`` always runs). ``repeats`` None: automatic (``target_ms``);
    ``warmup`` None: 2 on CUDA, 1 on the CPU. Keys: suite, facts, config, flops, matmul,
    published, targets, paths (name -> status, settings, batches[str(B)]), summary, notes;
    on CUDA with ``profile``, also profile (:func:`profile_networks` at fp16, largest batch).
    """
    say = progress or (lambda _line: None)
    dev = torch.device(device)
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch sees no CUDA device (use --device cpu)")
    if feature_size < 32 or feature_size % 32:
        raise ValueError(
            f"feature size must be a multiple of 32 (the hourglass), got {feature_size}"
        )
    batches = tuple(int(b) for b in batches)
    precisions = tuple(precisions or (CUDA_PRECISIONS if dev.type == "cuda" else CPU_PRECISIONS))
    plan = plan_paths(precisions, device, compile)
    known = [p.name for p in plan_paths(tuple(PRECISIONS), device, True)]
    if paths is not None:
        unknown = set(paths) - set(known)
        if unknown:
            raise ValueError(f"unknown paths {sorted(unknown)}; known here: {', '.join(known)}")
        plan = [p for p in plan if p.reference or p.name in set(paths)]
    warmup = (2 if dev.type == "cuda" else 1) if warmup is None else warmup
    matmul_n = matmul_size or (8192 if dev.type == "cuda" else 1024)

    warp_cpu = random_network("warp_network", reduced=reduced, seed=seed)
    decoder_cpu = random_network("decoder", reduced=reduced, seed=seed)
    counted = count_flops(warp_cpu, decoder_cpu, feature_size)
    released = not reduced and feature_size == FEATURE_SIZE
    man = manifest_flops(manifest)
    flops = counted["per_frame"]
    warp = warp_cpu.to(dev)
    decoder = decoder_cpu.to(dev)
    inputs = _make_inputs(warp, batches, input_sets, feature_size, seed, dev)
    flush = _CacheFlush(dev, flush_cache)
    bench_before = torch.backends.cudnn.benchmark
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = cudnn_benchmark
        torch.cuda.reset_peak_memory_stats(dev)

    result: dict[str, Any] = {
        "suite": "render",
        "facts": {**device_facts(dev), "date": utc_now(), "commit": git_commit()},
        "config": {
            "batches": list(batches),
            "precisions": list(precisions),
            "repeats": repeats,
            "repeats_rule": f"automatic: about {target_ms:.0f} ms of timed runs, "
            f"{MIN_REPEATS}..{MAX_REPEATS}"
            if repeats is None
            else "fixed",
            "warmup": warmup,
            "input_sets": input_sets,
            "reduced": reduced,
            "feature_size": feature_size,
            "output": counted["output"],
            "seed": seed,
            "compile": compile,
            "compile_mode": compile_mode if compile else None,
            "cudnn_benchmark": cudnn_benchmark if dev.type == "cuda" else None,
            "l2_flush_bytes": flush.bytes,
            "inputs": "per set: one f_s [1, C, D, H, W] expanded to the batch (as the Ditto "
            "engine does), x_s and x_d [B, 21, 3] per frame",
            "models": {
                name: {
                    "parameters": sum(p.numel() for p in m.parameters()),
                    "kwargs": network_spec(name).reduced_kwargs if reduced else "released",
                    "weights": "random (seeded), studio.fixtures.random_tree.random_network",
                }
                for name, m in (("warp_network", warp), ("decoder", decoder))
            },
            "timing": "CUDA events per run, synced at the run boundary; median of repeats"
            if dev.type == "cuda"
            else "perf_counter per run; median of repeats",
        },
        "flops": {
            "per_frame": flops,
            "counted": counted,
            "counted_with": "torch.utils.flop_counter.FlopCounterMode on meta copies at batch 1 "
            "(2 FLOPs per multiply-add; convolutions; grid sampling and norms not counted)",
            "manifest": man,
            "released_sizes": released,
            "matches_manifest": counted["per_frame"] == man["per_frame"] if released else None,
        },
        "matmul": {},
        "published": PUBLISHED,
        "targets": TARGETS,
        "paths": {},
        "notes": [],
    }

    rates: dict[tuple[str, bool], dict[str, Any]] = {}
    for name in precisions:
        p = PRECISIONS[name]
        key = (p.dtype, p.tf32)
        if key not in rates:
            try:
                rates[key] = matmul_rate(
                    p, dev, matmul_n, repeats or (10 if dev.type == "cuda" else 3)
                )
            except Exception as e:
                rates[key] = {"dtype": p.dtype, "tf32": p.tf32, "n": matmul_n, "error": _reason(e)}
        result["matmul"][name] = rates[key]
    say(
        "[render] matmul TFLOP/s: "
        + ", ".join(f"{k} {v.get('tflops', float('nan')):.2f}" for k, v in result["matmul"].items())
    )
    if "fp32" not in result["matmul"]:
        result["matmul"]["fp32"] = matmul_rate(PRECISIONS["fp32"], dev, matmul_n, repeats or 3)

    refs: dict[int, list[Tensor]] = {}
    eager_layout: dict[str, dict[str, float]] = {}  # precision -> layout -> fps at largest batch
    try:
        for spec in plan:
            precision = PRECISIONS[spec.precision]
            rate = result["matmul"][spec.precision].get("tflops")
            layout = spec.layout
            if layout == "auto":
                seen = eager_layout.get(spec.precision, {})
                layout = max(seen, key=seen.get) if seen else "contiguous"
            settings = _path_settings(spec, precision, layout)
            if spec.layout == "auto":
                settings["layout_rule"] = "the faster eager layout at the largest batch"
            if spec.graph and dev.type != "cuda":
                result["paths"][spec.name] = {"status": "skipped", "reason": "needs --device cuda"}
                continue
            started = time.perf_counter()
            wd: WarpDecode | None = None
            try:
                wd = WarpDecode(
                    warp,
                    decoder,
                    precision,
                    dev,
                    layout=layout,
                    reference=spec.reference,
                    compile=spec.compile,
                    compile_mode=compile_mode,
                    pad=spec.pad,
                    split=spec.split,
                )
                rec, images = _run_path(
                    spec,
                    wd,
                    inputs,
                    batches,
                    None if spec.reference else refs,
                    flops,
                    rate,
                    flush,
                    dev,
                    repeats,
                    warmup,
                    target_ms,
                )
            except Exception as e:
                synchronize(dev)
                rec, images = {"status": "error", "reason": _reason(e)}, {}
            if spec.reference:
                refs = images
                if not is_ok(rec):
                    raise RuntimeError(f"the fp32 eager reference failed: {rec.get('reason')}")
            settings["path_s"] = round(time.perf_counter() - started, 1)
            rec["settings"] = settings
            result["paths"][spec.name] = rec
            if not spec.graph and not spec.pad and not spec.split and is_ok(rec):
                ok_b = [int(b) for b, r in rec["batches"].items() if is_ok(r)]
                largest = str(max(ok_b))
                eager_layout.setdefault(spec.precision, {})[layout] = rec["batches"][largest]["fps"]
            say(_progress_line(spec.name, rec))
            del wd  # the path's weight copies and graph pools go before the next path
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if profile and dev.type == "cuda":
            # as loaded, then with the render engines' rewrites (depth split, padded channels)
            for key, rewrite in (("profile", False), ("profile_rewritten", True)):
                try:
                    result[key] = profile_networks(
                        warp,
                        decoder,
                        PRECISIONS["fp16"],
                        dev,
                        inputs,
                        max(batches),
                        PAD_MULTIPLE if rewrite else 0,
                        rewrite,
                    )
                except Exception as e:  # out of memory, a profiler without CUDA activity, ...
                    result[key] = {"error": _reason(e)}
    finally:
        if dev.type == "cuda":
            torch.backends.cudnn.benchmark = bench_before
    if dev.type == "cuda":
        result["facts"]["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
    else:
        result["notes"].append(
            "CUDA graph and torch.compile paths need --device cuda; on the CPU only eager "
            "and channels-last paths run"
        )
    if not compile and dev.type == "cuda":
        result["notes"].append("torch.compile paths not run (--compile measures them)")
    result["summary"] = _summary(result)
    return result


RENDER_KERNELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("grid sampling", ("grid_sampler",)),
    ("convolution / GEMM", ("conv", "implicit", "xmma", "cutlass", "gemm", "nvjet", "sm90_")),
    ("normalisation", ("norm", "welford")),
    ("triton (fused)", ("triton",)),
    ("upsample / pixel shuffle", ("upsample", "pixel_shuffle", "interpolate")),
    ("copy / layout", ("copy", "nchw", "nhwc", "cat", "memcpy", "memset", "fill")),
    ("reduction", ("reduce", "softmax")),
)


def profile_networks(
    warp: nn.Module,
    decoder: nn.Module,
    precision: Precision,
    device: torch.device,
    inputs: _Inputs,
    batch: int,
    pad: int = 0,
    split: bool = False,
) -> dict[str, Any]:
    """Where a batch's time goes: the kernels of the warp network and of the decoder, each run
    once eagerly (spectral norm folded, ``precision``, conv channels padded to ``pad``, the
    deep 3-D convolution depth-split with ``split``) after a warm-up, by kind of kernel."""
    wd = WarpDecode(warp, decoder, precision, device, pad=pad, split=split)
    f_s, x_s, x_d = wd.cast_inputs(*inputs.batch(batch)[0])
    f_b = f_s.expand(batch, *f_s.shape[1:])
    with wd.context():
        feature = wd.warp(f_b, x_s, x_d)
        for _ in range(2):
            wd.decoder(wd.warp(f_b, x_s, x_d))
        nets = {
            "warp_network": kernel_profile(lambda: wd.warp(f_b, x_s, x_d), device, RENDER_KERNELS),
            "decoder": kernel_profile(lambda: wd.decoder(feature), device, RENDER_KERNELS),
        }
    return {
        "precision": precision.name,
        "batch": batch,
        "pad": pad,
        "split": split,
        "networks": nets,
        "ms_per_frame": {n: p["kernel_ms"] / batch for n, p in nets.items()},
    }


def _profile_markdown(prof: dict[str, Any]) -> list[str]:
    padded = f", channels padded to {prof['pad']}" if prof.get("pad") else ""
    padded = (", mask depth-split" if prof.get("split") else "") + padded
    title = f"### Where the time goes: eager {prof.get('precision')}, B={prof.get('batch')}{padded}"
    out = ["", title, ""]
    if prof.get("error"):
        return [*out, f"Profile failed: {prof['error']}"]
    per = prof["ms_per_frame"]
    out.append(
        "Summed kernel time per frame: "
        + ", ".join(f"{n} {fmt(v, 3)} ms" for n, v in per.items())
        + f" (total {fmt(sum(per.values()), 3)} ms)."
    )
    for name, p in prof["networks"].items():
        out += ["", f"**{name}** ({p['kernels']} kernels, {fmt(p['kernel_ms'], 2)} ms)", ""]
        out += table(
            ["kernel kind", "kernels", "ms", "share"],
            [
                [k, str(v["kernels"]), fmt(v["ms"], 3), f"{100 * v['ms'] / p['kernel_ms']:.0f}%"]
                for k, v in p["by_category"].items()
            ]
            if p["kernel_ms"] > 0
            else [],
        )
        out += [
            "",
            *table(
                ["top kernels", "count", "ms"],
                [
                    [f"`{t['name'][:80]}`".replace("|", "/"), str(t["count"]), fmt(t["ms"], 3)]
                    for t in p["top_kernels"][:6]
                ],
            ),
        ]
    return out


def _progress_line(name: str, rec: dict[str, Any]) -> str:
    if not is_ok(rec):
        return f"[render] {name}: {rec['status']}: {rec.get('reason')}"
    cells = ", ".join(
        f"B={b} {r['fps']:.1f} fps cos {fmt_cos(r.get('cosine'))}"
        if is_ok(r)
        else f"B={b} {r['status']}"
        for b, r in rec["batches"].items()
    )
    return f"[render] {name}: {cells}"


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """Best path per batch, speed-ups over our fp32 eager, the best overall and the target."""
    paths = result["paths"]
    eager = paths["eager_fp32"]["batches"]
    best: dict[str, Any] = {}
    speedups: dict[str, dict[str, float]] = {}
    for name, rec in paths.items():
        if not is_ok(rec) or name == "eager_fp32":
            continue
        speedups[name] = {
            b: r["fps"] / eager[b]["fps"]
            for b, r in rec["batches"].items()
            if is_ok(r) and is_ok(eager.get(b, {}))
        }
    overall: dict[str, Any] | None = None
    for b in (str(x) for x in result["config"]["batches"]):
        cands = [
            (rec["batches"][b]["fps"], name, rec["batches"][b])
            for name, rec in paths.items()
            if is_ok(rec) and is_ok(rec["batches"].get(b, {}))
        ]
        accurate = [c for c in cands if (c[2].get("cosine") or 0.0) >= ACCURATE_COSINE]
        pool = accurate or cands
        if not pool:
            continue
        fps, name, r = max(pool, key=lambda c: c[0])
        best[b] = {
            "path": name,
            "fps": fps,
            "ms_per_frame": r["ms_per_frame"],
            "floor_fraction": r.get("floor_fraction"),
            "cosine": r.get("cosine"),
            "speedup_vs_eager": fps / eager[b]["fps"] if is_ok(eager.get(b, {})) else None,
            "meets_cosine": bool(accurate),
        }
        if overall is None or fps > overall["fps"]:
            overall = {"batch": int(b), **best[b]}
    summary: dict[str, Any] = {"best": best, "speedup_vs_eager": speedups, "best_overall": overall}
    out = result["config"]["output"]
    side_ok = out[-1] == TARGETS["side"] and out[-2] == TARGETS["side"]
    if overall is not None:
        base = eager.get(str(overall["batch"]), {})
        eager_fps = base["fps"] if is_ok(base) else None
        goal = TARGETS["render_loop_fps"]
        summary["vs_published_warp_decode"] = overall["fps"] / PUBLISHED["warp_decode_fps"]
        summary["targets"] = [
            {
                "target": f">= {goal:.0f} FPS at {TARGETS['side']}² (warp+decode alone; the "
                "render loop adds stitching and paste-back: pipeline suite)",
                "ours": overall["fps"],
                "path": overall["path"],
                "batch": overall["batch"],
                "met": bool(side_ok and overall["fps"] >= goal),
                "evaluated": side_ok,
                "needed_speedup_vs_eager": goal / eager_fps if eager_fps else None,
                "achieved_speedup_vs_eager": overall["fps"] / eager_fps if eager_fps else None,
            }
        ]
    else:
        summary["targets"] = "not evaluated: no path was measured"
    return summary


# --- reporting -----------------------------------------------------------------------------


def to_markdown(result: dict[str, Any]) -> str:
    """Markdown tables: frames/s, ms/frame, FLOP-floor fraction, accuracy, beside the published."""
    facts, cfg, paths = result["facts"], result["config"], result["paths"]
    keys = [str(b) for b in cfg["batches"]]
    ok = {n: r for n, r in paths.items() if is_ok(r)}
    pub, fl = result["published"], result["flops"]
    man = fl["manifest"]
    out_side = "x".join(str(v) for v in cfg["output"][1:])
    size = "released" if not cfg["reduced"] else "reduced"
    out = [
        "## Render: warp network + decoder, batched",
        "",
        f"Measured on **{facts.get('name')}** (capability {facts.get('capability') or '–'}), "
        f"torch {facts.get('torch')}, CUDA {facts.get('cuda_runtime')}, "
        f"{facts.get('date')}, commit `{facts.get('commit')}`"
        + (f", command `{facts['command']}`" if facts.get("command") else "")
        + ".",
        f"Random weights, {size} architecture (warp network "
        f"{cfg['models']['warp_network']['parameters']:,} and decoder "
        f"{cfg['models']['decoder']['parameters']:,} parameters), feature maps "
        f"{cfg['feature_size']}², output {out_side}; {cfg['timing']}; repeats "
        f"{cfg['repeats_rule'] if cfg['repeats'] is None else cfg['repeats']}; "
        f"{cfg['input_sets']} rotating input sets"
        + (
            f", L2 flushed before each run ({cfg['l2_flush_bytes'] // 2**20} MiB)"
            if cfg["l2_flush_bytes"]
            else ""
        )
        + ".",
        "",
        f"FLOPs per frame: **{fl['per_frame'] / 1e12:.4f} TFLOP** counted at these shapes "
        f"(warp {fl['counted']['warp_network'] / 1e9:,.1f} + decoder "
        f"{fl['counted']['decoder'] / 1e9:,.1f} GFLOP); the manifest "
        f"(`{man['keys']['warp_network']}` + `{man['keys']['decoder']}`, {man['read_from']}) "
        f"gives {man['per_frame'] / 1e12:.4f} TFLOP for the released sizes"
        + (
            f" ({'matches' if fl['matches_manifest'] else '**differs from**'} the count)."
            if fl["released_sizes"]
            else " (not these sizes)."
        ),
        f"Published ({pub['source']}): warp+decode {pub['warp_decode_ms']:,.0f} ms for the "
        f"{pub['clip_frames']}-frame clip = {pub['warp_decode_fps']:.1f} frames/s; render loop "
        f"{pub['render_loop_fps']} FPS. Target: >= {TARGETS['render_loop_fps']:.0f} FPS render "
        f"loop at {TARGETS['side']}².",
        "",
        "### Matrix rate of the same run (the FLOP floor's denominator)",
        "",
    ]
    rows = []
    for name, m in result["matmul"].items():
        rows.append(
            [
                name,
                m["dtype"] + (" (TF32)" if m.get("tf32") else ""),
                str(m["n"]),
                fmt(m.get("median_ms"), 3),
                fmt(m.get("tflops"), 2) if "tflops" in m else f"error: {m.get('error')}",
            ]
        )
    out += table(["precision", "matmul dtype", "n", "ms", "TFLOP/s"], rows)

    header = ["path", *(f"B={k}" for k in keys)]

    def cells(rec: dict[str, Any], field: str, digits: int) -> list[str]:
        row = []
        for k in keys:
            r = rec["batches"].get(k, {})
            row.append(fmt(r.get(field), digits) if is_ok(r) else ("error" if r else "–"))
        return row

    out += ["", "### Frames per second (median)", ""]
    out += table(header, [[n, *cells(r, "fps", 1)] for n, r in ok.items()])
    out += ["", "### ms per frame (median batch time / batch)", ""]
    out += table(header, [[n, *cells(r, "ms_per_frame", 3)] for n, r in ok.items()])
    out += [
        "",
        "### Fraction of the FLOP floor (conv TFLOP/s achieved / matmul TFLOP/s, same precision)",
        "",
    ]
    out += table(header, [[n, *cells(r, "floor_fraction", 3)] for n, r in ok.items()])
    out += ["", "### Speed-up over our fp32 eager (same batch, same run)", ""]
    rows = []
    for name, sp in result["summary"]["speedup_vs_eager"].items():
        rows.append([name, *(fmt(sp[k]) + "×" if k in sp else "–" for k in keys)])
    out += table(header, rows)
    out += ["", "### Images vs fp32 eager: cosine / relative L2 (worst input set)", ""]
    rows = []
    for name, rec in ok.items():
        row = []
        for k in keys:
            r = rec["batches"].get(k, {})
            row.append(
                f"{fmt_cos(r.get('cosine'))} / {fmt(r.get('rel_l2'), 6)}" if is_ok(r) else "–"
            )
        rows.append([name, *row])
    out += table(header, rows)

    out += ["", "### Beside the published figures", ""]
    summ = result["summary"]
    best = summ.get("best_overall")
    rows = [
        [
            "warp+decode frames/s",
            f"{pub['warp_decode_fps']:.1f}",
            f"{fmt(best['fps'], 1)} ({best['path']}, B={best['batch']})" if best else "–",
            fmt(summ.get("vs_published_warp_decode")) + "×" if best else "–",
        ],
        ["render loop FPS", f"{pub['render_loop_fps']}", "pipeline suite", "–"],
    ]
    out += table(["figure", "published", "ours (best accurate path)", "ours / published"], rows)
    targets = summ.get("targets")
    if isinstance(targets, list):
        out += [""]
        rows = []
        for t in targets:
            met = fmt(bool(t["met"])) if t.get("evaluated") else "not evaluated (not 512²)"
            ratio = (
                f"{fmt(t['achieved_speedup_vs_eager'])}× achieved, "
                f"{fmt(t['needed_speedup_vs_eager'])}× needed"
            )
            rows.append(
                [t["target"], fmt(t["ours"], 1), f"{t['path']}, B={t['batch']}", met, ratio]
            )
        out += table(["target", "ours", "path", "met", "vs our eager"], rows)

    others = {n: r for n, r in paths.items() if not is_ok(r)}
    errors = [
        (n, b, r.get("reason", ""))
        for n, rec in ok.items()
        for b, r in rec["batches"].items()
        if not is_ok(r)
    ]
    if others or errors:
        out += ["", "### Not measured", ""]
        rows = [
            [n, "all", r["status"], str(r.get("reason", "")).replace("|", "/")]
            for n, r in others.items()
        ]
        rows += [[n, f"B={b}", "error", str(why).replace("|", "/")] for n, b, why in errors]
        out += table(["path", "batch", "status", "reason"], rows)

    for key in ("profile", "profile_rewritten"):
        if result.get(key):
            out += _profile_markdown(result[key])

    out += ["", "### Settings per path", ""]
    rows = []
    for name, rec in ok.items():
        s = rec.get("settings", {})
        text = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("name", "reference"))
        rows.append([name, text.replace("|", "/")])
    out += table(["path", "settings"], rows)
    plots = result.get("plots")
    if plots:
        out += [""]
        if plots.get("files"):
            out += [f"![{Path(p).stem}]({Path(p).name})" for p in plots["files"]]
        else:
            out.append(f"Plots: {plots.get('skipped')}")
    notes = result.get("notes") or []
    if notes:
        out += ["", *(f"- {n}" for n in notes)]
    return "\n".join(out) + "\n"


def save_plots(result: dict[str, Any], folder: str | Path) -> dict[str, Any]:
    """PNG plots (frames/s and FLOP-floor fraction vs batch, per path) via matplotlib's Agg.

    Returns ``{"files": [...]}`` or ``{"files": [], "skipped": reason}``; also stored in
    ``result["plots"]``. matplotlib is not a dependency: without it nothing is drawn.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        info: dict[str, Any] = {"files": [], "skipped": f"matplotlib is not installed ({e})"}
        result["plots"] = info
        return info
    out_dir = Path(folder)
    out_dir.mkdir(parents=True, exist_ok=True)
    pub = result["published"]
    ok = {n: r for n, r in result["paths"].items() if is_ok(r)}
    files: list[str] = []

    def series(rec: dict[str, Any], field: str) -> list[tuple[int, float]]:
        return [
            (int(b), r[field])
            for b, r in rec["batches"].items()
            if is_ok(r) and r.get(field) is not None
        ]

    def finish(fig: Figure, name: str) -> None:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=120)
        files.append(str(path))

    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for name, rec in ok.items():
        pts = series(rec, "fps")
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=name)
    ax.axhline(pub["warp_decode_fps"], color="k", ls="--", lw=0.8, label="published warp+decode")
    ax.axhline(pub["render_loop_fps"], color="k", ls=":", lw=0.8, label="published render loop")
    ax.axhline(TARGETS["render_loop_fps"], color="r", lw=0.8, label="target render loop")
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="frames/s (median)")
    ax.set_xticks(result["config"]["batches"], [str(b) for b in result["config"]["batches"]])
    ax.set_title(f"Warp + decode throughput — {result['facts'].get('name')}")
    ax.legend(fontsize=7)
    finish(fig, "render_fps.png")

    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for name, rec in ok.items():
        pts = series(rec, "floor_fraction")
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=name)
    ax.set(xscale="log", xlabel="batch", ylabel="fraction of the FLOP floor")
    ax.set_xticks(result["config"]["batches"], [str(b) for b in result["config"]["batches"]])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    finish(fig, "render_floor_fraction.png")
    info = {"files": files}
    result["plots"] = info
    return info


# --- command line ------------------------------------------------------------------------


def _precision_list(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in PRECISIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"precisions must be some of {', '.join(PRECISIONS)}: {text}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    """The suite's command-line options (``studio bench --suite render`` maps onto these)."""
    p = argparse.ArgumentParser(
        prog="studio bench --suite render",
        description="Warp network + decoder throughput per batch, precision and path.",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if seen")
    p.add_argument("--json", metavar="OUT", help="write the full result as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the tables as Markdown")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (needs matplotlib)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per point (default: auto)")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs per point")
    p.add_argument(
        "--batches",
        type=lambda s: int_list(s, 1, MAX_BATCH, "batches"),
        default=DEFAULT_BATCHES,
        metavar="1,4,8,16,32",
    )
    p.add_argument(
        "--precisions",
        type=_precision_list,
        default=None,
        metavar="A,B",
        help=f"some of {', '.join(PRECISIONS)} (default: all on CUDA, fp32 on the CPU)",
    )
    p.add_argument("--paths", metavar="A,B", help="subset of the paths (eager_fp32 always runs)")
    p.add_argument("--reduced", action="store_true", help="narrow networks (smoke runs)")
    p.add_argument(
        "--feature-size",
        type=int,
        default=FEATURE_SIZE,
        help=f"f_s side, a multiple of 32 (default {FEATURE_SIZE}: 512² output)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-sets", type=int, default=3, help="rotating input sets")
    p.add_argument("--compile", action="store_true", help="also measure torch.compile paths")
    p.add_argument("--compile-mode", default=COMPILE_MODE, help=f"default {COMPILE_MODE}")
    p.add_argument("--matmul-size", type=int, default=None, help="n of the rate matmul")
    p.add_argument("--target-ms", type=float, default=TARGET_MS, help="timed ms per point (auto)")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="keep cuDNN heuristics")
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between runs")
    p.add_argument("--manifest", metavar="FILE", help=f"path of {MANIFEST_NAME}")
    p.add_argument("--no-profile", action="store_true", help="skip the kernel profile (CUDA)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite, write the outputs asked for, print the Markdown; 0, or 2 on errors."""
    args = build_parser().parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.repeats is not None and args.repeats < 1:
        print("--repeats must be >= 1", file=sys.stderr)
        return 2
    paths = [s.strip() for s in args.paths.split(",")] if args.paths else None
    try:
        result = run_render_suite(
            device=device,
            batches=args.batches,
            precisions=args.precisions,
            repeats=args.repeats,
            warmup=args.warmup,
            reduced=args.reduced,
            feature_size=args.feature_size,
            seed=args.seed,
            input_sets=max(1, args.input_sets),
            compile=args.compile,
            compile_mode=args.compile_mode,
            paths=paths,
            matmul_size=args.matmul_size,
            target_ms=args.target_ms,
            cudnn_benchmark=not args.no_cudnn_benchmark,
            flush_cache=not args.no_flush,
            manifest=args.manifest,
            profile=not args.no_profile,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (RuntimeError, ValueError, OSError) as e:
        print(f"studio bench render: {e}", file=sys.stderr)
        return 2
    given = list(sys.argv[1:] if argv is None else argv)
    result["facts"]["command"] = " ".join(["studio bench --suite render", *given])
    result["facts"]["argv"] = given
    if args.plots:
        info = save_plots(result, args.plots)
        if info.get("skipped"):
            print(f"plots skipped: {info['skipped']}", file=sys.stderr)
    text = to_markdown(result)
    write_outputs(result, text, args.json, args.markdown)
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
