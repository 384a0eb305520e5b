"""The frame viewer: a pyqtgraph ImageItem fed numpy frames on the GUI thread."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt

from studio.gui import theme

DIM = 0.35  # brightness of a stand-in frame (one that is not the frame asked for)


class FrameView(pg.GraphicsLayoutWidget):
    """Shows one RGB frame, aspect kept, no mouse interaction; a caption overlays it.

    A frame that does not exist yet (not rendered) is shown as a dimmed stand-in, the nearest
    rendered frame, with a caption that says so: never silently as if it were the real one.
    """

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setBackground(theme.BASE)
        self.view = self.addViewBox(lockAspect=True, invertY=True, enableMouse=False)
        self.view.setMenuEnabled(False)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.view.addItem(self.image)
        self.caption = pg.TextItem("", color=theme.TEXT, anchor=(0.5, 0.5), fill=theme.BASE)
        self.view.addItem(self.caption)
        self.framing = pg.PlotCurveItem(pen=pg.mkPen(theme.PLAYHEAD, width=3))  # show_framing
        self.framing.setVisible(False)
        self.view.addItem(self.framing)
        self.frame: np.ndarray | None = None
        self.standin = False  # whether the frame shown is a dimmed stand-in
        self.setMinimumSize(260, 260)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)

    def show_frame(self, frame: np.ndarray) -> None:
        """Display an HxWx3 uint8 frame (kept by reference)."""
        self._set_image(frame, frame)
        self.standin = False
        self._caption("")

    def show_standin(self, frame: np.ndarray | None, note: str) -> None:
        """Show ``frame`` dimmed (or nothing new) with ``note``: the asked-for frame is missing."""
        if frame is not None:
            dimmed = (frame.astype(np.float32) * DIM).astype(np.uint8)
            self._set_image(frame, dimmed)
        self.standin = True
        self._caption(note)

    def show_framing(self, image: np.ndarray, corners: np.ndarray, note: str) -> None:
        """The avatar ``image`` with the face crop's square (``corners`` [4, 2], image pixels)
        drawn on it and ``note``: where a new framing will crop before it is registered."""
        self._set_image(image, image)
        closed = np.vstack([corners, corners[:1]])
        self.framing.setData(closed[:, 0], closed[:, 1])
        self.framing.setVisible(True)
        self.standin = True
        self._caption(note)
        self.caption.setPos(image.shape[1] / 2, 24)

    def show_message(self, text: str) -> None:
        """A caption in the middle of the view (before the first frame arrives)."""
        self._caption(text)

    def _set_image(self, frame: np.ndarray, shown: np.ndarray) -> None:
        self.framing.setVisible(False)
        first = self.frame is None or self.frame.shape != frame.shape
        self.frame = frame
        self.image.setImage(shown, autoLevels=False, levels=(0, 255))
        if first:
            h, w = frame.shape[:2]
            self.view.setRange(xRange=(0, w), yRange=(0, h), padding=0.01)

    def _caption(self, text: str) -> None:
        self.caption.setText(text)
        self.caption.setVisible(bool(text))  # its fill would show as an empty box
        if self.frame is not None:
            h, w = self.frame.shape[:2]
        else:
            w = h = 512
            self.view.setRange(xRange=(0, w), yRange=(0, h), padding=0.01)
        self.caption.setPos(w / 2, h / 2)
