"""Control tracks: keyframed directions over a clip, applied to the motion once it is made.

A track holds keys (time in seconds, a value, and how the value goes to the next key:
``hold``, ``linear`` or ``smooth``, an ease in and out); before its first key a track has the
first key's value, after its last the last's. The tracks, each optional:

- ``pitch``, ``yaw``, ``roll``: degrees added to the head's pose (a nod is a pitch key);
- ``head``: the amplitude of the head's movement about the clip's first frame (1: as
  generated, 0: still, 1.5: livelier), pose and position alike;
- ``mouth``: the amplitude of the mouth's movement about its first frame (1: as generated;
  0.5 for a subdued delivery);
- ``eyes``: the lids' opening added, in pixels of a 512 frame (positive: wider);
- ``blink``: 1 blinks as generated, 0 holds the lids as they were at the clip's start;
- ``fade``: 1 the performance, 0 the avatar at rest as at the first frame (fade in and out);
- ``emotion``: a label of :data:`studio.layout.EMOTIONS` (its name, or its number) from each
  key, blended into the next key's label by the key's interpolation (``hold``: segments).

All but ``emotion`` apply to the generated motion rows before cadence and smoothing
(:func:`apply_controls`), so both engines honour them (their motion has one layout), the
smoothing's acceleration limit keeps a keyed turn natural, and the motion model does not run
again after an edit. The first frame is the reference, as it is for Ditto's relative driving.
``emotion`` conditions the motion itself (:meth:`ControlTracks.emotion_rows`: Ditto's LMDM
condition per frame; the demo engine's expression per label), so an emotion edit makes the
motion again.

The file (``studio render --controls FILE``)::

    {"format": "studio-controls/1",
     "tracks": {"pitch": [{"t": 5.0, "value": 0}, {"t": 5.3, "value": 8, "interp": "smooth"},
                          {"t": 5.6, "value": 0}],
                "mouth": [{"t": 0, "value": 1}, {"t": 2, "value": 0.6, "interp": "linear"}],
                "emotion": [{"t": 1.8, "value": "Neutral"}, {"t": 2.0, "value": "Happy",
                             "interp": "hold"}, {"t": 4.0, "value": "Neutral"}]}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio import layout
from studio.errors import InputError
from studio.files import read_json

CONTROLS_FORMAT = "studio-controls/1"
INTERPOLATIONS = ("hold", "linear", "smooth")
TRACKS: dict[str, tuple[float, float, float]] = {  # name -> (neutral, lowest, highest)
    "pitch": (0.0, -45.0, 45.0),
    "yaw": (0.0, -60.0, 60.0),
    "roll": (0.0, -45.0, 45.0),
    "head": (1.0, 0.0, 3.0),
    "mouth": (1.0, 0.0, 3.0),
    "eyes": (0.0, -20.0, 20.0),
    "blink": (1.0, 0.0, 1.0),
    "fade": (1.0, 0.0, 1.0),
    "emotion": (float(layout.DEFAULT_EMOTION), 0.0, float(layout.NUM_EMOTIONS - 1)),
}
POST_MOTION = tuple(name for name in TRACKS if name != "emotion")  # apply_controls' tracks
MAX_CONTROLS_BYTES = 16 * 2**20
PIXELS_PER_UNIT = 256.0  # keypoint units -> pixels of a 512 frame (the frame spans [-1, 1])


@dataclass(frozen=True)
class Key:
    """A track's value from ``t`` seconds, and how it goes to the next key."""

    t: float
    value: float
    interp: str = "smooth"


@dataclass(frozen=True)
class ControlTracks:
    """Keyed tracks by name (:data:`TRACKS`), keys sorted by time."""

    tracks: Mapping[str, tuple[Key, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.tracks.values())

    def sample(self, name: str, num_frames: int, fps: int = layout.FPS) -> np.ndarray:
        """The track's value at every frame [N] (its neutral value where it has no keys)."""
        keys = self.tracks.get(name, ())
        if not keys:
            return np.full(num_frames, TRACKS[name][0])
        times = np.arange(num_frames, dtype=np.float64) / fps
        return _curve(keys, np.array([k.value for k in keys]), times)

    def keys(self, name: str) -> tuple[Key, ...]:
        """Track ``name``'s keys, in time order (none where it has none)."""
        return tuple(self.tracks.get(name, ()))

    def value_at(self, name: str, t: float) -> float:
        """Track ``name``'s value at ``t`` seconds (a new key there keeps the curve)."""
        keys = self.keys(name)
        if not keys:
            return TRACKS[name][0]
        if name == "emotion":  # labels do not average: the key in force
            return next((k.value for k in reversed(keys) if k.t <= t), keys[0].value)
        return float(_curve(keys, np.array([k.value for k in keys]), np.array([float(t)]))[0])

    def with_key(self, name: str, key: Key, replace: int | None = None) -> ControlTracks:
        """These tracks with ``key`` on track ``name`` (instead of its key number ``replace``
        when given; a key at the same time is replaced), checked like a key from a file."""
        checked = _key({"t": key.t, "value": key.value, "interp": key.interp}, name, name)
        keys = [k for i, k in enumerate(self.keys(name)) if i != replace and k.t != checked.t]
        tracks = dict(self.tracks)
        tracks[name] = tuple(sorted([*keys, checked], key=lambda k: k.t))
        return ControlTracks(tracks)

    def without_key(self, name: str, index: int) -> ControlTracks:
        """These tracks without track ``name``'s key number ``index``."""
        keys = self.keys(name)
        tracks = dict(self.tracks)
        rest = keys[:index] + keys[index + 1 :]
        if rest:
            tracks[name] = rest
        else:
            tracks.pop(name, None)
        return ControlTracks(tracks)

    def emotion_rows(self, num_frames: int, fps: int = layout.FPS) -> np.ndarray | None:
        """[N, 8] float32 emotion weights per frame from the emotion track (one label, or
        two blended between keys), or None where it has no keys."""
        keys = self.tracks.get("emotion", ())
        if not keys:
            return None
        times = np.arange(num_frames, dtype=np.float64) / fps
        labels = np.eye(layout.NUM_EMOTIONS)[[int(k.value) for k in keys]]
        return _curve(keys, labels, times).astype(np.float32)

    def motion_key(self) -> tuple:
        """What of the tracks the motion itself depends on (the emotion keys): a cache key."""
        return tuple(self.tracks.get("emotion", ()))

    def to_dict(self) -> dict[str, Any]:
        def value(name: str, k: Key) -> Any:
            return layout.EMOTIONS[int(k.value)] if name == "emotion" else k.value

        return {
            "format": CONTROLS_FORMAT,
            "tracks": {
                name: [{"t": k.t, "value": value(name, k), "interp": k.interp} for k in keys]
                for name, keys in self.tracks.items()
                if keys
            },
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "controls") -> ControlTracks:
        """Tracks from their JSON form; InputError naming ``source``, the track and the key."""
        if not isinstance(data, dict):
            raise InputError(f'{source}: control tracks are a JSON object with "tracks"')
        fmt = data.get("format", CONTROLS_FORMAT)
        if fmt != CONTROLS_FORMAT:
            raise InputError(f"{source}: format {fmt!r} is not {CONTROLS_FORMAT!r}")
        unknown = sorted(set(data) - {"format", "tracks"})
        if unknown:
            raise InputError(f"{source}: unknown key {unknown[0]!r} (format, tracks)")
        tracks = data.get("tracks", {})
        if not isinstance(tracks, dict):
            raise InputError(f"{source}: tracks must be an object of track name -> keys")
        out: dict[str, tuple[Key, ...]] = {}
        for name, keys in tracks.items():
            if name not in TRACKS:
                raise InputError(
                    f"{source}: unknown track {name!r}; the tracks are {', '.join(TRACKS)}"
                )
            if not isinstance(keys, list):
                raise InputError(f"{source}: {name}: a list of keys {{t, value, interp}}")
            out[name] = tuple(
                sorted(
                    (_key(k, f"{source}: {name}[{i}]", name) for i, k in enumerate(keys)),
                    key=lambda k: k.t,
                )
            )
        return cls(out)

    def save(self, path: str | Path) -> None:
        from studio.files import write_atomic

        write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ControlTracks:
        """Tracks from a JSON file; InputError naming the file for anything wrong."""
        p = Path(path)
        data = read_json(p, "control tracks", MAX_CONTROLS_BYTES)
        return cls.from_dict(data, source=str(p))


def _weights(interp: str, u: np.ndarray) -> np.ndarray:
    """How far a key's value has gone to the next key's at fractions ``u`` of the gap."""
    if interp == "hold":
        return np.zeros_like(u)
    if interp == "linear":
        return u
    return u * u * (3.0 - 2.0 * u)


def _curve(keys: tuple[Key, ...], values: np.ndarray, times: np.ndarray) -> np.ndarray:
    """The keys' ``values`` ([K] numbers, or [K, D] rows such as emotion weights) at
    ``times``: the first key's before it, each key's going to the next by its
    interpolation, the last key's after it."""
    out = np.repeat(values[:1].astype(np.float64), len(times), axis=0)
    for i, (a, b) in enumerate(zip(keys, keys[1:], strict=False)):
        inside = (times >= a.t) & (times < b.t)
        w = _weights(a.interp, (times[inside] - a.t) / max(b.t - a.t, 1e-9))
        w = w.reshape(-1, *([1] * (values.ndim - 1)))
        out[inside] = values[i] + w * (values[i + 1] - values[i])
    out[times >= keys[-1].t] = values[-1]
    return out


def _emotion_label(value: Any, where: str) -> Any:
    """An emotion key's value as its label number: a name (any case) or a whole number."""
    if isinstance(value, str):
        names = [e.lower() for e in layout.EMOTIONS]
        if value.strip().lower() not in names:
            raise InputError(
                f"{where}: emotion {value!r} is not one of {', '.join(layout.EMOTIONS)}"
            )
        return names.index(value.strip().lower())
    if isinstance(value, int | float) and not isinstance(value, bool) and value != int(value):
        raise InputError(f"{where}: an emotion is a label name or number, not {value!r}")
    return value


def _key(item: Any, where: str, track: str) -> Key:
    if not isinstance(item, dict) or "t" not in item or "value" not in item:
        raise InputError(f'{where}: a key is {{"t": seconds, "value": number}}')
    unknown = sorted(set(item) - {"t", "value", "interp"})
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r} (t, value, interp)")
    t, value = item["t"], item["value"]
    if track == "emotion":
        value = _emotion_label(value, where)
    for label, v in (("t", t), ("value", value)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InputError(f"{where}: {label} must be a finite number, not {v!r}")
    if t < 0:
        raise InputError(f"{where}: t must be 0 or more seconds, not {t}")
    _, low, high = TRACKS[track]
    if not low <= value <= high:
        raise InputError(f"{where}: value {value} is outside {low:g}..{high:g} for {track}")
    interp = item.get("interp", "smooth")
    if interp not in INTERPOLATIONS:
        raise InputError(f"{where}: interp {interp!r} is not one of {', '.join(INTERPOLATIONS)}")
    return Key(float(t), float(value), interp)


def apply_controls(
    motion: np.ndarray, controls: ControlTracks | None, fps: int = layout.FPS
) -> np.ndarray:
    """``motion`` [N, 265] directed by ``controls`` (module docstring); the rows themselves
    when there are none, and bit for bit where every track is at its neutral value (a keyed
    move changes its own stretch, not the float rounding of the rest)."""
    if not controls or len(motion) == 0 or not any(controls.tracks.get(n) for n in POST_MOTION):
        return motion
    motion = np.asarray(motion, dtype=np.float32)
    n = motion.shape[0]
    tr = {name: controls.sample(name, n, fps) for name in POST_MOTION}
    deg = layout.pose_degrees(motion)
    t = motion[:, layout.T].astype(np.float64)
    exp = motion[:, layout.EXP].reshape(n, layout.NUM_KP, layout.KP_DIMS).astype(np.float64)
    scale = motion[:, layout.SCALE.start].astype(np.float64) + 1.0
    head = tr["head"][:, None]
    deg = deg[:1] + head * (deg - deg[:1]) + np.stack([tr[a] for a in layout.POSE_ANGLES], 1)
    t = t[:1] + head * (t - t[:1])
    lips, lids = list(layout.LIP_KP), list(layout.EYE_KP)
    exp[:, lips] = exp[:1, lips] + tr["mouth"][:, None, None] * (exp[:, lips] - exp[:1, lips])
    exp[:, lids] = exp[:1, lids] + tr["blink"][:, None, None] * (exp[:, lids] - exp[:1, lids])
    opening = tr["eyes"] / PIXELS_PER_UNIT / np.maximum(scale, 1e-6) / 2.0
    for upper, lower in layout.EYE_LIDS_KP:  # image y grows downwards: opening parts them
        exp[:, upper, 1] -= opening
        exp[:, lower, 1] += opening
    fade = tr["fade"]
    if np.any(fade < 1.0):  # towards the first frame, the avatar at rest
        first = layout.pose_degrees(motion[:1])
        deg = first + fade[:, None] * (deg - first)
        t = t[:1] + fade[:, None] * (t - t[:1])
        exp = exp[:1] + fade[:, None, None] * (exp - exp[:1])
    out = motion.copy()
    out[:, layout.T] = t
    out[:, layout.EXP] = exp.reshape(n, layout.EXP_DIM)
    limit = layout.POSE_LIMIT_DEG - 1.0
    layout.set_pose_degrees(out, np.clip(deg, -limit, limit))
    neutral = np.logical_and.reduce([tr[name] == TRACKS[name][0] for name in POST_MOTION])
    out[neutral] = motion[neutral]
    return out
