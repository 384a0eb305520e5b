"""The settings panel: engine, smoothing, cadence and output controls.

It edits one RenderSettings; ``changed(kind)`` says whether motion post-processing
("motion") or only the preview size ("output") is affected.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from studio.motion.cadence import CadenceThresholds
from studio.settings import MAX_SIZE, MIN_SIZE, RenderSettings

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
SIZES = (256, 384, 512, 768, 1024)

# What each backend can run, and why not when it cannot.
BACKENDS = {
    "demo": {
        "label": "demo (built-in)",
        "precisions": {"fp32"},
        "why": "the demo engine renders on the CPU in float32",
    },
}
DITTO_UNAVAILABLE = "set a folder of Ditto checkpoints to enable (the Ditto engine is coming)"


def _disable_item(combo: QComboBox, index: int, tip: str) -> None:
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    item = model.item(index)
    item.setEnabled(False)
    item.setToolTip(tip)


class ControlsPanel(QWidget):
    """Edits a RenderSettings; emits ``changed("motion" | "output")``."""

    changed = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._quiet = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(8)

        engine = QGroupBox("Engine")
        f = QFormLayout(engine)
        self.backend = QComboBox()
        self.backend.addItem(BACKENDS["demo"]["label"], "demo")
        self.backend.addItem("ditto", "ditto")
        _disable_item(self.backend, 1, DITTO_UNAVAILABLE)
        self.precision = QComboBox()
        for p in PRECISIONS:
            self.precision.addItem(p, p)
        self._apply_backend_precisions("demo")
        self.steps = QSpinBox()
        self.steps.setRange(1, 100)
        self.steps.setValue(10)
        self.steps.setEnabled(False)
        self.steps.setToolTip("LMDM sampling steps: used by the Ditto engine")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        f.addRow("Backend", self.backend)
        f.addRow("Precision", self.precision)
        f.addRow("Sampling steps", self.steps)
        f.addRow("Seed", self.seed)
        layout.addWidget(engine)

        smooth = QGroupBox("Pose smoothing")
        f = QFormLayout(smooth)
        self.smooth = QCheckBox("Smooth head pose (C²)")
        self.smooth.setToolTip(
            "Savitzky–Golay over pitch, yaw, roll and t, then an "
            "acceleration limit; expression is never touched"
        )
        self.window = QSpinBox()
        self.window.setRange(3, 31)
        self.window.setSingleStep(2)
        self.window.setToolTip("Savitzky–Golay window in frames (odd)")
        self.order = QSpinBox()
        self.order.setRange(0, 6)
        self.order.setToolTip("polynomial order of the local fit (below the window)")
        self.accel = QDoubleSpinBox()
        self.accel.setRange(0.01, 10.0)
        self.accel.setDecimals(2)
        self.accel.setSingleStep(0.05)
        self.accel.setSuffix(" °/frame²")
        self.accel.setToolTip("largest head-angle acceleration allowed after smoothing")
        f.addRow(self.smooth)
        f.addRow("Window", self.window)
        f.addRow("Order", self.order)
        f.addRow("Accel limit", self.accel)
        layout.addWidget(smooth)

        cadence = QGroupBox("Cadence")
        f = QFormLayout(cadence)
        self.stride = QComboBox()
        for label, value in (
            ("auto (from speech)", "auto"),
            ("every frame (1)", "1"),
            ("every 2nd (2)", "2"),
            ("every 3rd (3)", "3"),
        ):
            self.stride.addItem(label, value)
        self.guard = QSpinBox()
        self.guard.setRange(0, 6)
        self.guard.setToolTip("frames around a plosive burst or onset kept at stride 1")
        self.fast_flux = QDoubleSpinBox()
        self.fast_flux.setRange(0.05, 1.0)
        self.fast_flux.setSingleStep(0.05)
        self.fast_flux.setToolTip("spectral flux above which articulation counts as fast")
        self.calm_flux = QDoubleSpinBox()
        self.calm_flux.setRange(0.0, 0.95)
        self.calm_flux.setSingleStep(0.05)
        self.calm_flux.setToolTip("flux below which a voiced sound counts as sustained")
        self.pose_gap = QDoubleSpinBox()
        self.pose_gap.setRange(0.1, 20.0)
        self.pose_gap.setSingleStep(0.25)
        self.pose_gap.setSuffix(" °")
        self.pose_gap.setToolTip("most head rotation a blended gap may span (less ghosting)")
        f.addRow("Stride", self.stride)
        f.addRow("Plosive guard", self.guard)
        f.addRow("Fast flux ≥", self.fast_flux)
        f.addRow("Calm flux ≤", self.calm_flux)
        f.addRow("Max gap turn", self.pose_gap)
        layout.addWidget(cadence)

        output = QGroupBox("Output")
        f = QFormLayout(output)
        self.size = QComboBox()
        for s in SIZES:
            self.size.addItem(f"{s} × {s}", s)
        f.addRow("Size", self.size)
        layout.addWidget(output)
        layout.addStretch(1)

        self._crf = 18
        self._preset = "medium"
        self.set_settings(RenderSettings())
        for w in (self.seed, self.window, self.order, self.guard):
            w.valueChanged.connect(self._motion_changed)
        for w in (self.accel, self.fast_flux, self.calm_flux, self.pose_gap):
            w.valueChanged.connect(self._motion_changed)
        self.smooth.toggled.connect(self._motion_changed)
        self.stride.currentIndexChanged.connect(self._motion_changed)
        self.size.currentIndexChanged.connect(lambda *_: self._emit("output"))
        self.window.valueChanged.connect(self._window_changed)

    def _apply_backend_precisions(self, backend: str) -> None:
        spec = BACKENDS[backend]
        model = self.precision.model()
        for i, p in enumerate(PRECISIONS):
            item = model.item(i)
            ok = p in spec["precisions"]
            item.setEnabled(ok)
            item.setToolTip("" if ok else f"{p} unavailable: {spec['why']}")
        self.precision.setCurrentIndex(PRECISIONS.index("fp32"))

    def _window_changed(self, value: int) -> None:
        if value % 2 == 0:  # typed an even number: move to the next odd one
            self.window.setValue(value + 1)
            return
        self.order.setMaximum(min(6, value - 1))

    def _motion_changed(self, *_args) -> None:
        self._emit("motion")

    def _emit(self, kind: str) -> None:
        if not self._quiet:
            self.changed.emit(kind)

    def settings(self) -> RenderSettings:
        """The settings the controls show (validated)."""
        cadence = CadenceThresholds(
            plosive_guard=self.guard.value(),
            fast_flux=round(self.fast_flux.value(), 4),
            calm_flux=min(
                round(self.calm_flux.value(), 4), round(self.fast_flux.value(), 4) - 0.01
            ),
            max_pose_gap_deg=round(self.pose_gap.value(), 4),
        )
        size = int(self.size.currentData())
        return RenderSettings(
            smooth=self.smooth.isChecked(),
            smooth_window=self.window.value(),
            smooth_order=self.order.value(),
            accel_limit=round(self.accel.value(), 4),
            stride=str(self.stride.currentData()),
            cadence=cadence,
            seed=self.seed.value(),
            size=min(max(size, MIN_SIZE), MAX_SIZE),
            crf=self._crf,
            preset=self._preset,
            backend=str(self.backend.currentData()),
        ).validate()

    def set_settings(self, s: RenderSettings) -> None:
        """Show ``s`` without emitting ``changed``."""
        self._quiet = True
        try:
            self.seed.setValue(s.seed)
            self.smooth.setChecked(s.smooth)
            self.window.setValue(min(31, s.smooth_window))
            self.order.setMaximum(min(6, self.window.value() - 1))
            self.order.setValue(s.smooth_order)
            self.accel.setValue(s.accel_limit)
            self.stride.setCurrentIndex(max(0, self.stride.findData(str(s.stride))))
            self.guard.setValue(s.cadence.plosive_guard)
            self.fast_flux.setValue(s.cadence.fast_flux)
            self.calm_flux.setValue(s.cadence.calm_flux)
            self.pose_gap.setValue(s.cadence.max_pose_gap_deg)
            idx = self.size.findData(s.size)
            if idx < 0:
                self.size.addItem(f"{s.size} × {s.size}", s.size)
                idx = self.size.count() - 1
            self.size.setCurrentIndex(idx)
            self._crf, self._preset = s.crf, s.preset
            self.backend.setCurrentIndex(max(0, self.backend.findData(s.backend)))
        finally:
            self._quiet = False

    def set_enabled_for_render(self, enabled: bool) -> None:
        """Grey out what must not change during an export."""
        self.setEnabled(enabled)
