"""A/B comparison in the viewer: the preview held as A, shown beside the preview as it is now
(B) or split by a line, frame for frame under the one playhead, so playback, stepping and
scrubbing keep the two in step.

A take is held with View → Hold Preview as A; then any edit (settings, control tracks) makes
B. The bar above the viewer says what differs between the two and offers the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QWidget

from studio.gui.widgets.controls import combo_box
from studio.motion.controls import ControlTracks
from studio.settings import RenderSettings

MODES = {"side": "Side by side", "split": "Split line"}
GAP = 4  # pixels between the two frames side by side
LINE = (255, 214, 10)  # the split line's colour


def _fit(frame: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``frame`` resized (nearest pixel) to ``shape``'s height and width."""
    h, w = shape[:2]
    ys = np.minimum((np.arange(h) * frame.shape[0]) // h, frame.shape[0] - 1)
    xs = np.minimum((np.arange(w) * frame.shape[1]) // w, frame.shape[1] - 1)
    return frame[ys][:, xs]


def compose(a: np.ndarray, b: np.ndarray, mode: str, split: float = 0.5) -> np.ndarray:
    """One image of frames ``a`` and ``b`` (HxWx3 uint8; ``b`` fitted to ``a``'s size):
    side by side with a gap, or ``a`` left of a line at ``split`` (0..1) and ``b`` right."""
    if b.shape != a.shape:
        b = _fit(b, a.shape)
    h, w = a.shape[:2]
    if mode == "side":
        gap = np.zeros((h, GAP, 3), np.uint8)
        return np.concatenate([a, gap, b], axis=1)
    x = int(round(min(max(split, 0.0), 1.0) * w))
    out = b.copy()
    out[:, :x] = a[:, :x]
    out[:, max(x - 1, 0) : min(x + 1, w)] = LINE
    return out


def _flat(settings: RenderSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in settings.model_dump().items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def difference(
    a: RenderSettings,
    a_tracks: ControlTracks | None,
    b: RenderSettings,
    b_tracks: ControlTracks | None,
) -> str:
    """What differs from take A to take B, for people ("smooth: on → off; tracks: none →
    pitch, emotion"), or "the same settings and tracks"."""
    fa, fb = _flat(a), _flat(b)

    def show(v: Any) -> str:
        return {True: "on", False: "off"}.get(v, str(v)) if isinstance(v, bool) else str(v)

    parts = [f"{k}: {show(fa[k])} → {show(fb[k])}" for k in fa if fa[k] != fb.get(k)]

    def named(t: ControlTracks | None) -> str:
        names = [n for n, keys in (t.tracks.items() if t else ()) if keys]
        return ", ".join(names) or "none"

    if (a_tracks or None) != (b_tracks or None):
        ta, tb = named(a_tracks), named(b_tracks)
        parts.append(f"tracks: {ta} → {tb}" if ta != tb else "tracks: keys changed")
    return "; ".join(parts) or "the same settings and tracks"


@dataclass(frozen=True)
class HeldTake:
    """Take A: its frames (None where not rendered), settings and tracks."""

    frames: tuple[np.ndarray | None, ...]
    settings: RenderSettings
    tracks: ControlTracks | None

    def frame(self, index: int) -> np.ndarray | None:
        return self.frames[index] if 0 <= index < len(self.frames) else None


class CompareBar(QWidget):
    """Above the viewer while comparing: what A and B are, the layout, the split line's place,
    and Stop comparing."""

    changed = Signal()  # the layout or the line moved: show the frame again
    closed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.mode = combo_box(((text, key) for key, text in MODES.items()), "how A and B show")
        self.split = QSlider(Qt.Orientation.Horizontal)
        self.split.setRange(0, 100)
        self.split.setValue(50)
        self.split.setToolTip("where the line splits A (left) from B (right)")
        self.split.setMaximumWidth(160)
        stop = QPushButton("Stop comparing")
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 2, 4, 2)
        row.addWidget(self.label, 1)
        row.addWidget(self.mode)
        row.addWidget(self.split)
        row.addWidget(stop)
        self.mode.currentIndexChanged.connect(self._mode_changed)
        self.split.valueChanged.connect(self.changed)
        stop.clicked.connect(self.closed)
        self._mode_changed()

    def _mode_changed(self) -> None:
        self.split.setVisible(self.layout_mode == "split")
        self.changed.emit()

    @property
    def layout_mode(self) -> str:
        return str(self.mode.currentData())

    @property
    def split_at(self) -> float:
        return self.split.value() / 100.0

    def describe(self, text: str) -> None:
        side = "left" if self.layout_mode == "side" else "left of the line"
        self.label.setText(f"A ({side}): held take · B: now — {text}")
