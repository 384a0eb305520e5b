"""`studio gui`: create the application, open the window, optionally take a screenshot.

Ctrl-C in the terminal (SIGINT), SIGTERM and SIGHUP close the window and quit with one line
and status 130; an ignored signal (``nohup``) stays ignored. Python runs its signal handlers
only when the interpreter gets control, so a timer lets it in a few times a second while Qt's
loop runs. An unexpected exception in the window's code (a slot, an event) opens the error
dialog, with its traceback in a log file under the cache's ``logs/`` (one line on stderr says
where), and the window stays usable. With ``--screenshot``, an error dialog up at any time
makes the command fail (status 2) instead of saving the picture.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

SCREENSHOT_TIMEOUT_MS = 180_000
SIGNAL_POLL_MS = 200  # how often Python gets the chance to run a signal handler
EXIT_ERROR, EXIT_CANCELLED = 2, 130


def run(
    audio: str | None = None,
    avatar: str | None = None,
    screenshot: str | None = None,
    size: tuple[int, int] | None = None,
) -> int:
    """Run the studio; with ``screenshot``, save the window after the first render and exit."""
    from PySide6.QtWidgets import QApplication

    from studio.gui import theme
    from studio.gui.window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Talking-head studio")
    app.setOrganizationName("talkinghead-studio")
    theme.apply(app)
    made: dict[str, MainWindow] = {}
    restore_hook = install_excepthook(lambda: made.get("window"))
    status = {"code": 0}
    # before the window is made: its making may run Qt's events (a timer, a slot), and a
    # signal handled there must not be lost to a loop that has not started yet
    restore_signals = quit_on_signals(lambda: made.get("window"), app, status)
    try:
        window = made["window"] = MainWindow(audio=audio, avatar=avatar)
        if size is not None:
            window.resize(*size)
        window.show()
        if screenshot:
            _screenshot_after_render(window, Path(screenshot), status, app)
        if status.get("stopping"):  # interrupted while the window was being made
            window.close()
        else:
            app.exec()
    finally:
        restore_signals()
        restore_hook()
    return status["code"]


def _screenshot_after_render(window: Any, target: Path, status: dict, app: Any) -> None:
    """Save ``window`` to ``target`` once its first render finishes, then quit; an error
    dialog, or no render in time, fails instead (one line, ``status["code"]`` 2)."""
    from PySide6.QtCore import QTimer

    def fail(message: str) -> None:
        if status["code"] == 0:
            print(f"studio gui: error: {message.splitlines()[0]}", file=sys.stderr)
            status["code"] = EXIT_ERROR
        app.quit()

    def shoot(_stats: object = None) -> None:
        QTimer.singleShot(300, lambda: _save(window, target, status, app, fail))

    def fail_if_shown() -> None:  # a dialog opened while the window was being made
        message = error_shown(window)
        if message:
            fail(message)

    window.renderFinished.connect(shoot)
    window.errorShown.connect(fail)
    QTimer.singleShot(0, fail_if_shown)
    QTimer.singleShot(SCREENSHOT_TIMEOUT_MS, lambda: fail("no render finished in time"))


def error_shown(window: Any) -> str | None:
    """The text of the error dialog the window shows now, else None."""
    box = getattr(window, "error_box", None)
    if box is None or not box.isVisible():
        return None
    return box.text() or "an error dialog is open"


def _save(window: Any, target: Path, status: dict, app: Any, fail: Callable[[str], None]) -> None:
    message = error_shown(window)
    if message:  # a render finished, but something else went wrong: not a success
        fail(message)
        return
    image = window.grab()
    if not image.save(str(target)):
        fail(f"cannot write the screenshot {target}")
        return
    window.close()
    app.quit()


def quit_on_signals(window: Callable[[], Any], app: Any, status: dict) -> Callable[[], None]:
    """From now on: SIGINT, SIGTERM and SIGHUP (unless ignored) close ``window()`` (when it is
    made; without asking about a running batch), quit ``app`` and set ``status["stopping"]``
    and ``status["code"]`` to 130, with one line on stderr (a caller that has not started Qt's
    loop yet checks ``stopping`` instead of starting it). Returns the undo (the previous
    handlers back, the timer stopped)."""
    import contextlib
    import threading

    from PySide6.QtCore import QTimer

    from studio.signals import handled

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def stop(_signum: int, _frame: object) -> None:
        if status.get("stopping"):
            return
        status["stopping"] = True
        status["code"] = EXIT_CANCELLED
        print("\nstudio gui: interrupted; closing the window", file=sys.stderr)
        made = window()
        if made is not None:
            made.close_without_asking()  # a signal is the answer: a running batch stops
        app.quit()

    stack = contextlib.ExitStack()
    stack.enter_context(handled(stop))  # an inherited ignore (nohup): respected
    timer = QTimer()
    timer.timeout.connect(lambda: None)  # Python runs, and with it any pending handler
    timer.start(SIGNAL_POLL_MS)

    def restore() -> None:
        timer.stop()
        stack.close()

    return restore


def install_excepthook(window: Callable[[], Any]) -> Callable[[], None]:
    """``sys.excepthook`` for the GUI: an unexpected exception (raised in a slot or an event
    handler, which Qt reports through the hook) gets its traceback written to a log file, one
    line on stderr, and the error dialog of ``window()`` (when it exists by then); the app
    goes on. Returns the undo."""
    before = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt | SystemExit):
            from PySide6.QtWidgets import QApplication

            QApplication.quit()
            return
        text = "".join(traceback.format_exception(kind, value, tb))
        where = _write_log(text)
        first = (str(value).strip().splitlines() or [""])[0][:200]
        what = f"{kind.__name__}: {first}" if first else kind.__name__
        print(f"studio gui: internal error: {what} — {where}", file=sys.stderr)
        w = window()  # None while the window is not made yet
        if w is not None:
            w.show_error(
                f"Something went wrong inside the studio ({what}); it keeps running. "
                f"The details are in the log file.",
                f"{text}\n{where}",
            )

    sys.excepthook = hook
    return lambda: setattr(sys, "excepthook", before)


def _write_log(text: str) -> str:
    """``text`` in a new log file of the cache's ``logs/``: where, or why not."""
    from studio.paths import write_log

    try:
        return f"details in {write_log('studio-gui-error', text)}"
    except OSError as e:
        return f"no log file could be written ({e.strerror or e})"
