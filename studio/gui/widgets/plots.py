"""Timeline (waveform, stride bands, keyframes, in-between marks, playhead) and the pose and
jerk plots.

All plots share the time axis (seconds) with the timeline and draw the playhead. A click
anywhere on the timeline or a plot (its data or its time axis) seeks there; every plot has a
legend beside it, outside the data.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal

from studio import layout
from studio.gui import theme
from studio.motion.kinematics import pose_channels, pose_jerk, stride_transitions
from studio.render.pipeline import MotionResult

FPS = layout.FPS


def _plot(title: str, units: str) -> pg.PlotItem:
    item = pg.PlotItem()
    item.showGrid(x=True, y=True, alpha=0.15)
    item.setLabel("left", title, units=units)
    item.setMenuEnabled(False)
    item.hideButtons()
    item.getAxis("left").setWidth(58)
    item.setMouseEnabled(x=True, y=False)
    return item


def _clicked_frame(item: pg.PlotItem, event, num_frames: int) -> int | None:
    """The frame under a left click on ``item`` (its view or its axes), or None."""
    if event.button() != Qt.MouseButton.LeftButton or num_frames <= 0:
        return None
    pos = event.scenePos()
    if not item.sceneBoundingRect().contains(pos):
        return None
    t = item.vb.mapSceneToView(pos).x()
    return int(np.clip(np.floor(t * FPS), 0, num_frames - 1))


LEGEND_WIDTH = 96  # px: the legend column of every plot and of the timeline, so time axes align


def _legend_beside(layout: pg.GraphicsLayout, row: int) -> pg.LegendItem:
    """A legend in its own column right of the plot in ``row``: it never covers a curve."""
    legend = pg.LegendItem(labelTextColor=theme.TEXT, verSpacing=-4, labelTextSize="8pt")
    layout.addItem(legend, row=row, col=1)
    layout.layout.setColumnFixedWidth(1, LEGEND_WIDTH)
    return legend


def _fit(layout: pg.GraphicsLayout, legend: pg.LegendItem) -> None:
    """Keep a filled legend at its own height, at the top of its cell (a stretched legend
    spreads its rows and parts a label from its sample)."""
    legend.setMaximumHeight(legend.layout.preferredHeight() + 4)
    layout.layout.setAlignment(legend, Qt.AlignmentFlag.AlignTop)


def _swatch(colour: str, width: int = 2, dash: bool = False) -> pg.PlotDataItem:
    """A legend entry's sample line (an empty curve drawn with the entry's pen)."""
    style = Qt.PenStyle.DashLine if dash else Qt.PenStyle.SolidLine
    return pg.PlotDataItem(pen=pg.mkPen(colour, width=width, style=style))


BAND_Y0, BAND_HEIGHT = -1.45, 0.3  # the stride bands' place under the waveform
INBETWEEN_TINT = "#ffffffb0"
TRACK_ROW = 0.3  # waveform units between two tracks' rows of keys
TRACK_COLOURS = (
    "#f2c14e",
    "#7bd389",
    "#f78154",
    "#b388eb",
    "#4ecdc4",
    "#ff6b9d",
)  # pales an in-between's stride band (keyframes keep full colour)


class _KeyDots(pg.ScatterPlotItem):
    """One control track's keys: a click selects a key, a drag moves it in time (to whole
    frames); the timeline hears of both through ``select`` and ``moved``."""

    def __init__(self, name: str, select: Any, moved: Any, **opts: Any) -> None:
        super().__init__(**opts)
        self.track, self._select, self._moved = name, select, moved
        self._drag: int | None = None

    def _key_at(self, pos: Any) -> int | None:
        points = self.pointsAt(pos)
        return int(points[0].index()) if len(points) else None

    def mouseClickEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph's name
        index = self._key_at(ev.pos()) if ev.button() == Qt.MouseButton.LeftButton else None
        if index is None:
            ev.ignore()
            return
        ev.accept()
        self._select(self.track, index)

    def mouseDragEvent(self, ev: Any) -> None:  # noqa: N802 - pyqtgraph's name
        if ev.button() != Qt.MouseButton.LeftButton:
            ev.ignore()
            return
        if ev.isStart():
            self._drag = self._key_at(ev.buttonDownPos())
            if self._drag is None:
                ev.ignore()
                return
            self._select(self.track, self._drag)
        elif self._drag is None:
            ev.ignore()
            return
        ev.accept()
        t = max(0.0, round(ev.pos().x() * FPS) / FPS)
        x, y = self.getData()
        x = np.array(x, dtype=float)
        x[self._drag] = t
        self.setData(x=x, y=y)
        if ev.isFinish():
            index, self._drag = self._drag, None
            self._moved(self.track, index, t)


class Timeline(pg.GraphicsLayoutWidget):
    """Waveform, per-frame stride bands, keyframe ticks, optional in-between marks (the frames
    made from their keyframes, not rendered: tinted bands), the control tracks' keys and a
    draggable playhead; a click seeks. A key is selected by a click and moved by a drag; a
    double click asks for a key there."""

    scrubbed = Signal(int)  # frame under the dragged playhead or the click
    keySelected = Signal(str, int)  # track, key number
    keyMoved = Signal(str, int, float)  # track, key number, its new time (s)
    keyRequested = Signal(float)  # a double click at this time (s): add a key there

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        p = self.addPlot(row=0, col=0)
        self._plot = p
        p.setMenuEnabled(False)
        p.hideButtons()
        p.setLabel("bottom", "time", units="s")
        p.setMouseEnabled(x=True, y=False)
        p.getAxis("left").setWidth(58)
        p.getAxis("left").setStyle(showValues=False)
        p.getAxis("left").setLabel("audio")
        self.wave_hi = pg.PlotDataItem(pen=pg.mkPen(theme.ACCENT, width=1))
        self.wave_lo = pg.PlotDataItem(pen=pg.mkPen(theme.ACCENT, width=1))
        self.fill = pg.FillBetweenItem(self.wave_hi, self.wave_lo, brush=pg.mkBrush("#5aa9e655"))
        for it in (self.wave_hi, self.wave_lo, self.fill):
            p.addItem(it)
        self.bands = pg.BarGraphItem(x=[], height=[], width=1.0 / FPS, y0=BAND_Y0)
        p.addItem(self.bands)
        self.keys = pg.ScatterPlotItem(symbol="t1", size=6, pen=None, brush=pg.mkBrush(theme.TEXT))
        p.addItem(self.keys)
        # Tints the in-betweens' bands (over the stride bands, which keep their colour).
        self.inbetween_marks = pg.BarGraphItem(
            x=[], height=[], width=1.0 / FPS, y0=BAND_Y0, brush=pg.mkBrush(INBETWEEN_TINT), pen=None
        )
        self.inbetween_marks.setVisible(False)
        p.addItem(self.inbetween_marks)
        self.inbetween = np.zeros(0, bool)  # [N] whether each frame is an in-between
        self.playhead = pg.InfiniteLine(
            0,
            movable=True,
            pen=pg.mkPen(theme.PLAYHEAD, width=2),
            hoverPen=pg.mkPen(theme.ACCENT, width=3),
        )
        p.addItem(self.playhead)
        self.playhead.sigDragged.connect(self._dragged)
        p.setYRange(-1.5, 1.05, padding=0)
        p.enableAutoRange(x=False, y=False)
        legend = _legend_beside(self.ci, 0)
        for stride, colour in theme.STRIDE.items():
            bar = pg.BarGraphItem(x=[0], height=[1], width=1, brush=pg.mkBrush(colour), pen=None)
            legend.addItem(bar, f"stride {stride}")
        legend.addItem(self.keys, "keyframe")
        tint = pg.mkBrush(INBETWEEN_TINT)
        legend.addItem(
            pg.BarGraphItem(x=[0], height=[1], width=1, brush=tint, pen=None), "in-between"
        )
        _fit(self.ci, legend)
        self.legend = legend
        self.setMinimumHeight(120)
        self.setMaximumHeight(170)
        self._n = 0
        self.track_items: list[Any] = []  # the control tracks' keys (set_controls)
        self.selected: tuple[str, int] | None = None  # the selected key (track, number)
        self.scene().sigMouseClicked.connect(self._clicked)

    def getPlotItem(self) -> pg.PlotItem:  # noqa: N802 - pyqtgraph's name
        return self._plot

    def set_audio(self, samples: np.ndarray, rate: int) -> None:
        """Draw a min/max envelope of the audio (about 2000 buckets)."""
        n = samples.size
        buckets = max(1, min(2000, n // 16))
        edges = np.linspace(0, n, buckets + 1).astype(int)
        hi = np.maximum.reduceat(samples, edges[:-1])
        lo = np.minimum.reduceat(samples, edges[:-1])
        peak = max(float(np.abs(samples).max()), 1e-6)
        t = edges[:-1] / rate
        self.wave_hi.setData(t, hi / peak)
        self.wave_lo.setData(t, lo / peak)
        self._plot.setXRange(0, n / rate, padding=0.01)

    def set_controls(self, tracks: Any, selected: tuple[str, int] | None = None) -> None:
        """The control tracks' keys as diamonds along the top of the waveform, one row per
        keyed track (its name and each key's value in the tooltip), ``selected`` larger and
        outlined; None clears them."""
        for item in self.track_items:
            self._plot.removeItem(item)
        self.track_items = []
        self.selected = selected
        if not tracks:
            return
        keyed = [(name, keys) for name, keys in tracks.tracks.items() if keys]
        for row, (name, keys) in enumerate(keyed):
            y = 0.95 - TRACK_ROW * row
            colour = TRACK_COLOURS[row % len(TRACK_COLOURS)]
            chosen = selected[1] if selected is not None and selected[0] == name else -1
            spots = [
                {
                    "pos": (k.t, y),
                    "data": f"{name} {k.value:g} ({k.interp}) at {k.t:.2f} s",
                    "size": 14 if i == chosen else 9,
                    "pen": pg.mkPen(theme.PLAYHEAD if i == chosen else theme.TEXT, width=2),
                }
                for i, k in enumerate(keys)
            ]
            dots = _KeyDots(
                name,
                self.keySelected.emit,
                self.keyMoved.emit,
                spots=spots,
                symbol="d",
                brush=pg.mkBrush(colour),
            )
            dots.setToolTip(name)
            line = pg.PlotDataItem(
                [k.t for k in keys], [y] * len(keys), pen=pg.mkPen(colour, width=1)
            )
            label = pg.TextItem(name, color=colour, anchor=(-0.1, 0.5))  # after its last key
            label.setPos(keys[-1].t, y)
            for item in (line, dots, label):
                self._plot.addItem(item)
                self.track_items.append(item)

    def set_plan(self, strides: np.ndarray, keyframes: np.ndarray) -> None:
        """Coloured stride bands (1 red, 2 amber, 3 blue), keyframe ticks and the in-between
        marks (shown or not as :meth:`show_inbetweens` last said)."""
        self._n = strides.size
        x = (np.arange(strides.size) + 0.5) / FPS
        brushes = [pg.mkBrush(theme.STRIDE[int(s)]) for s in strides]
        self.bands.setOpts(
            x=x,
            height=np.full(strides.size, BAND_HEIGHT),
            brushes=brushes,
            pens=[None] * strides.size,
            width=1.0 / FPS,
            y0=BAND_Y0,
        )
        self.keys.setData(x=(keyframes + 0.5) / FPS, y=np.full(keyframes.size, -1.05))
        self.inbetween = np.ones(strides.size, bool)
        self.inbetween[np.asarray(keyframes, np.int64)] = False
        marked = x[self.inbetween]
        self.inbetween_marks.setOpts(
            x=marked, height=np.full(marked.size, BAND_HEIGHT), width=1.0 / FPS, y0=BAND_Y0
        )

    def show_inbetweens(self, on: bool) -> None:
        """Show or hide the in-between marks."""
        self.inbetween_marks.setVisible(on)

    def marked_frames(self) -> np.ndarray:
        """The frames marked as in-betweens now (none while the marks are hidden)."""
        if not self.inbetween_marks.isVisible():
            return np.zeros(0, np.int64)
        return np.flatnonzero(self.inbetween)

    def is_inbetween(self, frame: int) -> bool:
        """Whether ``frame`` of the plan shown is an in-between (not a keyframe)."""
        return 0 <= frame < self.inbetween.size and bool(self.inbetween[frame])

    def set_frame(self, frame: int) -> None:
        if not self.playhead.moving:
            self.playhead.setValue((frame + 0.5) / FPS)

    def _dragged(self) -> None:
        if self._n:
            frame = int(np.clip(self.playhead.value() * FPS, 0, self._n - 1))
            self.scrubbed.emit(frame)

    def _clicked(self, event) -> None:
        frame = _clicked_frame(self._plot, event, self._n)
        if frame is None:
            return
        if event.double():
            self.keyRequested.emit(frame / FPS)
            return
        self.scrubbed.emit(frame)


class MotionPlots(pg.GraphicsLayoutWidget):
    """Pose angles (deg), translation, and jerk (rad/s³) raw vs smoothed; a click seeks."""

    scrubbed = Signal(int)  # frame under a click on a plot or its time axis

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.angles = _plot("angles", "°")
        self.trans = _plot("t", "")
        self.jerk = _plot("jerk", "rad/s³")
        self.legends = []
        for row, item in enumerate((self.angles, self.trans, self.jerk)):
            self.addItem(item, row=row, col=0)
            self.legends.append(_legend_beside(self.ci, row))
        angle_legend, trans_legend, jerk_legend = self.legends
        self.legend = angle_legend
        self.trans.setXLink(self.angles)
        self.jerk.setXLink(self.angles)
        self.jerk.setLabel("bottom", "time", units="s")
        self.curves: dict[str, dict[str, pg.PlotDataItem]] = {
            "raw": {},
            "sampled": {},
            "smoothed": {},
        }
        for name, colour in {**theme.CHANNELS, **theme.T_CHANNELS}.items():
            plot = self.angles if name in theme.CHANNELS else self.trans
            self.curves["raw"][name] = plot.plot(pen=pg.mkPen(theme.RAW, width=1))
            self.curves["sampled"][name] = plot.plot(
                pen=pg.mkPen(theme.SAMPLED, width=1, style=Qt.PenStyle.DashLine)
            )
            self.curves["smoothed"][name] = plot.plot(pen=pg.mkPen(colour, width=2))
            legend = angle_legend if plot is self.angles else trans_legend
            legend.addItem(self.curves["smoothed"][name], name.replace("_", " "))
        for legend in (angle_legend, trans_legend):
            legend.addItem(_swatch(theme.RAW, 1), "raw")
            legend.addItem(_swatch(theme.SAMPLED, 1, dash=True), "cadence")
        self.jerk_raw = self.jerk.plot(pen=pg.mkPen(theme.JERK_RAW, width=1))
        self.jerk_smooth = self.jerk.plot(pen=pg.mkPen(theme.JERK_SMOOTHED, width=2))
        self.transitions = pg.ScatterPlotItem(
            symbol="o", size=5, pen=None, brush=pg.mkBrush(theme.TRANSITION)
        )
        self.jerk.addItem(self.transitions)
        jerk_legend.addItem(self.jerk_raw, "raw")
        jerk_legend.addItem(self.jerk_smooth, "smoothed")
        jerk_legend.addItem(self.transitions, "stride change")
        for legend in self.legends:
            _fit(self.ci, legend)
        for item in (self.angles, self.trans, self.jerk):
            item.enableAutoRange(x=False)
        self.playheads = []
        for item in (self.angles, self.trans, self.jerk):
            line = pg.InfiniteLine(0, pen=pg.mkPen(theme.PLAYHEAD, width=1))
            item.addItem(line)
            self.playheads.append(line)
        self.setMinimumHeight(240)
        self.smoothed_data: np.ndarray | None = None  # [N, 6] pose of the smoothed curve
        self._n = 0
        self.scene().sigMouseClicked.connect(self._clicked)

    def link_to(self, timeline: Timeline) -> None:
        self.angles.setXLink(timeline.getPlotItem())

    def set_visible(self, family: str, visible: bool) -> None:
        """Show or hide one family of curves: raw, sampled or smoothed."""
        for curve in self.curves[family].values():
            curve.setVisible(visible)
        if family == "raw":
            self.jerk_raw.setVisible(visible)
        if family == "smoothed":
            self.jerk_smooth.setVisible(visible)

    def _clicked(self, event) -> None:
        for item in (self.angles, self.trans, self.jerk):
            frame = _clicked_frame(item, event, self._n)
            if frame is not None:
                self.scrubbed.emit(frame)
                return

    def set_result(self, result: MotionResult) -> None:
        """Plot raw, cadence-sampled and smoothed pose, and the jerk of each."""
        self._n = result.num_frames
        t = np.arange(result.num_frames) / FPS + 0.5 / FPS
        names = list(theme.CHANNELS) + list(theme.T_CHANNELS)
        for family, motion in (
            ("raw", result.raw),
            ("sampled", result.sampled),
            ("smoothed", result.smoothed),
        ):
            pose = pose_channels(motion)
            if family == "smoothed":
                self.smoothed_data = pose
            for i, name in enumerate(names):
                self.curves[family][name].setData(t, pose[:, i])
        jr, js = pose_jerk(result.sampled), pose_jerk(result.smoothed)
        tj = (np.arange(jr.size) + 2.0) / FPS
        self.jerk_raw.setData(tj, jr)
        self.jerk_smooth.setData(tj, js)
        tr = stride_transitions(result.plan.strides)
        tr = tr[(tr >= 2) & (tr < jr.size + 2)]
        self.transitions.setData(x=tr / FPS, y=jr[tr - 2] if tr.size else [])
        self.angles.setXRange(0, result.num_frames / FPS, padding=0.01)

    def set_frame(self, frame: int) -> None:
        for line in self.playheads:
            line.setValue((frame + 0.5) / FPS)
