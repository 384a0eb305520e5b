"""A notice bar above the viewer: a sentence the user must not miss, an action, a close button."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton


class NoticeBar(QFrame):
    """Hidden until :meth:`show_notice`; stays until closed or replaced (unlike a status
    message, which fades after seconds)."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("notice")
        self.setStyleSheet(
            "#notice { background: #2d3a4d; border: 1px solid #4a6488; border-radius: 4px; }"
            "#notice QLabel { color: #e6ecf5; }"
        )
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.action = QPushButton()
        self.action.hide()
        close = QToolButton()
        close.setText("✕")
        close.setToolTip("Dismiss")
        close.setAutoRaise(True)
        close.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 4, 4, 4)
        row.addWidget(self.label, 1)
        row.addWidget(self.action)
        row.addWidget(close)
        self._slot: Callable[[], None] | None = None
        self.action.clicked.connect(self._act)
        self.hide()

    def show_notice(
        self, text: str, action: str = "", slot: Callable[[], None] | None = None
    ) -> None:
        """Show ``text``; with ``action`` and ``slot`` a button that runs ``slot``."""
        self.label.setText(text)
        self._slot = slot
        self.action.setText(action)
        self.action.setVisible(bool(action and slot))
        self.show()

    def text(self) -> str:
        return "" if self.isHidden() else self.label.text()

    def _act(self) -> None:
        if self._slot is not None:
            self._slot()
