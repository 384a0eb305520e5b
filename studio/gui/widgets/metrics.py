"""The metrics panel: jerk raw vs smoothed, transition peak, exp fidelity, timings, the
preview's state and render speed.

Numbers of a render that no longer matches what is shown (a cancelled or superseded preview)
are marked stale, never left looking current.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from studio.render.pipeline import MotionResult

ROWS = (
    ("jerk_raw", "Mean jerk, raw"),
    ("jerk_smoothed", "Mean jerk, smoothed"),
    ("jerk_reduction", "Jerk reduction"),
    ("transition", "Transition peak"),
    ("exp_mae", "Expression MAE"),
    ("accel", "Max accel / limit"),
    ("rendered", "Keyframes (cadence)"),
    ("timings", "Stage timings"),
    ("preview", "Preview"),
    ("fps", "Render speed"),
)
STALE_STYLE = "color: #7d8594; font-style: italic;"


class MetricsPanel(QWidget):
    """Read-only numbers about the current motion and the last render."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 0, 6, 6)
        box = QGroupBox("Metrics")
        form = QFormLayout(box)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        self.values: dict[str, QLabel] = {}
        for key, label in ROWS:
            value = QLabel("–")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(label, value)
            self.values[key] = value
        outer.addWidget(box)

    def text(self, key: str) -> str:
        return self.values[key].text()

    def set_result(self, r: MotionResult) -> None:
        k = r.kinematics
        raw, smooth = k["pose_jerk_mean_raw"], k["pose_jerk_mean_smoothed"]
        red = 100.0 * (1 - smooth / raw) if raw > 0 else 0.0
        self.values["jerk_raw"].setText(f"{raw:.2f} rad/s³")
        self.values["jerk_smoothed"].setText(f"{smooth:.2f} rad/s³")
        self.values["jerk_reduction"].setText(f"{red:.1f} %")
        self.values["transition"].setText(
            f"{k['transition_jerk_peak_raw']:.1f} → {k['transition_jerk_peak_smoothed']:.1f} rad/s³"
        )
        self.values["exp_mae"].setText(
            f"{k['exp_mae']:.3g} (velocity corr {k['exp_velocity_corr']:.3f})"
        )
        self.values["accel"].setText(
            f"{k['accel_max_smoothed']:.3f} / {k['accel_limit']:.3f} °/frame²"
        )
        n, keys = r.num_frames, int(r.plan.keyframes.size)
        self.values["rendered"].setText(f"{keys} of {n} ({100.0 * keys / max(n, 1):.0f} %)")
        self.values["timings"].setText(
            "\n".join(f"{name}: {ms:.0f} ms" for name, ms in r.timings_ms.items())
        )

    def set_render_stats(self, stats: dict) -> None:
        """A completed preview render: its speed, and the preview is whole."""
        self.values["fps"].setText(
            f"{stats['fps']:.1f} fps\n{stats['frames']} frames in {stats['wall_ms'] / 1000:.2f} s"
        )
        self.values["fps"].setStyleSheet("")
        self.set_preview(f"complete: {stats['frames']} frames")

    def set_preview(self, text: str, stale: bool = False) -> None:
        """The preview's state; ``stale`` also marks the last render speed as not this one."""
        self.values["preview"].setText(text)
        self.values["preview"].setStyleSheet(STALE_STYLE if stale else "")
        if stale and self.values["fps"].text() != "–":
            fps = self.values["fps"]
            if not fps.text().endswith("(an earlier render)"):
                fps.setText(f"{fps.text()}\n(an earlier render)")
            fps.setStyleSheet(STALE_STYLE)

    def is_stale(self, key: str) -> bool:
        return bool(self.values[key].styleSheet())
