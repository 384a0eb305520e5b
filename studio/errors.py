"""User-facing errors: one clear sentence naming the file or option and what to do."""

from __future__ import annotations


class StudioError(Exception):
    """An error caused by the user's input or environment, shown without a traceback."""


class InputError(StudioError):
    """A bad input file (audio, avatar, preset): the message names the file."""


class OptionError(StudioError):
    """An invalid option value: the message names the option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


class OutputError(StudioError):
    """The output cannot be written where the user asked."""


class Cancelled(Exception):
    """Raised inside a long job when the user cancels it."""
