"""The per-frame LMDM condition: HuBERT features plus emotion, eye and source-keypoint parts.

Parts, in this fixed order, each present when its flag is on (Ditto's ``audio2motion_cfg``
keys ``use_emo``, ``use_eye_open``, ``use_eye_ball``, ``use_sc``):

    HuBERT 1024 | emotion 8 | eye_open 2 | eye_ball 6 | sc 63     (C = 1103 with all on)

Frame indices are global output frames; negative ones (the online priming frames) are
clamped to 0. The emotion table is looped modulo its length; eye info is taken from the
source frame ``mirror(i, n)`` for video sources and from frame 0 for images (or with
``eye_f0_mode``); sc (frame-0 canonical keypoints) is constant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from studio.errors import OptionError
from studio.layout import (
    DEFAULT_EMOTION,
    EMOTION_LOGIT,
    EMOTIONS,
    EYE_BALL_DIM,
    EYE_OPEN_DIM,
    HUBERT_DIM,
    NUM_EMOTIONS,
    SC_DIM,
    softmax,
)

__all__ = [
    "EMOTIONS",
    "EmotionSpec",
    "ConditionConfig",
    "ConditionSource",
    "assemble",
    "condition_layout",
    "condition_width",
    "emotion_table",
    "emotion_vector",
    "mirror_indices",
    "source_indices",
]

EMOTION_OPTION = "--emotion"
PART_FLAGS = (
    ("emotion", "use_emo", NUM_EMOTIONS),
    ("eye_open", "use_eye_open", EYE_OPEN_DIM),
    ("eye_ball", "use_eye_ball", EYE_BALL_DIM),
    ("sc", "use_sc", SC_DIM),
)

EmotionSpec = int | Sequence[int] | Sequence[int | Sequence[int]] | np.ndarray


def emotion_vector(labels: int | Sequence[int]) -> np.ndarray:
    """[8] float32: softmax of a logit vector holding 8 at ``labels`` and 0 elsewhere."""
    if isinstance(labels, (list, tuple)):
        chosen = list(labels)
    else:
        chosen = [labels]
    if not chosen or not all(_is_label(v) for v in chosen):
        raise OptionError(
            EMOTION_OPTION,
            f"labels must be integers 0..{NUM_EMOTIONS - 1} ({_label_names()}), got {labels!r}",
        )
    logits = np.zeros(NUM_EMOTIONS, dtype=np.float64)
    logits[[int(v) for v in chosen]] = EMOTION_LOGIT
    return softmax(logits).astype(np.float32)


def emotion_from_weights(weights: np.ndarray) -> np.ndarray:
    """[n, 8] condition rows for per-frame label weights (a keyed emotion track: one label,
    or two blended): the softmax of the weighted logits, so a whole label is exactly
    :func:`emotion_vector`'s row and a blend goes smoothly from one to the other."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != NUM_EMOTIONS:
        raise ValueError(f"emotion weights must be [n, {NUM_EMOTIONS}], got {list(w.shape)}")
    return softmax(EMOTION_LOGIT * w, axis=1).astype(np.float32)


def emotion_table(emotion: EmotionSpec) -> np.ndarray:
    """[m, 8] float32 per-frame emotion rows (m = 1 for a constant emotion).

    Accepts an int label; a list of int labels (one blended target); a list of per-frame
    entries, each an int or a list of ints; or an array [m, 8] (or [8]) used as is.
    """
    if isinstance(emotion, np.ndarray) and emotion.dtype.kind in "fc":
        arr = np.asarray(emotion.real if emotion.dtype.kind == "c" else emotion, np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2 or arr.shape[1] != NUM_EMOTIONS or len(arr) == 0:
            raise OptionError(
                EMOTION_OPTION,
                f"an emotion array must be [m, {NUM_EMOTIONS}], got {list(emotion.shape)}",
            )
        if not np.isfinite(arr).all():
            raise OptionError(EMOTION_OPTION, "the emotion array holds NaN or infinite values")
        return np.ascontiguousarray(arr)
    if isinstance(emotion, np.ndarray):
        emotion = emotion.tolist()
    if _is_label(emotion):
        return emotion_vector(emotion)[None, :]  # type: ignore[arg-type]
    if isinstance(emotion, (list, tuple)) and emotion:
        if any(isinstance(e, (list, tuple, np.ndarray)) for e in emotion):
            return np.stack([emotion_vector(_labels(e)) for e in emotion])
        return emotion_vector(emotion)[None, :]
    raise OptionError(
        EMOTION_OPTION,
        f"must be a label 0..{NUM_EMOTIONS - 1} ({_label_names()}), a list of labels, "
        f"a per-frame list of labels or an [m, {NUM_EMOTIONS}] array; got {emotion!r}",
    )


SOURCE_ORDERS = ("pingpong", "loop")  # how a video avatar's frames follow the clip

@dataclass(frozen=True, eq=False)
class ConditionConfig:
    """Which parts the condition holds, the emotion and the eye mode."""

    use_emo: bool = True
    use_eye_open: bool = True
    use_eye_ball: bool = True
    use_sc: bool = True
    emotion: EmotionSpec = DEFAULT_EMOTION
    eye_f0_mode: bool = False
    table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        table = emotion_table(self.emotion) if self.use_emo else np.zeros((1, NUM_EMOTIONS))
        table = table.astype(np.float32)
        table.flags.writeable = False
        object.__setattr__(self, "table", table)

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], **overrides: Any) -> ConditionConfig:
        """From Ditto's ``audio2motion_cfg`` keys (missing flags default to on)."""
        flags = {flag: bool(cfg.get(flag, True)) for _, flag, _ in PART_FLAGS}
        for key in ("emotion", "eye_f0_mode"):
            if key in cfg:
                flags[key] = cfg[key]
        if "emo" in cfg and "emotion" not in cfg:
            flags["emotion"] = cfg["emo"]
        flags.update(overrides)
        return cls(**flags)

    @property
    def width(self) -> int:
        """Condition width C."""
        return condition_width(self)


@dataclass(frozen=True, eq=False)
class ConditionSource:
    """The avatar's part of the condition: per-frame eye info and frame-0 keypoints."""

    eye_open: np.ndarray  # [n, 2] (left, right)
    eye_ball: np.ndarray  # [n, 6] (xL, xR, yL, yR, zL, zR)
    sc: np.ndarray  # [63] canonical keypoints of frame 0, before video smoothing
    is_image: bool = True
    order: str = "pingpong"  # a video's playback order (:func:`source_indices`)

    def __post_init__(self) -> None:
        for name, width in (("eye_open", EYE_OPEN_DIM), ("eye_ball", EYE_BALL_DIM)):
            arr = np.asarray(getattr(self, name), dtype=np.float32)
            arr = arr.reshape(len(arr), -1) if arr.ndim == 3 else arr  # [n, 1, w] lists
            if arr.ndim != 2 or arr.shape[1] != width or len(arr) == 0:
                raise ValueError(f"{name} must be [n >= 1, {width}], got {list(arr.shape)}")
            object.__setattr__(self, name, np.ascontiguousarray(arr))
        sc = np.asarray(self.sc, dtype=np.float32).reshape(-1)
        if sc.shape != (SC_DIM,):
            raise ValueError(f"sc must hold {SC_DIM} values, got {np.asarray(self.sc).size}")
        object.__setattr__(self, "sc", sc)

    @classmethod
    def from_source_info(
        cls, info: Mapping[str, Any], order: str = "pingpong"
    ) -> ConditionSource:
        """From a Ditto-style ``source_info`` dict (eye_open_lst, eye_ball_lst, sc, ...) and a
        video's playback ``order``."""
        return cls(
            eye_open=np.concatenate(
                [np.reshape(e, (-1, EYE_OPEN_DIM)) for e in info["eye_open_lst"]]
            ),
            eye_ball=np.concatenate(
                [np.reshape(e, (-1, EYE_BALL_DIM)) for e in info["eye_ball_lst"]]
            ),
            sc=info["sc"],
            is_image=bool(info.get("is_image_flag", len(info["eye_open_lst"]) == 1)),
            order=order,
        )


def mirror_indices(index: np.ndarray | int, size: int) -> np.ndarray:
    """Ping-pong source frame for output frame(s) ``index`` >= 0: 0..n-1, n-1..0, 0..."""
    idx = np.asarray(index, dtype=np.int64)
    turn, rest = np.divmod(idx, int(size))
    return np.where(turn % 2 == 0, rest, size - 1 - rest)


def source_indices(index: np.ndarray | int, size: int, order: str = "pingpong") -> np.ndarray:
    """The source frame a video avatar shows at output frame(s) ``index``: ping-pong
    (Ditto's: back and forth, no jump) or loop (0..n-1, 0..n-1: a jump at each turn, for a
    video made to loop)."""
    if order not in SOURCE_ORDERS:
        raise ValueError(f"order must be one of {SOURCE_ORDERS}, got {order!r}")
    if order == "loop":
        return np.asarray(index, dtype=np.int64) % int(size)
    return mirror_indices(index, size)


def condition_layout(cfg: ConditionConfig | Mapping[str, Any]) -> dict[str, slice]:
    """Column slice of every present part, in order (``hubert`` first)."""
    flags = _flags(cfg)
    parts = {"hubert": slice(0, HUBERT_DIM)}
    col = HUBERT_DIM
    for name, flag, width in PART_FLAGS:
        if flags[flag]:
            parts[name] = slice(col, col + width)
            col += width
    return parts


def condition_width(cfg: ConditionConfig | Mapping[str, Any]) -> int:
    """Condition width C: 1024 plus the widths of the parts whose flag is on (1103 max)."""
    return next(reversed(condition_layout(cfg).values())).stop


def assemble(
    features: np.ndarray,
    start_index: int,
    source: ConditionSource | None,
    cfg: ConditionConfig | Mapping[str, Any],
) -> np.ndarray:
    """[n, C] float32 condition for HuBERT ``features`` [n, 1024] of frames start_index.. .

    ``start_index`` is the global frame of row 0: 0 offline, the window's frame online
    (negative for the priming frames, which are clamped to 0). ``source`` may be None when
    no eye or sc part is on.
    """
    config = cfg if isinstance(cfg, ConditionConfig) else ConditionConfig.from_mapping(cfg)
    feats = np.asarray(features)
    if feats.ndim != 2 or feats.shape[1] != HUBERT_DIM:
        raise ValueError(f"features must be [n, {HUBERT_DIM}], got {list(feats.shape)}")
    layout = condition_layout(config)
    n = len(feats)
    out = np.empty((n, condition_width(config)), dtype=np.float32)
    out[:, layout["hubert"]] = feats
    frames = np.maximum(np.arange(start_index, start_index + n, dtype=np.int64), 0)
    if "emotion" in layout:
        out[:, layout["emotion"]] = config.table[frames % len(config.table)]
    needs_source = [p for p in ("eye_open", "eye_ball", "sc") if p in layout]
    if needs_source and source is None:
        raise ValueError(f"the condition parts {needs_source} need a ConditionSource")
    for part in ("eye_open", "eye_ball"):
        if part in layout:
            rows: np.ndarray = getattr(source, part)
            if config.eye_f0_mode or source.is_image or len(rows) == 1:  # type: ignore[union-attr]
                out[:, layout[part]] = rows[0]
            else:
                out[:, layout[part]] = rows[source_indices(frames, len(rows), source.order)]
    if "sc" in layout:
        out[:, layout["sc"]] = source.sc  # type: ignore[union-attr]
    return out


# --- internals ---------------------------------------------------------------


def _is_label(v: Any) -> bool:
    return (
        isinstance(v, (int, np.integer))
        and not isinstance(v, (bool, np.bool_))
        and 0 <= int(v) < NUM_EMOTIONS
    )


def _labels(entry: Any) -> int | list[int]:
    return entry.tolist() if isinstance(entry, np.ndarray) else entry


def _label_names() -> str:
    return ", ".join(f"{i} {name}" for i, name in enumerate(EMOTIONS))


def _flags(cfg: ConditionConfig | Mapping[str, Any]) -> dict[str, bool]:
    if isinstance(cfg, ConditionConfig):
        return {flag: bool(getattr(cfg, flag)) for _, flag, _ in PART_FLAGS}
    return {flag: bool(cfg.get(flag, True)) for _, flag, _ in PART_FLAGS}
