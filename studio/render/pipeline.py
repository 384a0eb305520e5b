"""The clip composition: audio -> phonetics -> motion -> cadence -> smoothing -> frames -> MP4.

One composition for every engine (:class:`~studio.engines.base.Engine`, opened by
:mod:`studio.render.engines`): the engine makes the motion, its
:class:`~studio.engines.base.Renderer` the frames. Motion for the whole clip is computed first
(cheap), so a change of smoothing or cadence re-runs only :func:`postprocess`, not the
generator.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from studio import layout
from studio.audio.io import Audio
from studio.audio.phonetics import PhoneticFrames
from studio.audio.phonetics import analyze as analyze_phonetics
from studio.engines.base import Engine, Progress, Renderer, crossfade
from studio.errors import Cancelled
from studio.motion.cadence import CadencePlan, blend_weights, plan_cadence, sample_motion
from studio.motion.controls import ControlTracks, apply_controls
from studio.motion.kinematics import kinematics_report, smooth_motion
from studio.render.inbetween import motion_inbetweens
from studio.settings import RenderSettings

if TYPE_CHECKING:
    from studio.export.writer import Writer

CancelCheck = Callable[[], bool]


def frame_shape(renderer: Renderer) -> tuple[int, int]:
    """(height, width) of the renderer's frames."""
    return renderer.height, renderer.width


@dataclass
class MotionResult:
    """Everything known about a clip before rendering."""

    audio: Audio
    phon: PhoneticFrames
    raw: np.ndarray  # generated motion [N, 265]
    plan: CadencePlan
    smoothed: np.ndarray  # after pose smoothing: what is rendered
    kinematics: dict[str, float]
    timings_ms: dict[str, float] = field(default_factory=dict)
    controls: ControlTracks | None = None  # the tracks that directed it (an export keeps them)

    @property
    def num_frames(self) -> int:
        return self.raw.shape[0]

    @functools.cached_property
    def sampled(self) -> np.ndarray:
        """The cadence-sampled motion, made again from ``raw`` and the plan when first asked
        (the plots want it; a render does not, so a long clip does not hold it twice)."""
        return sample_motion(apply_controls(self.raw, self.controls), self.plan)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def generate(
    engine: Engine, audio: Audio, seed: int, controls: ControlTracks | None = None
) -> tuple[PhoneticFrames, np.ndarray, dict]:
    """Phonetics and raw motion (the part worth caching): (phon, motion, timings). A keyed
    emotion track in ``controls`` conditions the motion (the engine's ``with_emotion``)."""
    t0 = time.perf_counter()
    phon = analyze_phonetics(audio.samples, audio.num_frames)
    t_feat = _ms(t0)
    rows = None if controls is None else controls.emotion_rows(audio.num_frames)
    if rows is not None:
        engine = engine.with_emotion(rows)
    t0 = time.perf_counter()
    raw = np.asarray(engine.generate(audio, phon, seed), dtype=np.float32)
    if raw.shape != (audio.num_frames, layout.MOTION_DIM):
        raise RuntimeError(f"engine {engine.name} returned motion {raw.shape}")
    timings = {"features": t_feat, "motion": _ms(t0)}
    split = engine.last_timings
    if split:  # the engine's own split (e.g. hubert, lmdm) replaces the aggregate
        del timings["motion"]
        timings.update(split)
    return phon, raw, timings


def postprocess(
    audio: Audio,
    phon: PhoneticFrames,
    raw: np.ndarray,
    settings: RenderSettings,
    timings=None,
    controls: ControlTracks | None = None,
    source_motion: np.ndarray | None = None,
) -> MotionResult:
    """Control tracks, cadence plan, cadence sampling and smoothing on cached raw motion
    (``controls`` direct the motion before the rest: the smoothing keeps a keyed turn within
    its acceleration limit, cadence renders what a keyed move needs). ``source_motion``: an
    avatar that moves by itself (:meth:`~studio.engines.base.Engine.source_motion`), whose
    pose, position and scale the frames show: cadence bounds its gaps by that motion."""
    timings = dict(timings or {})
    t0 = time.perf_counter()
    directed = apply_controls(raw, controls)
    shown = directed
    if source_motion is not None:  # the video's own head, the driving expression
        shown = np.array(source_motion, np.float32, copy=True)
        shown[:, layout.EXP] = directed[:, layout.EXP]
    plan = plan_cadence(phon, settings.stride, settings.cadence, motion=shown)
    sampled = sample_motion(directed, plan)
    timings["cadence"] = _ms(t0)
    t0 = time.perf_counter()
    smoothed = smooth_motion(sampled, settings.smoothing)
    timings["smoothing"] = _ms(t0)
    kin = kinematics_report(sampled, smoothed, plan.strides, settings.accel_limit)
    return MotionResult(audio, phon, raw, plan, smoothed, kin, timings, controls or None)


def analyze(
    audio: Audio, settings: RenderSettings, engine: Engine, controls: ControlTracks | None = None
) -> MotionResult:
    """Motion, cadence plan and kinematics for a clip, without rendering."""
    phon, raw, timings = generate(engine, audio, settings.seed, controls)
    source = engine.source_motion(audio.num_frames, settings)
    return postprocess(audio, phon, raw, settings, timings, controls, source)


blend = crossfade  # the in-place cross-fade (a renderer without keypoints makes these)


def make_inbetween(
    renderer: Renderer,
    prev_image: np.ndarray,
    next_image: np.ndarray,
    motion: np.ndarray,
    w: float,
    keys: Sequence[int] | None = None,
) -> np.ndarray:
    """The frame at weight ``w`` between two keyframe renders: the renderer's
    :meth:`~studio.engines.base.Renderer.inbetween` with the motion-compensated warp
    (``motion``: the rows of the previous keyframe, the next one and the frame; ``keys``
    their frame indices, where known)."""
    return renderer.inbetween(prev_image, next_image, motion, w, motion_inbetweens, keys)


def _needed_keyframes(
    plan: CadencePlan, prv: np.ndarray, nxt: np.ndarray, w: np.ndarray, known: Sequence | None
) -> np.ndarray:
    """The keyframes to render: all of them, or with ``known`` frames only those that a
    missing frame is made from."""
    if known is None:
        return plan.keyframes
    missing = np.array([f is None for f in known], dtype=bool)
    need = np.zeros(plan.num_frames, dtype=bool)
    need[prv[missing]] = True
    blended = missing & (w > 0.0)
    need[nxt[blended]] = True
    return np.flatnonzero(need)


def iter_frames(
    result: MotionResult,
    renderer: Renderer,
    batch: int | None = None,
    cancel: CancelCheck | None = None,
    progress: Progress | None = None,
    stats: dict | None = None,
    known: Sequence[np.ndarray | None] | None = None,
    overlap: bool = True,
) -> Iterator[np.ndarray]:
    """All frames in order: keyframes rendered in batches, in-betweens made from the two
    neighbouring keyframes in one call per batch (the renderer's
    :meth:`~studio.engines.base.Renderer.inbetweens`, motion-compensated).

    ``known`` (one entry per frame, None where missing) holds frames rendered before with
    the same motion and settings, e.g. the GUI's preview: they are passed through, and only
    the keyframes the missing frames need are rendered. ``stats['render_s']`` accumulates the
    time spent rendering and blending, ``stats['blend_s']`` the blending alone. ``batch``
    (keyframes per chunk) defaults to the renderer's own. ``overlap=False`` renders each
    chunk only when its frames are due (no device work ahead), so that the two times are each
    stage's own cost (:mod:`studio.render.fidelity`).
    """
    plan = result.plan
    n = plan.num_frames
    if known is not None and len(known) != n:
        raise ValueError(f"{len(known)} known frames for a clip of {n}")
    batch = batch or renderer.batch
    prv, nxt, w = blend_weights(plan)
    keys = _needed_keyframes(plan, prv, nxt, w, known)
    chunks = [keys[start : start + batch] for start in range(0, keys.size, batch)]
    if chunks:
        renderer.prepare(result.smoothed, inbetweens=bool((w > 0.0).any()))
    # A device renderer works one chunk ahead (the GPU renders while we encode).
    if overlap:
        results = renderer.iter_render(iter(chunks))
    else:
        results = (renderer.render_frames(chunk) for chunk in chunks)
    rendered: dict[int, np.ndarray] = {}
    stats = stats if stats is not None else {}
    stats.setdefault("render_s", 0.0)
    stats.setdefault("blend_s", 0.0)
    stats["reused_frames"] = 0 if known is None else sum(f is not None for f in known)

    def inbetweens_upto(last: int) -> dict[int, np.ndarray]:
        """The missing in-betweens from ``frame`` to ``last``, made in one call."""
        todo = np.arange(frame, last + 1)
        todo = todo[w[todo] > 0.0]
        if known is not None:
            todo = todo[[known[f] is None for f in todo]]
        if todo.size == 0:
            return {}
        t0 = time.perf_counter()
        p, q = prv[todo], nxt[todo]
        rows = result.smoothed[np.stack([p, q, todo], 1)]  # [B, 3, motion]
        made = renderer.inbetweens(
            [rendered[int(k)] for k in p],
            [rendered[int(k)] for k in q],
            rows,
            w[todo],
            warp=motion_inbetweens,
            keys=np.stack([p, q, todo], 1),
        )
        dt = time.perf_counter() - t0
        stats["render_s"] += dt
        stats["blend_s"] += dt
        return dict(zip(todo.tolist(), made, strict=True))

    def frames_upto(last: int) -> Iterator[np.ndarray]:
        nonlocal frame
        made = inbetweens_upto(last)
        while frame <= last:
            if known is not None and known[frame] is not None:
                yield known[frame]
            elif w[frame] == 0.0:
                yield rendered[int(prv[frame])]
            else:
                yield made.pop(frame)
            frame += 1

    frame = 0
    if progress is not None:
        progress("render", 0, n)  # before the first batch, which may build (compile) engines
    for chunk in chunks:
        if cancel is not None and cancel():
            raise Cancelled()
        t0 = time.perf_counter()
        images = next(results)
        rendered.update(zip(chunk.tolist(), images, strict=True))
        stats["render_s"] += time.perf_counter() - t0
        last = int(chunk[-1])
        yield from frames_upto(last)
        for k in [k for k in rendered if k < last]:
            del rendered[k]
        if progress is not None:
            progress("render", frame, n)
    if frame < n:  # known frames after the last rendered keyframe (or all of them)
        yield from frames_upto(n - 1)
        if progress is not None:
            progress("render", frame, n)


def retimed(result: MotionResult, fps: int) -> MotionResult:
    """``result`` at ``fps``: its smoothed motion resampled (:func:`studio.motion.retime.retime`)
    and every frame a keyframe (cadence's plan is the 25 fps clip's); its rows are the
    directed ones already, so it carries no tracks to apply again."""
    from studio.motion.retime import retime

    rows = retime(result.smoothed, fps)
    plan = plan_cadence(None, 1, num_frames=rows.shape[0])
    return replace(result, raw=rows, plan=plan, smoothed=rows, controls=None)


def quality_of(result: MotionResult, engine: Engine) -> dict:
    """The clip's weight-free quality metrics (:func:`studio.motion.quality.quality_report`):
    head dynamics, silent-lip stability over the silences Silero VAD finds
    (:func:`speech_silence`; ``silent_lips.silence_from`` says which), blinks,
    mouth-envelope correlation."""
    from studio.motion.quality import quality_report

    silence, source = speech_silence(result.audio, result.phon)
    report = quality_report(result.smoothed, engine.canonical_keypoints(), result.phon, silence)
    report["silent_lips"]["silence_from"] = source
    return report


_SILENCES: weakref.WeakKeyDictionary[Audio, Future[np.ndarray | None]] = (
    weakref.WeakKeyDictionary()
)
_SILENCES_LOCK = threading.Lock()


def speech_silence(audio: Audio, phon: PhoneticFrames) -> tuple[np.ndarray, str]:
    """The clip's silent frames and where they come from: Silero VAD (its model ships in its
    wheel), found once per audio (a GUI re-measures every preview of the same speech; a
    render starts it as soon as it has read the speech, :func:`find_silence_aside`); the
    phonetics' own silence where the VAD cannot run (not installed). A VAD that failed
    raises here once; the next call tries again."""
    found = _silence(audio, aside=False)
    try:
        vad = found.result()
    except BaseException:
        with _SILENCES_LOCK:
            if _SILENCES.get(audio) is found:
                del _SILENCES[audio]
        raise
    return (np.asarray(phon.silence, bool), "phonetics") if vad is None else (vad, "silero-vad")


def find_silence_aside(audio: Audio) -> None:
    """Start :func:`speech_silence`'s VAD on a thread of its own, as soon as the speech is
    read: the engine's opening, the analysis and the frames hide its CPU time (1-2 s for a
    minute of speech), which the quality report would wait for after the last frame."""
    _silence(audio, aside=True)


def _silence(audio: Audio, aside: bool) -> Future[np.ndarray | None]:
    with _SILENCES_LOCK:
        found = _SILENCES.get(audio)
        if found is not None:
            return found
        found = _SILENCES[audio] = Future()
    if aside:
        threading.Thread(
            target=_find_silence, args=(found, audio), name="silence", daemon=True
        ).start()
    else:
        _find_silence(found, audio)
    return found


def _find_silence(found: Future[np.ndarray | None], audio: Audio) -> None:
    """The VAD's mask, or None where it cannot run (the phonetics' silence stands in)."""
    from studio.motion.quality import vad_silence

    try:
        try:
            found.set_result(vad_silence(audio.samples))
        except RuntimeError:
            found.set_result(None)
    except BaseException as e:  # noqa: BLE001 - the one who waits for it raises it
        found.set_exception(e)


# stages an engine reports among its timings that are warm-up, paid by a process's first clip:
# capturing LMDM's window graphs (the Ditto engine on a GPU)
WARMUP_STAGES = ("lmdm_capture",)


def warmup_of(report: dict) -> dict[str, float]:
    """The engine's warm-up stages (:data:`WARMUP_STAGES`), taken out of a render report's
    ``timings_ms``, for its ``warmup_ms``: the stages then measure the clip's work only."""
    timings = report["timings_ms"]
    return {name: timings.pop(name) for name in WARMUP_STAGES if name in timings}


def build_report(result: MotionResult, timings_ms: dict[str, float], rendered: bool) -> dict:
    """The report: frame counts, stride histogram, timings and kinematics."""
    n = result.num_frames
    return {
        "frames": n,
        "fps": layout.FPS,
        "duration_s": round(result.audio.duration_s, 4),
        "rendered_frames": int(result.plan.keyframes.size) if rendered else 0,
        "rendered_fraction": round(result.plan.rendered_fraction, 4),
        "stride_histogram": result.plan.histogram(),
        "warp_forced_keyframes": int(result.plan.warp_forced),
        "timings_ms": {k: round(v, 2) for k, v in timings_ms.items()},
        "kinematics": {k: round(float(v), 6) for k, v in result.kinematics.items()},
    }


def iter_rgba(
    result: MotionResult,
    renderer: Renderer,
    batch: int | None = None,
    cancel: CancelCheck | None = None,
    progress: Progress | None = None,
    stats: dict | None = None,
) -> Iterator[np.ndarray]:
    """Every frame as [H, W, 4] RGBA with straight alpha (the renderer's
    :meth:`~studio.engines.base.Renderer.render_rgba`), in order. Every frame is rendered:
    in-betweens are made from RGB keyframes, so a transparent export renders them in full."""
    n = result.num_frames
    batch = batch or renderer.batch
    stats = stats if stats is not None else {}
    stats.setdefault("render_s", 0.0)
    stats.setdefault("blend_s", 0.0)
    stats["reused_frames"] = 0
    renderer.prepare(result.smoothed, inbetweens=False)
    if progress is not None:
        progress("render", 0, n)
    for start in range(0, n, batch):
        if cancel is not None and cancel():
            raise Cancelled()
        t0 = time.perf_counter()
        images = renderer.render_rgba(np.arange(start, min(start + batch, n)))
        stats["render_s"] += time.perf_counter() - t0
        yield from images
        if progress is not None:
            progress("render", min(start + batch, n), n)


@contextlib.contextmanager
def drawn_over(renderer: Renderer, colour: tuple[int, int, int] | None) -> Iterator[None]:
    """The renderer draws over ``colour`` inside the block (None: its avatar's own backdrop,
    nothing changed), and over what it drew over before after it."""
    if colour is None:
        yield
        return
    before = renderer.backdrop
    renderer.set_backdrop(colour)
    try:
        yield
    finally:
        renderer.set_backdrop(before)


@contextlib.contextmanager
def _at_frame_rate(renderer: Renderer, fps: int) -> Iterator[None]:
    """The renderer is told the frames' rate inside the block (a retimed export's)."""
    before, renderer.frame_rate = renderer.frame_rate, fps
    try:
        yield
    finally:
        renderer.frame_rate = before


@contextlib.contextmanager
def _encoder_planes(renderer: Renderer, writer: Writer) -> Iterator[None]:
    """Let a renderer that can (``yuv_planes``) hand over yuv420p planes while exporting to
    a writer that takes them."""
    if not renderer.yuv_planes or not writer.takes_planes:
        yield
        return
    before, renderer.pixel_format = renderer.pixel_format, "yuv420p"
    try:
        yield
    finally:
        renderer.pixel_format = before


def start_video(
    result: MotionResult,
    renderer: Renderer,
    out_path: str,
    settings: RenderSettings,
    cancel: CancelCheck | None = None,
    progress: Progress | None = None,
    started: float | None = None,
    known: Sequence[np.ndarray | None] | None = None,
) -> EncodingVideo:
    """Render every frame into the video's (or PNG sequence's) encoder; ``.finish()`` on what
    this returns writes the file atomically and gives the report. The renderer is free again
    when this returns, so a batch renders its next clip while x264 ends this one. On an
    exception nothing is written.

    ``started`` is the perf_counter() value the job began at (for the total); ``known``
    frames (see :func:`iter_frames`) are encoded as they are, not rendered again. The
    settings' ``background`` draws the head over a colour, or over nothing (RGBA frames to a
    file type with alpha).
    """
    from studio.export.encoder_thread import EncoderThread
    from studio.export.writer import open_writer

    started = time.perf_counter() if started is None else started
    fps = int(settings.fps)
    if fps != layout.FPS:  # every frame at the output's times, rendered from resampled motion
        result = retimed(result, fps)
        known = None
    alpha = settings.background == "transparent"
    if settings.background != "avatar":  # frames seen before were drawn over the avatar
        known = None
    stats: dict = {}
    split_before = renderer.timings_ms
    t0 = time.perf_counter()
    height, width = frame_shape(renderer)
    with contextlib.ExitStack() as files:  # the writer and its encoder: discarded on an error
        writer = files.enter_context(
            open_writer(
                out_path,
                width,
                height,
                audio=result.audio,
                crf=settings.crf,
                preset=settings.preset,
                fps=fps,
                codec=settings.codec,
                alpha=alpha,
                hardware=settings.hw_encode,
            )
        )
        encoder = files.enter_context(EncoderThread(writer))
        with (
            _encoder_planes(renderer, writer),
            drawn_over(renderer, settings.backdrop),
            _at_frame_rate(renderer, fps),
        ):
            if alpha:
                frames = iter_rgba(result, renderer, cancel=cancel, progress=progress, stats=stats)
            else:
                frames = iter_frames(
                    result, renderer, cancel=cancel, progress=progress, stats=stats, known=known
                )
            measured = InbetweenSample(result, renderer, alpha)
            for i, img in enumerate(frames):
                measured.keep(i, img)
                encoder.put(img)
            if cancel is not None and cancel():
                raise Cancelled()
            inbetween_psnr = measured.psnr(progress)  # full renders over the same backdrop
        timings = dict(result.timings_ms)
        split = {k: v - split_before.get(k, 0.0) for k, v in renderer.timings_ms.items()}
        if split:  # the renderer's stages (device time, overlapping the host), and the blending
            timings.update(split)  # this clip's: a renderer kept from clip to clip accumulates
            timings["blend"] = stats["blend_s"] * 1000.0
        else:
            timings["render"] = stats["render_s"] * 1000.0
        facts = {
            "fps": fps,
            # a PNG sequence is its folder
            "output": str(out_path) if writer.codec != "png" else f"{writer.path}{os.sep}",
            "background": settings.background,
            "size": renderer.size,
            "frame_size": [width, height],
            "reused_frames": stats["reused_frames"],
        }
        if inbetween_psnr is not None:
            facts["inbetween_psnr"] = inbetween_psnr
        # the file stays open past this block: its ExitStack goes with the video
        return EncodingVideo(result, writer, encoder, timings, facts, started, t0, files.pop_all())


@dataclass
class EncodingVideo:
    """A clip whose frames are all with its encoder (:func:`start_video`): :meth:`finish`
    waits for the encoder, writes the file and returns the report; :meth:`abort` discards it.
    Either may run on another thread than the render's."""

    result: MotionResult
    writer: Writer
    encoder: Any  # studio.export.encoder_thread.EncoderThread
    timings: dict[str, float]  # the clip's stages, without the encoder's
    facts: dict[str, Any]  # the report's fields known when the last frame was rendered
    started: float  # when the job began (perf_counter)
    render_start: float  # when its first frame was asked for
    files: contextlib.ExitStack  # the writer and its encoder thread, still open
    rendered_at: float = field(default_factory=time.perf_counter)  # the last frame queued

    def finish(self, aside: bool = False) -> dict:
        """Wait for the encoder, commit the file; the report. ``aside``: this runs beside
        the next clip's render, so its wait is ``encode_tail`` and the frame rate is the
        render's alone; else both count as before (``encode_wait``, the loop's wall)."""
        loop_wait = self.encoder.wait_s
        with self.files:  # commits on a normal exit; the encoder's error discards the file
            self.encoder.finish()
        writer = self.writer
        timings = dict(self.timings)
        # The encoder runs beside the render loop: "encode" is its own busy time, "encode_wait"
        # the part of it the loop waited for (what encoding added to the wall time).
        timings["encode"] = writer.encode_seconds * 1000.0
        timings["encode_wait"] = (loop_wait if aside else self.encoder.wait_s) * 1000.0
        if aside:
            timings["encode_tail"] = (self.encoder.wait_s - loop_wait) * 1000.0
        timings["total"] = _ms(self.started)
        report = build_report(self.result, timings, rendered=True)
        report["codec"] = writer.codec
        report["encoder"] = getattr(writer, "encoder", writer.codec)
        if getattr(writer, "note", ""):
            report["notes"] = [*report.get("notes", []), writer.note]
        report.update(self.facts)
        loop_end = self.rendered_at if aside else time.perf_counter()
        loop_s = max(loop_end - self.render_start, 1e-9)
        report["render_fps"] = round(self.result.num_frames / loop_s, 2)
        return report

    def abort(self) -> None:
        """Discard the file now, from any thread (a batch stopped before this clip's record
        could be kept), unless it is written already: a :meth:`finish` still writing it, or
        still to come, then raises Cancelled."""
        self.writer.abort()


class InbetweenSample:
    """A dozen of a clip's in-betweens kept as they are made, then measured against full
    renders of their motion (:func:`studio.render.fidelity.inbetween_psnr`): what cadence
    cost this clip in picture. Only RGB frames (not RGBA, not encoder planes) are kept."""

    def __init__(self, result: MotionResult, renderer: Renderer, alpha: bool = False) -> None:
        from studio.render.fidelity import PSNR_SAMPLE, sample_inbetweens

        self.result, self.renderer = result, renderer
        rgb = not alpha and renderer.pixel_format == "rgb24"
        picked = sample_inbetweens(result.plan, PSNR_SAMPLE) if rgb else []
        self.wanted = {int(i) for i in picked}
        self.made: dict[int, np.ndarray] = {}

    def keep(self, index: int, image: np.ndarray) -> None:
        if index in self.wanted:
            self.made[index] = np.array(image, copy=True)  # the renderer may reuse its buffer

    def psnr(self, progress: Progress | None = None) -> dict | None:
        if not self.made:
            return None
        from studio.render.fidelity import inbetween_psnr

        return inbetween_psnr(self.result, self.renderer, self.made, progress)
