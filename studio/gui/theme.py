"""A calm dark palette for Qt and pyqtgraph, and the colours the plots share."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

BACKGROUND = "#1b1e24"
PANEL = "#23272f"
BASE = "#15171c"
TEXT = "#d8dce3"
MUTED = "#8a93a3"
ACCENT = "#5aa9e6"
GRID = "#2e333d"

# Curves: raw / cadence-sampled / smoothed, and per pose channel.
RAW = "#6b7280"
SAMPLED = "#c7a35a"
CHANNELS = {"pitch": "#5aa9e6", "yaw": "#7ccf8a", "roll": "#e08a6f"}
T_CHANNELS = {"t_x": "#b892e6", "t_y": "#e6c35a", "t_z": "#6fd0d0"}
JERK_RAW = "#9aa3b2"
JERK_SMOOTHED = "#5aa9e6"
TRANSITION = "#e0607a"
STRIDE = {1: "#e0607a", 2: "#c7a35a", 3: "#3f7fbf"}
PLAYHEAD = "#f2f2f2"


def apply(app: QApplication) -> None:
    """Fusion style with a dark palette; pyqtgraph in the same colours, row-major images."""
    app.setStyle("Fusion")
    pal = QPalette()
    role = QPalette.ColorRole
    roles_by_colour = {
        PANEL: (role.Window, role.AlternateBase, role.ToolTipBase, role.Button),
        TEXT: (role.WindowText, role.ToolTipText, role.Text, role.ButtonText),
        BASE: (role.Base, role.HighlightedText),
        ACCENT: (role.Highlight,),
        MUTED: (role.PlaceholderText,),
    }
    for colour, roles in roles_by_colour.items():
        for r in roles:
            pal.setColor(r, QColor(colour))
    for r in (role.Text, role.ButtonText, role.WindowText):
        pal.setColor(QPalette.ColorGroup.Disabled, r, QColor("#5c6370"))
    app.setPalette(pal)
    app.setStyleSheet(
        "QGroupBox { font-weight: 600; border: 1px solid #323844; border-radius: 6px;"
        " margin-top: 10px; padding: 8px 6px 6px 6px; }"
        "QGroupBox::title { subcontrol-origin: margin; left: 8px; padding: 0 4px; color: #aab3c2; }"
        "QDockWidget::title { padding: 4px 8px; background: #1f232a; }"
        "QStatusBar { color: #aab3c2; }"
        "QToolBar { spacing: 4px; border: none; }"
    )
    pg.setConfigOptions(
        imageAxisOrder="row-major", background=BACKGROUND, foreground=MUTED, antialias=True
    )
