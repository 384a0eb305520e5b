"""What every talking-head engine offers, so that nothing above it branches on an engine's name.

An engine package (:mod:`studio.engines.demo`, :mod:`studio.engines.ditto`) is registered by
one line in :mod:`studio.render.engines` and has, in its ``__init__`` (importable without
torch): ``CAPABILITIES`` (a :class:`Capabilities`), ``prepare(request)`` (every check of the
request's inputs, in the order a user fixes them, before any long work) and
``open(prepared, progress)`` (the engine itself, an :class:`Engine`); an engine that
``needs_checkpoints`` also has ``check_checkpoints(path)`` (the folder's root, or an error
naming every missing file).

An engine makes the clip's motion (:meth:`Engine.generate`) and hands out renderers of one
signature (:meth:`Engine.renderer`); a :class:`Renderer` turns motion rows into frames.
Capabilities (precisions, runtimes, the controls it honours, whether it takes an avatar photo
or needs checkpoints) are asked of the engine, not inferred from its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from studio.audio.io import Audio
from studio.audio.phonetics import PhoneticFrames
from studio.layout import FPS
from studio.settings import RenderSettings

Progress = Callable[[str, int, int], None]
# (prev_images, next_images, prev_kp, next_kp, kp, w), batched over the first dimension ->
# the in-betweens (studio.render.inbetween.motion_inbetweens)
InbetweenWarp = Callable[[Any, Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray], Any]
INBETWEEN_BATCH = 8  # in-betweens warped in one call on the host (bounds its temporaries)

DEFAULT_RENDER_BATCH = 8
PIXEL_FORMATS = ("rgb24", "yuv420p")


def crossfade(a: np.ndarray, b: np.ndarray, w: float) -> np.ndarray:
    """(1 - w) a + w b for uint8 frames, in 8-bit fixed point."""
    wi = int(round(w * 256))
    out = a.astype(np.uint16) * (256 - wi) + b.astype(np.uint16) * wi + 128
    return (out >> 8).astype(np.uint8)


def straight_rgba(over_black: np.ndarray, over_white: np.ndarray) -> np.ndarray:
    """[..., H, W, 4] uint8 RGBA with straight alpha from the same frames drawn over black and
    over white (triangulation matting: a drawing composited over its backdrop is
    ``a * C + (1 - a) * B``, so ``1 - a`` is the white frame's excess over the black one
    and the black frame is ``a * C``)."""
    k = over_black.astype(np.int32)
    excess = (over_white.astype(np.int32) - k).mean(axis=-1)
    alpha = np.clip(np.rint(255.0 - excess), 0, 255).astype(np.int32)
    colour = np.where(alpha[..., None] > 0, (k * 255 + alpha[..., None] // 2), 0)
    colour = np.minimum(colour // np.maximum(alpha[..., None], 1), 255)
    return np.concatenate([colour, alpha[..., None]], axis=-1).astype(np.uint8)


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, known without opening it (and without torch)."""

    label: str  # shown in menus
    takes_avatar: bool  # animates the user's photo (else it draws its own character)
    needs_checkpoints: bool
    precisions: tuple[str, ...]  # render precisions it offers ("auto" first where it has one)
    cuda_only: frozenset[str] = frozenset()  # of those, the ones that need a CUDA GPU
    runtimes: tuple[str, ...] = ("torch",)  # render runtimes it can run
    controls: frozenset[str] = frozenset()  # RenderSettings fields beyond the common ones
    # the RenderSettings fields its checks before any work read (``prepare``, besides the
    # backend): a batch checks each job whose values of these differ
    checked: frozenset[str] = frozenset()
    why_cpu: str = ""  # why the precisions are few, for a tooltip

    @property
    def default_precision(self) -> str:
        return self.precisions[0]

    def precisions_here(self, cuda: bool) -> tuple[str, ...]:
        """The precisions this machine can run (those needing CUDA dropped without a GPU)."""
        return tuple(p for p in self.precisions if cuda or p not in self.cuda_only)

    def honours(self, control: str) -> bool:
        """Whether the engine reads the RenderSettings field ``control`` (emotion, steps, …)."""
        return control in self.controls


@dataclass(frozen=True)
class EngineRequest:
    """Everything that opens an engine: the settings (``settings.backend`` names the engine)
    and, for engines that need them, the checkpoint folder, the avatar photo (or a
    registered avatar folder), the device and the avatar cache folder."""

    settings: RenderSettings
    checkpoints: str | None = None
    avatar: str | None = None
    device: str | None = None
    avatar_cache: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A request whose inputs were checked: what the engine resolved (its checkpoint set,
    device, …) and notes for options it will ignore."""

    request: EngineRequest
    resolved: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class Renderer:
    """Motion rows -> RGB frames of one size; the defaults a renderer may override.

    A renderer is given the clip's motion once (:meth:`prepare`) and then frame indices
    (:meth:`render_frames`, or :meth:`iter_render` over chunks of them, which a device
    renderer runs one chunk ahead). ``pixel_format`` ``"yuv420p"`` asks for the encoder's
    planes instead of RGB where :attr:`yuv_planes` says the renderer can make them.
    """

    yuv_planes = False

    def __init__(self, size: int, batch: int = DEFAULT_RENDER_BATCH) -> None:
        self.size = int(size)
        self.width = self.height = self.size  # a renderer of other frames sets its own
        self.batch = int(batch)
        self.pixel_format = "rgb24"
        # frames/s of the frame indices it is given (an export at another rate renders
        # resampled motion; an avatar that moves by itself, a video, keeps its own pace)
        self.frame_rate = FPS
        self._motion: np.ndarray | None = None

    def render_batch(self, motion: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
        """[K, motion] rows -> [K, H, W, 3] uint8; ``frames``: the rows' indices in the clip,
        where the caller knows them (an avatar that moves by itself, a video, follows them)."""
        raise NotImplementedError

    def prepare(self, motion: np.ndarray, inbetweens: bool = True) -> None:
        """Take the clip's (smoothed) motion; :meth:`render_frames` indexes into it.
        ``inbetweens``: whether frames will be made between the rendered ones (a renderer
        that keeps its keyframes for them need not otherwise)."""
        self._motion = motion

    def render_frames(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``frames`` (indices into the prepared motion) -> [K, H, W, 3] uint8."""
        if self._motion is None:
            raise RuntimeError("render_frames() needs prepare(motion) first")
        return self.render_batch(self._motion[np.asarray(frames)], np.asarray(frames))

    def iter_render(self, chunks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """:meth:`render_frames` of each chunk, in order."""
        for chunk in chunks:
            yield self.render_frames(chunk)

    def set_backdrop(self, colour: tuple[int, int, int] | None) -> None:
        """Draw the frames over a solid ``colour`` (RGB) instead of the avatar's own
        backdrop; None gives the avatar's back."""
        raise NotImplementedError(f"{type(self).__name__} draws over its avatar only")

    @property
    def backdrop(self) -> tuple[int, int, int] | None:
        """The colour :meth:`set_backdrop` set (None: the avatar's own)."""
        return getattr(self, "_backdrop", None)

    def render_rgba(self, frames: np.ndarray) -> np.ndarray:
        """Frames ``frames`` (indices into the prepared motion) -> [K, H, W, 4] uint8 with
        straight alpha: the head on nothing. Drawn over black and over white
        (:func:`straight_rgba`), exact for a renderer that composites its drawing over its
        backdrop (the demo character, Ditto's paste-back)."""
        before = self.backdrop
        try:
            self.set_backdrop((0, 0, 0))
            black = self.render_frames(frames)
            self.set_backdrop((255, 255, 255))
            white = self.render_frames(frames)
        finally:
            self.set_backdrop(before)
        return straight_rgba(np.asarray(black), np.asarray(white))

    def keypoints_2d(self, motion: np.ndarray) -> np.ndarray | None:
        """[K, motion] rows -> [K, P, 2] (x, y) pixel positions of the implicit keypoints
        (P >= 21: a renderer may add points of its own drawing) in the frames it renders
        (pixel centres at i + 0.5), or None where it cannot say (its in-betweens are then
        cross-fades)."""
        return None

    def inbetween(
        self,
        prev_image: np.ndarray,
        next_image: np.ndarray,
        motion: np.ndarray,
        w: float,
        warp: InbetweenWarp | None = None,
        keys: Sequence[int] | None = None,
    ) -> np.ndarray:
        """The frame at weight ``w`` between two rendered keyframes: :meth:`inbetweens` of
        one (``motion`` [3, motion]: the previous keyframe's row, the next one's, its own;
        ``keys``: their three frame indices, where known)."""
        rows = np.asarray(motion)[None]
        index = None if keys is None else np.asarray(keys, np.int64)[None]
        return self.inbetweens([prev_image], [next_image], rows, np.array([w]), warp, index)[0]

    def inbetweens(
        self,
        prev_images: Sequence[np.ndarray],
        next_images: Sequence[np.ndarray],
        motion: np.ndarray,
        w: np.ndarray,
        warp: InbetweenWarp | None = None,
        keys: np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """The frames at weights ``w`` [B] between rendered keyframes.

        ``motion`` [B, 3, motion]: the rows of each previous keyframe, the next one and the
        in-between. With ``warp`` (the render layer's
        :func:`studio.render.inbetween.motion_inbetweens`) and keypoints from
        :meth:`keypoints_2d`, both neighbours are moved to the in-between's keypoints before
        blending; otherwise a cross-fade in place. ``keys`` [B, 3] (frame indices of the
        previous keyframe, the next one and the in-between in the prepared motion, where the
        caller knows them) lets a renderer that keeps its keyframes' crops warp those
        instead and paste the result back (the Ditto renderer).
        """
        motion = np.asarray(motion)
        count = motion.shape[0]
        kp = (
            None
            if warp is None or count == 0
            else self.keypoints_2d(motion.reshape(-1, motion.shape[-1]))
        )
        if kp is None:
            return [
                crossfade(a, b, float(x))
                for a, b, x in zip(prev_images, next_images, w, strict=True)
            ]
        kp = kp.reshape(count, 3, *kp.shape[1:])
        out: list[np.ndarray] = []
        for s in range(0, count, INBETWEEN_BATCH):
            part = slice(s, s + INBETWEEN_BATCH)
            made = warp(
                np.stack(prev_images[part]),
                np.stack(next_images[part]),
                kp[part, 0],
                kp[part, 1],
                kp[part, 2],
                np.asarray(w)[part],
            )
            out.extend(made)
        return out

    @property
    def timings_ms(self) -> dict[str, float]:
        """The renderer's own stage split in ms (empty: the pipeline times "render" whole)."""
        return {}

    def build_engines(
        self, frames: int, progress: Progress | None = None, ahead: int | None = None
    ) -> None:
        """Build what rendering ``frames`` keyframes needs before the first one (compile,
        export, capture), as a stage of its own; nothing to build by default. ``ahead``: the
        keyframes these engines will render in all (a batch's clips; default ``frames``),
        for choices that pay off only over many frames."""

    def describe(self) -> dict[str, Any]:
        """What renders: backend, device, precision, and for device engines runtime and
        memory (the GUI's status bar, reports)."""
        return {"device": "CPU", "precision": "fp32"}


LATENCIES = ("low", "balanced", "smooth")  # live: less lookahead, or smoother motion


class MotionStream(Protocol):
    """Incremental motion for live audio: an engine's :meth:`Engine.generate`, a chunk at a
    time. ``push`` takes the next 16 kHz mono samples and the phonetic frames that became
    final with them (:class:`studio.audio.phonetics.PhoneticStream`), and returns the motion
    rows ``[k, 265]`` that became final (frames in order from 0, none twice); ``finish``
    returns the rest once the audio has ended. A row for frame ``j`` needs the audio up to
    frame ``j + lookahead_frames`` (the stream's algorithmic latency), or, for a stream that
    ``reads_phonetics``, the phonetic frames up to ``j + lookahead_frames``, which come later
    by the phonetics' own lookahead."""

    lookahead_frames: int
    reads_phonetics: bool  # a stream without the attribute reads the samples only

    def push(self, samples: np.ndarray, phon: PhoneticFrames) -> np.ndarray: ...

    def finish(self) -> np.ndarray: ...


class Engine(Protocol):
    """A talking-head engine: the clip's motion, and renderers of its frames."""

    name: str
    capabilities: Capabilities
    progress: Progress | None
    last_timings: dict[str, float]

    def generate(self, audio: Audio, phon: PhoneticFrames, seed: int) -> np.ndarray:
        """[N, 265] motion for the clip (``progress`` sees its stages)."""
        ...

    def with_settings(self, settings: RenderSettings) -> Engine:
        """The same engine (networks, avatar) under other settings."""
        ...

    def with_emotion(self, rows: np.ndarray | None) -> Engine:
        """The same engine with its motion conditioned on per-frame emotion ``rows`` [N, 8]
        (weights of :data:`studio.layout.EMOTIONS`, from a keyed emotion track); None: the
        settings' one emotion."""
        ...

    def motion_stream(self, seed: int, latency: str = "balanced") -> MotionStream:
        """Motion for live audio (``latency`` one of :data:`LATENCIES`), frame for frame the
        clip's :meth:`generate` where the engine's layout allows it."""
        ...

    def motion_key(self, settings: RenderSettings) -> tuple:
        """What the generated motion depends on besides audio and seed (a cache key)."""
        ...

    def source_motion(self, num_frames: int, settings: RenderSettings) -> np.ndarray | None:
        """[num_frames, motion] rows of the avatar's own motion where it moves by itself (a
        video: the frames its pose, position and scale come from), else None: what adaptive
        cadence must see to bound the gaps it blends across."""
        ...

    def renderer(self, settings: RenderSettings) -> Renderer:
        """A renderer of frames under ``settings`` (size, precision, frame mode, …)."""
        ...

    def renderer_key(self, settings: RenderSettings) -> tuple:
        """What a renderer from :meth:`renderer` depends on (a cache key)."""
        ...

    def frame_size(self, settings: RenderSettings) -> tuple[int, int]:
        """(width, height) of the frames under ``settings``."""
        ...

    def canonical_keypoints(self) -> np.ndarray:
        """[21, 3] canonical keypoints the motion drives (the character's or the avatar's):
        what the quality metrics measure mouth, lids and blinks on."""
        ...

    def describe(self) -> dict[str, Any]:
        """The engine for reports: name, device, and what it was opened on."""
        ...
