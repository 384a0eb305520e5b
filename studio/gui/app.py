"""`studio gui`: create the application, open the window, optionally take a screenshot."""

from __future__ import annotations

import sys
from pathlib import Path

SCREENSHOT_TIMEOUT_MS = 180_000


def run(
    audio: str | None = None,
    avatar: str | None = None,
    screenshot: str | None = None,
    size: tuple[int, int] | None = None,
) -> int:
    """Run the studio; with ``screenshot``, save the window after the first render and exit."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from studio.gui import theme
    from studio.gui.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Talking-head studio")
    app.setOrganizationName("talkinghead-studio")
    theme.apply(app)
    window = MainWindow(audio=audio, avatar=avatar)
    if size is not None:
        window.resize(*size)
    window.show()
    status = {"code": 0}
    if screenshot:
        target = Path(screenshot)

        def shoot(_stats=None) -> None:
            QTimer.singleShot(300, lambda: _save(window, target, status, app))

        def fail(message: str) -> None:
            print(f"studio gui: error: {message}", file=sys.stderr)
            status["code"] = 2
            app.quit()

        window.renderFinished.connect(shoot)
        window.errorShown.connect(fail)
        QTimer.singleShot(SCREENSHOT_TIMEOUT_MS, lambda: fail("no render finished in time"))
    app.exec()
    return status["code"]


def _save(window, target: Path, status: dict, app) -> None:
    image = window.grab()
    if not image.save(str(target)):
        print(f"studio gui: error: cannot write the screenshot {target}", file=sys.stderr)
        status["code"] = 2
    window.close()
    app.quit()
