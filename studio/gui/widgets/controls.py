"""The settings panel: engine, Ditto, smoothing, cadence and output controls.

It edits one RenderSettings; ``changed(kind)`` says what is affected: "backend" (the engine
itself), "motion" (the generator's inputs or the post-processing of its motion; the motion
worker's cache decides what really re-runs) or "output" (only the frames: size, precision,
frame mode, pose deltas).
"""

from __future__ import annotations

from collections.abc import Iterable
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
from studio.settings import RUNTIMES, RenderSettings, spec

PRECISIONS = spec("precision").choices
MOTION_PRECISIONS = spec("motion_precision").choices
SIZES = (256, 384, 512, 768, 1024)  # the Size menu's sides, each within the schema's range
STRIDE_LABELS = {
    "auto": "auto (from speech)",
    "1": "every frame (1)",
    "2": "every 2nd (2)",
    "3": "every 3rd (3)",
}
FRAME_LABELS = {"full": "full image (paste-back)", "crop": "face crop (size × size)"}
VIDEO_LOOP_LABELS = {"pingpong": "back and forth", "loop": "loop"}

NEEDS_CHECKPOINTS = "set a checkpoint folder (File → Checkpoints…) to enable"
COMPILE_TIP = (
    "warp + decoder through torch.compile: about 1.6x the frame rate on a GPU, after a first "
    "render that compiles for about a minute (re-renders only)"
)
RUNTIME_UNCHECKED = "not checked yet: set a checkpoint folder (File → Checkpoints…)"
COMPILE_NEEDS_CUDA = "compiling needs a CUDA GPU and torch sees none here"
MOTION_NEEDS_CUDA = "needs a CUDA GPU: the CPU runs LMDM in fp32"
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


def setting_spin(key: str, tip: str | None = None) -> QSpinBox:
    """An integer box for the setting ``key``: the schema's range and step (its help as the
    tooltip unless ``tip``)."""
    s = spec(key)
    return spin_box(int(s.low or 0), int(s.high or 0), tip or s.help, step=int(s.step))


def setting_number(key: str, tip: str | None = None) -> QDoubleSpinBox:
    """A decimal box for the setting ``key``: the schema's range, step, decimals and unit."""
    s = spec(key)
    suffix = f" {s.unit}" if s.unit else ""
    low, high = float(s.low or 0.0), float(s.high or 0.0)
    return number_box(low, high, tip or s.help, s.step, suffix=suffix, decimals=s.decimals)


def setting_combo(key: str, labels: dict[str, str] | None = None, tip: str = "") -> QComboBox:
    """A menu of the setting ``key``'s choices from the schema (``labels`` name some)."""
    labels = labels or {}
    return combo_box(((labels.get(c, c), c) for c in spec(key).choices), tip or spec(key).help)


def show_exactly(box: QDoubleSpinBox, value: float, decimals: int) -> None:
    """Set ``value`` with as many decimals as it needs (at least ``decimals``): a preset's
    0.125 is shown as 0.125, never rounded to the box's usual display."""
    need = next((d for d in range(decimals, 16) if round(value, d) == value), 15)
    box.setDecimals(need)
    box.setValue(value)


def _exact(box: QDoubleSpinBox) -> float:
    """A box's value without the binary noise of its arithmetic."""
    return round(box.value(), box.decimals())


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
        self.seed = engine.row("Seed", setting_spin("seed"))
        layout.addWidget(engine)

        options = self.engine_box = FormGroup("Engine options")
        emotions = spec("emotion")
        self.emotion = options.row(
            "Emotion",
            combo_box(
                (
                    (f"{i} {EMOTIONS[i]}", i)
                    for i in range(int(emotions.low or 0), int(emotions.high or 0) + 1)
                ),
                "emotion label of LMDM's condition (re-runs the motion)",
            ),
        )
        self.steps = options.row(
            "Sampling steps",
            setting_spin("steps", "LMDM DDIM sampling steps (re-runs the motion; fewer is faster)"),
        )
        self.motion_precision = options.row(
            "Motion",
            combo_box(
                ((p, p) for p in MOTION_PRECISIONS),
                "LMDM's precision on a GPU (re-runs the motion): fp32 is the released weights' "
                "own; tf32, fp16 and bf16 sample faster; the CPU runs fp32",
            ),
        )
        self.deltas: dict[str, QDoubleSpinBox] = {
            axis: options.row(
                f"Δ {axis}",
                setting_number(
                    f"delta_{axis}", f"constant head {axis} added at stitching (re-renders only)"
                ),
            )
            for axis in ("pitch", "yaw", "roll")
        }
        framing = "the avatar is registered again with its crop moved (a second or two)"
        self.crop: dict[str, QDoubleSpinBox] = {
            key: options.row(label, setting_number(key, f"{spec(key).help}; {framing}"))
            for key, label in (
                ("crop_scale", "Crop scale"),
                ("crop_vx", "Crop x"),
                ("crop_vy", "Crop y"),
            )
        }
        self.frame = options.row(
            "Frame",
            setting_combo(
                "frame",
                FRAME_LABELS,
                "full: the avatar image at its own resolution with the face pasted back; "
                "crop: the 512² face render, resized to the output size",
            ),
        )
        self.video_loop = options.row(
            "Video avatar",
            setting_combo(
                "video_loop",
                VIDEO_LOOP_LABELS,
                "a video avatar past its last frame: back and forth (no jump), or from its first "
                "frame again (a video made to loop)",
            ),
        )
        self.runtime = options.row(
            "Runtime",
            setting_combo(
                "runtime", tip="engine backend of the warp network and decoder (re-renders)"
            ),
        )
        self.set_runtimes({"torch": None})
        self.compile = options.row("", QCheckBox("Compile render networks"))
        self.compile.setToolTip(COMPILE_NEEDS_CUDA)
        self.compile.setEnabled(False)
        self._offer_motion_precisions()  # fp32 only, until a CUDA GPU is seen
        layout.addWidget(options)
        # the RenderSettings field each engine option edits: enabled where the engine reads it
        self._engine_options = {
            "emotion": self.emotion,
            "steps": self.steps,
            "motion_precision": self.motion_precision,
            **{f"delta_{axis}": box for axis, box in self.deltas.items()},
            **self.crop,
            "frame": self.frame,
            "video_loop": self.video_loop,
            "runtime": self.runtime,
        }

        smooth = FormGroup("Pose smoothing")
        self.smooth = smooth.row(None, QCheckBox("Smooth head pose (C²)"))
        self.smooth.setToolTip(
            "Savitzky–Golay over pitch, yaw, roll and t, then an "
            "acceleration limit; expression is never touched"
        )
        self.window = smooth.row(
            "Window", setting_spin("smooth_window", "Savitzky–Golay window in frames (odd)")
        )
        self.order = smooth.row(
            "Order",
            setting_spin("smooth_order", "polynomial order of the local fit (below the window)"),
        )
        self.accel = smooth.row(
            "Accel limit",
            setting_number(
                "accel_limit", "largest head-angle acceleration allowed after smoothing"
            ),
        )
        layout.addWidget(smooth)

        cadence = FormGroup("Cadence")
        self.stride = cadence.row("Stride", setting_combo("stride", STRIDE_LABELS))
        self.guard = cadence.row(
            "Plosive guard",
            setting_spin(
                "cadence.plosive_guard", "frames around a plosive burst or onset kept at stride 1"
            ),
        )
        self.fast_flux = cadence.row(
            "Fast flux ≥",
            setting_number(
                "cadence.fast_flux", "spectral flux above which articulation counts as fast"
            ),
        )
        self.calm_flux = cadence.row(
            "Calm flux ≤",
            setting_number(
                "cadence.calm_flux", "flux below which a voiced sound counts as sustained"
            ),
        )
        self.pose_gap = cadence.row(
            "Max gap turn",
            setting_number(
                "cadence.max_pose_gap_deg",
                "most head rotation a blended gap may span (less ghosting)",
            ),
        )
        self.warp_px = cadence.row(
            "Max warp",
            setting_number(
                "cadence.max_warp_px",
                "most keypoint movement an in-between is warped across; more is rendered",
            ),
        )
        self.lid_px = cadence.row(
            "Max lid change",
            setting_number(
                "cadence.max_lid_px",
                "most change of an eye's opening an in-between is warped across; a blink is "
                "rendered",
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

        # the schema's setting each widget edits (its range and choices are the schema's)
        self.fields: dict[str, QWidget] = {
            "seed": self.seed,
            "precision": self.precision,
            "emotion": self.emotion,
            "steps": self.steps,
            "motion_precision": self.motion_precision,
            **{f"delta_{axis}": box for axis, box in self.deltas.items()},
            **self.crop,
            "frame": self.frame,
            "video_loop": self.video_loop,
            "runtime": self.runtime,
            "compile": self.compile,
            "smooth": self.smooth,
            "smooth_window": self.window,
            "smooth_order": self.order,
            "accel_limit": self.accel,
            "stride": self.stride,
            "cadence.plosive_guard": self.guard,
            "cadence.fast_flux": self.fast_flux,
            "cadence.calm_flux": self.calm_flux,
            "cadence.max_pose_gap_deg": self.pose_gap,
            "cadence.max_warp_px": self.warp_px,
            "cadence.max_lid_px": self.lid_px,
            "size": self.size,
        }
        self._crf = 18
        self._preset = "medium"
        # what only an export reads (its dialog sets them): kept as a preset gave them
        self._fps, self._codec, self._background = "25", "h264", "avatar"
        self._hw_encode = False  # the Export dialog's, kept with the rest
        self._memory, self._batch = "auto", 0
        self._cadence = CadenceThresholds()  # keeps the thresholds no widget shows
        self.set_settings(RenderSettings())
        for w in (self.seed, self.window, self.order, self.guard, self.steps):
            w.valueChanged.connect(self._motion_changed)
        for w in (
            self.accel,
            self.fast_flux,
            self.calm_flux,
            self.pose_gap,
            self.warp_px,
            self.lid_px,
        ):
            w.valueChanged.connect(self._motion_changed)
        self.smooth.toggled.connect(self._motion_changed)
        self.stride.currentIndexChanged.connect(self._motion_changed)
        self.emotion.currentIndexChanged.connect(self._motion_changed)
        self.motion_precision.currentIndexChanged.connect(self._motion_changed)
        for w in self.deltas.values():
            w.valueChanged.connect(self._output_changed)
        for w in self.crop.values():
            w.valueChanged.connect(self._motion_changed)
        for w in (self.size, self.frame, self.runtime):
            w.currentIndexChanged.connect(self._output_changed)
        self.compile.toggled.connect(self._output_changed)
        self.video_loop.currentIndexChanged.connect(self._motion_changed)  # eyes and frames
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
        """Whether precisions and options that need a CUDA GPU (fp16, compile, LMDM's faster
        precisions) are offered."""
        self._cuda = bool(cuda)
        self.compile.setToolTip(COMPILE_TIP if self._cuda else COMPILE_NEEDS_CUDA)
        if not self._cuda:
            self.compile.setChecked(False)
        self._offer_motion_precisions()
        self._apply_backend_precisions(self.backend_name())

    def _offer_motion_precisions(self) -> None:
        """LMDM's faster precisions enabled with a CUDA GPU; without one greyed with the
        reason, and fp32 (what the CPU runs) chosen."""
        if not self._cuda:
            self.motion_precision.setCurrentIndex(0)
        for i, p in enumerate(MOTION_PRECISIONS[1:], start=1):
            _set_item(self.motion_precision, i, self._cuda, p if self._cuda else MOTION_NEEDS_CUDA)

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
        self.order.setMaximum(min(int(spec("smooth_order").high or 0), value - 1))

    def _motion_changed(self, *_args) -> None:
        self._emit("motion")

    def _output_changed(self, *_args) -> None:
        self._emit("output")

    def _emit(self, kind: str) -> None:
        if not self._quiet:
            self.changed.emit(kind)

    def settings(self) -> RenderSettings:
        """The settings the controls show (validated)."""
        fast, calm = _exact(self.fast_flux), _exact(self.calm_flux)
        cadence = CadenceThresholds(
            plosive_guard=self.guard.value(),
            fast_flux=fast,
            calm_flux=calm if calm < fast else max(0.0, round(fast - 0.01, 4)),
            calm_voicing=self._cadence.calm_voicing,
            calm_level_step=self._cadence.calm_level_step,
            max_pose_gap_deg=_exact(self.pose_gap),
            max_warp_px=_exact(self.warp_px),
            max_lid_px=_exact(self.lid_px),
        )
        return RenderSettings(
            smooth=self.smooth.isChecked(),
            smooth_window=self.window.value(),
            smooth_order=self.order.value(),
            accel_limit=_exact(self.accel),
            stride=str(self.stride.currentData()),
            cadence=cadence,
            seed=self.seed.value(),
            size=int(self.size.currentData()),
            crf=self._crf,
            preset=self._preset,
            fps=self._fps,
            codec=self._codec,
            background=self._background,
            hw_encode=self._hw_encode,
            backend=self.backend_name(),
            emotion=int(self.emotion.currentData()),
            delta_pitch=_exact(self.deltas["pitch"]),
            delta_yaw=_exact(self.deltas["yaw"]),
            delta_roll=_exact(self.deltas["roll"]),
            steps=self.steps.value(),
            motion_precision=str(self.motion_precision.currentData()),
            **{key: _exact(box) for key, box in self.crop.items()},
            memory=self._memory,
            batch=self._batch,
            precision=str(self.precision.currentData()),
            frame=str(self.frame.currentData()),
            video_loop=str(self.video_loop.currentData()),
            compile=self.compile.isChecked() and self._cuda,
            runtime=str(self.runtime.currentData()),
        )

    def set_settings(self, s: RenderSettings) -> None:
        """Show ``s`` without emitting ``changed``: every value as it is (the widgets' ranges
        are the schema's, and decimal boxes show as many decimals as a value needs).

        A backend that is not available here (ditto without checkpoints) falls back to demo;
        a precision the backend cannot run here (fp16 without CUDA) to the backend's default.
        """
        self._quiet = True
        try:
            self.seed.setValue(s.seed)
            self.smooth.setChecked(s.smooth)
            self.window.setValue(s.smooth_window)
            self._window_changed(s.smooth_window)
            self.order.setValue(s.smooth_order)
            numbers = {
                "accel_limit": (self.accel, s.accel_limit),
                "cadence.fast_flux": (self.fast_flux, s.cadence.fast_flux),
                "cadence.calm_flux": (self.calm_flux, s.cadence.calm_flux),
                "cadence.max_pose_gap_deg": (self.pose_gap, s.cadence.max_pose_gap_deg),
                "cadence.max_warp_px": (self.warp_px, s.cadence.max_warp_px),
                "cadence.max_lid_px": (self.lid_px, s.cadence.max_lid_px),
                **{
                    f"delta_{axis}": (box, float(getattr(s, f"delta_{axis}")))
                    for axis, box in self.deltas.items()
                },
                **{key: (box, float(getattr(s, key))) for key, box in self.crop.items()},
            }
            for key, (box, value) in numbers.items():
                show_exactly(box, value, spec(key).decimals)
            self._cadence = s.cadence
            self.stride.setCurrentIndex(max(0, self.stride.findData(str(s.stride))))
            self.guard.setValue(s.cadence.plosive_guard)
            idx = self.size.findData(s.size)
            if idx < 0:
                self.size.addItem(size_label(s.size), s.size)
                idx = self.size.count() - 1
            self.size.setCurrentIndex(idx)
            self._crf, self._preset = s.crf, s.preset
            self._fps, self._codec, self._background = s.fps, s.codec, s.background
            self._hw_encode = s.hw_encode
            self._memory, self._batch = s.memory, s.batch
            self.emotion.setCurrentIndex(max(0, self.emotion.findData(int(s.emotion))))
            self.steps.setValue(s.steps)
            motion = MOTION_PRECISIONS.index(s.motion_precision) if self._cuda else 0
            self.motion_precision.setCurrentIndex(motion)
            self.frame.setCurrentIndex(max(0, self.frame.findData(s.frame)))
            self.video_loop.setCurrentIndex(max(0, self.video_loop.findData(s.video_loop)))
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
        return s.replace(backend=backend, precision=want)

    def set_enabled_for_render(self, enabled: bool) -> None:
        """Grey out what must not change during an export."""
        self.setEnabled(enabled)
