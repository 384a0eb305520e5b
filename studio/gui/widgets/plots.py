"""Timeline (waveform, stride bands, keyframes, playhead) and the pose and jerk plots.

All plots share the time axis (seconds) with the timeline and draw the playhead.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Signal

from studio.gui import theme
from studio.motion import layout
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


class Timeline(pg.PlotWidget):
    """Waveform, per-frame stride bands, keyframe ticks and a draggable playhead."""

    scrubbed = Signal(int)  # frame under the dragged playhead

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        p = self.getPlotItem()
        p.setMenuEnabled(False)
        p.hideButtons()
        p.hideAxis("left")
        p.setLabel("bottom", "time", units="s")
        p.setMouseEnabled(x=True, y=False)
        p.getAxis("left").setWidth(58)
        p.showAxis("left")
        p.getAxis("left").setStyle(showValues=False)
        p.getAxis("left").setLabel("audio")
        self.wave_hi = pg.PlotDataItem(pen=pg.mkPen(theme.ACCENT, width=1))
        self.wave_lo = pg.PlotDataItem(pen=pg.mkPen(theme.ACCENT, width=1))
        self.fill = pg.FillBetweenItem(self.wave_hi, self.wave_lo, brush=pg.mkBrush("#5aa9e655"))
        for it in (self.wave_hi, self.wave_lo, self.fill):
            p.addItem(it)
        self.bands = pg.BarGraphItem(x=[], height=[], width=1.0 / FPS, y0=-1.45)
        p.addItem(self.bands)
        self.keys = pg.ScatterPlotItem(symbol="t1", size=6, pen=None, brush=pg.mkBrush(theme.TEXT))
        p.addItem(self.keys)
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
        self.setMinimumHeight(120)
        self.setMaximumHeight(170)
        self._n = 0

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
        self.getPlotItem().setXRange(0, n / rate, padding=0.01)

    def set_plan(self, strides: np.ndarray, keyframes: np.ndarray) -> None:
        """Coloured stride bands (1 red, 2 amber, 3 blue) and keyframe ticks."""
        self._n = strides.size
        x = (np.arange(strides.size) + 0.5) / FPS
        brushes = [pg.mkBrush(theme.STRIDE[int(s)]) for s in strides]
        self.bands.setOpts(
            x=x,
            height=np.full(strides.size, 0.3),
            brushes=brushes,
            pens=[None] * strides.size,
            width=1.0 / FPS,
            y0=-1.45,
        )
        self.keys.setData(x=(keyframes + 0.5) / FPS, y=np.full(keyframes.size, -1.05))

    def set_frame(self, frame: int) -> None:
        if not self.playhead.moving:
            self.playhead.setValue((frame + 0.5) / FPS)

    def _dragged(self) -> None:
        if self._n:
            frame = int(np.clip(self.playhead.value() * FPS, 0, self._n - 1))
            self.scrubbed.emit(frame)


class MotionPlots(pg.GraphicsLayoutWidget):
    """Pose angles (deg), translation, and jerk (rad/s³) raw vs smoothed."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.angles = _plot("angles", "°")
        self.trans = _plot("t", "")
        self.jerk = _plot("jerk", "rad/s³")
        for row, item in enumerate((self.angles, self.trans, self.jerk)):
            self.addItem(item, row=row, col=0)
        self.trans.setXLink(self.angles)
        self.jerk.setXLink(self.angles)
        self.jerk.setLabel("bottom", "time", units="s")
        self.legend = self.angles.addLegend(offset=(-10, 4), labelTextColor=theme.TEXT, colCount=3)
        self.curves: dict[str, dict[str, pg.PlotDataItem]] = {
            "raw": {},
            "sampled": {},
            "smoothed": {},
        }
        for name, colour in {**theme.CHANNELS, **theme.T_CHANNELS}.items():
            plot = self.angles if name in theme.CHANNELS else self.trans
            self.curves["raw"][name] = plot.plot(pen=pg.mkPen(theme.RAW, width=1))
            self.curves["sampled"][name] = plot.plot(
                pen=pg.mkPen(theme.SAMPLED, width=1, style=pg.QtCore.Qt.PenStyle.DashLine)
            )
            self.curves["smoothed"][name] = plot.plot(
                pen=pg.mkPen(colour, width=2), name=name if plot is self.angles else None
            )
        jerk_legend = self.jerk.addLegend(offset=(-10, 4), labelTextColor=theme.TEXT, colCount=3)
        self.jerk_raw = self.jerk.plot(pen=pg.mkPen(theme.JERK_RAW, width=1), name="raw")
        self.jerk_smooth = self.jerk.plot(
            pen=pg.mkPen(theme.JERK_SMOOTHED, width=2), name="smoothed"
        )
        self.transitions = pg.ScatterPlotItem(
            symbol="o", size=5, pen=None, brush=pg.mkBrush(theme.TRANSITION)
        )
        self.jerk.addItem(self.transitions)
        jerk_legend.addItem(self.transitions, "stride change")
        for item in (self.angles, self.trans, self.jerk):
            item.enableAutoRange(x=False)
        self.playheads = []
        for item in (self.angles, self.trans, self.jerk):
            line = pg.InfiniteLine(0, pen=pg.mkPen(theme.PLAYHEAD, width=1))
            item.addItem(line)
            self.playheads.append(line)
        self.setMinimumHeight(240)
        self.smoothed_data: np.ndarray | None = None  # [N, 6] pose of the smoothed curve

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

    def set_result(self, result: MotionResult) -> None:
        """Plot raw, cadence-sampled and smoothed pose, and the jerk of each."""
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
        self.angles.setXRange(0, result.num_frames / FPS, padding=0.01)

    def set_frame(self, frame: int) -> None:
        for line in self.playheads:
            line.setValue((frame + 0.5) / FPS)
