"""Weight-free quality metrics of a talking-head motion (numpy/scipy only).

What users judge and kinematics does not measure: how the head moves (THEval's head-motion
dynamics and smoothness), whether the mouth keeps still in silence, how often the eyes blink
and at what intervals, and whether the mouth opens with the speech (a lip-sync proxy). All of
it is read from the studio's own motion ([N, 265] rows, :func:`studio.layout.unpack`), the
avatar's canonical keypoints ([21, 3]) and the per-frame speech cues
(:class:`studio.audio.phonetics.PhoneticFrames`); no model weights.

Units: angles in degrees; time in frames at :data:`studio.layout.FPS` (25 fps) unless a name
says seconds; translation in normalised keypoint units. Mouth and eye openings are measured
on the expression keypoints (:func:`expression_keypoints`: the keypoint transform at a neutral
pose, so a nod or a lean does not read as a mouth movement) and divided by the eye distance,
so they compare across avatars.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio import layout
from studio.audio.phonetics import PhoneticFrames, frame_count

MIN_SILENCE_S = 0.3  # a silent stretch shorter than this is a breath between words, not a pause
SILENCE_EDGE_S = 0.08  # skipped at each end of a stretch: the mouth settles after the last word
BLINK_FRACTION = 0.5  # a blink: both eyes' opening below this fraction of the open level
BLINK_SCHEDULE_S = (2.4, 4.0)  # Ditto's own blink schedule (and the demo engine's)
MOUTH_METHODS = ("extent", "pair")


# --- shared stages -----------------------------------------------------------------------------


def _frames(motion: np.ndarray | layout.MotionFrames) -> layout.MotionFrames:
    """Unpacked motion (unpacked once by :func:`quality_report`, then shared)."""
    return motion if isinstance(motion, layout.MotionFrames) else layout.unpack(motion)


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, stops) of the runs of True in a 1-D mask."""
    edges = np.diff(np.concatenate([[0], np.asarray(mask, np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def expression_keypoints(
    motion: np.ndarray | layout.MotionFrames, canonical: np.ndarray
) -> np.ndarray:
    """[N, 21, 3] ``canonical + exp``: LivePortrait's keypoint transform
    ``scale * (R kp + exp) + t`` at a neutral pose (no rotation, scale 1, no translation).

    The expression's own geometry: the mouth and eye openings are read from it, so a nod, a
    turn or a lean never reads as a lip or lid movement (``exp`` is a view-space offset, so
    measuring after the full transform would mix in a few percent of the pose)."""
    kp = np.asarray(canonical, np.float64).reshape(layout.NUM_KP, layout.KP_DIMS)
    return kp + np.asarray(_frames(motion).exp, np.float64)


def _eye_distance(local: np.ndarray) -> np.ndarray:
    """[N] distance between the left and the right eye's lid centroids."""
    (left, right) = (local[:, list(pair)].mean(axis=1) for pair in layout.EYE_LIDS_KP)
    return np.maximum(np.linalg.norm(left - right, axis=-1), 1e-9)


# --- head motion -------------------------------------------------------------------------------


def head_dynamics(motion: np.ndarray | layout.MotionFrames) -> dict[str, Any]:
    """THEval's head-motion dynamics of a clip.

    ``diff_var``: per axis (pitch, yaw, roll), the variance of the frame-to-frame angle
    difference, in degrees² per frame² (frames at 25 fps). ``angle_std``: per axis, the
    standard deviation of the angle, degrees. ``translation_var``: the mean variance of the
    translation's x and y (z is ignored by the keypoint transform), keypoint units².
    ``smoothness``: sqrt(mean angle std × mean diff variance + mean translation variance), the
    THEval formula (its units mixed as THEval's). A still head scores 0 throughout.
    """
    f = _frames(motion)
    angles = np.stack([f.pitch, f.yaw, f.roll], axis=1).astype(np.float64)
    diff_var = np.var(np.diff(angles, axis=0), axis=0) if len(angles) > 1 else np.zeros(3)
    angle_std = np.std(angles, axis=0)
    t_var = float(np.mean(np.var(np.asarray(f.t, np.float64)[:, :2], axis=0)))
    smooth = float(np.sqrt(angle_std.mean() * diff_var.mean() + t_var))
    return {
        "diff_var": dict(zip(layout.POSE_ANGLES, diff_var.tolist(), strict=True)),
        "angle_std": dict(zip(layout.POSE_ANGLES, angle_std.tolist(), strict=True)),
        "translation_var": t_var,
        "smoothness": smooth,
    }


# --- mouth -------------------------------------------------------------------------------------


def mouth_opening(
    motion: np.ndarray | layout.MotionFrames, canonical: np.ndarray, method: str = "extent"
) -> np.ndarray:
    """[N] mouth opening per frame, in eye distances, on the expression keypoints.

    ``"extent"``: the vertical extent (max y - min y) of the lip set :data:`layout.LIP_KP`,
    which reads any model's lip keypoints whatever their roles; ``"pair"``: the distance
    between :data:`layout.LIP_UPPER_KP` and :data:`layout.LIP_LOWER_KP` (the demo rig's
    lips). Both include the closed mouth's own height: compare them, not their level."""
    return _mouth(expression_keypoints(motion, canonical), method)


def _mouth(local: np.ndarray, method: str = "extent") -> np.ndarray:
    """:func:`mouth_opening` of head-frame keypoints."""
    if method not in MOUTH_METHODS:
        raise ValueError(f"method must be one of {', '.join(MOUTH_METHODS)}, got {method!r}")
    if method == "pair":
        gap = local[:, layout.LIP_UPPER_KP] - local[:, layout.LIP_LOWER_KP]
        height = np.linalg.norm(gap, axis=-1)
    else:
        y = local[:, list(layout.LIP_KP), 1]
        height = y.max(axis=1) - y.min(axis=1)
    return height / _eye_distance(local)


def silent_stretches(
    silence: np.ndarray, min_s: float = MIN_SILENCE_S, edge_s: float = SILENCE_EDGE_S
) -> list[tuple[int, int]]:
    """[(start, stop)] frame ranges of the silent stretches of at least ``min_s`` seconds,
    each less ``edge_s`` seconds at both ends (where the mouth closes after speech and opens
    before it)."""
    starts, stops = _runs(np.asarray(silence, bool))
    keep = stops - starts >= round(min_s * layout.FPS)
    edge = round(edge_s * layout.FPS)
    return [(int(a) + edge, int(b) - edge) for a, b in zip(starts[keep], stops[keep], strict=True)]


def silent_lip_deviation(
    opening: np.ndarray,
    silence: np.ndarray,
    min_s: float = MIN_SILENCE_S,
    edge_s: float = SILENCE_EDGE_S,
) -> float:
    """Mean absolute deviation of the mouth opening over the silent stretches (each about its
    own mean, so a mouth left a little open is not mumbling), in eye distances: a head should
    not move its lips in silence. NaN when the clip has no stretch of ``min_s`` seconds."""
    x = np.asarray(opening, np.float64)
    spans = silent_stretches(silence, min_s, edge_s)
    return _mad(*(x[a:b] for a, b in spans))


def _mad(*parts: np.ndarray) -> float:
    """Mean absolute deviation of each part about its own mean, pooled (NaN if empty)."""
    dev = [np.abs(p - p.mean()) for p in parts if p.size]
    return float(np.concatenate(dev).mean()) if dev else float("nan")


def mouth_envelope_correlation(
    opening: np.ndarray, level: np.ndarray, speech: np.ndarray | None = None
) -> float:
    """Pearson correlation of the mouth opening with the speech envelope (the phonetics'
    ``level``) over the speech frames (all frames when ``speech`` is None): a weight-free
    lip-sync proxy. NaN when either is constant there or fewer than 3 frames are speech."""
    x, y = np.asarray(opening, np.float64), np.asarray(level, np.float64)
    if speech is not None:
        m = np.asarray(speech, bool)
        x, y = x[m], y[m]
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def envelope_lag(
    opening: np.ndarray, level: np.ndarray, speech: np.ndarray | None = None, max_lag: int = 5
) -> tuple[int, float]:
    """(lag, correlation) of the best :func:`mouth_envelope_correlation` with the mouth shifted
    by -max_lag..max_lag frames; lag > 0: the mouth follows the sound by that many frames,
    lag < 0: it leads (a lip-sync offset, as SyncNet reports one, without its weights)."""
    x, y = np.asarray(opening), np.asarray(level)
    m = np.ones(x.size, bool) if speech is None else np.asarray(speech, bool)
    n = x.size
    best = (0, float("nan"))
    for lag in range(-max_lag, max_lag + 1):
        a, b = max(0, -lag), min(n, n - lag)  # level frames j whose mouth frame j + lag exists
        r = mouth_envelope_correlation(x[a + lag : b + lag], y[a:b], m[a:b])
        if np.isfinite(r) and not r <= best[1]:
            best = (lag, r)
    return best


# --- eyes --------------------------------------------------------------------------------------


def eye_openings(motion: np.ndarray | layout.MotionFrames, canonical: np.ndarray) -> np.ndarray:
    """[N, 2] lid gap (upper to lower lid distance) of the left and the right eye, in eye
    distances, on the expression keypoints."""
    return _eyes(expression_keypoints(motion, canonical))


def _eyes(local: np.ndarray) -> np.ndarray:
    """:func:`eye_openings` of head-frame keypoints."""
    return np.linalg.norm(layout.lid_gaps(local), axis=-1) / _eye_distance(local)[:, None]


@dataclass(frozen=True)
class Blinks:
    """Blink events of a clip. ``onsets``: first frame of each blink (the eyes' opening below
    the fraction of the open level); ``intervals_s``: seconds between successive onsets."""

    onsets: np.ndarray  # [k] int frames
    intervals_s: np.ndarray  # [k - 1] float seconds
    seconds: float  # clip length

    @property
    def rate_per_min(self) -> float:
        return 60.0 * self.onsets.size / self.seconds if self.seconds > 0 else 0.0

    @property
    def in_schedule(self) -> float:
        """Fraction of intervals within :data:`BLINK_SCHEDULE_S` (NaN without intervals)."""
        if self.intervals_s.size == 0:
            return float("nan")
        lo, hi = BLINK_SCHEDULE_S
        eps = 0.5 / layout.FPS  # onsets are whole frames
        ok = (self.intervals_s >= lo - eps) & (self.intervals_s <= hi + eps)
        return float(ok.mean())

    def summary(self) -> dict[str, Any]:
        """Count, rate, interval statistics and the schedule fraction (floats, NaN if none)."""
        iv = self.intervals_s
        stat = (lambda fn: float(fn(iv))) if iv.size else (lambda fn: float("nan"))
        return {
            "count": int(self.onsets.size),
            "rate_per_min": self.rate_per_min,
            "interval_mean_s": stat(np.mean),
            "interval_median_s": stat(np.median),
            "interval_min_s": stat(np.min),
            "interval_max_s": stat(np.max),
            "in_schedule": self.in_schedule,
            "schedule_s": list(BLINK_SCHEDULE_S),
        }


def blink_events(eyes: np.ndarray, fraction: float = BLINK_FRACTION) -> np.ndarray:
    """[k] onset frames of the dips of the mean eye opening (of [N] or [N, 2] openings) below
    ``fraction`` of the open level (the median: eyes are open most of the time)."""
    e = np.asarray(eyes, np.float64)
    e = e.mean(axis=1) if e.ndim == 2 else e
    if e.size == 0:
        return np.zeros(0, np.int64)
    starts, _ = _runs(e < fraction * np.median(e))
    return starts.astype(np.int64)


def blinks(
    motion: np.ndarray | layout.MotionFrames,
    canonical: np.ndarray,
    fraction: float = BLINK_FRACTION,
) -> Blinks:
    """Blink events from the eye keypoints (see :func:`blink_events`), their intervals in
    seconds and, through :class:`Blinks`, the rate per minute and the 2.4-4 s schedule."""
    return _blinks(eye_openings(motion, canonical), fraction)


def _blinks(eyes: np.ndarray, fraction: float = BLINK_FRACTION) -> Blinks:
    """:func:`blinks` of [N, 2] eye openings."""
    onsets = blink_events(eyes, fraction)
    return Blinks(onsets, np.diff(onsets) / layout.FPS, eyes.shape[0] / layout.FPS)


# --- voice activity (optional) -----------------------------------------------------------------


_SILERO_LOCK = threading.Lock()


def _silero() -> tuple[Any, Any]:
    """silero_vad's ``get_speech_timestamps`` and ``load_silero_vad``. Its model module sets
    torch to one thread, process-wide, when first imported: that call is held off while it
    imports, so that a render on another thread keeps its thread count (and its float sums
    their order). RuntimeError when the package is missing."""
    import torch

    with _SILERO_LOCK:
        real = torch.set_num_threads
        torch.set_num_threads = lambda _n: None
        try:
            from silero_vad import get_speech_timestamps, load_silero_vad
        except ImportError as exc:
            raise RuntimeError(
                "Silero VAD is not installed: pip install 'silero-vad==6.2.3' (torch only), "
                "or use the phonetic silence mask"
            ) from exc
        finally:
            torch.set_num_threads = real
    return get_speech_timestamps, load_silero_vad


class WindowProbabilities:
    """Silero's speech probability of every 512-sample window of ``audio`` (16 kHz), computed
    by one call of its TorchScript ``audio_forward`` (the model's own loop: states reset, the
    last window zero-padded, as ``get_speech_timestamps`` calls it window by window), and
    handed back in order to ``get_speech_timestamps`` in the model's place.

    Called window by window from Python, the model gives up the interpreter on each of its
    1,875 calls for a minute of speech; beside a render thread running Python, each call then
    waited for that thread's switch interval: 0.35 s alone became 13 s (measured here), and a
    render's report waited seconds for it after the last frame. One call waits once."""

    def __init__(self, model: Any, audio: Any) -> None:
        self._probs = iter(model.audio_forward(audio, 16000)[0].tolist())

    def reset_states(self) -> None:
        """Nothing: the probabilities were computed from reset states."""

    def __call__(self, chunk: Any, sampling_rate: int) -> np.float64:
        return np.float64(next(self._probs))  # read back with .item(), as the model's tensor


def vad_silence(samples16k: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """[frames] bool silence mask at 25 fps from Silero VAD (the ``silero-vad`` package, whose
    wheel ships its model; it needs torch only, not torchaudio). Optional: the phonetics'
    ``silence`` is the default. Raises RuntimeError when the package is missing."""
    import torch

    get_speech_timestamps, load_silero_vad = _silero()
    audio = torch.from_numpy(np.ascontiguousarray(samples16k, np.float32))
    probs = WindowProbabilities(load_silero_vad(), audio)
    spans = get_speech_timestamps(audio, probs, threshold=threshold, sampling_rate=16000)
    silence = np.ones(frame_count(len(samples16k)), bool)
    for span in spans:
        a, b = (round(span[k] / layout.SAMPLES_PER_FRAME) for k in ("start", "end"))
        silence[a:b] = False
    return silence


# --- the report --------------------------------------------------------------------------------


def _json(x: Any, digits: int = 4) -> Any:
    """Rounded, JSON-ready copy: floats to ``digits`` significant digits (the metrics span
    1e-6 .. 1e2), NaN and inf to None."""
    if isinstance(x, dict):
        return {k: _json(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json(v, digits) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(f"{float(x):.{digits}g}") if np.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def quality_report(
    motion: np.ndarray,
    canonical: np.ndarray,
    phon: PhoneticFrames,
    silence: np.ndarray | None = None,
) -> dict[str, Any]:
    """All the metrics of a clip as a JSON-ready dict (rounded; NaN as None). ``silence``
    overrides the phonetics' silence mask (e.g. :func:`vad_silence`). Motion and phonetics
    are cut to the shorter of the two."""
    n = min(len(motion), phon.num_frames)
    f = layout.unpack(np.asarray(motion)[:n])
    silent = np.asarray(phon.silence if silence is None else silence, bool)[:n]
    silent = np.pad(silent, (0, n - silent.size), constant_values=True)
    local = expression_keypoints(f, canonical)
    opening = _mouth(local)
    stretches = silent_stretches(silent)
    b = _blinks(_eyes(local))
    speech = ~silent
    lag, lag_r = envelope_lag(opening, np.asarray(phon.level)[:n], speech)
    return _json(
        {
            "frames": n,
            "seconds": n / layout.FPS,
            "head": head_dynamics(f),
            "silent_lips": {
                "deviation": silent_lip_deviation(opening, silent),
                "stretches": len(stretches),
                "frames": int(sum(b - a for a, b in stretches)),
                "speech_deviation": _mad(opening[speech]),
            },
            "blinks": b.summary(),
            "lip_sync": {
                "envelope_correlation": mouth_envelope_correlation(
                    opening, np.asarray(phon.level)[:n], speech
                ),
                "best_lag_frames": lag,
                "best_lag_correlation": lag_r,
                "speech_frames": int(speech.sum()),
            },
        }
    )
