"""The settings panel: engine, Ditto, smoothing, cadence and output controls.

It edits one RenderSettings; ``changed(kind)`` says what is affected: "backend" (the engine
itself), "motion" (the generator's inputs or the post-processing of its motion; the motion
worker's cache decides what really re-runs) or "output" (only the frames: size, precision,
frame mode, pose deltas).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

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


def spin_box(low: int, high: int, tip: str, step: int = 1) -> QSpinBox:
    """An integer box from ``low`` to ``high`` with its tooltip."""
    box = QSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setToolTip(tip)
    return box


def number_box(
    low: float, high: float, tip: str, step: float, suffix: str = "", decimals: int = 2
) -> QDoubleSpinBox:
    """A decimal box from ``low`` to ``high``, with its step, unit suffix and tooltip."""
    box = QDoubleSpinBox()
    box.setDecimals(decimals)
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setSuffix(suffix)
    box.setToolTip(tip)
    return box


def combo_box(items: Iterable[tuple[str, object]], tip: str = "") -> QComboBox:
    """A menu of (label, data) items with its tooltip."""
    combo = QComboBox()
    for label, data in items:
        combo.addItem(label, data)
    combo.setToolTip(tip)
    return combo


W = TypeVar("W", bound=QWidget)


class FormGroup(QGroupBox):
    """A titled box of form rows, each added with the widget it shows."""

    def __init__(self, title: str) -> None:
        super().__init__(title)
        self._form = QFormLayout(self)

    def row(self, label: str | None, widget: W) -> W:
        """Add ``widget`` under ``label`` (None: a row of its own); the widget."""
        if label is None:
            self._form.addRow(widget)
        else:
            self._form.addRow(label, widget)
        return widget


def size_label(side: int) -> str:
    """How a square output size is shown: ``512 × 512``."""
    return f"{side} × {side}"


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

        engine = FormGroup("Engine")
        self.backend = engine.row(
            "Backend",
            combo_box(
                ((caps.label, name) for name, caps in self._caps.items()),
                "the engine: the built-in demo, or Ditto's networks",
            ),
        )
        for i, caps in enumerate(self._caps.values()):
            if caps.needs_checkpoints:
                _disable_item(self.backend, i, NEEDS_CHECKPOINTS)
        self.precision = engine.row("Precision", combo_box((p, p) for p in PRECISIONS))
        self.seed = engine.row("Seed", spin_box(0, 2**31 - 1, "seed of the motion generator"))
        layout.addWidget(engine)

        options = self.engine_box = FormGroup("Engine options")
        self.emotion = options.row(
            "Emotion",
            combo_box(
                ((f"{i} {name}", i) for i, name in enumerate(EMOTIONS)),
                "emotion label of LMDM's condition (re-runs the motion)",
            ),
        )
        self.steps = options.row(
            "Sampling steps",
            spin_box(
                1, MAX_STEPS, "LMDM DDIM sampling steps (re-runs the motion; fewer is faster)"
            ),
        )
        self.deltas: dict[str, QDoubleSpinBox] = {
            axis: options.row(
                f"Δ {axis}",
                number_box(
                    -MAX_DELTA_DEG,
                    MAX_DELTA_DEG,
                    f"constant head {axis} added at stitching (re-renders only)",
                    step=1.0,
                    suffix=" °",
                    decimals=1,
                ),
            )
            for axis in ("pitch", "yaw", "roll")
        }
        self.frame = options.row(
            "Frame",
            combo_box(
                (("full image (paste-back)", "full"), ("face crop (size × size)", "crop")),
                "full: the avatar image at its own resolution with the face pasted back; "
                "crop: the 512² face render, resized to the output size",
            ),
        )
        self.runtime = options.row(
            "Runtime",
            combo_box(
                ((name, name) for name in RUNTIMES),
                "engine backend of the warp network and decoder (re-renders)",
            ),
        )
        self.set_runtimes({"torch": None})
        self.compile = options.row("", QCheckBox("Compile render networks"))
        self.compile.setToolTip(COMPILE_NEEDS_CUDA)
        self.compile.setEnabled(False)
        layout.addWidget(options)
        # the RenderSettings field each engine option edits: enabled where the engine reads it
        self._engine_options = {
            "emotion": self.emotion,
            "steps": self.steps,
            **{f"delta_{axis}": box for axis, box in self.deltas.items()},
            "frame": self.frame,
            "runtime": self.runtime,
        }

        smooth = FormGroup("Pose smoothing")
        self.smooth = smooth.row(None, QCheckBox("Smooth head pose (C²)"))
        self.smooth.setToolTip(
            "Savitzky–Golay over pitch, yaw, roll and t, then an "
            "acceleration limit; expression is never touched"
        )
        self.window = smooth.row(
            "Window", spin_box(3, 31, "Savitzky–Golay window in frames (odd)", step=2)
        )
        self.order = smooth.row(
            "Order", spin_box(0, 6, "polynomial order of the local fit (below the window)")
        )
        self.accel = smooth.row(
            "Accel limit",
            number_box(
                0.01,
                10.0,
                "largest head-angle acceleration allowed after smoothing",
                step=0.05,
                suffix=" °/frame²",
            ),
        )
        layout.addWidget(smooth)

        cadence = FormGroup("Cadence")
        self.stride = cadence.row(
            "Stride",
            combo_box(
                (
                    ("auto (from speech)", "auto"),
                    ("every frame (1)", "1"),
                    ("every 2nd (2)", "2"),
                    ("every 3rd (3)", "3"),
                )
            ),
        )
        self.guard = cadence.row(
            "Plosive guard",
            spin_box(0, 6, "frames around a plosive burst or onset kept at stride 1"),
        )
        self.fast_flux = cadence.row(
            "Fast flux ≥",
            number_box(0.05, 1.0, "spectral flux above which articulation counts as fast", 0.05),
        )
        self.calm_flux = cadence.row(
            "Calm flux ≤",
            number_box(0.0, 0.95, "flux below which a voiced sound counts as sustained", 0.05),
        )
        self.pose_gap = cadence.row(
            "Max gap turn",
            number_box(
                0.1,
                20.0,
                "most head rotation a blended gap may span (less ghosting)",
                step=0.25,
                suffix=" °",
            ),
        )
        layout.addWidget(cadence)

        output = FormGroup("Output")
        self.size = output.row(
            "Size",
            combo_box(
                ((size_label(s), s) for s in SIZES),
                "square output side (demo, and Ditto crop frames; Ditto full frames keep the "
                "avatar image's size)",
            ),
        )
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
                self.size.addItem(size_label(s.size), s.size)
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
