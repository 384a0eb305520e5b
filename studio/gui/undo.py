"""Undo and redo of the edits a user makes to a clip: its control tracks and its settings.

Each edit is a command on the window's ``QUndoStack`` holding the state before and after it;
undoing puts the earlier state back through the same paths an edit takes (the preview is made
again, the motion model re-runs only where the edit needs it). Steps of one setting in a row
(a spin box's arrows) merge into one command.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QUndoCommand

from studio.settings import RenderSettings

SETTINGS_EDIT = 1  # the merge id of settings edits


class TracksEdit(QUndoCommand):
    """The control tracks from ``before`` to ``after`` (and the selected key with them)."""

    def __init__(
        self, window: Any, before: Any, after: Any, text: str, selection: Any = None
    ) -> None:
        super().__init__(text)
        self.window, self.before, self.after = window, before, after
        self.selection_before = window.timeline.selected
        self.selection_after = selection

    def redo(self) -> None:
        self.window.set_tracks(self.after, self.selection_after)

    def undo(self) -> None:
        self.window.set_tracks(self.before, self.selection_before)


def _changed(a: RenderSettings, b: RenderSettings) -> list[str]:
    da, db = a.model_dump(), b.model_dump()
    return [k for k in da if da[k] != db[k]]


class SettingsEdit(QUndoCommand):
    """The settings from ``before`` to ``after``; made when the edit is already shown, so its
    first redo does nothing."""

    def __init__(self, window: Any, before: RenderSettings, after: RenderSettings) -> None:
        self.keys = _changed(before, after)
        super().__init__(f"Change {', '.join(k.replace('_', ' ') for k in self.keys)}")
        self.window, self.before, self.after = window, before, after
        self._shown = True

    def id(self) -> int:  # noqa: A003 - Qt's name
        return SETTINGS_EDIT

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt's name
        """One command for steps of the same setting in a row."""
        if not isinstance(other, SettingsEdit) or other.keys != self.keys:
            return False
        self.after = other.after
        return True

    def redo(self) -> None:
        if self._shown:
            self._shown = False
            return
        self.window.apply_settings(self.after)

    def undo(self) -> None:
        self.window.apply_settings(self.before)
