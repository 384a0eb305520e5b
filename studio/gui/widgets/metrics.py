"""The metrics panel: jerk raw vs smoothed, transition peak, exp fidelity, timings, the
preview's state and render speed; and a Quality group with the clip's weight-free quality
metrics (:func:`studio.render.pipeline.quality_of`) and the keyframes the warp bound forced.

Numbers of a render that no longer matches what is shown (a cancelled or superseded preview)
are marked stale, never left looking current.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from studio import layout
from studio.motion.quality import BLINK_SCHEDULE_S
from studio.render.pipeline import MotionResult

ROWS = (
    ("jerk_raw", "Mean jerk, raw"),
    ("jerk_smoothed", "Mean jerk, smoothed"),
    ("jerk_reduction", "Jerk reduction"),
    ("transition", "Transition peak"),
    ("exp_mae", "Expression MAE"),
    ("accel", "Max accel / limit"),
    ("rendered", "Keyframes (cadence)"),
    ("inbetween_psnr", "In-between PSNR"),
    ("timings", "Stage timings"),
    ("preview", "Preview"),
    ("fps", "Render speed"),
)
QUALITY_ROWS = (
    ("head_smoothness", "Head smoothness"),
    ("silent_lips", "Lips in silence"),
    ("blink_rate", "Blink rate"),
    ("blink_schedule", "Blinks {:g}–{:g} s".format(*BLINK_SCHEDULE_S)),
    ("lip_sync", "Lip sync"),
    ("warp_forced", "Warp-forced keys"),
)
STALE_STYLE = "color: #7d8594; font-style: italic;"
NONE = "–"


def _num(value: float | None, fmt: str = ".3g") -> str:
    """A report number (None where the report has no value, e.g. no silence or no blinks)."""
    return NONE if value is None else format(value, fmt)


def inbetween_psnr_text(score: dict[str, Any] | None, rendered: int, frames: int) -> str:
    """The In-between PSNR row: a preview's in-betweens against full renders (mean, 5th
    percentile, worst), or why there is no figure."""
    if score is None:
        return "none: every frame rendered" if rendered >= frames else NONE
    return (
        f"{_num(score['mean'], '.1f')} dB mean\np5 {_num(score['p5'], '.1f')}, worst "
        f"{_num(score['worst'], '.1f')}\n{score['measured']} of {score['inbetweens']} measured"
    )


def quality_texts(quality: dict[str, Any], warp_forced: int) -> dict[str, str]:
    """The Quality rows' texts of a :func:`~studio.render.pipeline.quality_of` report and the
    plan's warp-forced keyframe count (a pure function: the tests compare with it)."""
    head, lips = quality["head"], quality["silent_lips"]
    blinks, sync = quality["blinks"], quality["lip_sync"]
    diff = "/".join(_num(head["diff_var"][a], ".2g") for a in layout.POSE_ANGLES)
    share = blinks["in_schedule"]
    lag = sync["best_lag_frames"]
    return {
        "head_smoothness": f"{_num(head['smoothness'])}\nΔ var {diff} °²",
        "silent_lips": (
            f"{_num(lips['deviation'])} (speech {_num(lips['speech_deviation'])})\n"
            f"{lips['stretches']} stretches, {lips['frames']} frames"
        ),
        "blink_rate": f"{_num(blinks['rate_per_min'], '.1f')} /min ({blinks['count']} blinks)",
        "blink_schedule": (
            f"{NONE if share is None else format(100.0 * share, '.0f') + ' %'} of intervals\n"
            f"(mean {_num(blinks['interval_mean_s'], '.2f')} s)"
        ),
        "lip_sync": (
            f"{_num(sync['envelope_correlation'], '.2f')}\nbest lag "
            f"{NONE if lag is None else format(1000.0 * lag / layout.FPS, '+.0f')} ms "
            f"(r {_num(sync['best_lag_correlation'], '.2f')})"
        ),
        "warp_forced": f"{int(warp_forced)}",
    }


class MetricsPanel(QWidget):
    """Read-only numbers about the current motion and the last render."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 0, 6, 6)
        box = QGroupBox("Metrics")
        form = QFormLayout(box)
        self.values: dict[str, QLabel] = {}
        self._rows(form, ROWS)
        self.values["inbetween_psnr"].setWordWrap(True)
        outer.addWidget(box)
        quality = QGroupBox("Quality")
        quality.setToolTip(
            "weight-free measures of the smoothed motion: head smoothness (THEval); lips in "
            "silence: mean absolute deviation of the mouth opening, against speech's; blink "
            "rate and the share of blink intervals in Ditto's 2.4–4 s schedule; lip sync: "
            "correlation of the mouth opening with the speech envelope, and its best lag; "
            "keyframes the warp bound forced (in-betweens too far to warp)"
        )
        self._rows(QFormLayout(quality), QUALITY_ROWS)
        for key, _ in QUALITY_ROWS:  # wrapped: the dock stays as narrow as it was
            self.values[key].setWordWrap(True)
        outer.addWidget(quality)

    def _rows(self, form: QFormLayout, rows: tuple[tuple[str, str], ...]) -> None:
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        for key, label in rows:
            value = QLabel(NONE)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            form.addRow(label, value)
            self.values[key] = value

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

    def set_quality(self, quality: dict[str, Any] | None, warp_forced: int = 0) -> None:
        """The Quality rows from a :func:`~studio.render.pipeline.quality_of` report; None
        (not measured, e.g. the engine could not say its keypoints) empties them."""
        if quality is None:
            for key, _ in QUALITY_ROWS:
                self.values[key].setText(NONE)
            return
        for key, text in quality_texts(quality, warp_forced).items():
            self.values[key].setText(text)

    def set_render_stats(self, stats: dict) -> None:
        """A completed preview render: its speed, and the preview is whole."""
        self.values["fps"].setText(
            f"{stats['fps']:.1f} fps\n{stats['frames']} frames in {stats['wall_ms'] / 1000:.2f} s"
        )
        self.values["fps"].setStyleSheet("")
        self.values["inbetween_psnr"].setText(
            inbetween_psnr_text(
                stats.get("inbetween_psnr"), stats["rendered_frames"], stats["frames"]
            )
        )
        self.values["inbetween_psnr"].setStyleSheet("")
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
        if stale and self.values["inbetween_psnr"].text() != NONE:
            self.values["inbetween_psnr"].setStyleSheet(STALE_STYLE)

    def is_stale(self, key: str) -> bool:
        return bool(self.values[key].styleSheet())
