"""The control-track key editor under the timeline: the selected key's track, time, value and
interpolation edited in place, a key added at the playhead, the selected key deleted.

It edits nothing itself: every change is a new :class:`~studio.motion.controls.ControlTracks`
sent with ``edited`` (and the key to select after it), so the window can keep it on its undo
stack.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDoubleSpinBox, QGridLayout, QLabel, QPushButton, QWidget

from studio import layout
from studio.gui.widgets.controls import combo_box
from studio.motion.controls import INTERPOLATIONS, TRACKS, ControlTracks, Key

MAX_KEY_TIME_S = 24 * 3600.0

Selection = tuple[str, int] | None


class TrackEditor(QWidget):
    """The selected key, edited in place; Add key (at the playhead) and Delete key."""

    edited = Signal(object, str, object)  # new tracks, what changed, the key selected after
    selected = Signal(object)  # the key selected now (track, number) or None

    def __init__(self, playhead_s: Callable[[], float], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._playhead_s = playhead_s
        self.tracks = ControlTracks()
        self.selection: Selection = None
        self.track = combo_box(((n, n) for n in TRACKS), "the track a new key goes on")
        self.time = QDoubleSpinBox()
        self.time.setRange(0.0, MAX_KEY_TIME_S)
        self.time.setDecimals(2)
        self.time.setSingleStep(1.0 / layout.FPS)
        self.time.setSuffix(" s")
        self.value = QDoubleSpinBox()
        self.value.setDecimals(2)
        self.emotion = combo_box(((e, i) for i, e in enumerate(layout.EMOTIONS)), "emotion")
        self.interp = combo_box(((i, i) for i in INTERPOLATIONS), "how it goes to the next key")
        self.add_button = QPushButton("Add key")
        self.add_button.setToolTip("a key on the track at the playhead, keeping the curve (K)")
        self.delete_button = QPushButton("Delete key")
        self.delete_button.setToolTip("delete the selected key (Delete)")
        self.info = QLabel("")
        grid = QGridLayout(self)  # two short rows: it shares the width with the plots
        grid.setContentsMargins(4, 0, 4, 0)
        grid.setVerticalSpacing(2)
        for col, w in enumerate((QLabel("Keys"), self.track, self.info)):
            grid.addWidget(w, 0, col)
        grid.addWidget(self.add_button, 0, 3)
        grid.addWidget(self.delete_button, 0, 4)
        for col, w in enumerate((self.time, self.value, self.interp), start=1):
            grid.addWidget(w, 1, col)
        grid.addWidget(self.emotion, 1, 2)
        grid.setColumnStretch(5, 1)
        self.add_button.clicked.connect(self.add_key)
        self.delete_button.clicked.connect(self.delete_key)
        self.track.currentIndexChanged.connect(self._track_chosen)
        for box in (self.time, self.value):
            box.editingFinished.connect(self._key_edited)
        for combo in (self.emotion, self.interp):
            combo.activated.connect(self._key_edited)
        self._show()

    # --- what it shows -----------------------------------------------------------------

    def set_tracks(self, tracks: ControlTracks | None, selection: Selection = None) -> None:
        """Show ``tracks`` with key ``selection`` selected (None: none)."""
        self.tracks = tracks or ControlTracks()
        keys = self.tracks.keys(selection[0]) if selection else ()
        self.selection = selection if selection and 0 <= selection[1] < len(keys) else None
        self._show()

    def select(self, name: str, index: int) -> None:
        """Select track ``name``'s key number ``index`` (a click on the timeline)."""
        self.set_tracks(self.tracks, (name, index))
        self.selected.emit(self.selection)

    def _show(self) -> None:
        sel = self.selection
        name = sel[0] if sel else str(self.track.currentData())
        if sel:
            self.track.blockSignals(True)
            self.track.setCurrentIndex(self.track.findData(name))
            self.track.blockSignals(False)
        _, low, high = TRACKS[name]
        self.value.setRange(low, high)
        key = self.tracks.keys(name)[sel[1]] if sel else None
        for w in (self.time, self.value, self.emotion, self.interp):
            w.blockSignals(True)
        if key is not None:
            self.time.setValue(key.t)
            self.value.setValue(key.value)
            self.emotion.setCurrentIndex(int(key.value) if name == "emotion" else 0)
            self.interp.setCurrentIndex(self.interp.findData(key.interp))
        for w in (self.time, self.value, self.emotion, self.interp):
            w.blockSignals(False)
            w.setEnabled(key is not None)
        self.value.setVisible(name != "emotion")
        self.emotion.setVisible(name == "emotion")
        self.delete_button.setEnabled(key is not None)
        count = len(self.tracks.keys(name))
        self.info.setText(f"key {sel[1] + 1} of {count}" if sel else f"{count} keys")

    def _track_chosen(self) -> None:
        self.selection = None
        self._show()
        self.selected.emit(None)

    # --- edits ---------------------------------------------------------------------------

    def add_key(self) -> None:
        """A key on the chosen track at the playhead, with the track's value there."""
        self.add_key_at(self._playhead_s())

    def add_key_at(self, t: float) -> None:
        name = str(self.track.currentData())
        t = max(0.0, round(t * layout.FPS) / layout.FPS)
        key = Key(t, self.tracks.value_at(name, t))
        self._edit(self.tracks.with_key(name, key), f"Add {name} key at {t:.2f} s", name, t)

    def delete_key(self) -> None:
        if self.selection is None:
            return
        name, index = self.selection
        t = self.tracks.keys(name)[index].t
        text = f"Delete {name} key at {t:.2f} s"
        self.edited.emit(self.tracks.without_key(name, index), text, None)

    def move_key(self, name: str, index: int, t: float) -> None:
        """Key ``index`` of ``name`` to ``t`` seconds (a drag on the timeline)."""
        old = self.tracks.keys(name)[index]
        moved = Key(t, old.value, old.interp)
        text = f"Move {name} key to {t:.2f} s"
        self._edit(self.tracks.with_key(name, moved, replace=index), text, name, t)

    def _key_edited(self) -> None:
        if self.selection is None:
            return
        name, index = self.selection
        old = self.tracks.keys(name)[index]
        value = float(self.emotion.currentData()) if name == "emotion" else self.value.value()
        key = Key(round(self.time.value(), 4), value, str(self.interp.currentData()))
        if key == old:
            return
        tracks = self.tracks.with_key(name, key, replace=index)
        self._edit(tracks, f"Edit {name} key at {key.t:.2f} s", name, key.t)

    def _edit(self, tracks: ControlTracks, text: str, name: str, t: float) -> None:
        try:
            index = [k.t for k in tracks.keys(name)].index(t)
        except ValueError:
            index = None
        self.edited.emit(tracks, text, None if index is None else (name, index))
