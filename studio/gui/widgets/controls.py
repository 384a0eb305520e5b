"""The settings panel: engine, Ditto, smoothing, cadence and output controls.

It edits one RenderSettings; ``changed(kind)`` says what is affected: "backend" (the engine
itself), "motion" (the generator's inputs or the post-processing of its motion; the motion
worker's cache decides what really re-runs) or "output" (only the frames: size, precision,
frame mode, pose deltas).
"""

from __future__ import annotations

from dataclasses import replace

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

from studio.engines.base import Capabilities
from studio.layout import EMOTIONS
from studio.motion.cadence import CadenceThresholds
from studio.render.engines import ENGINES, capabilities
from studio.settings import (
    MAX_DELTA_DEG,
    MAX_SIZE,
    MAX_STEPS,
    MIN_SIZE,
    RUNTIMES,
    RenderSettings,
)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
SIZES = (256, 384, 512, 768, 1024)

NEEDS_CHECKPOINTS = "set a checkpoint folder (File → Checkpoints…) to enable"
COMPILE_TIP = (
    "warp + decoder through torch.compile: about 1.6x the frame rate on a GPU, after a first "
    "render that compiles for about a minute (re-renders only)"
)
RUNTIME_UNCHECKED = "not checked yet: set a checkpoint folder (File → Checkpoints…)"
COMPILE_NEEDS_CUDA = "compiling needs a CUDA GPU and torch sees none here"
FP16_NEEDS_CUDA = "fp16 unavailable: half precision needs a CUDA GPU and torch sees none here"
PRECISION_TIPS = {
    "auto": "fp16 on a GPU, fp32 on the CPU (warp and decoder; HuBERT and LMDM stay fp32)",
    "fp32": "float32 everywhere",
    "bf16": "warp and decoder under bfloat16 autocast",
    "fp16": "warp and decoder under float16 autocast (GPU only)",
}
NOT_USED = "not used by the {label} engine"
DEFAULT_BACKEND = RenderSettings().backend


def _disable_item(combo: QComboBox, index: int, tip: str) -> None:
    _set_item(combo, index, False, tip)


def _set_item(combo: QComboBox, index: int, enabled: bool, tip: str) -> None:
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    item = model.item(index)
    item.setEnabled(enabled)
    item.setToolTip(tip)


def _item_enabled(combo: QComboBox, index: int) -> bool:
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    item = model.item(index)
    return item is not None and item.isEnabled()


class ControlsPanel(QWidget):
    """Edits a RenderSettings; emits ``changed("backend" | "motion" | "output")``."""

    changed = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._quiet = False
        self._cuda = False
        self._caps = {name: capabilities(name) for name in ENGINES}
        self._precision_for = {b: caps.default_precision for b, caps in self._caps.items()}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(8)

        engine = QGroupBox("Engine")
        f = QFormLayout(engine)
        self.backend = QComboBox()
        for i, (name, caps) in enumerate(self._caps.items()):
            self.backend.addItem(caps.label, name)
            if caps.needs_checkpoints:
                _disable_item(self.backend, i, NEEDS_CHECKPOINTS)
        self.backend.setToolTip("the engine: the built-in demo, or Ditto's networks")
        self.precision = QComboBox()
        for p in PRECISIONS:
            self.precision.addItem(p, p)
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.seed.setToolTip("seed of the motion generator")
        f.addRow("Backend", self.backend)
        f.addRow("Precision", self.precision)
        f.addRow("Seed", self.seed)
        layout.addWidget(engine)

        options = QGroupBox("Engine options")
        self.engine_box = options
        f = QFormLayout(options)
        self.emotion = QComboBox()
        for i, name in enumerate(EMOTIONS):
            self.emotion.addItem(f"{i} {name}", i)
        self.emotion.setToolTip("emotion label of LMDM's condition (re-runs the motion)")
        self.steps = QSpinBox()
        self.steps.setRange(1, MAX_STEPS)
        self.steps.setToolTip("LMDM DDIM sampling steps (re-runs the motion; fewer is faster)")
        self.deltas: dict[str, QDoubleSpinBox] = {}
        for axis in ("pitch", "yaw", "roll"):
            box = QDoubleSpinBox()
            box.setRange(-MAX_DELTA_DEG, MAX_DELTA_DEG)
            box.setDecimals(1)
            box.setSingleStep(1.0)
            box.setSuffix(" °")
            box.setToolTip(f"constant head {axis} added at stitching (re-renders only)")
            self.deltas[axis] = box
        self.frame = QComboBox()
        self.frame.addItem("full image (paste-back)", "full")
        self.frame.addItem("face crop (size × size)", "crop")
        self.frame.setToolTip(
            "full: the avatar image at its own resolution with the face pasted back; "
            "crop: the 512² face render, resized to the output size"
        )
        f.addRow("Emotion", self.emotion)
        f.addRow("Sampling steps", self.steps)
        f.addRow("Δ pitch", self.deltas["pitch"])
        f.addRow("Δ yaw", self.deltas["yaw"])
        f.addRow("Δ roll", self.deltas["roll"])
        self.runtime = QComboBox()
        for name in RUNTIMES:
            self.runtime.addItem(name, name)
        self.runtime.setToolTip("engine backend of the warp network and decoder (re-renders)")
        self.set_runtimes({"torch": None})
        self.compile = QCheckBox("Compile render networks")
        self.compile.setToolTip(COMPILE_NEEDS_CUDA)
        self.compile.setEnabled(False)
        f.addRow("Frame", self.frame)
        f.addRow("Runtime", self.runtime)
        f.addRow("", self.compile)
        layout.addWidget(options)
        # the RenderSettings field each engine option edits: enabled where the engine reads it
        self._engine_options = {
            "emotion": self.emotion,
            "steps": self.steps,
            **{f"delta_{axis}": box for axis, box in self.deltas.items()},
            "frame": self.frame,
            "runtime": self.runtime,
        }

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
        self.size.setToolTip(
            "square output side (demo, and Ditto crop frames; Ditto full frames keep the "
            "avatar image's size)"
        )
        f.addRow("Size", self.size)
        layout.addWidget(output)
        layout.addStretch(1)

        self._crf = 18
        self._preset = "medium"
        self._memory, self._batch = "auto", 0
        self.set_settings(RenderSettings())
        for w in (self.seed, self.window, self.order, self.guard, self.steps):
            w.valueChanged.connect(self._motion_changed)
        for w in (self.accel, self.fast_flux, self.calm_flux, self.pose_gap):
            w.valueChanged.connect(self._motion_changed)
        self.smooth.toggled.connect(self._motion_changed)
        self.stride.currentIndexChanged.connect(self._motion_changed)
        self.emotion.currentIndexChanged.connect(self._motion_changed)
        for w in self.deltas.values():
            w.valueChanged.connect(self._output_changed)
        for w in (self.size, self.frame, self.runtime):
            w.currentIndexChanged.connect(self._output_changed)
        self.compile.toggled.connect(self._output_changed)
        self.precision.currentIndexChanged.connect(self._precision_changed)
        self.backend.currentIndexChanged.connect(self._backend_changed)
        self.window.valueChanged.connect(self._window_changed)

    # --- backend availability --------------------------------------------------------------

    def set_engine_available(
        self, name: str, available: bool, why: str = NEEDS_CHECKPOINTS
    ) -> None:
        """Enable or grey out the engine ``name`` in the backend menu (``why`` as its tooltip);
        the default engine takes over when the current one goes."""
        label = self._caps[name].label
        tip = f"{label}: on the checkpoints set in File → Checkpoints…" if available else why
        _set_item(self.backend, self.backend.findData(name), available, tip)
        if not available and self.backend_name() == name:
            self.set_backend(DEFAULT_BACKEND)

    def engine_available(self, name: str) -> bool:
        return _item_enabled(self.backend, self.backend.findData(name))

    def capabilities(self, name: str | None = None) -> Capabilities:
        """What the engine ``name`` (default: the one chosen) can do."""
        return self._caps[name or self.backend_name()]

    def set_cuda_available(self, cuda: bool) -> None:
        """Whether precisions and options that need a CUDA GPU (fp16, compile) are offered."""
        self._cuda = bool(cuda)
        self.compile.setToolTip(COMPILE_TIP if self._cuda else COMPILE_NEEDS_CUDA)
        if not self._cuda:
            self.compile.setChecked(False)
        self._apply_backend_precisions(self.backend_name())

    def set_runtimes(self, reasons: dict[str, str | None]) -> None:
        """Enable the runtimes that can run here (``reasons[name]`` None), others greyed with
        the reason as their tooltip; an unusable current runtime falls back to torch."""
        for i, name in enumerate(RUNTIMES):
            why = reasons.get(name, RUNTIME_UNCHECKED)
            _set_item(self.runtime, i, why is None, f"{name}: usable here" if why is None else why)
        if not _item_enabled(self.runtime, self.runtime.currentIndex()):
            self.runtime.setCurrentIndex(RUNTIMES.index("torch"))

    def backend_name(self) -> str:
        return str(self.backend.currentData())

    def set_backend(self, backend: str, emit: bool = False) -> None:
        """Select ``backend``; ``emit`` says whether ``changed("backend")`` fires."""
        quiet, self._quiet = self._quiet, not emit or self._quiet
        try:
            self.backend.setCurrentIndex(max(0, self.backend.findData(backend)))
            self._apply_backend_precisions(self.backend_name())
        finally:
            self._quiet = quiet

    def precision_choices(self, backend: str) -> set[str]:
        """The precisions ``backend`` can run here."""
        return set(self._caps[backend].precisions_here(self._cuda))

    def _apply_backend_precisions(self, backend: str) -> None:
        caps = self._caps[backend]
        allowed = self.precision_choices(backend)
        for i, p in enumerate(PRECISIONS):
            ok = p in allowed
            if ok:
                tip = PRECISION_TIPS[p]
            elif p in caps.cuda_only:
                tip = FP16_NEEDS_CUDA
            else:
                tip = f"{p} unavailable: {caps.why_cpu}"
            _set_item(self.precision, i, ok, tip)
        want = self._precision_for.get(backend, caps.default_precision)
        if want not in allowed:
            want = caps.default_precision
        quiet, self._quiet = self._quiet, True
        try:
            self.precision.setCurrentIndex(PRECISIONS.index(want))
        finally:
            self._quiet = quiet
        for field, widget in self._engine_options.items():
            widget.setEnabled(caps.honours(field))
        self.compile.setEnabled(self._cuda and caps.honours("compile"))
        used = any(caps.honours(field) for field in (*self._engine_options, "compile"))
        self.engine_box.setEnabled(used)
        self.engine_box.setToolTip("" if used else NOT_USED.format(label=caps.label))

    def _backend_changed(self, *_args) -> None:
        self._apply_backend_precisions(self.backend_name())
        self._emit("backend")

    def _precision_changed(self, *_args) -> None:
        self._precision_for[self.backend_name()] = str(self.precision.currentData())
        self._emit("output")

    # --- edits --------------------------------------------------------------------------------

    def _window_changed(self, value: int) -> None:
        if value % 2 == 0:  # typed an even number: move to the next odd one
            self.window.setValue(value + 1)
            return
        self.order.setMaximum(min(6, value - 1))

    def _motion_changed(self, *_args) -> None:
        self._emit("motion")

    def _output_changed(self, *_args) -> None:
        self._emit("output")

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
            backend=self.backend_name(),
            emotion=int(self.emotion.currentData()),
            delta_pitch=round(self.deltas["pitch"].value(), 2),
            delta_yaw=round(self.deltas["yaw"].value(), 2),
            delta_roll=round(self.deltas["roll"].value(), 2),
            steps=self.steps.value(),
            memory=self._memory,
            batch=self._batch,
            precision=str(self.precision.currentData()),
            frame=str(self.frame.currentData()),
            compile=self.compile.isChecked() and self._cuda,
            runtime=str(self.runtime.currentData()),
        ).validate()

    def set_settings(self, s: RenderSettings) -> None:
        """Show ``s`` without emitting ``changed``.

        A backend that is not available here (ditto without checkpoints) falls back to demo;
        a precision the backend cannot run here (fp16 without CUDA) to the backend's default.
        """
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
            self._memory, self._batch = s.memory, s.batch
            self.emotion.setCurrentIndex(max(0, self.emotion.findData(int(s.emotion))))
            self.steps.setValue(s.steps)
            for axis, box in self.deltas.items():
                box.setValue(float(getattr(s, f"delta_{axis}")))
            self.frame.setCurrentIndex(max(0, self.frame.findData(s.frame)))
            self.compile.setChecked(bool(s.compile) and self._cuda)
            want = RUNTIMES.index(s.runtime) if s.runtime in RUNTIMES else 0
            self.runtime.setCurrentIndex(want if _item_enabled(self.runtime, want) else 0)
            ok = s.backend in self._caps and self.engine_available(s.backend)
            backend = s.backend if ok else DEFAULT_BACKEND
            if s.precision in self._caps[backend].precisions:
                self._precision_for[backend] = s.precision
            self.backend.setCurrentIndex(max(0, self.backend.findData(backend)))
            self._apply_backend_precisions(backend)
        finally:
            self._quiet = False

    def with_backend(self, s: RenderSettings, backend: str) -> RenderSettings:
        """``s`` on another backend, with that backend's precision choice."""
        caps = self._caps[backend]
        want = self._precision_for.get(backend, caps.default_precision)
        if want not in self.precision_choices(backend):
            want = caps.default_precision
        return replace(s, backend=backend, precision=want).validate()

    def set_enabled_for_render(self, enabled: bool) -> None:
        """Grey out what must not change during an export."""
        self.setEnabled(enabled)
