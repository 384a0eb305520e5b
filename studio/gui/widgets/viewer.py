"""The frame viewer: a pyqtgraph ImageItem fed numpy frames on the GUI thread."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from studio.gui import theme


class FrameView(pg.GraphicsLayoutWidget):
    """Shows one RGB frame, aspect kept, no mouse interaction; a caption overlays it."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground(theme.BASE)
        self.view = self.addViewBox(lockAspect=True, invertY=True, enableMouse=False)
        self.view.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.view.addItem(self.image)
        self.caption = pg.TextItem("", color=theme.MUTED, anchor=(0.5, 0.5))
        self.view.addItem(self.caption)
        self.frame: np.ndarray | None = None
        self.setMinimumSize(260, 260)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)

    def show_frame(self, frame: np.ndarray) -> None:
        """Display an HxWx3 uint8 frame (kept by reference)."""
        first = self.frame is None or self.frame.shape != frame.shape
        self.frame = frame
        self.image.setImage(frame, autoLevels=False, levels=(0, 255))
        if first:
            h, w = frame.shape[:2]
            self.view.setRange(xRange=(0, w), yRange=(0, h), padding=0.01)
        self.caption.setText("")

    def show_message(self, text: str) -> None:
        """A caption in the middle of the view (before the first frame arrives)."""
        self.caption.setText(text)
        if self.frame is not None:
            h, w = self.frame.shape[:2]
        else:
            w = h = 512
            self.view.setRange(xRange=(0, w), yRange=(0, h), padding=0.01)
        self.caption.setPos(w / 2, h / 2)
