"""The Ditto engine: HuBERT, condition, LMDM motion; then stitch, warp, decode, paste-back.

It plugs into the same pipeline as the demo engine (:mod:`studio.render.pipeline`):
:meth:`DittoEngine.generate` makes the clip's [N, 265] motion, :meth:`DittoEngine.renderer`
returns a :class:`DittoRenderer` that turns motion rows into frames in batches on the device.
Networks are loaded once per checkpoint folder and device and shared by every engine.

Precision (the released set's choice): HuBERT and LMDM run in fp32; warp and decoder run in
fp16 on a GPU (weights cast; grid sampling stays fp32) and fp32 on the CPU, as the runtime's
engines (:mod:`studio.engines.ditto.warp_decode`): a few static batch sizes, CUDA graphs.
Frames come back through double-buffered pinned host memory, one chunk behind the GPU, so it
renders the next chunk while the host blends and encodes the last one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from studio.audio.features import ChunkGeometry, HubertFeatures
from studio.audio.io import Audio
from studio.audio.phonetics import PhoneticFrames
from studio.avatar.folder import avatar_source
from studio.avatar.image import load_image
from studio.avatar.putback import FramePasteBack, PasteBack, paste_mask
from studio.avatar.register import REGISTRATION_ROLES, RegistrationSettings, register_avatar
from studio.avatar.video import MIN_VIDEO_FRAMES, VIDEO_FPS, is_video, read_video
from studio.engines.base import EngineRequest, InbetweenWarp, Prepared, Progress, Renderer
from studio.engines.ditto import CAPABILITIES
from studio.engines.ditto.crops import KeyframeCrops
from studio.engines.ditto.warp_decode import (
    AUTOTUNE_MIN_FRAMES,
    WarpDecodeEngines,
    render_precisions,
)
from studio.engines.ditto.warp_graphs import WarpGraphs
from studio.errors import InputError, OptionError
from studio.export.yuv import rgb_to_yuv420p
from studio.imports import import_aside
from studio.layout import MOTION_DIM, NUM_KP, motion_from_info
from studio.models.checkpoints import CheckpointSet, discover, load_cfg
from studio.motion.condition import (
    ConditionConfig,
    ConditionSource,
    assemble,
    emotion_from_weights,
    source_indices,
)
from studio.motion.fast_lmdm import graphs_made_ms
from studio.motion.generator import WindowMemo, generate_motion
from studio.motion.kinematics import SMOOTHING_MODULES
from studio.motion.live_lmdm import LiveMotion, live_plan
from studio.motion.stitch import StitchConfig, StitchControls, stitch_motion, video_config
from studio.readahead import read_ahead
from studio.runtime.aot_artifacts import LOADER_MODULES
from studio.runtime.base import HALF_DTYPES, resolve_device
from studio.runtime.precision import precision_support
from studio.settings import RenderSettings

CROP = 512  # the decoder's output side
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
MAX_AUTO_BATCH = 32
CPU_BATCH = 4
STREAMED_MAX_BATCH = 4
RENDER_CONFIGS = 2  # warp/decoder engine sets (runtime, precision, compile) kept per network set
# Working memory of warp + decode per frame of a batch (activations, fp32), with headroom;
# half precision needs about half. Used to pick a batch from free VRAM.
WORK_BYTES_PER_FRAME = 640 * 2**20
VRAM_FRACTION = 0.6  # of the free memory a batch may take
RESIDENT_MIN_FREE = 8 * 2**30  # below this much free VRAM, auto streams

# Files the engine needs (registration needs its own, see studio.avatar.register).
ENGINE_ROLES = ("hubert", "lmdm", "stitch_network", "warp_network", "decoder")
ALL_ROLES = (*REGISTRATION_ROLES, *ENGINE_ROLES)  # what an avatar + engine build reads
NETWORK_ROLES = ("lmdm", "stitch_network", "warp_network", "decoder")


# Stages reported through ``progress(stage, done, total)``: short, for people.
STAGE_LOADING = "loading networks"
STAGE_HUBERT = "HuBERT features"
STAGE_LMDM = "LMDM windows"
STAGE_ENGINES = "building engines"
_RUNTIME_NAMES = {"torch": "PyTorch", "onnxruntime": "ONNX Runtime", "tensorrt": "TensorRT"}


def require(checkpoints: CheckpointSet, roles: Sequence[str], layout: str = "pytorch") -> None:
    """InputError listing every missing or broken file of ``roles``, by name and stage."""
    problems = []
    for role in roles:
        try:
            checkpoints.path(role, layout)
        except InputError:
            status = next(f for f in checkpoints.missing(layout) if f.role == role)
            problems.append(checkpoints.describe(status))
    if problems:
        raise InputError(
            f"the Ditto engine cannot run from {checkpoints.root}: "
            + "; ".join(problems)
            + " (`studio doctor --checkpoints DIR` lists every file)"
        )


def render_dtype(precision: str, device: torch.device, runtime: str = "torch") -> torch.dtype:
    """The widest compute dtype of the warp network and decoder for a ``--precision`` value
    (the plan :class:`WarpDecodeEngines` runs, :func:`render_precisions`; fp32 for anything
    not a half type): memory plans size frames by it."""
    plan = render_precisions(precision, runtime, device)
    dtypes = [HALF_DTYPES.get(p, torch.float32) for p in plan.values()]
    return max(dtypes, key=lambda d: d.itemsize)


@dataclass(frozen=True)
class MemoryPlan:
    """Which memory mode runs and the batch size, with the reason (for the report)."""

    mode: str  # "resident" or "streamed"
    batch: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "batch": self.batch, "reason": self.reason}


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def plan_memory(
    mode: str, batch: int, device: torch.device, dtype: torch.dtype, free_bytes: int | None = None
) -> MemoryPlan:
    """Resolve ``--memory`` and ``--batch`` (0 = automatic) for ``device``.

    resident: the clip's stitched keypoints and each batch's frames stay on the device, and
    batches are as large as free memory allows; streamed: keypoints per batch, small batches,
    frames copied out through a pinned host buffer before the next batch starts.
    """
    if device.type != "cuda":
        chosen = "resident" if mode == "auto" else mode
        return MemoryPlan(chosen, batch or CPU_BATCH, "CPU: host memory is the device memory")
    if free_bytes is None:
        free_bytes, _ = torch.cuda.mem_get_info(device)
    per_frame = WORK_BYTES_PER_FRAME // (2 if dtype != torch.float32 else 1)
    fits = _pow2_floor(min(MAX_AUTO_BATCH, int(free_bytes * VRAM_FRACTION // per_frame)))
    gib = free_bytes / 2**30
    if mode == "auto":
        chosen = "resident" if free_bytes >= RESIDENT_MIN_FREE else "streamed"
        reason = f"{gib:.1f} GiB free VRAM"
    else:
        chosen, reason = mode, f"asked for ({gib:.1f} GiB free VRAM)"
    if chosen == "streamed":
        fits = min(fits, STREAMED_MAX_BATCH)
    return MemoryPlan(chosen, batch or fits, reason)


# --- networks -------------------------------------------------------------------------------


@dataclass
class DittoNetworks:
    """The four networks the engine runs, loaded strictly, in eval mode, on one device."""

    lmdm: nn.Module
    stitch: nn.Module
    warp: nn.Module
    decoder: nn.Module
    device: torch.device
    _render: dict[str, WarpDecodeEngines] = field(default_factory=dict, repr=False)
    _render_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def warp_decode(
        self, precision: str, compile: bool = False, runtime: str = "torch"
    ) -> WarpDecodeEngines:
        """The (cached) warp + decoder engines for a runtime, precision and compile setting;
        the engines of the least recently used settings go past :data:`RENDER_CONFIGS`."""
        key = f"{runtime}:{precision}{'+compile' if compile else ''}"
        with self._render_lock:  # a batch's analysis thread opens engine copies too
            if key in self._render:
                self._render[key] = self._render.pop(key)  # most recently used last
            else:
                made = WarpDecodeEngines(
                    self.warp, self.decoder, precision, self.device, compile, runtime
                )
                while len(self._render) >= RENDER_CONFIGS:
                    del self._render[next(iter(self._render))]
                self._render[key] = made
            return self._render[key]


_NETS: dict[tuple, DittoNetworks] = {}
_NETS_LOCK = threading.Lock()


def _fingerprint(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def load_networks(
    checkpoints: CheckpointSet,
    device: torch.device,
    on_loaded: Callable[[int, int], None] | None = None,
) -> DittoNetworks:
    """The engine's networks from the pytorch layout; one set is kept (reloaded on change).

    ``on_loaded(done, total)`` is called after each network read from disk (not for a set
    already loaded), so a caller can show the load's progress.
    """
    from studio.models import load_network

    require(checkpoints, NETWORK_ROLES)
    paths = {role: checkpoints.path(role) for role in NETWORK_ROLES}
    key = (str(device), *(_fingerprint(p) for p in paths.values()))
    with _NETS_LOCK:
        if key not in _NETS:
            _NETS.clear()  # one set at a time: full size is ~700 MB
            loaded = {}
            for role, p in paths.items():
                loaded[role] = load_network(role, p, device)
                if on_loaded is not None:
                    on_loaded(len(loaded), len(paths))
            _NETS[key] = DittoNetworks(
                loaded["lmdm"],
                loaded["stitch_network"],
                loaded["warp_network"],
                loaded["decoder"],
                device,
            )
        return _NETS[key]


def _condition_config(checkpoints: CheckpointSet, emotion: int) -> tuple[ConditionConfig, dict]:
    """Condition flags from the PyTorch cfg pkl when present (defaults otherwise)."""
    try:
        cfg = load_cfg(checkpoints.path("cfg_pytorch", "cfg"))
    except InputError:
        cfg = {}
    a2m = cfg.get("audio2motion_cfg", {}) if isinstance(cfg, dict) else {}
    defaults = cfg.get("default_kwargs", {}) if isinstance(cfg, dict) else {}
    return ConditionConfig.from_mapping(a2m, emotion=int(emotion)), dict(defaults)


# --- timing ---------------------------------------------------------------------------------


class StageClock:
    """Per-stage time without host syncs: CUDA events on a GPU, perf_counter on the CPU.

    ``ms()`` resolves pending events; call it once the work is known to be done (after a
    download), so timing never adds a sync of its own. Past :attr:`KEEP` pending stages the
    oldest half is resolved (long done by then): a live session, which never asks, holds a
    bounded number of events.
    """

    KEEP = 256

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pending: list[tuple[str, Any, Any]] = []
        self._ms: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self._pending.append((name, start, end))
            if len(self._pending) > self.KEEP:
                self._resolve(self.KEEP // 2)
        else:
            t0 = time.perf_counter()
            yield
            self._ms[name] = self._ms.get(name, 0.0) + (time.perf_counter() - t0) * 1000.0

    def ms(self) -> dict[str, float]:
        self._resolve(len(self._pending))
        return dict(self._ms)

    def _resolve(self, count: int) -> None:
        """Add the oldest ``count`` pending stages' times (waiting for their end events)."""
        for name, start, end in self._pending[:count]:
            end.synchronize()
            self._ms[name] = self._ms.get(name, 0.0) + start.elapsed_time(end)
        del self._pending[:count]


# --- renderer -------------------------------------------------------------------------------


def _controls(settings: RenderSettings) -> StitchControls:
    """Pose deltas in degrees; a zero delta stays absent (the reference tells them apart)."""
    deltas = {
        f"delta_{a}": float(getattr(settings, f"delta_{a}")) or None
        for a in ("pitch", "yaw", "roll")
    }
    return StitchControls(**deltas)


class DeviceAvatar:
    """An avatar's arrays on the device: its features [n, 32, 16, 64, 64] (one per source
    frame) and source keypoint info, and for a video its frames [n, H, W, 3] uint8 when a
    full-frame paste-back first asks for them. Made once per engine and shared, read-only,
    by every renderer of it (a 10 s video is 2 GiB of features, and the GUI's preview and an
    export each hold a renderer)."""

    def __init__(self, avatar: Any, device: torch.device) -> None:
        self.device = device
        self.f_s = torch.as_tensor(np.asarray(avatar.f_s, dtype=np.float32)).to(device)
        self.source = {
            k: torch.as_tensor(np.asarray(v, dtype=np.float32)).to(device)
            for k, v in avatar.x_s_info.items()
        }
        self._host_frames = getattr(avatar, "frames", None)
        self._frames: Tensor | None = None
        self._lock = threading.Lock()

    def frames(self) -> Tensor | None:
        """A video's frames on the device (uploaded on first use); None for a photo."""
        if self._host_frames is None:
            return None
        with self._lock:
            if self._frames is None:
                self._frames = torch.as_tensor(np.asarray(self._host_frames)).to(self.device)
            return self._frames


class DittoRenderer(Renderer):
    """Motion rows -> RGB frames: stitch, warp, decode and paste back, batched on the device.

    ``frame="full"`` pastes the 512² render back into the avatar image (its resolution);
    ``"crop"`` returns the render itself, resized to ``size``. Call :meth:`prepare` with the
    clip's motion first (it fixes the relative-driving frame d0 = frame 0 and, resident, stitches
    the whole clip), then :meth:`render_frames` with frame indices; :meth:`render_batch` renders
    rows directly (stitching them as they come).
    """

    def __init__(
        self,
        networks: DittoNetworks,
        avatar: Any,
        settings: RenderSettings,
        size: int,
        memory: MemoryPlan,
        on_device: DeviceAvatar | None = None,
    ) -> None:
        super().__init__(size, memory.batch)
        self.nets = networks
        self.device = dev = networks.device
        self.dtype = render_dtype(settings.precision, dev, settings.runtime)
        self.memory = memory
        self.full = settings.frame == "full"
        # the engine's shared copy (else this renderer's own)
        self.on_device = on_device or DeviceAvatar(avatar, dev)
        self.f_s = self.on_device.f_s
        self.source = self.on_device.source
        # a video avatar: output frame g is source frame mirror(g, n) (features, keypoints,
        # background and crop matrix); only its expression is driven, its eyes are its own
        self.video_frames = getattr(avatar, "frames", None)
        self.video_loop = settings.video_loop
        self.sources = 1 if self.video_frames is None else len(self.video_frames)
        self._next_row = 0  # render_batch's frame count when the caller gives no indices
        self.controls = _controls(settings)
        self._avatar = avatar
        self._backdrop: tuple[int, int, int] | None = None
        self._pastes: dict[tuple[int, int, int] | None, PasteBack] = {}
        # crop frames over a backdrop: the paste mask and the colour (0..1), on the device
        self._feather: Tensor | None = None
        self._backdrop_rgb: Tensor | None = None
        if self.full:
            self.paste = self._paste_back(avatar.image if self.video_frames is None else None)
            self._pastes[None] = self.paste
            self.height, self.width = (int(v) for v in np.asarray(avatar.image).shape[:2])
        else:
            self.height = self.width = int(size)
        self.size = self.width
        self.d0: Tensor | None = None
        self._x: tuple[Tensor, Tensor] | None = None  # resident: the clip's (x_s, x_d)
        self._motion: Tensor | None = None  # streamed: the clip's motion, stitched per batch
        self.clock = StageClock(dev)
        self._pinned: list[Tensor | None] = [None, None, None]  # iter_render's two, _download's
        self.crops = KeyframeCrops()  # the latest keyframes' crops, for their in-betweens
        self._keep_crops = True  # prepare() says whether the clip has in-betweens
        self.warp_graphs = WarpGraphs(dev)  # their warp, from CUDA graphs on a GPU
        self.warp_decode = networks.warp_decode(
            settings.precision, settings.compile, settings.runtime
        )

    def _paste_back(self, image: np.ndarray | None, colour: Any = None) -> Any:
        """The paste-back onto ``image`` (an image avatar), else onto each source frame of a
        video avatar, or a ``colour`` frame of its size."""
        m_c2o = self._avatar.m_c2o
        if self.video_frames is None:
            return PasteBack(image, m_c2o, CROP, self.device)
        size = tuple(np.asarray(self.video_frames).shape[1:3])
        frames = None if colour is not None else self.on_device.frames()
        return FramePasteBack(frames, m_c2o, CROP, self.device, colour=colour, size_hw=size)

    def _sources(self, frames: np.ndarray | None) -> Tensor | None:
        """Source frame indices (on the device) of output ``frames``; None for an image."""
        if self.video_frames is None or frames is None:
            return None
        at = np.asarray(frames, np.int64)
        if self.frame_rate != VIDEO_FPS:  # a retimed export: the video keeps its own pace
            at = np.floor(at * (VIDEO_FPS / self.frame_rate) + 1e-9).astype(np.int64)
        order = torch.from_numpy(source_indices(at, self.sources, self.video_loop))
        if self.device.type == "cuda":  # a pageable upload would wait for the GPU to drain
            return order.pin_memory().to(self.device, non_blocking=True)
        return order.to(self.device)

    # - keypoints -
    def _stitch(self, rows: Tensor, frames: np.ndarray | None = None) -> tuple[Tensor, Tensor]:
        """x_s, x_d of ``rows``; a video avatar's source keypoints are those of the rows'
        ``frames`` (their indices in the clip)."""
        d0 = rows[0] if self.d0 is None else self.d0
        src = self._sources(frames)
        with self.clock.stage("stitching"):
            if src is None:
                return stitch_motion(
                    self.source, rows, StitchConfig(d0=d0), self.controls, self.nets.stitch
                )
            source = {k: v[src] for k, v in self.source.items()}
            return stitch_motion(source, rows, video_config(d0=d0), self.controls, self.nets.stitch)

    def prepare(self, motion: np.ndarray, inbetweens: bool = True) -> None:
        """Take the clip's motion: d0 is its frame 0; resident mode stitches every frame now;
        keyframe crops are kept only for a clip with in-betweens."""
        rows = self._upload(motion)
        self.d0 = rows[0].clone()
        self.crops.clear()
        self._keep_crops = inbetweens
        self._next_row = 0
        resident = self.memory.mode == "resident"
        self._x = self._stitch(rows, np.arange(len(rows))) if resident else None
        self._motion = rows if self._x is None else None

    yuv_planes = True  # "yuv420p": frames leave the device as the encoder's planes

    def describe(self) -> dict[str, Any]:
        run = self.warp_decode.describe()
        return {
            "device": str(self.device),
            "precision": _DTYPE_NAMES.get(self.dtype, str(self.dtype)),
            "memory": f"{self.memory.mode}, batch {self.memory.batch}",
            "runtime": f"{run['runtime']}{', compiled' if run['compiled'] else ''}",
        }

    def _upload(self, motion: np.ndarray) -> Tensor:
        m = np.ascontiguousarray(motion, dtype=np.float32)
        if m.ndim != 2 or m.shape[1] != MOTION_DIM:
            raise ValueError(f"motion must be [K, {MOTION_DIM}], got {list(m.shape)}")
        return torch.from_numpy(m).to(self.device)

    # - rendering -
    def _keypoints(self, frames: np.ndarray) -> tuple[Tensor, Tensor]:
        idx = torch.as_tensor(np.asarray(frames, dtype=np.int64))
        if self.device.type == "cuda":  # a pageable upload would wait for the GPU to drain
            idx = idx.pin_memory().to(self.device, non_blocking=True)
        if self._x is not None:
            return self._x[0][idx], self._x[1][idx]
        if self._motion is not None:
            return self._stitch(self._motion[idx], frames)
        raise RuntimeError("render_frames() needs prepare(motion) first")

    def _rows_keypoints(self, motion: np.ndarray, frames: np.ndarray) -> tuple[Tensor, Tensor]:
        """x_s, x_d of ``frames``: the prepared clip's (on the device: no host sync), or
        stitched from their ``motion`` rows [..., 265] where the prepared motion does not
        reach them (a live session prepares its first row only)."""
        prepared = self._x[0] if self._x is not None else self._motion
        if prepared is not None and int(frames.max()) < len(prepared):
            return self._keypoints(frames)
        return self._stitch(self._upload(motion.reshape(-1, MOTION_DIM)), frames)

    def render_frames(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``frames`` (indices into the prepared motion) -> [K, H, W, 3] uint8."""
        frames = np.asarray(frames)
        return self._render(*self._keypoints(frames), frames=frames, sources=frames)

    def render_batch(self, motion: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """[K, 265] motion rows -> [K, H, W, 3] uint8 (d0 from :meth:`prepare` or row 0).
        ``frames``: the rows' indices in the clip (a video avatar's source frames follow
        them, and their crops are kept for the in-betweens between them, as a live session's
        keyframes need; without them, the rows count on from the last call's)."""
        keep = frames is not None
        if frames is None:
            frames = self._next_row + np.arange(len(motion))
        frames = np.asarray(frames)
        self._next_row = int(frames.max()) + 1 if frames.size else self._next_row
        x_s, x_d = self._stitch(self._upload(motion), frames)
        return self._render(x_s, x_d, frames=frames if keep else None, sources=frames)

    def iter_render(self, chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """:meth:`render_frames` of each chunk in turn, one batch ahead on a GPU.

        Each chunk's frames are copied into one of two pinned host buffers behind its render;
        the host waits for a chunk only once the next one is queued, so the GPU is never idle
        while the caller blends and encodes. Chunks longer than the batch are split.
        """
        pending: tuple[Any, Tensor] | None = None
        slot = 0
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            x_s, x_d = self._keypoints(chunk)
            if self.device.type != "cuda":
                yield self._render(x_s, x_d, frames=np.asarray(chunk), sources=np.asarray(chunk))
                continue
            k = x_d.shape[0]
            buf: Tensor | None = None
            self.crops.start_chunk()
            for s in range(0, k, self.batch):  # each part copied out before the next overwrites
                rows = slice(s, s + self.batch)
                part = self._frames(x_s[rows], x_d[rows], np.asarray(chunk)[rows], True)
                if buf is None:
                    buf = self._pinned_slot(slot, (k, *part.shape[1:]))
                buf[s : s + part.shape[0]].copy_(part, non_blocking=True)
            assert buf is not None
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            slot ^= 1
            if pending is not None:
                yield self._collect(*pending)
            pending = (done, buf)
        if pending is not None:
            yield self._collect(*pending)

    @staticmethod
    def _collect(done: Any, buf: Tensor) -> np.ndarray:
        done.synchronize()
        return buf.numpy().copy()  # the pinned slot is reused two chunks later

    def _pinned_slot(self, slot: int, shape: tuple[int, ...]) -> Tensor:
        cur = self._pinned[slot]
        if cur is None or cur.shape[0] < shape[0] or cur.shape[1:] != shape[1:]:
            cur = self._pinned[slot] = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        return cur[: shape[0]]

    def _render(
        self,
        x_s: Tensor,
        x_d: Tensor,
        frames: np.ndarray | None = None,
        sources: np.ndarray | None = None,
    ) -> np.ndarray:
        """All rows in batches of the renderer's batch, into one host array (``frames``:
        their indices, whose crops are kept for in-betweens; ``sources``: their indices for
        a video avatar's source frames)."""
        k = x_d.shape[0]
        out: np.ndarray | None = None
        if frames is not None:
            self.crops.start_chunk()
        for s in range(0, k, self.batch):
            rows = slice(s, s + self.batch)
            part = self._frames(
                x_s[rows],
                x_d[rows],
                None if frames is None else frames[rows],
                None if sources is None else sources[rows],
            )
            if out is None:
                out = np.empty((k, *part.shape[1:]), dtype=np.uint8)
            self._download(part, out[s : s + part.shape[0]])
        if out is None:  # no rows
            rows = self.height * 3 // 2 if self.pixel_format == "yuv420p" else self.height
            tail = (self.width,) if self.pixel_format == "yuv420p" else (self.width, 3)
            return np.empty((0, rows, *tail), dtype=np.uint8)
        return out

    @torch.no_grad()
    def _frames(
        self,
        x_s: Tensor,
        x_d: Tensor,
        frames: np.ndarray | None = None,
        sources: np.ndarray | bool | None = None,
    ) -> Tensor:
        """Up to a batch of frames on the device: [b, H, W, 3] uint8 (or yuv420p planes),
        on the engines of the ladder rung that holds them (padded). The crops of ``frames``
        (their indices) are kept for the in-betweens between them; ``sources`` (the frames'
        indices, or True: ``frames``) pick a video avatar's source frames."""
        src = self._sources(frames if sources is True else sources)
        with self.clock.stage("warp_decode"):
            batch = self.warp_decode.batch_for(x_d.shape[0], self.batch)
            f_s = self.f_s if src is None else self.f_s[src]
            img = self.warp_decode(f_s, x_s, x_d, batch)
        if frames is None or not self._keep_crops:
            return self._finish(img, src)
        crop = (img.clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1)
        self.crops.put(frames, crop)
        if self._crop_is_frame():  # the kept crop is the frame: not converted twice
            with self.clock.stage("putback"):
                return crop
        return self._finish(img, src)

    def _crop_is_frame(self) -> bool:
        return (
            not self.full
            and self.width == CROP
            and self.pixel_format == "rgb24"
            and self._backdrop is None
        )

    def set_backdrop(self, colour: tuple[int, int, int] | None) -> None:
        """Full frames: the crop pasted back onto a solid ``colour`` frame instead of the
        avatar image; crop frames: the crop over ``colour`` through the paste-back's feather
        mask (None: as they were)."""
        self._backdrop = None if colour is None else tuple(int(c) for c in colour)
        if not self.full:
            if colour is not None:
                if self._feather is None:
                    self._feather = paste_mask(CROP).to(self.device)[None, None]
                rgb = torch.tensor(self._backdrop, dtype=torch.float32, device=self.device)
                self._backdrop_rgb = (rgb / 255)[None, :, None, None]
            return
        paste = self._pastes.get(self._backdrop)
        if paste is None:
            image = np.empty_like(np.asarray(self._avatar.image))
            image[:] = np.asarray(self._backdrop, np.uint8)
            paste = self._paste_back(image, self._backdrop)
            self._pastes[self._backdrop] = paste
        self.paste = paste

    def _finish(self, img: Tensor, src: Tensor | None = None) -> Tensor:
        """Crops [b, 3, 512, 512] in 0..1 -> the frames: pasted back (onto source frames
        ``src`` of a video avatar) or resized, as RGB or yuv420p planes."""
        with self.clock.stage("putback"):
            if self.full:
                frames = self.paste(img) if src is None else self.paste(img, src)
            else:
                if self._backdrop is not None:
                    assert self._feather is not None and self._backdrop_rgb is not None
                    m = self._feather.to(img.dtype)
                    img = img.clamp(0, 1) * m + self._backdrop_rgb.to(img.dtype) * (1 - m)
                if self.width != CROP:
                    img = F.interpolate(img, size=(self.height, self.width), mode="area")
                frames = (img.clamp(0, 1) * 255).to(torch.uint8).permute(0, 2, 3, 1)
            if self.pixel_format == "yuv420p":
                return rgb_to_yuv420p(frames)
            return frames

    @torch.no_grad()
    def inbetweens(
        self,
        prev_images: Sequence[np.ndarray],
        next_images: Sequence[np.ndarray],
        motion: np.ndarray,
        w: np.ndarray,
        warp: InbetweenWarp | None = None,
        keys: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """In-betweens warped on the keyframes' crops on the device (keypoints: the stitched
        driving keypoints projected onto the crop), then pasted back like a keyframe; a
        cross-fade of the frames where the crops are not kept (rows rendered directly)."""
        prev = nxt = None
        if warp is not None and keys is not None and len(keys):
            keys = np.asarray(keys)
            prev, nxt = self.crops.get(keys[:, 0]), self.crops.get(keys[:, 1])
        if (prev is None or nxt is None) and self.video_frames is not None and keys is not None:
            # a video's background moves between keyframes: a cross-fade would show two
            at = np.asarray(keys)[:, 2]
            x_s, x_d = self._stitch(self._upload(np.asarray(motion)[:, 2]), at)
            return list(self._render(x_s, x_d, sources=at))
        if prev is None or nxt is None:
            return super().inbetweens(prev_images, next_images, motion, w, None, keys)
        with self.clock.stage("inbetween"):
            _, x_d = self._rows_keypoints(np.asarray(motion), keys.reshape(-1))
            kp = ((x_d[..., :2].double() + 1.0) * (CROP / 2.0)).unflatten(0, (len(keys), 3))
            made = self.warp_graphs(warp, prev, nxt, kp, w)
        if self._crop_is_frame():
            frames = made
        else:
            # + 0.5: the frames' truncating conversion gives the warped uint8 values back
            crops = made.permute(0, 3, 1, 2).float().add_(0.5).div_(255.0)
            frames = self._finish(crops, self._sources(keys[:, 2]))
        out = np.empty(tuple(frames.shape), dtype=np.uint8)
        self._download(frames, out)
        return list(out)

    def _download(self, frames: Tensor, out: np.ndarray) -> None:
        """Device frames into ``out``; on a GPU through a pinned buffer of its own (slot 2, so
        a chunk pending in :meth:`iter_render` is never overwritten)."""
        if self.device.type != "cuda":
            np.copyto(out, frames.numpy())
            return
        buf = self._pinned_slot(2, tuple(frames.shape))
        buf.copy_(frames, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()  # the frame is needed on the host
        np.copyto(out, buf.numpy())

    @property
    def timings_ms(self) -> dict[str, float]:
        """Accumulated stitching, warp_decode and putback time in ms."""
        return self.clock.ms()

    def build_engines(
        self, frames: int, progress: Progress | None = None, ahead: int | None = None
    ) -> None:
        """Build now the warp + decoder engines that rendering ``frames`` frames in batches of
        :attr:`batch` will use (ONNX export, torch.compile, CUDA graph capture: minutes on a
        first run), reporting the stage "building engines" with counts, so that the wait has a
        name and the frame count that follows measures frames only. Built engines are reused.
        With fewer than :data:`~studio.engines.ditto.warp_decode.AUTOTUNE_MIN_FRAMES` frames
        ``ahead`` (default ``frames``) they are built without cuDNN's kernel search.
        """
        from studio.runtime.onnx_cache import export_purpose

        wd = self.warp_decode
        wd.autotune = (frames if ahead is None else ahead) >= AUTOTUNE_MIN_FRAMES
        full, rest = divmod(max(0, int(frames)), self.batch)
        sizes = ([self.batch] if full else []) + ([rest] if rest else [])  # chunk lengths
        runtime = _RUNTIME_NAMES.get(wd.runtime, wd.runtime)
        with export_purpose(runtime):
            for i, k in enumerate(sizes):
                batch = wd.batch_for(k, self.batch)  # the last chunk may share a built rung
                if progress is not None:
                    progress(f"{STAGE_ENGINES}: {runtime}, batch {batch}", i, len(sizes))
                wd.engines(batch)  # built once; a rung already built is only looked up
        if progress is not None and sizes:
            progress(STAGE_ENGINES, len(sizes), len(sizes))


# --- engine ---------------------------------------------------------------------------------


class DittoEngine:
    """Ditto's pipeline on a user's checkpoints and a registered avatar.

    ``avatar`` is what :func:`studio.avatar.register.register_avatar` returns (f_s, x_s_info,
    eye info, the crop matrix and the image). ``settings`` supplies emotion, sampling steps,
    pose deltas, precision, memory mode, batch and frame mode.
    """

    name = "ditto"
    capabilities = CAPABILITIES

    def __init__(
        self,
        checkpoints: str | os.PathLike[str] | CheckpointSet,
        avatar: Any,
        settings: RenderSettings,
        device: str | torch.device | None = None,
        providers: Sequence[str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.checkpoints = (
            checkpoints if isinstance(checkpoints, CheckpointSet) else discover(checkpoints)
        )
        require(self.checkpoints, ENGINE_ROLES)
        self.device = resolve_device(device)
        self.settings = settings
        self.avatar = avatar
        self.progress: Progress | None = progress
        # the four networks and HuBERT, counted as they are read (seconds to minutes on a CPU)
        total = len(NETWORK_ROLES) + 1
        self._report(STAGE_LOADING, 0, total)
        self.networks = load_networks(
            self.checkpoints,
            self.device,
            on_loaded=lambda done, _n: self._report(STAGE_LOADING, done, total),
        )
        self._check_render(settings)
        if providers is None and self.device.type == "cpu":
            providers = ("CPUExecutionProvider",)
        # On a GPU HuBERT runs in torch there (one batched call per clip) unless the caller
        # names ONNX Runtime providers; ORT may have only its CPU provider.
        on_gpu = providers is None and self.device.type == "cuda"
        self._hubert_run = {"providers": providers, "device": self.device if on_gpu else None}
        self.hubert = HubertFeatures(self.checkpoints.path("hubert"), **self._hubert_run)
        # HuBERT runners of the live plans' chunk geometries (the clip's is self.hubert)
        self._live_hubert: dict[ChunkGeometry, HubertFeatures] = {self.hubert.geometry: self.hubert}
        self._report(STAGE_LOADING, total, total)
        self.condition, self.cfg_defaults = _condition_config(self.checkpoints, settings.emotion)
        lmdm_c = self.networks.lmdm.cond_dim
        if self.condition.width != lmdm_c:
            raise InputError(
                f"{self.checkpoints.path('lmdm')} takes a {lmdm_c}-wide condition, but the "
                f"config's parts make {self.condition.width}: check ditto_cfg/ matches the LMDM"
            )
        self.last_timings: dict[str, float] = {}
        # the last clip's LMDM windows, shared by the engine's copies (with_settings): an
        # emotion edit samples only the windows from the first one its keys change
        self.windows = WindowMemo()
        # the avatar on the device, made by the first renderer, shared by the engine's copies
        self._on_device: list[DeviceAvatar] = []
        self._uploading = threading.Lock()

    def _report(self, stage: str, done: int, total: int) -> None:
        """Tell :attr:`progress` (the CLI's bars, the GUI's status bar) where a stage is."""
        if self.progress is not None:
            self.progress(stage, done, total)

    def with_settings(self, settings: RenderSettings) -> DittoEngine:
        """The same engine (networks, avatar) with other settings."""
        other = object.__new__(DittoEngine)
        other.__dict__.update(self.__dict__)
        other._check_render(settings)
        other.settings = settings
        other.condition = replace(self.condition, emotion=int(settings.emotion))
        other.last_timings = {}
        return other

    def with_emotion(self, rows: np.ndarray | None) -> DittoEngine:
        """The same engine with LMDM conditioned on per-frame emotion ``rows`` [N, 8] (a
        keyed emotion track); None: the settings' one label."""
        other = self.with_settings(self.settings)
        if rows is not None:
            other.condition = replace(self.condition, emotion=emotion_from_weights(rows))
        return other

    def _check_render(self, settings: RenderSettings) -> None:
        """A runtime or precision that cannot run here fails now, before any motion is made."""
        self.networks.warp_decode(settings.precision, settings.compile, settings.runtime)

    def generate(self, audio: Audio, phon: PhoneticFrames, seed: int) -> np.ndarray:
        """[N, 265] motion: HuBERT features, the 1103-wide condition, LMDM windows. From the
        first window on, what the render's next steps import is imported beside the windows
        (:meth:`_imports_ahead`; :func:`~studio.imports.import_aside`), where the main thread
        mostly waits on the GPU. Measured (docs/benchmarks.md): beside the networks' load or
        HuBERT, which run Python, the imports slowed those by about as much as they saved;
        started once every window was queued, they hid nowhere (CUDA's launch queue keeps the
        main thread only a few steps ahead of the GPU); from the first window they slow the
        windows by about half of what they take. ``lmdm_capture`` in :attr:`last_timings` is
        the time spent capturing LMDM's window graphs (a process's first clip, on a GPU)."""
        t0 = time.perf_counter()
        self._report(STAGE_HUBERT, 0, 1)  # one call: counted as one step
        feats = self.hubert.offline(audio.samples)
        self._report(STAGE_HUBERT, 1, 1)
        source = self._condition_source()
        cond = assemble(feats[: audio.num_frames], 0, source, self.condition)
        t_hubert = (time.perf_counter() - t0) * 1000.0
        t0 = time.perf_counter()
        kp_source = torch.from_numpy(motion_from_info(_first_info(self.avatar)))

        def on_window(done: int, total: int) -> None:
            if done == 1 and self.device.type == "cuda":
                import_aside(self._imports_ahead())
            self._report(STAGE_LMDM, done, total)

        made = graphs_made_ms()
        motion = generate_motion(
            self.networks.lmdm,
            torch.from_numpy(cond),  # on the host: its windows' digests read it there
            kp_source,
            self.settings.steps,
            seed,
            on_window=on_window,
            precision=self.settings.motion_precision,
            memo=self.windows,
        )
        host = motion.cpu().numpy()  # the one read-back: cadence, smoothing and plots need it
        t_lmdm = (time.perf_counter() - t0) * 1000.0
        self.last_timings = {"hubert": t_hubert, "lmdm": t_lmdm}
        if self.device.type == "cuda":  # the window graphs' capture (first clip only): a warm-up
            capture = graphs_made_ms() - made
            self.last_timings.update(lmdm_capture=capture, lmdm=t_lmdm - capture)
        return host

    def _imports_ahead(self) -> tuple[str, ...]:
        """The heavy modules a clip's steps after LMDM import on first use: SciPy's signal
        module (the pose smoothing) and, where the render engines will be compiled
        artifacts (``--compile`` on a GPU), their loader."""
        compiled = self.settings.compile and _compile_note(self.settings, self.device) is None
        return (*SMOOTHING_MODULES, *(LOADER_MODULES if compiled else ()))

    def motion_stream(
        self, seed: int, latency: str = "balanced", *, overlap: int | None = None
    ) -> LiveMotion:
        """:meth:`generate` for live audio (:class:`studio.motion.live_lmdm.LiveMotion`): the
        ``latency`` setting's plan (:data:`~studio.motion.live_lmdm.LIVE_PLANS`: HuBERT chunk,
        LMDM window advance, final smoothing pass), with windows of ``overlap`` if given.
        ``"smooth"`` with ``overlap=10`` makes the clip's frames (LMDM at the clip's
        ``motion_precision``); the live plans run LMDM's matmuls in TF32 on a GPU (half the
        window's time on an H200), or in the setting's half type where it names one."""
        plan = live_plan(latency, overlap)
        hubert = self._live_hubert.get(plan.hubert)
        if hubert is None:
            path = self.checkpoints.path("hubert")
            hubert = HubertFeatures(path, chunksize=plan.hubert, **self._hubert_run)
            self._live_hubert[plan.hubert] = hubert
        return LiveMotion(
            hubert,
            self.hubert.silence(plan.priming),
            self.networks.lmdm,
            torch.from_numpy(motion_from_info(_first_info(self.avatar))),
            self._condition_source(),
            self.condition,
            self.settings.steps,
            seed,
            plan,
            precision=_live_precision(self.settings.motion_precision, overlap is None),
        )

    def memory_plan(self, settings: RenderSettings | None = None) -> MemoryPlan:
        s = settings or self.settings
        dtype = render_dtype(s.precision, self.device, s.runtime)
        return plan_memory(s.memory, s.batch, self.device, dtype)

    def renderer(self, settings: RenderSettings | None = None) -> DittoRenderer:
        s = settings or self.settings
        with self._uploading:  # the avatar's device copy first: the memory plan sees it
            if not self._on_device:
                self._on_device.append(DeviceAvatar(self.avatar, self.device))
        on_device = self._on_device[0]
        if s.frame == "full":
            on_device.frames()  # a video's frames too, before the plan reads free memory
        return DittoRenderer(self.networks, self.avatar, s, s.size, self.memory_plan(s), on_device)

    def source_motion(self, num_frames: int, settings: RenderSettings) -> np.ndarray | None:
        """A video avatar's own motion rows in playback order (pose, translation and scale
        follow them); None for a photo."""
        frames = getattr(self.avatar, "frames", None)
        if frames is None:
            return None
        info = self.avatar.x_s_info
        rows = np.stack(
            [
                motion_from_info({k: v[i : i + 1] for k, v in info.items()})
                for i in range(len(frames))
            ]
        )
        return rows[source_indices(np.arange(num_frames), len(frames), settings.video_loop)]

    def _condition_source(self) -> ConditionSource:
        """The avatar's part of LMDM's condition (a video's eyes in its playback order)."""
        info = self.avatar.source_info()
        return ConditionSource.from_source_info(info, self.settings.video_loop)

    def motion_key(self, settings: RenderSettings) -> tuple:
        """The networks, the avatar, and the settings LMDM reads (a video's playback order
        orders its eye features)."""
        loop = settings.video_loop if getattr(self.avatar, "frames", None) is not None else None
        key = ("ditto", id(self.networks), id(self.avatar), settings.emotion, settings.steps)
        return (*key, loop)

    def renderer_key(self, settings: RenderSettings) -> tuple:
        """The networks and avatar, and every setting the renderer reads (the size only for
        crop frames: full frames are the avatar image's size)."""
        s = settings
        return (
            "ditto",
            id(self.networks),
            id(self.avatar),
            s.frame,
            s.size if s.frame == "crop" else None,
            s.precision,
            s.compile,
            s.runtime,
            s.delta_pitch,
            s.delta_yaw,
            s.delta_roll,
            s.memory,
            s.batch,
            s.video_loop,
        )

    def frame_size(self, settings: RenderSettings) -> tuple[int, int]:
        if settings.frame == "full":
            h, w = np.asarray(self.avatar.image).shape[:2]
            return int(w), int(h)
        return settings.size, settings.size

    def canonical_keypoints(self) -> np.ndarray:
        """The avatar's canonical keypoints (its x_s_info kp) as [21, 3]."""
        return np.asarray(_first_info(self.avatar)["kp"], np.float32).reshape(NUM_KP, 3)

    def describe(self) -> dict[str, Any]:
        """The engine for reports: device, memory plan, the warp/decoder runtime that runs,
        sampling steps and the avatar (``summary``: one line for people)."""
        s = self.settings
        return {
            "name": self.name,
            "device": str(self.device),
            "memory": self.memory_plan().to_dict(),
            "render": self.networks.warp_decode(s.precision, s.compile, s.runtime).describe(),
            "steps": s.steps,
            "avatar": str(getattr(self.avatar, "folder", "")),
            "eye_method": getattr(self.avatar, "eye_method", None),
            "notes": list(getattr(self.avatar, "notes", []) or []),
            "summary": describe_avatar(self.avatar),
        }


def _first_info(avatar: Any) -> dict[str, np.ndarray]:
    """The avatar's source frame 0 keypoint info (a video's first frame; an image's own)."""
    return {k: np.asarray(v)[:1] for k, v in avatar.x_s_info.items()}


def _live_precision(setting: str, live: bool) -> str:
    """LMDM's precision for a stream: a live plan's matmuls at least TF32 (fp32 is half as
    fast there), the clip's layout at the clip's own setting."""
    return "tf32" if live and setting == "fp32" else setting


def _motion_note(settings: RenderSettings, device: torch.device) -> str | None:
    """Why ``motion_precision`` has nothing to act on here: the CPU runs LMDM's eager fp32
    loop. On a GPU that cannot run it, OptionError."""
    p = settings.motion_precision
    if p == "fp32":
        return None
    if device.type != "cuda":
        return (
            f"--motion-precision {p} is ignored on the {device.type.upper()}: LMDM runs in "
            "fp32 there"
        )
    why = precision_support("torch", device)[p]
    if why is not None:
        raise OptionError("--motion-precision", f"{p} cannot run here: {why}; use fp32")
    return None


def _compile_note(settings: RenderSettings, device: torch.device) -> str | None:
    """Why ``compile`` has nothing to act on here (None when it does): it compiles the warp +
    decoder CUDA graphs of the torch runtime on a GPU."""
    if not settings.compile:
        return None
    if device.type != "cuda":
        return (
            f"--compile is ignored on the {device.type.upper()}: it compiles the warp + decoder "
            "into CUDA graphs, which need a GPU (--device cuda)"
        )
    if settings.runtime != "torch":
        return (
            f"--compile is ignored with --runtime {settings.runtime}: it compiles the CUDA "
            "graphs of the torch runtime (--runtime torch)"
        )
    return None


def prepare(request: EngineRequest) -> Prepared:
    """Every check before any work, in the order a user fixes things: the checkpoint folder
    (every file an avatar and the engine read), the avatar image, then device, runtime and
    precision."""
    if not request.checkpoints:
        raise OptionError(
            "--checkpoints",
            "the Ditto engine needs Ditto's checkpoint folder (File → Checkpoints…)",
        )
    found = discover(request.checkpoints)
    require(found, ALL_ROLES)
    # the weights into the page cache while the checks go on and the engine opens (a cold
    # disk): in the engine's order, the avatar's networks last (a cached avatar needs none)
    read_ahead(found.path(role) for role in (*NETWORK_ROLES, "hubert", *REGISTRATION_ROLES))
    if not request.avatar:
        raise OptionError(
            "--avatar", "the Ditto engine needs --avatar FILE (a face photo or a short video)"
        )
    image, cache = avatar_source(request.avatar)
    # a missing file, text, a damaged or too short video, ...: named now, not after loading
    if is_video(image):
        read_video(image, max_frames=MIN_VIDEO_FRAMES)
    else:
        load_image(image)
    device = resolve_device(request.device)
    s = request.settings
    render_precisions(s.precision, s.runtime, device)  # refused before the work
    notes = tuple(n for n in (_motion_note(s, device), _compile_note(s, device)) if n)
    resolved = {
        "checkpoints": found,
        "device": device,
        "image": image,
        "cache": cache or request.avatar_cache,
    }
    return Prepared(request, resolved, notes)


def open_prepared(prepared: Prepared, progress: Progress | None = None) -> DittoEngine:
    """Register (or reopen from its cache) the avatar, then load the networks."""
    r = prepared.resolved
    s = prepared.request.settings
    framing = RegistrationSettings(
        crop_scale=s.crop_scale, crop_vy_ratio=s.crop_vy, crop_vx_ratio=s.crop_vx
    )
    avatar = register_avatar(
        r["image"],
        r["checkpoints"],
        cache_dir=r["cache"],
        device=r["device"],
        progress=progress,
        settings=framing,
    )
    return DittoEngine(
        r["checkpoints"], avatar, prepared.request.settings, device=r["device"], progress=progress
    )


def describe_avatar(avatar: Any) -> str:
    """One line about a registered avatar for the CLI and the GUI status bar."""
    h, w = np.asarray(avatar.image).shape[:2]
    frames = getattr(avatar, "frames", None)
    kind = "" if frames is None else f" video ({len(frames)} frames at {VIDEO_FPS} fps)"
    notes = "; ".join(getattr(avatar, "notes", []) or [])
    eye = getattr(avatar, "eye_method", "unknown")
    folder = getattr(avatar, "folder", None)
    state = "reused from cache" if getattr(avatar, "cached", False) else "registered"
    where = f", {state} {Path(folder)}" if folder else ""
    line = f"avatar {w}x{h}{kind}, eye features: {eye}{where}"
    return line + (f" ({notes})" if notes else "")
