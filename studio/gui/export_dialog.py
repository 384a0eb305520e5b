"""The Export dialog: path and file type (MP4, WebM, QuickTime, PNG sequence), background
(the avatar's, transparent, or a keying colour), size, quality, encoder speed, frame rate and
codec; progress, ETA and Cancel.

An existing file is never overwritten without asking: Export on one offers to replace it or
to write beside it under a fresh name.
"""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from studio.export.video import ALPHA_SUFFIXES, CONTAINERS, PNG_SEQUENCE, written_path
from studio.files import unused_name
from studio.gui.widgets.controls import SIZES, combo_box, setting_combo, setting_spin, size_label
from studio.settings import spec

FORMATS = {  # file type -> its label in the menu
    **{suffix: c.label for suffix, c in CONTAINERS.items()},
    PNG_SEQUENCE: "PNG sequence (a folder of frames + WAV)",
}
BACKGROUND_LABELS = {
    "avatar": "Avatar (as previewed)",
    "transparent": "Transparent (alpha)",
    "green": "Green screen",
    "blue": "Blue screen",
    "black": "Black",
    "white": "White",
}


class ExportDialog(QDialog):
    """Collects export options and shows the export's progress."""

    # path, size, crf, preset, fps, codec, background, hardware encoding
    exportRequested = Signal(str, int, int, str, str, str, str, bool)
    cancelRequested = Signal()

    def __init__(
        self,
        path: str,
        size: int,
        crf: int,
        parent=None,
        full_frame_hw: tuple[int, int] | None = None,
        preset: str = "medium",
        fps: str = "25",
        codec: str = "h264",
        background: str = "avatar",
        hw_encode: bool = False,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export")
        self.setMinimumWidth(520)
        self.path = QLineEdit(path)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        row = QHBoxLayout()
        row.addWidget(self.path, 1)
        row.addWidget(browse)
        self.size = combo_box((size_label(s), s) for s in sorted(set(SIZES) | {size}))
        self.size.setCurrentIndex(self.size.findData(size))
        if full_frame_hw is not None:
            h, w = full_frame_hw
            self.size_note = QLabel(
                f"Ditto full frames keep the avatar image's size: {w} × {h}. "
                "Size applies to crop frames (and the demo) only."
            )
            self.size.setEnabled(False)
            self.size.setToolTip("full frames are the avatar image's size; choose crop to resize")
        else:
            self.size_note = QLabel("Square output side. With Ditto it applies to crop frames.")
        self.size_note.setWordWrap(True)
        self.size_note.setObjectName("size_note")
        self.crf = setting_spin(
            "crf", "H.264 constant rate factor: lower is better quality, 18 is visually lossless"
        )
        self.crf.setValue(crf)
        self.preset = setting_combo(
            "preset",
            tip="x264 speed preset: faster presets encode sooner at the same quality (CRF) but "
            "make larger files; on a fast GPU, 'veryfast' keeps the encoder from setting the pace",
        )
        self.preset.setCurrentIndex(max(0, self.preset.findData(preset)))
        self.fps = setting_combo(
            "fps",
            tip="25 fps is the motion's own rate; 24/30/50/60 render every frame from the motion "
            "resampled to that rate (no adaptive cadence)",
        )
        self.fps.setCurrentIndex(max(0, self.fps.findData(fps)))
        self.codec = setting_combo(
            "codec",
            tip="H.264 plays everywhere; HEVC and AV1 make smaller files at the same quality "
            "(slower to encode; `studio doctor` lists the encoders)",
        )
        self.codec.setCurrentIndex(max(0, self.codec.findData(codec)))
        self.format = combo_box(
            ((label, suffix) for suffix, label in FORMATS.items()),
            "MP4 plays everywhere; WebM (VP9) and QuickTime (ProRes 4444) keep an alpha channel "
            "for compositing, as does a PNG sequence (a folder of frames and the audio as WAV)",
        )
        self.background = setting_combo(
            "background",
            BACKGROUND_LABELS,
            tip="what the head is drawn over: the avatar's own picture, nothing (alpha: WebM, "
            "QuickTime or PNG), or a keying colour for a video editor",
        )
        self.background.setCurrentIndex(max(0, self.background.findData(background)))
        self.hw_encode = QCheckBox("on the GPU's video encoder (NVENC) where there is one")
        self.hw_encode.setToolTip(spec("hw_encode").help)
        self.hw_encode.setChecked(hw_encode)
        self._show_format()
        self.path.textChanged.connect(self._show_format)
        self.format.currentIndexChanged.connect(self._format_chosen)
        self.background.currentIndexChanged.connect(self._background_chosen)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        self.status = QLabel("The file appears only when the export finishes.")
        self.status.setWordWrap(True)
        form = QFormLayout()
        form.addRow("File", row)
        form.addRow("Size", self.size)
        form.addRow("", self.size_note)
        form.addRow("Quality (CRF)", self.crf)
        form.addRow("Encoder speed", self.preset)
        form.addRow("Frame rate", self.fps)
        form.addRow("Format", self.format)
        form.addRow("Background", self.background)
        form.addRow("Codec (MP4)", self.codec)
        form.addRow("Encode", self.hw_encode)
        self.buttons = QDialogButtonBox()
        self.export_button = self.buttons.addButton(
            "Export", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.cancel_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        self.close_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Close)
        self.export_button.clicked.connect(self._export)
        self.cancel_button.clicked.connect(self._cancel)
        self.close_button.clicked.connect(self.reject)
        self.cancel_button.setEnabled(False)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.running = False
        self._t0 = 0.0
        self.overwrite_box: QMessageBox | None = None

    def suffix(self) -> str:
        """The chosen file type's suffix (.mp4, .webm, .mov, .png)."""
        return str(self.format.currentData())

    def _show_format(self) -> None:
        """The Format menu follows the path's suffix; the codec menu is for MP4 only."""
        suffix = Path(self.path.text().strip()).suffix.lower()
        i = self.format.findData(suffix)
        if i >= 0 and i != self.format.currentIndex():
            self.format.blockSignals(True)
            self.format.setCurrentIndex(i)
            self.format.blockSignals(False)
        self.codec.setEnabled(self.suffix() == ".mp4")
        self.hw_encode.setEnabled(self.suffix() == ".mp4")

    def _format_chosen(self) -> None:
        """A file type chosen from the menu gives the path its suffix."""
        path = Path(self.path.text().strip())
        self.path.setText(str(path.with_suffix(self.suffix())))
        if self.suffix() not in ALPHA_SUFFIXES and self.background.currentData() == "transparent":
            self.background.setCurrentIndex(self.background.findData("avatar"))

    def _background_chosen(self) -> None:
        """Transparent needs a file type with alpha: MP4 becomes WebM."""
        if self.background.currentData() == "transparent" and self.suffix() not in ALPHA_SUFFIXES:
            self.format.setCurrentIndex(self.format.findData(".webm"))

    def _browse(self) -> None:
        filters = ";;".join(f"{label} (*{suffix})" for suffix, label in FORMATS.items())
        chosen = f"{FORMATS[self.suffix()]} (*{self.suffix()})"
        path, picked = QFileDialog.getSaveFileName(
            self, "Export", self.path.text(), filters, chosen
        )
        if path:
            suffix = picked.rsplit("*", 1)[-1].rstrip(")") if picked else self.suffix()
            self.path.setText(path if Path(path).suffix.lower() in FORMATS else path + suffix)

    def _export(self) -> None:
        target = written_path(Path(self.path.text().strip()).expanduser())
        if target.exists():
            self._ask_overwrite(target)
            return
        self._emit_export()

    def _ask_overwrite(self, target: Path) -> None:
        """Replace ``target``, write beside it under a fresh name, or go back (non-blocking)."""
        chosen = Path(self.path.text().strip()).expanduser()
        fresh = unused_name(chosen)
        while written_path(fresh).exists():  # a PNG sequence's folder is the name to avoid
            fresh = unused_name(fresh)
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Export",
            f"{target.name} already exists in {target.parent}.",
            parent=self,
        )
        box.setInformativeText(f"Replace it, or save the new export as {fresh.name}?")
        replace = box.addButton("Replace", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton(f"Save as {fresh.name}", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)

        def answered(_result: int) -> None:
            clicked = box.clickedButton()
            if clicked is keep:
                self.path.setText(str(fresh))
            if clicked in (keep, replace):
                self._emit_export()

        box.finished.connect(answered)
        self.overwrite_box = box
        box.open()

    def _emit_export(self) -> None:
        self.exportRequested.emit(
            self.path.text().strip(),
            int(self.size.currentData()),
            self.crf.value(),
            str(self.preset.currentData()),
            str(self.fps.currentData()),
            str(self.codec.currentData()),
            str(self.background.currentData()),
            self.hw_encode.isChecked(),
        )

    def _cancel(self) -> None:
        if self.running:
            self.status.setText("Cancelling…")
            self.cancelRequested.emit()

    def started(self) -> None:
        self.running = True
        self._t0 = time.monotonic()
        self.progress.setValue(0)
        self.export_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.close_button.setEnabled(False)
        self.status.setText("Exporting…")

    def set_progress(self, done: int, total: int) -> None:
        if not self.running or total <= 0:
            return
        frac = done / total
        self.progress.setValue(int(100 * frac))
        elapsed = time.monotonic() - self._t0
        if frac > 0.02:
            eta = elapsed * (1 - frac) / frac
            self.status.setText(f"Exporting… {done} of {total} frames, about {eta:.0f} s left")

    def finished(self, message: str, ok: bool) -> None:
        self.running = False
        self.export_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.close_button.setEnabled(True)
        if ok:
            self.progress.setValue(100)
        self.status.setText(message)

    def reject(self) -> None:  # closing while running cancels first
        if self.running:
            self._cancel()
            return
        super().reject()
