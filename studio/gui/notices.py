"""The studio's notices (``logging`` under ``studio.*``, INFO and above) as a Qt signal.

Compute code logs what a user should know before a long or large step ("exporting
warp_network to ONNX for ONNX Runtime (≈ 182 MB, once)") and never prints; the CLI shows
those lines on stderr (:func:`studio.progress.show_notices`), the window in its status bar
through this bridge. Records may come from any thread: the signal is queued to the GUI.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QObject, Signal


class NoticeBridge(QObject):
    """Emits ``notice(message)`` for every INFO+ record of the ``studio`` loggers while
    attached."""

    notice = Signal(str)

    def __init__(self, parent: QObject | None = None, logger: str = "studio") -> None:
        super().__init__(parent)
        self._log = logging.getLogger(logger)
        self._level = self._log.level
        bridge = self

        class _Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    bridge.notice.emit(record.getMessage())
                except Exception:  # noqa: BLE001 - logging must never break the work
                    self.handleError(record)

        self._handler = _Handler(logging.INFO)
        self._log.addHandler(self._handler)
        if self._log.level == logging.NOTSET or self._log.level > logging.INFO:
            self._log.setLevel(logging.INFO)

    def detach(self) -> None:
        """Stop forwarding (the window is closing); the logger's level comes back."""
        self._log.removeHandler(self._handler)
        self._log.setLevel(self._level)
