"""The studio's main window: viewer, transport, timeline, plots, controls, metrics.

The window only holds state and widgets. Work happens on two workers (motion and
render) reached through queued signals; see :mod:`studio.gui.worker`. A toolbar switch picks
the mode: Clip (the clip's preview, plots and playback) or Live (:mod:`studio.gui.live`: audio
animated as it arrives, on a session thread of its own). The motion worker
checks checkpoint folders and builds the Ditto engine; the engine that made a motion result
travels with every render and export request to the render worker.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QImageReader, QKeySequence, QUndoStack
from PySide6.QtWidgets import (
    QCheckBox,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.avatar.crop import crop_corners, crop_geometry
from studio.avatar.folder import AVATAR_META
from studio.avatar.register import CROP_SIZE
from studio.avatar.video import is_video
from studio.errors import StudioError
from studio.export.video import check_alpha_output, check_output_path
from studio.files import unused_name
from studio.gui.batch_window import AVATAR_FILTER, BatchWindow
from studio.gui.compare import CompareBar, HeldTake, compose, difference
from studio.gui.export_dialog import ExportDialog
from studio.gui.live import LiveContext, LivePanel
from studio.gui.notices import NoticeBridge
from studio.gui.playback import Playback
from studio.gui.undo import SettingsEdit, TracksEdit
from studio.gui.widgets.controls import DEFAULT_BACKEND, ControlsPanel
from studio.gui.widgets.metrics import MetricsPanel
from studio.gui.widgets.notice import NoticeBar
from studio.gui.widgets.plots import MotionPlots, Timeline
from studio.gui.widgets.track_editor import TrackEditor
from studio.gui.widgets.viewer import FrameView
from studio.gui.worker import (
    CheckpointCheck,
    EngineInfo,
    ExportJob,
    MotionJob,
    MotionWorker,
    RenderWorker,
    checkpoint_engines,
    default_export_path,
    export_settings,
    start_in_thread,
)
from studio.layout import FPS
from studio.motion.controls import ControlTracks
from studio.render.engines import ENGINES
from studio.render.pipeline import MotionResult, quality_of
from studio.render.project import Project
from studio.settings import MAX_SIZE, RenderSettings, load_preset_tracks

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".mp3", ".aiff", ".aif", ".au", ".caf"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}
AUDIO_FILTER = "Audio (*.wav *.flac *.ogg *.mp3 *.aiff *.au);;All files (*)"
PRESET_FILTER = "Presets (*.json)"
PROJECT_FILTER = "Projects (*.json)"
MAX_RECENT = 8
DEBOUNCE_MS = 60
NEEDS_AVATAR = "Open an avatar first: a face photo or video (File → Open Avatar…)"
CHECKPOINTS_KEY = "checkpoints/folder"
AVATAR_NEEDS_CHECKPOINTS = (
    "The {engine} engine draws its own character, so {name} is not animated. To animate your "
    "photo, set Ditto's checkpoint folder (File → Checkpoints…) and pick the ditto backend."
)
AVATAR_READY = (
    "The {engine} engine draws its own character, so {name} is not animated. The checkpoints "
    "are set: pick the {other} backend to animate your photo."
)

log = logging.getLogger(__name__)


def app_settings() -> QSettings:
    """The studio's QSettings (an INI file under $STUDIO_CONFIG_DIR when that is set)."""
    folder = os.environ.get("STUDIO_CONFIG_DIR")
    if folder:
        return QSettings(str(Path(folder) / "studio.ini"), QSettings.Format.IniFormat)
    return QSettings("talkinghead-studio", "studio")


class MainWindow(QMainWindow):
    """The studio window. ``renderFinished`` fires after each completed preview render."""

    requestMotion = Signal(object)
    requestRender = Signal(int, object, object, object)  # generation, result, settings, engine
    requestExport = Signal(object)
    requestCheck = Signal(str)  # a checkpoint folder to check
    renderFinished = Signal(object)  # stats
    errorShown = Signal(str)
    checkpointsChanged = Signal(bool)  # after a check or a clear: whether ditto is available
    engineChanged = Signal(object)  # EngineInfo of a newly built engine

    def __init__(self, audio: str | None = None, avatar: str | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Talking-head studio")
        self.setAcceptDrops(True)
        self.store = app_settings()
        self.audio_path: str | None = audio
        self.avatar_path: str | None = avatar
        self.generation = 0
        self.result: MotionResult | None = None
        self.tracks: ControlTracks | None = None  # keyed directions of the clip (File menu)
        self.frames: list[np.ndarray | None] = []
        self.old_frames: list[np.ndarray | None] = []  # the previous preview: stand-ins
        self.rendering = False
        self.render_cancelled = False  # the preview stopped short (Ctrl+R renders again)
        self.preview_settings: RenderSettings | None = None  # what ``frames`` were made with
        self.preview_result: MotionResult | None = None
        self.build_stage = ""  # the Ditto engine's build stage, while it is built
        self.last_fps: float | None = None
        self.error_box: QMessageBox | None = None
        self.quit_box: QMessageBox | None = None  # asks before a close stops a running batch
        self._quitting = False  # the user chose to stop the batch and quit
        self.batch_window: BatchWindow | None = None
        self.export_dialog: ExportDialog | None = None
        self.engine = None  # the engine that made ``result`` (None: the demo engine)
        self.engine_info: EngineInfo | None = None  # the Ditto engine built last
        self.last_stats: dict | None = None
        self.checkpoints: str | None = None  # a checked checkpoint folder
        self._checking: str | None = None  # the folder being checked
        self._announce_check = True
        self._restore_backend = DEFAULT_BACKEND
        self.building_engine = False

        self._build_widgets()
        self._build_actions()
        self._start_workers()
        self._restore()
        self._debounce = QTimer(self)
        self._debounce.setSingleShot(True)
        self._debounce.setInterval(DEBOUNCE_MS)
        self._debounce.timeout.connect(self.request_motion)
        self.controls.changed.connect(self._controls_changed)
        if avatar:
            self._set_avatar(avatar, announce=False, rebuild=False)
        remembered = self.store.value(CHECKPOINTS_KEY)
        if isinstance(remembered, str) and remembered:
            self._check_checkpoints(remembered, announce=False)
        self.viewer.show_message("preparing…")
        QTimer.singleShot(0, self.request_motion)

    # --- layout ------------------------------------------------------------------------

    def _build_widgets(self) -> None:
        self.viewer = FrameView()
        self.compare_bar = CompareBar()
        self.compare_bar.hide()
        self.compare_bar.changed.connect(lambda: self._show_frame(self.playback.frame))
        self.compare_bar.closed.connect(lambda: self.set_compare(False))
        self.held: HeldTake | None = None  # take A of an A/B comparison
        self.notice = NoticeBar()
        self.timeline = Timeline()
        self.track_editor = TrackEditor(lambda: self.playback.frame / FPS)
        self.undo_stack = QUndoStack(self)  # track and settings edits
        self._shown_settings: RenderSettings | None = None  # the last edit's (undo's before)
        self._applying = False  # an undo or redo is putting settings back
        self.plots = MotionPlots()
        self.plots.link_to(self.timeline)
        self.controls = ControlsPanel()
        self.metrics = MetricsPanel()
        self.playback = Playback(self)
        self.notices = NoticeBridge(self)
        self.notices.notice.connect(self._show_notice, Qt.ConnectionType.QueuedConnection)

        self.play_button = QToolButton()
        self.play_button.setText("▶  Play")
        self.play_button.setToolTip("Play / pause (Space)")
        self.play_button.clicked.connect(self.playback.toggle)
        self.frame_label = QLabel("frame – / –")
        self.frame_label.setMinimumWidth(180)
        self.loop_box = QCheckBox("Loop")
        self.loop_box.setChecked(True)
        self.loop_box.toggled.connect(lambda on: setattr(self.playback, "loop", on))
        self.curve_boxes = {}
        transport = QHBoxLayout()
        transport.setContentsMargins(6, 2, 6, 2)
        transport.addWidget(self.play_button)
        transport.addWidget(self.frame_label)
        transport.addWidget(self.loop_box)
        transport.addStretch(1)
        curves = QHBoxLayout()
        curves.setContentsMargins(62, 2, 6, 0)
        curves.addWidget(QLabel("Curves:"))
        for family, label in (("raw", "raw"), ("sampled", "cadence"), ("smoothed", "smoothed")):
            box = QCheckBox(label)
            box.setChecked(True)
            box.toggled.connect(lambda on, f=family: self.plots.set_visible(f, on))
            curves.addWidget(box)
            self.curve_boxes[family] = box
        curves.addStretch(1)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.setSpacing(2)
        ll.addWidget(self.notice)
        ll.addWidget(self.compare_bar)
        ll.addWidget(self.viewer, 1)
        ll.addLayout(transport)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(2)
        rl.addLayout(curves)
        rl.addWidget(self.plots, 1)
        rl.addWidget(self.timeline)
        rl.addWidget(self.track_editor)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(left)
        top.addWidget(right)
        top.setStretchFactor(0, 2)
        top.setStretchFactor(1, 3)
        top.setChildrenCollapsible(False)
        self.top_splitter = top
        self.live = LivePanel(self._live_context)
        self.live.failed.connect(self.show_error)
        self.live.message.connect(self.statusBar().showMessage)
        self.modes = QStackedWidget()
        self.modes.addWidget(top)
        self.modes.addWidget(self.live)
        self.setCentralWidget(self.modes)

        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(self.controls)
        sl.addWidget(self.metrics)
        sl.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(side)
        # Wide enough for the panel and its vertical scrollbar: never a horizontal one.
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        bar = scroll.verticalScrollBar().sizeHint().width()
        scroll.setMinimumWidth(side.minimumSizeHint().width() + bar + 2 * scroll.frameWidth())
        self.dock = QDockWidget("Settings", self)
        self.dock.setObjectName("settings_dock")
        self.dock.setWidget(scroll)
        self.dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
        )
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)

        self.status_engine = QLabel()
        self.status_batch = QLabel()  # a batch running, its window closed or not
        self.status_batch.setToolTip("the Batch queue (Ctrl+B shows it)")
        self.status_batch.hide()
        self.progress_bar = QProgressBar()
        self.progress_bar.setMaximumWidth(180)
        self.progress_bar.setMaximumHeight(16)
        self.progress_bar.setTextVisible(False)
        self.progress_bar.hide()
        self.statusBar().addPermanentWidget(self.progress_bar)
        self.statusBar().addPermanentWidget(self.status_batch)
        self.statusBar().addPermanentWidget(self.status_engine)
        self.playback.frameChanged.connect(self._show_frame)
        self.playback.playingChanged.connect(
            lambda on: self.play_button.setText("❚❚  Pause" if on else "▶  Play")
        )
        self.timeline.scrubbed.connect(self.playback.seek)
        self.timeline.keySelected.connect(self.track_editor.select)
        self.timeline.keyMoved.connect(self.track_editor.move_key)
        self.timeline.keyRequested.connect(self.track_editor.add_key_at)
        self.track_editor.selected.connect(
            lambda sel: self.timeline.set_controls(self.tracks, sel)
        )
        self.track_editor.edited.connect(self.edit_tracks)
        self.plots.scrubbed.connect(self.playback.seek)
        self._update_engine_status()

    def _build_actions(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self.act_open_audio = file_menu.addAction("Open &Audio…", self.open_audio_dialog)
        self.act_open_audio.setShortcut(QKeySequence.StandardKey.Open)
        self.act_open_avatar = file_menu.addAction("Open A&vatar…", self.open_avatar_dialog)
        self.recent_menu = file_menu.addMenu("Open &Recent")
        file_menu.addSeparator()
        self.act_checkpoints = file_menu.addAction("&Checkpoints…", self.checkpoints_dialog)
        self.act_checkpoints.setStatusTip(
            "choose Ditto's checkpoint folder (the one holding ditto_pytorch/) to enable the "
            "ditto backend"
        )
        self.act_clear_checkpoints = file_menu.addAction(
            "C&lear Checkpoints", self.clear_checkpoints
        )
        self.act_clear_checkpoints.setEnabled(False)
        file_menu.addSeparator()
        file_menu.addAction("&Load Preset…", self.load_preset_dialog)
        file_menu.addAction("&Save Preset…", self.save_preset_dialog)
        file_menu.addSeparator()
        file_menu.addAction("Open &Project…", self.open_project_dialog)
        file_menu.addAction("Save P&roject…", self.save_project_dialog)
        file_menu.addAction("Load Control &Tracks…", self.load_tracks_dialog)
        self.act_save_tracks = file_menu.addAction(
            "Save Control Trac&ks…", self.save_tracks_dialog
        )
        self.act_clear_tracks = file_menu.addAction("Clear Control Tracks", self.clear_tracks)
        self.act_clear_tracks.setEnabled(False)
        self.act_save_tracks.setEnabled(False)
        file_menu.addSeparator()
        self.act_export = file_menu.addAction("&Export…", self.open_export_dialog)
        self.act_export.setShortcut(QKeySequence("Ctrl+E"))
        self.act_batch = file_menu.addAction("&Batch queue…", self.open_batch_window)
        self.act_batch.setShortcut(QKeySequence("Ctrl+B"))
        file_menu.addSeparator()
        quit_action = file_menu.addAction("&Quit", self.close)
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)

        edit_menu = bar.addMenu("&Edit")
        self.act_undo = self.undo_stack.createUndoAction(self, "&Undo")
        self.act_undo.setShortcut(QKeySequence.StandardKey.Undo)
        self.act_redo = self.undo_stack.createRedoAction(self, "&Redo")
        self.act_redo.setShortcut(QKeySequence.StandardKey.Redo)
        edit_menu.addAction(self.act_undo)
        edit_menu.addAction(self.act_redo)
        edit_menu.addSeparator()
        self.act_add_key = edit_menu.addAction("Add &Key at Playhead", self.track_editor.add_key)
        self.act_add_key.setShortcut(QKeySequence(Qt.Key.Key_K))
        self.act_delete_key = edit_menu.addAction(
            "&Delete Selected Key", self.track_editor.delete_key
        )
        self.act_delete_key.setShortcut(QKeySequence(Qt.Key.Key_Delete))

        view_menu = bar.addMenu("&View")
        self.act_hold = view_menu.addAction("&Hold Preview as A", self.hold_take)
        self.act_hold.setShortcut(QKeySequence("Ctrl+Shift+A"))
        self.act_hold.setStatusTip(
            "keep the preview as take A, then change settings or tracks and compare it with B"
        )
        self.act_compare = view_menu.addAction("Compare &A/B")
        self.act_compare.setCheckable(True)
        self.act_compare.setShortcut(QKeySequence("Ctrl+K"))
        self.act_compare.setEnabled(False)
        self.act_compare.toggled.connect(self.set_compare)

        play_menu = bar.addMenu("&Playback")
        self.clip_actions: list[QAction] = []  # Clip mode's: off in Live mode
        for text, key, slot in (
            ("Play / Pause", Qt.Key.Key_Space, self.playback.toggle),
            ("Previous frame", Qt.Key.Key_Left, lambda: self.playback.step(-1)),
            ("Next frame", Qt.Key.Key_Right, lambda: self.playback.step(1)),
            ("Jump to start", Qt.Key.Key_Home, lambda: self.playback.seek(0)),
        ):
            act = QAction(text, self)
            act.setShortcut(QKeySequence(key))
            act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            act.triggered.connect(slot)
            play_menu.addAction(act)
            self.addAction(act)
            self.clip_actions.append(act)
        self.act_render = play_menu.addAction("&Render preview", self.render_preview)
        self.act_render.setShortcut(QKeySequence("Ctrl+R"))
        self.act_render.setToolTip("Render the preview again (Ctrl+R)")
        self.act_cancel = play_menu.addAction("Cancel render", self.cancel_render)
        self.act_cancel.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.act_inbetweens = play_menu.addAction("Mark &in-between frames")
        self.act_inbetweens.setCheckable(True)
        self.act_inbetweens.setShortcut(QKeySequence("Ctrl+I"))
        self.act_inbetweens.setStatusTip(
            "tint the frames made from their keyframes (not rendered) on the timeline"
        )
        self.act_inbetweens.toggled.connect(self.timeline.show_inbetweens)
        self.clip_actions += [self.act_render, self.act_cancel, self.act_export]
        self.clip_actions.append(self.act_inbetweens)

        tools = self.addToolBar("Main")
        tools.setObjectName("main_toolbar")
        tools.setMovable(False)
        tools.addAction(self.act_open_audio)
        tools.addAction(self.act_open_avatar)
        tools.addSeparator()
        tools.addAction(self.act_render)
        tools.addAction(self.act_cancel)
        tools.addAction(self.act_export)
        tools.addSeparator()
        self.mode_group = QActionGroup(self)
        self.mode_group.setExclusive(True)
        self.mode_actions: dict[str, QAction] = {}
        for mode, text, key, tip in (
            ("clip", "Clip", "Ctrl+1", "Clip mode: preview, plots and export of an audio file"),
            ("live", "Live", "Ctrl+2", "Live mode: animate a microphone or a file as it plays"),
        ):
            act = QAction(text, self)
            act.setCheckable(True)
            act.setShortcut(QKeySequence(key))
            act.setToolTip(f"{tip} ({key})")
            act.triggered.connect(lambda _=False, m=mode: self.set_mode(m))
            self.mode_group.addAction(act)
            tools.addAction(act)
            self.mode_actions[mode] = act
        self.mode_actions["clip"].setChecked(True)
        self._rebuild_recent()

    def _start_workers(self) -> None:
        self.motion_worker = MotionWorker()
        self.render_worker = RenderWorker()
        self.motion_thread = start_in_thread(self.motion_worker, "studio-motion")
        self.render_thread = start_in_thread(self.render_worker, "studio-render")
        self.requestMotion.connect(self.motion_worker.compute)
        self.requestRender.connect(self.render_worker.render)
        self.requestExport.connect(self.render_worker.export)
        self.requestCheck.connect(self.motion_worker.check)
        # Worker -> window: always queued, so every slot runs on the GUI thread.
        queued = Qt.ConnectionType.QueuedConnection
        for signal, slot in (
            (self.motion_worker.audioLoaded, self._audio_loaded),
            (self.motion_worker.motionReady, self._motion_ready),
            (self.motion_worker.failed, self._failed),
            (self.motion_worker.engineProgress, self._engine_progress),
            (self.motion_worker.motionProgress, self._motion_progress),
            (self.motion_worker.engineReady, self._engine_ready),
            (self.motion_worker.engineFailed, self._engine_failed),
            (self.motion_worker.engineCancelled, self._engine_cancelled),
            (self.motion_worker.checkpointsChecked, self._checkpoints_checked),
            (self.render_worker.framesReady, self._frames_ready),
            (self.render_worker.progress, self._progress),
            (self.render_worker.renderDone, self._render_done),
            (self.render_worker.cancelled, self._cancelled),
            (self.render_worker.failed, self._failed),
            (self.render_worker.exportDone, self._export_done),
        ):
            signal.connect(slot, queued)

    # --- persistence --------------------------------------------------------------------

    def _restore(self) -> None:
        geo = self.store.value("window/geometry")
        if isinstance(geo, QByteArray) and not geo.isEmpty():
            self.restoreGeometry(geo)
        else:
            self.resize(1600, 1000)
        state = self.store.value("window/state")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.restoreState(state)
        saved = self.store.value("settings/last")
        if isinstance(saved, str) and saved:
            try:
                settings = RenderSettings.from_dict(json.loads(saved))
            except (StudioError, ValueError):
                return  # an unreadable old value: start from the defaults
            # Ditto is not available before the remembered checkpoints are checked: start on
            # demo and switch once they are (and an avatar is open).
            self._restore_backend = settings.backend
            self.controls.set_settings(settings)

    def _save(self) -> None:
        self.store.setValue("window/geometry", self.saveGeometry())
        self.store.setValue("window/state", self.saveState())
        try:
            self.store.setValue("settings/last", json.dumps(self.controls.settings().to_dict()))
        except StudioError:
            pass
        self.store.sync()

    def _recent(self) -> list[str]:
        value = self.store.value("files/recent", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _add_recent(self, path: str) -> None:
        items = [p for p in self._recent() if p != path]
        self.store.setValue("files/recent", [path, *items][:MAX_RECENT])
        self._rebuild_recent()

    def _rebuild_recent(self) -> None:
        self.recent_menu.clear()
        for path in self._recent():
            self.recent_menu.addAction(path, lambda p=path: self.open_path(p))
        self.recent_menu.setEnabled(bool(self._recent()))

    # --- requests -------------------------------------------------------------------------

    def current_settings(self) -> RenderSettings:
        return self.controls.settings()

    def _next_generation(self) -> int:
        self.generation += 1
        gen = self.generation
        self.motion_worker.cancellation.cancel_upto(gen - 1)
        self.render_worker.cancellation.cancel_upto(gen - 1)
        return gen

    def request_motion(self) -> None:
        """(Re)compute motion for the current audio and settings; rendering follows."""
        try:
            settings = self.current_settings()
        except StudioError as e:
            self.show_error(str(e))
            return
        self._shown_settings = settings  # a preset or project shown: edits start from it
        gen = self._next_generation()
        self.statusBar().showMessage("computing motion…")
        self._show_busy()
        self.requestMotion.emit(
            MotionJob(
                gen, self.audio_path, settings, self.checkpoints, self.avatar_path, self.tracks
            )
        )

    def request_render(self) -> None:
        """Re-render the preview of the current motion (e.g. after a size change)."""
        if self.result is None:
            return
        gen = self._next_generation()
        self._start_render(gen, self.result)

    def render_preview(self) -> None:
        """Playback → Render preview (Ctrl+R): render again, e.g. after a cancel."""
        if self.result is None:
            self.request_motion()
        else:
            self.request_render()

    def _start_render(self, gen: int, result: MotionResult) -> None:
        try:
            settings = self.current_settings()
        except StudioError as e:
            self.show_error(str(e))
            return
        if any(f is not None for f in self.frames):
            self.old_frames = self.frames
        if len(self.old_frames) != result.num_frames:
            self.old_frames = []
        self.frames = [None] * result.num_frames
        self.preview_settings, self.preview_result = settings, result
        self.rendering = True
        self.render_cancelled = False
        self.metrics.set_preview(f"rendering… 0 of {result.num_frames} frames", stale=True)
        self.statusBar().showMessage("rendering preview…")
        self.requestRender.emit(gen, result, settings, self.engine)
        self._show_frame(self.playback.frame)

    def cancel_render(self) -> None:
        """Stop the preview render and a Ditto engine build (Esc); rendered frames stay."""
        self.render_worker.cancellation.cancel_upto(self.generation)
        self.motion_worker.cancellation.cancel_upto(self.generation)
        self.motion_worker.build_cancellation.cancel_upto(self.generation)

    def apply_settings(self, settings: RenderSettings) -> None:
        """Show ``settings`` and make the preview from them (an undo or redo)."""
        backend = self.current_settings().backend != settings.backend
        self._applying = True
        try:
            self.controls.set_settings(settings)
            self._shown_settings = settings
            self._controls_changed("backend" if backend else "settings")
        finally:
            self._applying = False

    def _record_settings(self) -> None:
        """An edit in the settings panel: onto the undo stack (from the settings shown)."""
        try:
            now = self.current_settings()
        except StudioError:
            return
        before, self._shown_settings = self._shown_settings, now
        if before is not None and before != now:
            self.undo_stack.push(SettingsEdit(self, before, now))

    def _controls_changed(self, kind: str) -> None:
        if not self._applying:
            self._record_settings()
        # Stop the outdated preview at once: it would compete with the new motion for the CPU.
        self.render_worker.cancellation.cancel_upto(self.generation)
        if kind == "backend":
            self._backend_changed()
        elif kind == "output":
            self.request_render()
        else:
            self.show_framing()
            self._debounce.start()

    def show_framing(self) -> bool:
        """A changed crop framing drawn on the avatar at once, before the avatar is
        registered again with it (from the landmarks of its last registration)."""
        avatar = getattr(self.engine, "avatar", None)
        landmarks = getattr(avatar, "lmk203", None)
        shown = self.preview_settings
        s = self.current_settings()
        framing = (s.crop_scale, s.crop_vx, s.crop_vy)
        if landmarks is None or shown is None:
            return False
        if framing == (shown.crop_scale, shown.crop_vx, shown.crop_vy):
            return False
        geo = crop_geometry(landmarks, CROP_SIZE, s.crop_scale, s.crop_vy, True, s.crop_vx)
        note = (
            f"framing: scale {s.crop_scale:g}, x {s.crop_vx:+g}, y {s.crop_vy:+g}: "
            "registering the avatar with it…"
        )
        self.viewer.show_framing(np.asarray(avatar.image), crop_corners(geo), note)
        return True

    def _backend_changed(self) -> None:
        self._debounce.stop()
        # The engine being built is for the other backend now.
        self.motion_worker.build_cancellation.cancel_upto(self.generation)
        caps = self.controls.capabilities()
        if caps.needs_checkpoints and not self.checkpoints:
            self.controls.set_backend(DEFAULT_BACKEND)
            self.show_error("Set the checkpoint folder first (File → Checkpoints…).")
            return
        if caps.takes_avatar and not self.avatar_path:
            self.controls.set_backend(DEFAULT_BACKEND)
            self.statusBar().showMessage(NEEDS_AVATAR, 10000)
            self.show_error(NEEDS_AVATAR)
            return
        self._update_engine_status()
        self.request_motion()

    # --- worker results --------------------------------------------------------------------

    def _audio_loaded(self, gen: int, audio) -> None:
        if gen != self.generation:
            return
        self.timeline.set_audio(audio.samples, 16000)
        self.playback.set_source(audio.path, audio.num_frames)
        if len(self.frames) != audio.num_frames:  # another clip: nothing shown belongs to it
            self.frames, self.old_frames = [], []

    def _motion_ready(self, gen: int, result: MotionResult, engine=None) -> None:
        if gen != self.generation:
            return
        self.result = result
        self.engine = engine
        self._building(False)
        self.plots.set_result(result)
        self.timeline.set_plan(result.plan.strides, result.plan.keyframes)
        self.metrics.set_result(result)
        self.metrics.set_quality(self._quality(result, engine), result.plan.warp_forced)
        self._start_render(gen, result)

    def _quality(self, result: MotionResult, engine) -> dict | None:
        """The clip's quality metrics (about a millisecond); None where they cannot be had (no
        engine, or one that cannot say its keypoints): the panel shows dashes, the preview
        goes on."""
        if engine is None:
            return None
        try:
            return quality_of(result, engine)
        except Exception:  # noqa: BLE001 - a metric must never stop the preview
            log.warning("quality metrics failed; the panel shows dashes", exc_info=True)
            return None

    def _frames_ready(self, gen: int, start: int, frames: list[np.ndarray]) -> None:
        if gen != self.generation or start + len(frames) > len(self.frames):
            return
        self.frames[start : start + len(frames)] = frames
        if start <= self.playback.frame < start + len(frames) or self.viewer.standin:
            self._show_frame(self.playback.frame)  # the playhead's frame, or a nearer stand-in

    def _progress(self, gen: int, stage: str, done: int, total: int) -> None:
        if stage == "export" and self.export_dialog is not None:
            self.export_dialog.set_progress(done, total)
        elif gen == self.generation:
            note = ""
            if done == 0 and self.controls.settings().compile:
                note = " (the first render with compile builds the networks: about a minute)"
            self.statusBar().showMessage(f"rendering preview… {done}/{total}{note}")
            self.metrics.set_preview(f"rendering… {done} of {total} frames", stale=True)
            self._show_progress(done, total)

    def _show_progress(self, done: int, total: int) -> None:
        """A bar of ``done`` of ``total``; a busy bar where nothing is counted or the count is
        complete while work goes on (a full bar would look finished)."""
        if total <= 0 or done >= total:
            self._show_busy()
            return
        self.progress_bar.setRange(0, total)
        self.progress_bar.setValue(done)
        self.progress_bar.show()

    def _show_busy(self) -> None:
        self.progress_bar.setRange(0, 0)
        self.progress_bar.show()

    # --- the Ditto engine ------------------------------------------------------------------

    def _building(self, on: bool) -> None:
        if not on:
            self.build_stage = ""
        if self.building_engine != on:
            self.building_engine = on
            self._update_engine_status()

    def _engine_progress(self, gen: int, stage: str, done: int, total: int) -> None:
        if gen != self.generation:
            return
        self.build_stage = stage if total <= 1 else f"{stage} {done}/{total}"
        self._building(True)
        self._update_engine_status()
        self.statusBar().showMessage(f"starting the Ditto engine: {stage}… (Esc cancels)")
        self._show_progress(done, total)

    def _motion_progress(self, gen: int, stage: str, done: int, total: int) -> None:
        """The engine computing motion (HuBERT features, LMDM windows) for this request."""
        if gen != self.generation:
            return
        count = f" {done}/{total}" if total > 1 else ""
        self.statusBar().showMessage(f"computing motion: {stage}{count}… (Esc cancels)")
        self._show_progress(done, total)

    def _engine_ready(self, gen: int, info: EngineInfo) -> None:
        self.engine_info = info
        self._building(False)
        self.notice.hide()  # the photo is animated now
        notes = f" ({'; '.join(info.notes)})" if info.notes else ""
        label = self.controls.capabilities(info.backend).label
        self.statusBar().showMessage(
            f"{label} engine ready on {info.device}: {info.description}{notes}", 10000
        )
        self.engineChanged.emit(info)

    def _engine_failed(self, gen: int, message: str, details: str) -> None:
        if gen != self.generation:
            return
        self._back_to_default(message, details)

    def _engine_cancelled(self, gen: int) -> None:
        if gen != self.generation:
            return
        label = self.controls.capabilities().label
        self._back_to_default("", "")
        self.statusBar().showMessage(
            f"opening the {label} engine was cancelled; on {DEFAULT_BACKEND}", 8000
        )

    def _back_to_default(self, message: str, details: str) -> None:
        """Fall back to the default engine (after a failed or cancelled build); keep going."""
        self._building(False)
        self.progress_bar.hide()
        self.controls.set_backend(DEFAULT_BACKEND)
        self._update_engine_status()
        if message:
            self.show_error(message, details)
        self.request_motion()

    # --- checkpoints -------------------------------------------------------------------------

    def checkpoints_dialog(self) -> None:
        """File → Checkpoints…: pick the folder holding ditto_pytorch/."""
        start = self.checkpoints or str(Path.home())
        path = QFileDialog.getExistingDirectory(self, "Ditto checkpoint folder", start)
        if path:
            self.set_checkpoints(path)

    def set_checkpoints(self, path: str) -> None:
        """Check ``path`` on the motion worker; a valid folder enables ditto and is remembered.

        ``checkpointsChanged`` fires when the check is done; a folder with missing files shows
        them (name and stage) in the error dialog and changes nothing.
        """
        self._check_checkpoints(str(Path(path).expanduser()), announce=True)

    def _check_checkpoints(self, path: str, announce: bool) -> None:
        self._checking = path
        self._announce_check = announce
        self.statusBar().showMessage(f"checking the checkpoints in {path}…")
        self.requestCheck.emit(path)

    def _checkpoints_checked(self, check: CheckpointCheck) -> None:
        if check.requested != self._checking:
            return  # an older request, or cleared meanwhile
        announce, self._checking = self._announce_check, None
        self.controls.set_cuda_available(check.cuda)
        if check.runtimes:
            self.controls.set_runtimes(check.runtimes)
        if not check.ok:
            if announce:
                self.statusBar().showMessage("checkpoints not set: files are missing", 8000)
                self.show_error(check.message, check.details)
            else:  # the remembered folder went bad: say so where the engine is chosen
                for name in checkpoint_engines():
                    self.controls.set_engine_available(
                        name, False, f"checkpoints unusable: {check.message}"
                    )
                self.statusBar().showMessage(f"checkpoints unusable: {check.message}", 15000)
            self.checkpointsChanged.emit(self.checkpoints is not None)
            return
        changed = check.path != self.checkpoints
        self.checkpoints = check.path
        self.store.setValue(CHECKPOINTS_KEY, check.path)
        self.act_clear_checkpoints.setEnabled(True)
        engines = checkpoint_engines()
        for name in engines:
            self.controls.set_engine_available(name, True)
        if announce:
            labels = ", ".join(self.controls.capabilities(n).label for n in engines)
            self.statusBar().showMessage(
                f"checkpoints set: {check.path}; available: {labels}", 10000
            )
        self.checkpointsChanged.emit(True)
        caps = self.controls.capabilities()
        if caps.needs_checkpoints:
            if changed:  # other networks: reopen the engine
                self.motion_worker.build_cancellation.cancel_upto(self.generation)
                self.request_motion()
        elif self._restore_backend in engines:
            wanted, self._restore_backend = self._restore_backend, DEFAULT_BACKEND
            if not self.controls.capabilities(wanted).takes_avatar or self.avatar_path:
                self.controls.set_backend(wanted, emit=True)

    def clear_checkpoints(self) -> None:
        """File → Clear Checkpoints: forget the folder; the engines that need it go away."""
        was_on_it = self.controls.capabilities().needs_checkpoints
        self.checkpoints = None
        self._checking = None
        self.store.remove(CHECKPOINTS_KEY)
        self.act_clear_checkpoints.setEnabled(False)
        for name in checkpoint_engines():
            self.controls.set_engine_available(name, False)
        self.checkpointsChanged.emit(False)
        self.statusBar().showMessage(
            "checkpoints cleared; the engines that need them are off", 8000
        )
        if was_on_it:
            self.motion_worker.build_cancellation.cancel_upto(self.generation)
            self._update_engine_status()
            self.request_motion()

    def _render_done(self, gen: int, stats: dict) -> None:
        if gen != self.generation:
            return
        self.rendering = False
        self.last_fps = stats["fps"]
        self.last_stats = stats
        self.old_frames = []
        self.progress_bar.hide()
        self.metrics.set_render_stats(stats)
        self._update_engine_status()
        self.statusBar().showMessage(
            f"preview ready: {stats['frames']} frames, {stats['rendered_frames']} rendered, "
            f"{stats['fps']:.1f} fps",
            8000,
        )
        self._describe_compare()
        self._show_frame(self.playback.frame)
        self.renderFinished.emit(stats)

    def _cancelled(self, gen: int) -> None:
        if gen == RenderWorker.EXPORT_GENERATION:
            if self.export_dialog is not None:
                self.export_dialog.finished("Export cancelled; nothing was written.", ok=False)
            return
        if gen == self.generation:
            self.rendering = False
            self.render_cancelled = True
            self.progress_bar.hide()
            done = sum(f is not None for f in self.frames)
            self.metrics.set_preview(
                f"cancelled: {done} of {len(self.frames)} frames rendered; Ctrl+R renders again",
                stale=True,
            )
            self.statusBar().showMessage(
                "render cancelled; Render preview (Ctrl+R) renders the rest", 8000
            )
            self._show_frame(self.playback.frame)

    def _failed(self, gen: int, message: str, details: str) -> None:
        if gen == RenderWorker.EXPORT_GENERATION:
            if self.export_dialog is not None:
                self.export_dialog.finished(f"Export failed: {message}", ok=False)
            self.show_error(message, details)
            return
        if gen != self.generation:
            return
        self.rendering = False
        self.progress_bar.hide()
        self._building(False)
        self.statusBar().showMessage("failed", 5000)
        self.show_error(message, details)

    def _export_done(self, path: str, report: dict) -> None:
        self._add_recent_export(path)
        reused = report.get("reused_frames", 0)
        note = f"; {reused} preview frames reused" if reused else ""
        if self.export_dialog is not None:
            self.export_dialog.finished(
                f"Wrote {report.get('output', path)} ({report['frames']} frames, "
                f"{report['render_fps']:.1f} fps{note}).",
                ok=True,
            )
        self.statusBar().showMessage(f"exported {path}", 8000)

    def _add_recent_export(self, path: str) -> None:
        self.store.setValue("files/last_export", path)

    # --- display ------------------------------------------------------------------------------

    def _set_frame_label(self, index: int) -> None:
        n = len(self.frames)
        kind = "   in-between" if self.timeline.is_inbetween(index) else ""
        self.frame_label.setText(f"frame {index + 1} / {n}   {index / FPS:6.2f} s{kind}")

    # --- A/B comparison -----------------------------------------------------------------------

    def hold_take(self) -> bool:
        """Keep the preview as take A (its frames, settings and tracks) and compare it with
        the preview as it becomes (B)."""
        if not self.frames or all(f is None for f in self.frames) or self.result is None:
            self.show_error("Nothing to hold yet: wait for the preview to render.")
            return False
        settings = self.preview_settings or self.current_settings()
        self.held = HeldTake(tuple(self.frames), settings, self.result.controls)
        self.act_compare.setEnabled(True)
        if self.act_compare.isChecked():
            self.set_compare(True)
        else:
            self.act_compare.setChecked(True)
        return True

    def set_compare(self, on: bool) -> None:
        """Show take A beside (or split with) the preview, or the preview alone."""
        on = bool(on) and self.held is not None
        if self.act_compare.isChecked() != on:
            self.act_compare.setChecked(on)
            return
        self.compare_bar.setVisible(on)
        self._describe_compare()
        self._show_frame(self.playback.frame)

    @property
    def comparing(self) -> bool:
        return self.held is not None and self.act_compare.isChecked()

    def _describe_compare(self) -> None:
        if self.held is None or self.result is None:
            return
        now = self.preview_settings or self.current_settings()
        text = difference(self.held.settings, self.held.tracks, now, self.result.controls)
        self.compare_bar.describe(text)

    def _show_frame(self, index: int) -> None:
        """Show frame ``index`` (the playhead's) and say which it is; a frame not rendered yet
        is a dimmed stand-in with a caption saying why. Comparing, take A's frame is shown
        beside it or split with it."""
        self.timeline.set_frame(index)
        self.plots.set_frame(index)
        if not self.frames:
            return
        index = min(index, len(self.frames) - 1)
        self._set_frame_label(index)
        frame = self.frames[index]
        if frame is not None:
            held = self.held.frame(index) if self.comparing else None  # type: ignore[union-attr]
            if held is not None:
                bar = self.compare_bar
                frame = compose(held, frame, bar.layout_mode, bar.split_at)
            self.viewer.show_frame(frame)
            return
        if self.rendering:
            note = f"frame {index + 1} is not rendered yet: rendering…"
        elif self.render_cancelled:
            note = f"frame {index + 1} was not rendered (cancelled)\nRender preview: Ctrl+R"
        else:
            note = f"frame {index + 1} is not rendered"
        self.viewer.show_standin(self._standin(index), note)

    def _standin(self, index: int) -> np.ndarray | None:
        """What to show dimmed for a missing frame: the previous preview's frame there, else
        the nearest rendered frame before it."""
        if index < len(self.old_frames) and self.old_frames[index] is not None:
            return self.old_frames[index]
        for i in range(index, -1, -1):
            if self.frames[i] is not None:
                return self.frames[i]
        return None

    def _update_engine_status(self) -> None:
        """Backend, device and precision of the last render (what really ran)."""
        st = self.last_stats or {"backend": DEFAULT_BACKEND, "device": "CPU", "precision": "fp32"}
        fps = f"{self.last_fps:.1f} fps" if self.last_fps else "– fps"
        audio = "" if not self.playback.silent else f"  ·  {self.playback.silent_reason}"
        memory = f"  ·  memory {st['memory']}" if st.get("memory") else ""
        runtime = f"  ·  runtime {st['runtime']}" if st.get("runtime") else ""
        wanted = self.controls.backend_name()
        pending = ""
        if self.building_engine:
            stage = f": {self.build_stage}" if self.build_stage else ""
            label = self.controls.capabilities().label
            pending = f"  ·  starting the {label} engine{stage}…"
        elif wanted != st["backend"]:
            pending = f"  ·  switching to {wanted}…"
        self.status_engine.setText(
            f"backend {st['backend']}  ·  device {st['device']}  ·  precision {st['precision']}"
            f"{runtime}{memory}  ·  last render {fps}{audio}{pending}"
        )

    def _show_notice(self, text: str) -> None:
        """A notice from the engines (a large cache about to be written): the status bar."""
        self.statusBar().showMessage(text, 20000)

    def show_error(self, message: str, details: str = "") -> None:
        """A dialog with a one-line explanation and a details section; non-blocking."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Studio", message.splitlines()[0], parent=self)
        extra = details.strip() or message.strip()
        if extra != message.splitlines()[0].strip():  # only when there is more to show
            box.setDetailedText(extra)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.error_box = box
        self.errorShown.emit(message)

    # --- files ----------------------------------------------------------------------------------

    def open_audio(self, path: str) -> None:
        self.audio_path = path
        self._add_recent(path)
        self.setWindowTitle(f"Talking-head studio — {Path(path).name}")
        self.request_motion()

    def _set_avatar(self, path: str, announce: bool = True, rebuild: bool = True) -> bool:
        """Use the image (or registered avatar folder) ``path``; an engine that animates it is
        reopened on it, and on one that draws its own character a notice says how to animate
        the photo."""
        p = Path(path)
        if p.is_dir():
            if not (p / AVATAR_META).exists():
                self.show_error(
                    f"{p} is not a registered avatar folder (no {AVATAR_META}); "
                    "choose an image or a folder the studio registered."
                )
                return False
        elif not QImageReader(str(p)).canRead() and not is_video(p):
            self.show_error(
                f"Cannot read {p.name} as an image or a video; use a PNG, JPEG, BMP or WebP "
                "photo, or an MP4, MOV, WebM or MKV video of the face."
            )
            return False
        self.avatar_path = str(p)
        self._add_recent(str(p))
        caps, current = self.controls.capabilities(), self.controls.backend_name()
        if announce:
            animator = next((n for n in ENGINES if self.controls.capabilities(n).takes_avatar), "")
            if caps.takes_avatar:
                self.notice.hide()
                self.statusBar().showMessage(
                    f"avatar {p.name} set; registering it for the {caps.label} engine", 10000
                )
            elif animator and self.controls.engine_available(animator):
                label = self.controls.capabilities(animator).label
                self.notice.show_notice(
                    AVATAR_READY.format(name=p.name, engine=current, other=label),
                    f"Use {label}",
                    lambda: self.controls.set_backend(animator, emit=True),
                )
            elif animator:
                self.notice.show_notice(
                    AVATAR_NEEDS_CHECKPOINTS.format(name=p.name, engine=current),
                    "Checkpoints…",
                    self.checkpoints_dialog,
                )
        if caps.takes_avatar and rebuild:
            self.motion_worker.build_cancellation.cancel_upto(self.generation)
            self.request_motion()
        return True

    def open_path(self, path: str) -> None:
        """Open a dropped or recent file: audio by suffix, otherwise an avatar (a photo, a
        video of a face or a registered avatar folder)."""
        p = Path(path)
        if p.suffix.lower() in AUDIO_SUFFIXES:
            self.open_audio(str(p))
        elif p.is_dir() or p.suffix.lower() in IMAGE_SUFFIXES or is_video(p):
            self._set_avatar(str(p))
        else:
            self.show_error(
                f"{p.name}: not an audio file, an image or a video the studio can open."
            )

    def _ask_open(self, title: str, filters: str) -> str:
        """A file the user picks to open, starting in the home folder ("" when cancelled)."""
        path, _ = QFileDialog.getOpenFileName(self, title, str(Path.home()), filters)
        return path

    def _ask_save(self, title: str, filters: str) -> str:
        """A JSON file the user names to save, starting in the home folder, ``.json`` added
        when missing ("" when cancelled)."""
        path, _ = QFileDialog.getSaveFileName(self, title, str(Path.home()), filters)
        return path if not path or path.endswith(".json") else path + ".json"

    def open_audio_dialog(self) -> None:
        path = self._ask_open("Open audio", AUDIO_FILTER)
        if path:
            self.open_audio(path)

    def open_avatar_dialog(self) -> None:
        path = self._ask_open("Open avatar", AVATAR_FILTER)
        if path:
            self._set_avatar(path)

    def load_preset_dialog(self) -> None:
        path = self._ask_open("Load preset", PRESET_FILTER)
        if path:
            self.load_preset(path)

    def load_preset(self, path: str) -> None:
        """The preset's settings, and its control tracks when it carries them."""
        try:
            settings = RenderSettings.load(path)
            tracks = load_preset_tracks(path)
        except StudioError as e:
            self.show_error(str(e))
            return
        self.controls.set_settings(settings)
        if tracks is not None:
            self.edit_tracks(tracks, f"Load the tracks of preset {Path(path).name}")
        else:
            self.request_motion()

    def save_preset_dialog(self) -> None:
        path = self._ask_save("Save preset", PRESET_FILTER)
        if path:
            self.save_preset(path)

    def save_preset(self, path: str) -> None:
        try:
            self.controls.settings().save(path, self.tracks)
        except (OSError, StudioError) as e:
            self.show_error(f"Cannot save the preset to {path}: {e}")

    # --- control tracks and projects -------------------------------------------------------

    def set_tracks(
        self, tracks: ControlTracks | None, selection: tuple[str, int] | None = None
    ) -> None:
        """Direct the clip with ``tracks`` (None: none): keys on the timeline (``selection``
        the selected one), the motion post-processed again (the motion model runs again
        only for an emotion edit)."""
        self.tracks = tracks if tracks else None
        self.track_editor.set_tracks(self.tracks, selection)
        self.timeline.set_controls(self.tracks, self.track_editor.selection)
        self.act_clear_tracks.setEnabled(self.tracks is not None)
        self.act_save_tracks.setEnabled(self.tracks is not None)
        self.request_motion()

    def edit_tracks(
        self, tracks: ControlTracks | None, text: str, selection: tuple[str, int] | None = None
    ) -> None:
        """Change the tracks as an undoable edit (``text`` names it in Edit → Undo)."""
        self.undo_stack.push(TracksEdit(self, self.tracks, tracks or None, text, selection))

    def clear_tracks(self) -> None:
        self.edit_tracks(None, "Clear control tracks")

    def load_tracks_dialog(self) -> None:
        path = self._ask_open("Load control tracks", PRESET_FILTER)
        if path:
            self.load_tracks(path)

    def load_tracks(self, path: str) -> None:
        try:
            tracks = ControlTracks.load(path)
        except StudioError as e:
            self.show_error(str(e))
            return
        self.edit_tracks(tracks, f"Load control tracks {Path(path).name}")

    def save_tracks_dialog(self) -> None:
        path = self._ask_save("Save control tracks", PRESET_FILTER)
        if path:
            self.save_tracks(path)

    def save_tracks(self, path: str) -> None:
        """The tracks as a file `studio render --controls` reads."""
        try:
            (self.tracks or ControlTracks()).save(path)
        except (OSError, StudioError) as e:
            self.show_error(f"Cannot save the control tracks to {path}: {e}")
            return
        self.statusBar().showMessage(f"control tracks saved to {path}", 5000)

    def open_project_dialog(self) -> None:
        path = self._ask_open("Open project", PROJECT_FILTER)
        if path:
            self.open_project(path)

    def open_project(self, path: str) -> None:
        """The project's audio, avatar, settings and tracks, as they were saved."""
        try:
            project = Project.load(path)
        except StudioError as e:
            self.show_error(str(e))
            return
        self.controls.set_settings(project.settings)
        if project.avatar:
            self._set_avatar(project.avatar, announce=False, rebuild=False)
        if project.audio:
            self.audio_path = project.audio
            self.setWindowTitle(f"Talking-head studio — {Path(project.audio).name}")
        self._add_recent(path)
        self.set_tracks(project.controls)

    def save_project_dialog(self) -> None:
        path = self._ask_save("Save project", PROJECT_FILTER)
        if path:
            self.save_project(path)

    def save_project(self, path: str) -> None:
        try:
            Project(
                self.audio_path,
                self.avatar_path,
                self.controls.settings(),
                self.tracks or ControlTracks(),
            ).save(path)
        except (OSError, StudioError) as e:
            self.show_error(f"Cannot save the project to {path}: {e}")
            return
        self.statusBar().showMessage(f"project saved to {path}", 5000)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt API
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt API
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.open_path(url.toLocalFile())

    # --- export --------------------------------------------------------------------------------

    def export_frame_hw(self) -> tuple[int, int] | None:
        """The frame size (h, w) an export will have when the Size choice does not set it
        (Ditto's full frames are the avatar image's size)."""
        if self.engine is None:
            return None
        s = self.current_settings()
        w, h = self.engine.frame_size(s)
        other = s.replace(size=s.size + 2 if s.size + 2 <= MAX_SIZE else s.size - 2)
        return None if self.engine.frame_size(other) != (w, h) else (h, w)

    def open_export_dialog(self) -> ExportDialog:
        s = self.current_settings()
        last = self.store.value("files/last_export")
        path = str(last) if last else default_export_path(self.audio_path)
        path = str(unused_name(path))  # never suggest the file the last export wrote
        dlg = ExportDialog(
            path,
            s.size,
            s.crf,
            self,
            full_frame_hw=self.export_frame_hw(),
            preset=s.preset,
            fps=s.fps,
            codec=s.codec,
            background=s.background,
            hw_encode=s.hw_encode,
        )
        dlg.exportRequested.connect(self.export)
        dlg.cancelRequested.connect(self.render_worker.cancel_export)
        self.export_dialog = dlg
        dlg.open()
        return dlg

    def export(
        self,
        path: str,
        size: int,
        crf: int,
        preset: str | None = None,
        fps: str | None = None,
        codec: str | None = None,
        background: str | None = None,
        hw_encode: bool | None = None,
    ) -> None:
        """Export the current motion to ``path`` with the preview's settings (and the dialog's
        size, quality, encoder speed, frame rate, codec, background and hardware encoding)."""
        if self.result is None:
            self.show_error("Nothing to export yet: wait for the motion to be computed.")
            return
        try:
            target = check_output_path(path)
            settings = export_settings(
                self.current_settings(), size, crf, preset, fps, codec, background, hw_encode
            )
            check_alpha_output(target, settings.background == "transparent")
            ran = self.engine.name if self.engine is not None else DEFAULT_BACKEND
            if ran != settings.backend:
                raise StudioError(
                    f"Nothing to export with the {settings.backend} backend yet: the preview "
                    f"is still from the {ran} engine; wait for it to switch."
                )
        except StudioError as e:
            if self.export_dialog is not None:
                self.export_dialog.finished(str(e), ok=False)
            self.show_error(str(e))
            return
        if self.export_dialog is not None:
            self.export_dialog.started()
        known = self.preview_frames_for(settings)
        self.requestExport.emit(
            ExportJob(self.result, settings, str(target), self.engine, known=known)
        )

    def preview_frames_for(self, settings: RenderSettings) -> tuple | None:
        """The preview's frames (None where missing) when they are what an export with
        ``settings`` would render: the same motion, and settings that differ at most in what
        only the encoder reads (quality, speed, codec) or what the renderer ignores."""
        p = self.preview_settings
        if p is None or self.preview_result is not self.result:
            return None
        encoder = ("crf", "preset", "codec", "hw_encode")  # what only the encoder reads
        if settings.replace(size=p.size, **{k: getattr(p, k) for k in encoder}) != p:
            return None
        if self.engine is None or self.engine.renderer_key(settings) != self.engine.renderer_key(p):
            return None
        frames = tuple(self.frames)
        return frames if any(f is not None for f in frames) else None

    # --- modes ----------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The central area's mode: "clip" or "live"."""
        return "live" if self.modes.currentWidget() is self.live else "clip"

    def set_mode(self, mode: str) -> None:
        """Show Clip or Live mode. Live pauses the clip's playback (and turns its shortcuts
        off); going back to Clip stops a live session."""
        if mode not in self.mode_actions:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode_actions[mode].setChecked(True)
        if mode == self.mode:
            return
        live = mode == "live"
        if live:
            self.playback.pause()
        else:
            self.live.stop()
        for act in self.clip_actions:
            act.setEnabled(not live)
        self.modes.setCurrentWidget(self.live if live else self.top_splitter)

    def _live_context(self) -> LiveContext:
        """What a live session starts from: the current settings, and the engine that made
        the clip's motion when it is of the chosen backend (reused, not opened again)."""
        settings = self.current_settings()
        engine = self.engine if getattr(self.engine, "name", None) == settings.backend else None
        return LiveContext(settings, engine, self.checkpoints, self.avatar_path, self.audio_path)

    def open_batch_window(self) -> BatchWindow:
        """Open (or raise) the one Batch queue window, its defaults this window's current
        settings, checkpoints and avatar."""
        if self.batch_window is None:
            self.batch_window = BatchWindow(parent=self)
            for signal in (
                self.batch_window.batchStarted,
                self.batch_window.jobFinished,
                self.batch_window.batchFinished,
            ):
                signal.connect(self._show_batch)
        self.batch_window.set_defaults(self.controls.settings(), self.checkpoints, self.avatar_path)
        self.batch_window.show()
        self.batch_window.raise_()
        self.batch_window.activateWindow()
        return self.batch_window

    def _show_batch(self, *_args: object) -> None:
        """The status bar's word on the batch: clips left while it runs, then how it ended."""
        w = self.batch_window
        if w is None:
            return
        if w.running:
            left = w.left()
            self.status_batch.setText(f"Batch: {left} clip{'s' * (left != 1)} to go")
        else:
            self.status_batch.setText(f"Batch {w.outcome or 'ended'}")
            self.statusBar().showMessage(f"Batch queue: {w.summary.text()}", 20000)
        self.status_batch.setVisible(w.running)

    # --- shutdown --------------------------------------------------------------------------------

    def _ask_to_stop_the_batch(self) -> None:
        """Quit only if the user agrees to stop the running batch (non-blocking)."""
        assert self.batch_window is not None
        left = self.batch_window.left()
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Studio",
            f"A batch is running: {left} clip{'s' * (left != 1)} to go.",
            parent=self,
        )
        box.setInformativeText(
            "Quitting stops it: the clip being rendered is not kept. Finished videos stay, "
            "and Run in the Batch queue goes on from where it stopped."
        )
        stop = box.addButton("Stop the batch and quit", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton("Keep it running", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)

        def answered(_result: int) -> None:
            if box.clickedButton() is stop:
                self._quitting = True
                self.close()

        box.finished.connect(answered)
        self.quit_box = box
        box.open()

    def close_without_asking(self) -> None:
        """Close, stopping a running batch without the question (a signal to the process)."""
        self._quitting = True
        self.close()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        batch = self.batch_window
        if batch is not None and batch.running and not self._quitting:
            event.ignore()
            self._ask_to_stop_the_batch()
            return
        if batch is not None:
            batch.shutdown()
            batch.hide()
        self.live.shutdown()
        self._save()
        self.notices.detach()
        self.playback.pause()
        self.render_worker.cancel_export()
        self.motion_worker.cancellation.cancel_upto(1 << 62)
        self.render_worker.cancellation.cancel_upto(1 << 62)
        for thread in (self.motion_thread, self.render_thread):
            thread.quit()
            thread.wait(5000)
        super().closeEvent(event)
