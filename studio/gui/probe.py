"""What Qt offers here, for `studio doctor`: importable without Qt (it then says why not).

It also holds the logging rules that quiet QtMultimedia's start-up chatter, for every place
that loads QtMultimedia (the window's playback, this probe).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

# QtMultimedia's start-up chatter: the PipeWire/VA-API library probes and FFmpeg's info lines
# ("Couldn't load pipewire-0.3 library", "Input #0, wav, ..."). Warnings still show, and a
# user's QT_LOGGING_RULES wins over these.
QUIET_MULTIMEDIA = (
    "qt.multimedia.symbolsresolver=false\n"
    "qt.multimedia.ffmpeg*.info=false\n"
    "qt.multimedia.ffmpeg*.debug=false"
)


def qt_report() -> dict[str, Any]:
    """PySide6 and Qt versions, the platform plugins and whether QtMultimedia is there; or
    ``{"available": False, "reason": ...}``."""
    try:
        import PySide6
        from PySide6 import QtCore
    except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
        return {"available": False, "reason": str(e)}
    QtCore.QLoggingCategory.setFilterRules(QUIET_MULTIMEDIA)
    plugin_dir = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms"
    plugins = (
        sorted(p.name.removeprefix("libq").split(".")[0] for p in plugin_dir.glob("libq*.so*"))
        if plugin_dir.is_dir()
        else []
    )
    try:
        multimedia = importlib.util.find_spec("PySide6.QtMultimedia") is not None
    except (ImportError, ValueError):
        multimedia = False
    return {
        "available": True,
        "pyside6": PySide6.__version__,
        "qt": QtCore.qVersion(),
        "platform_plugins": plugins,
        "multimedia": multimedia,
    }
