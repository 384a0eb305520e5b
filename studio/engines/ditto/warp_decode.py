"""Warp + decode for the Ditto renderer on the runtime's engines (issue 6).

Both networks run as engines of the chosen runtime (torch by default:
:class:`~studio.runtime.torch_backend.TorchEngine`) at static batch sizes, each with its own
precision from :func:`~studio.runtime.base.parse_precision` (the released
set's fp16 on a GPU, fp32 on the CPU), the decoder with its spectral norm folded into plain
convolutions. Half precision casts the weights of both, once for the engines of every batch
size (grid sampling still runs in fp32): on the H200 that is 10% faster than the warp network
under autocast, at a cosine of 0.99995 to fp32 eager for the full-size networks
(docs/benchmarks.md, render suite).
On CUDA each engine is built with cuDNN's autotuner on (unless the work ahead is short:
:data:`AUTOTUNE_MIN_FRAMES`) and captured as a CUDA graph (the algorithms are fixed then, so
replays pay nothing for it), except a compiled artifact's engine
of a large batch (``torch_backend.UNCAPTURED_BATCH``), which runs as it is on the algorithms
the build chose; the avatar's f_s is written into the warp graph's static buffer (or a kept
copy) once per renderer, not copied per batch. Engines exist only for the batch
sizes of a short ladder (:func:`static_batch`: 1, 2, 4, 8, 16, 24, 32, ... up to the batch
cap), a shorter batch is padded to the next rung, and the engines of the least recently used
sizes are freed past :data:`MAX_BATCH_SIZES`: clips of any length reuse a few captured (and
compiled) graphs instead of building new ones for every length.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import Tensor, nn

from studio.errors import OptionError
from studio.models.channel_pad import TENSOR_CORE_MULTIPLE, pad_conv_channels
from studio.models.decoder import fold_spectral_norm
from studio.models.depth_split import split_deep_conv3d
from studio.models.warp_network import FEATURE_SIZE
from studio.runtime.base import HALF_DTYPES, EngineBase, SharedFlags, release_cached_memory
from studio.runtime.factory import make_engine
from studio.runtime.precision import parse_precision, precision_support
from studio.runtime.torch_backend import PrecisionAdapter

__all__ = [
    "HALF_MODES",
    "MAX_BATCH_SIZES",
    "RENDER_NETWORKS",
    "WarpDecodeEngines",
    "prebuild_rungs",
    "render_precisions",
    "static_batch",
]

RENDER_NETWORKS = ("warp_network", "decoder")
MAX_BATCH_SIZES = 4  # engines (graphs, compiled code) kept for this many batch sizes
HALF_MODES = ("cast", "autocast")  # the torch engines' policies for fp16/bf16
_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
AOT_DEFAULT = "compiled/aot under the cache root"  # aot_dir's default (None: no packages)


def prebuild_rungs(batch: int) -> list[int]:
    """The compiled rungs a renderer of ``batch`` uses, in the order to build them ahead: its
    batch first (every call of a quarter of it or more pads to it: :meth:`WarpDecodeEngines.
    batch_for`), then the ladder's rungs of shorter calls (a live session's keyframes). The
    rungs in between are never picked once the batch is built."""
    return [int(batch)] + [r for r in _LADDER if 4 * r < batch]


def static_batch(frames: int, cap: int) -> int:
    """The engine batch that renders ``frames`` (<= ``cap``): the next rung of the ladder,
    or ``cap`` itself when that is smaller."""
    n, cap = max(1, int(frames)), max(1, int(cap))
    if n >= cap:
        return cap
    return min(cap, next((r for r in _LADDER if r >= n), cap))


def _write_benchmark(on: bool) -> None:
    torch.backends.cudnn.benchmark = on


CUDNN_AUTOTUNE = SharedFlags(lambda: torch.backends.cudnn.benchmark, _write_benchmark)


# cuDNN's search for the fastest convolution kernels, at an engine's first calls, costs a new
# process about 2.4 s and makes compiled engines' frames about 4% faster (H100: 292.6 against
# 305.5 frames/s, build 2.39 s of torch.convolution in a warm render's profile,
# docs/benchmarks.md): it pays for itself from about 16,000 frames (11 minutes at 25 fps)
AUTOTUNE_MIN_FRAMES = 16_000


def _cudnn_autotune(device: torch.device, on: bool) -> contextlib.AbstractContextManager[None]:
    """cuDNN's autotuner on or off while engines are built on a GPU (held: it is
    process-wide)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return CUDNN_AUTOTUNE.hold(on)


def render_precisions(precision: str, runtime: str, device: torch.device) -> dict[str, str]:
    """The warp network's and the decoder's precision for a ``--precision`` value ("auto":
    the per-network defaults) on ``runtime`` and ``device``: what :class:`WarpDecodeEngines`
    runs, and what memory plans and reports read. OptionError (naming ``--runtime``) for a
    runtime that cannot run on the device, or (``--precision``) a precision it cannot run."""
    dev = torch.device(device)
    why = precision_support(runtime, dev).get("fp32")
    if why is not None:
        raise OptionError("--runtime", f"{runtime} cannot run on {dev} here: {why}")
    spec = None if precision == "auto" else precision
    plan = parse_precision(spec, runtime, dev, option="--precision", networks=RENDER_NETWORKS)
    return {n: plan.of(n) for n in RENDER_NETWORKS}


class WarpDecodeEngines:
    """f_s, x_s, x_d -> RGB in [0, 1] (fp32, [B, 3, 512, 512]) on engines built per batch size.

    ``precision`` is the render setting: ``auto`` (per-network defaults), ``fp32``, ``fp16``
    or ``bf16``; ``compile`` runs both through ``torch.compile`` inside the graphs (CUDA
    only: on the CPU it is ignored and :attr:`compiled` says so); ``runtime`` is the engine
    backend (torch, onnxruntime or tensorrt; CUDA graphs and compile are torch's, and a
    runtime that cannot run here is an OptionError naming ``--runtime``); ``channel_pad``
    zero-pads convolution channels to that multiple (:mod:`studio.models.channel_pad`) and
    ``depth_split`` runs the 7x7x7 mask convolution over depth slices
    (:mod:`studio.models.depth_split`); both the same arithmetic up to rounding, by default on
    CUDA graphs only. The output of
    :meth:`__call__` is an engine's static buffer on CUDA: the next call overwrites it, so
    consume (or copy) it before rendering the next batch.

    Keyword-only knobs whose defaults are what the renderer runs (the render bench turns them
    to measure the alternatives on these same engines): ``cuda_graphs`` (None: on for torch on
    CUDA; False runs the engines eagerly, and then ``compile`` is off too); ``half_mode``, the
    torch engines' policy for fp16/bf16 (``cast``: weights cast once; ``autocast``: fp32
    weights under ``torch.autocast``); ``channels_last`` (torch: weights and inputs in
    channels-last layouts, 4-D and 3-D; each batch size's engines then hold their own copy of
    the weights); ``compile_mode`` (``torch.compile``'s mode); ``feature_size`` (None: the
    product's f_s side; the decoder's static input, which must match the maps the warp
    network's ``example_inputs`` give); ``aot_dir``: where compiled engines are kept as
    AOTInductor packages (:mod:`studio.runtime.aot_cache`: built by the first compiled run,
    loaded by later processes in a fraction of a second; None compiles in process each time).
    """

    def __init__(
        self,
        warp: nn.Module,
        decoder: nn.Module,
        precision: str,
        device: torch.device,
        compile: bool = False,
        runtime: str = "torch",
        channel_pad: int | None = None,
        depth_split: bool | None = None,
        *,
        cuda_graphs: bool | None = None,
        half_mode: str = "cast",
        channels_last: bool = False,
        compile_mode: str = "default",
        feature_size: int | None = None,
        aot_dir: str | Path | None = AOT_DEFAULT,
    ) -> None:
        self.device = torch.device(device)
        if aot_dir is AOT_DEFAULT:
            from studio.paths import compiled_cache_dir

            aot_dir = compiled_cache_dir() / "aot"
        self.aot_dir = aot_dir
        self.runtime = runtime
        self.precisions = render_precisions(precision, runtime, self.device)
        torch_runtime = runtime == "torch"
        if half_mode not in HALF_MODES:
            raise ValueError(f"half_mode must be one of {', '.join(HALF_MODES)}, not {half_mode}")
        if not torch_runtime and (half_mode != "cast" or channels_last):
            raise ValueError(
                f"half_mode and channels_last are the torch runtime's, not {runtime}'s"
            )
        self.cuda = self.device.type == "cuda"
        # engines built from now on tune cuDNN's kernels (a renderer with a short clip ahead
        # turns it off: DittoRenderer.build_engines)
        self.autotune = True
        self.graphs = self.cuda and torch_runtime and cuda_graphs is not False
        self.compiled = compile and self.graphs
        self.half_mode = half_mode
        self.channels_last = channels_last
        self.compile_mode = compile_mode
        folded = fold_spectral_norm(decoder)
        # the engine's static input is the warp's output
        folded.feature_size = FEATURE_SIZE if feature_size is None else feature_size
        if channel_pad is None:  # cuDNN on a GPU; ONNX Runtime and TensorRT pad for themselves
            channel_pad = TENSOR_CORE_MULTIPLE if self.graphs else 0
        self.channel_pad = channel_pad
        # cuDNN's deep 3-D kernel is the slow one (studio.models.depth_split)
        if depth_split is None:
            depth_split = self.graphs
        self.depth_split = depth_split
        if depth_split:
            warp = split_deep_conv3d(warp)  # a copy: the caller's network stays as it is
        if channel_pad:  # the split's copy and the fold's are ours to rewrite
            warp = pad_conv_channels(warp, channel_pad, inplace=depth_split)
            folded = pad_conv_channels(folded, channel_pad, inplace=True)
        self._modules = {"warp_network": warp, "decoder": folded}
        self._adapters: dict[str, nn.Module] = {}
        self._engines: dict[int, dict[str, EngineBase]] = {}
        # batch -> (the avatar's f_s, the batch's features made of it: the graph's buffer, or
        # on engines without one a contiguous copy, so no call expands it again)
        self._f_s: dict[int, tuple[Tensor, Tensor]] = {}

    def describe(self) -> dict[str, object]:
        """What runs, for reports: runtime, per-network precision, CUDA graphs (False, or the
        batch sizes whose engines replay one: a compiled artifact's large batch runs without),
        torch.compile, cuDNN's kernel search."""
        return {
            "runtime": self.runtime,
            "precision": dict(self.precisions),
            "cuda_graphs": self.graphs
            and sorted(b for b, e in self._engines.items() if all(x.captured for x in e.values())),
            "compiled": self.compiled,
            "compiled_packages": sorted(
                {getattr(e, "aot", "off") for eng in self._engines.values() for e in eng.values()}
            ),
            "channel_pad": self.channel_pad,
            "depth_split": self.depth_split,
            "cudnn_autotune": self.cuda and self.autotune,  # for engines built from now on
        }

    def engines(self, batch: int) -> dict[str, EngineBase]:
        """The (cached) warp and decoder engines for ``batch``; captured on CUDA (see the
        module's docstring for the exception)."""
        if batch in self._engines:
            self._engines[batch] = self._engines.pop(batch)  # most recently used last
        else:
            while len(self._engines) >= MAX_BATCH_SIZES:
                oldest = next(iter(self._engines))
                del self._engines[oldest]
                self._f_s.pop(oldest, None)
                if self.cuda:
                    release_cached_memory()
            built: dict[str, EngineBase] = {}
            with _cudnn_autotune(self.device, self.autotune):
                for name in RENDER_NETWORKS:
                    built[name] = make_engine(
                        name,
                        self.runtime,
                        self.precisions[name],
                        self.device,
                        module=self._module(name),
                        batch=batch,
                        cuda_graph=self.graphs,
                        **self._options(name),
                    )
            self._engines[batch] = built
        return self._engines[batch]

    def batch_for(self, frames: int, cap: int) -> int:
        """The engine batch for ``frames``: a built rung up to twice the ladder's, else the
        ladder's (so preview and export batches share engines instead of evicting them).
        Compiled engines take any built rung up to ``cap`` for a quarter of it or more (a
        clip's last batch): compiling another costs seconds from the caches and a minute
        without, padding it a few milliseconds. Smaller calls (a live session's one or two
        keyframes) keep rungs of their own: padded to the cap each would cost 10x.
        """
        want = static_batch(frames, cap)
        long = self.compiled and 4 * want >= cap
        reach = max(cap, 2 * want) if long else 2 * want
        built = [b for b in self._engines if want <= b <= reach]
        return min(built) if built else want

    def _module(self, name: str) -> nn.Module:
        """The network for a new engine: on torch one precision adapter per network (its
        weights cast once), shared by the engines of every batch size."""
        if self.runtime != "torch" or self.channels_last:  # channels-last engines copy it
            return self._modules[name]
        if name not in self._adapters:
            mode = self._options(name)["mode"]
            self._adapters[name] = PrecisionAdapter(
                name, self._modules.pop(name), self.precisions[name], self.device, mode
            ).eval()  # the adapter holds what it needs: no extra fp32 copy stays behind
        return self._adapters[name]

    def _options(self, name: str) -> dict[str, object]:
        if self.runtime != "torch":
            return {}
        half = self.precisions[name] in HALF_DTYPES
        options: dict[str, object] = {
            "compile": self.compiled,
            "mode": self.half_mode if half else None,
        }
        if self.compiled and self.compile_mode != "default":
            options["compile_mode"] = self.compile_mode
        if self.compiled and self.aot_dir is not None:  # compiled once, loaded by later runs
            options["aot_dir"] = self.aot_dir
            options["aot_build"] = True
        if self.channels_last:
            options["channels_last"] = True
        return options

    def load_avatar(self, f_s: Tensor, batch: int) -> None:
        """Write the avatar's f_s [1, C, D, H, W] into the engines of ``batch`` (built here if
        need be) now rather than at the next call, which does it for a new f_s anyway: a caller
        that times calls keeps this once-per-avatar copy out of them."""
        self._features(self.engines(batch)["warp_network"], f_s, batch)

    def __call__(self, f_s: Tensor, x_s: Tensor, x_d: Tensor, batch: int) -> Tensor:
        """Render ``x_d.shape[0] <= batch`` frames of the avatar ``f_s`` [1, C, D, H, W] (an
        image), or of one feature volume per frame (``f_s`` [b, C, D, H, W]: a video avatar's
        frames for these rows)."""
        b = x_d.shape[0]
        if not 0 < b <= batch:
            raise ValueError(f"{b} frames do not fit a batch of {batch}")
        if b < batch:  # pad with the last frame; the padding is rendered and dropped
            x_s = torch.cat((x_s, x_s[-1:].expand(batch - b, -1, -1)))
            x_d = torch.cat((x_d, x_d[-1:].expand(batch - b, -1, -1)))
        eng = self.engines(batch)
        warp = eng["warp_network"]
        # cuDNN's choices were fixed when the engines were built (autotuned there)
        feature = warp.run(
            {
                "feature_3d": self._features(warp, f_s, batch),
                "kp_source": x_s,
                "kp_driving": x_d,
            }
        )["out"]
        image = eng["decoder"].run({"feature": feature})["output"]
        return image[:b]

    def _features(self, warp: EngineBase, f_s: Tensor, batch: int) -> Tensor:
        """f_s for every frame of the batch, written once per avatar and batch size: into the
        graph's own buffer, or (ONNX Runtime, TensorRT) a contiguous copy kept for the calls."""
        held = self._f_s.get(batch)
        if held is not None and held[0] is f_s:
            return held[1]
        b = f_s.shape[0]
        static = getattr(warp, "static_inputs", None)
        buf = static["feature_3d"] if static else f_s.new_empty((batch, *f_s.shape[1:]))
        # an image's f_s in every row; per frame (a video) its rows, padded with the last,
        # written straight into the buffer (no padded copy first)
        buf[:b].copy_(f_s)
        buf[b:].copy_(f_s[-1:].expand(batch - b, *f_s.shape[1:]))
        if b == 1:
            self._f_s[batch] = (f_s, buf)
        else:
            self._f_s.pop(batch, None)  # the buffer no longer holds an image's features
        return buf
