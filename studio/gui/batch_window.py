"""The Batch queue window: many clips rendered by the batch code of ``studio batch``.

A row is one clip: its audio, avatar, preset and output name. Run turns the rows into
:class:`~studio.batch.jobs.Job` objects (a row's settings: its preset, else the main window's
settings at the time the window was opened or raised) and hands them to
:func:`studio.batch.run.run_batch` on a worker thread, so everything the CLI does holds here:
one warm engine per avatar, a failed clip recorded and the batch going on, and the state file
in the output folder that makes a rerun skip finished clips (shown as "skipped"). Stop cancels
the running clip; finished videos are kept. Errors are one line in the window, never a
traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QRect, Qt, QThread, QUrl, Signal, Slot
from PySide6.QtGui import QColor, QDesktopServices, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.batch.jobs import (
    AUDIO_SUFFIXES,
    Job,
    audio_files,
    check_outputs,
    with_output_type,
)
from studio.batch.run import (
    REPORT_FILE,
    EngineOptions,
    JobOptionError,
    audio_seconds,
    check_engines,
    one_line,
    pace,
    run_batch,
)
from studio.errors import Cancelled, StudioError
from studio.export.video import ALPHA_SUFFIXES, written_path
from studio.gui import theme
from studio.gui.worker import start_in_thread
from studio.render.engines import capabilities
from studio.settings import RenderSettings

AUDIO_FILTER = "Audio (" + " ".join(f"*{s}" for s in AUDIO_SUFFIXES) + ");;All files (*)"
AVATAR_FILTER = (
    "Faces: photos and videos (*.png *.jpg *.jpeg *.bmp *.webp *.mp4 *.mov *.m4v *.webm *.mkv "
    "*.avi);;All files (*)"
)
PRESET_FILTER = "Presets (*.json)"
COLUMNS = ("Audio", "Avatar", "Preset", "Output", "Status", "Progress", "Time", "Error")
AUDIO, AVATAR, PRESET, OUTPUT, STATUS, PROGRESS, TIME, ERROR = range(len(COLUMNS))
WIDTHS = (180, 100, 110, 170, 160, 110, 100)  # the Error column takes the rest
STATUS_COLOURS = {
    "running": theme.ACCENT,
    "writing": theme.ACCENT,  # rendered; its file is finished beside the next clip's render
    "done": "#7ccf8a",
    "failed": theme.TRANSITION,
    "skipped": theme.MUTED,
    "stopped": theme.SAMPLED,
}
OPENABLE = ("done", "skipped")  # rows whose MP4 is in the output folder
ACTIVE = ("running", "writing")  # rows the batch is working on
EMPTY_HINT = "No clips yet: Add files…, Add folder…, or drop audio files or a folder here"
NO_AVATAR_ON_DEMO = (
    "{row}: the demo engine draws its own face and takes no avatar. Choose Avatar → No avatar "
    "for it, or set Ditto's checkpoint folder in the main window (File → Checkpoints…) and "
    "pick the ditto backend."
)
NEEDS_AN_AVATAR = "{row}: the {engine} engine animates a face: choose Avatar → Choose an avatar…"


@dataclass
class QueueRow:
    """One clip of the queue and how it went in the last run."""

    audio: str
    avatar: str | None
    preset: str | None  # a preset file; None: the window's base settings
    name: str  # the MP4's file name in the output folder, unique in the queue
    status: str = "queued"  # queued, running, writing, done, skipped, failed, stopped
    note: str = ""  # the status's detail ("failed before, not retried", a build stage)
    progress: float = 0.0  # the running clip's rendered fraction, 0..1
    error: str = ""
    time: str = ""  # "2.1 s · 0.5x" once done
    record: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        """Back to queued: what the last run said of it no longer holds."""
        self.status, self.note, self.progress, self.error, self.time = "queued", "", 0.0, "", ""
        self.record = {}


def unique_name(name: str, taken: Iterable[str]) -> str:
    """``name`` as an output file name (its own type where the batch writes it, else
    ``.mp4`` added), or ``stem_2.mp4``, ``stem_3.mp4``… where taken."""
    name = with_output_type(Path(name.strip()).name.strip() or "clip.mp4")
    stem, suffix = name[: -len(Path(name).suffix)], Path(name).suffix
    used = {t.lower() for t in taken}
    n, candidate = 2, name
    while candidate.lower() in used:
        candidate, n = f"{stem}_{n}{suffix}", n + 1
    return candidate


@dataclass(frozen=True)
class BatchRequest:
    """What a run needs: the jobs, the output folder, how engines open, retry or not."""

    jobs: tuple[Job, ...]
    out_dir: str
    options: EngineOptions
    retry_failed: bool = False


class BatchWorker(QObject):
    """Runs one batch (:func:`~studio.batch.run.run_batch`) on its thread; reports by signals.

    ``cancel`` (a threading.Event, set from the GUI) stops the running clip at its next frame
    batch, or an engine being opened at its next step.
    """

    requested = Signal(object)  # BatchRequest: emitted from the GUI, runs here
    planned = Signal(object)  # {job name: seconds of speech}
    jobStarted = Signal(str)  # job name
    progress = Signal(str, int, int)  # stage, done, total (of the running job)
    jobDone = Signal(object)  # the job's record (run_batch's on_job)
    line = Signal(str)  # a progress line ("[2/3] b.mp4: done, …")
    batchDone = Signal(str, str, object)  # outcome (done|stopped|error), message, report|None

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__()
        self.cancel = cancel
        self.requested.connect(self.run)

    def _progress(self, stage: str, done: int, total: int) -> None:
        if self.cancel.is_set():
            raise Cancelled()
        self.progress.emit(stage, done, total)

    @Slot(object)
    def run(self, request: BatchRequest) -> None:
        """Run the batch; ``batchDone`` last, whatever happens."""
        try:
            self.planned.emit({job.name: audio_seconds(job) for job in request.jobs})
            report = run_batch(
                request.jobs,
                request.out_dir,
                request.options,
                request.retry_failed,
                progress=self._progress,
                say=self.line.emit,
                cancel=self.cancel.is_set,
                on_start=lambda job: self.jobStarted.emit(job.name),
                on_job=self.jobDone.emit,
            )
        except Cancelled:
            self.batchDone.emit("stopped", "", None)
        except StudioError as e:
            self.batchDone.emit("error", one_line(e), None)
        except Exception as e:  # noqa: BLE001 - one line in the window, the app goes on
            self.batchDone.emit("error", f"The batch stopped: {one_line(e)}", None)
        else:
            self.batchDone.emit("done", "", report)


class ProgressDelegate(QStyledItemDelegate):
    """Paints the Progress column's value (0..100 in UserRole) as a progress bar."""

    def paint(self, painter, option: QStyleOptionViewItem, index) -> None:
        value = index.data(Qt.ItemDataRole.UserRole)
        if value is None:
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        bar.rect = QRect(option.rect.adjusted(4, 4, -4, -4))
        bar.minimum, bar.maximum, bar.progress = 0, 100, int(value)
        bar.text, bar.textVisible = f"{int(value)}%", True
        bar.textAlignment = Qt.AlignmentFlag.AlignCenter
        bar.state = QStyle.StateFlag.State_Enabled | QStyle.StateFlag.State_Horizontal
        bar.palette = option.palette
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)


class BatchWindow(QWidget):
    """The Batch queue: rows of clips, Run/Stop, per-clip status and progress, a summary.

    ``settings``: the settings of rows without a preset; ``checkpoints``: the engines'
    checkpoint folder; ``avatar``: the avatar of rows added from now on. With a ``parent``
    (the main window) it is a window of its own that hides on close (a running batch goes on);
    the parent stops it (:meth:`shutdown`) when it closes, after asking (:meth:`left`).
    """

    batchStarted = Signal()
    jobStarted = Signal(str)  # job name
    jobFinished = Signal(object)  # the job's record
    batchFinished = Signal(str)  # outcome: done, stopped or error

    def __init__(
        self,
        settings: RenderSettings | None = None,
        checkpoints: str | None = None,
        avatar: str | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Batch queue")
        self.setAcceptDrops(True)
        self.resize(1200, 540)
        self.base_settings = settings or RenderSettings()
        self.checkpoints = checkpoints
        self.avatar = avatar
        self.preset: str | None = None  # the preset of rows added from now on
        self.rows: list[QueueRow] = []
        self.outcome = ""  # how the last run ended: done, stopped, error
        self.report: dict[str, Any] | None = None
        self._index: dict[str, int] = {}  # job name -> row, while running
        self._running_name: str | None = None
        self._ran_in: str | None = None  # the output folder of the last run
        self._seconds: dict[str, float] = {}
        self._started = 0.0
        self._cancel = threading.Event()
        self._worker: BatchWorker | None = None
        self._thread: QThread | None = None
        self._ended: QThread | None = None
        self._build()
        self._update()

    # --- layout --------------------------------------------------------------------------

    def _button(self, text: str, slot, tip: str) -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        b.clicked.connect(slot)
        return b

    def _menu_button(self, text: str, tip: str, *actions: tuple[str, Any]) -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        menu = QMenu(b)
        for label, slot in actions:
            menu.addAction(label, slot)
        b.setMenu(menu)
        return b

    def _build(self) -> None:
        self.add_files_button = self._button(
            "Add &files…", self.add_files_dialog, "add audio files, one clip each"
        )
        self.add_folder_button = self._button(
            "Add f&older…", self.add_folder_dialog, "add every audio file of a folder"
        )
        self.avatar_button = self._menu_button(
            "&Avatar",
            "the avatar of the selected rows (none: of every row)",
            ("Choose an avatar…", self.avatar_dialog),
            ("No avatar (the engine's own face)", lambda: self.set_avatar(None)),
        )
        self.preset_button = self._menu_button(
            "&Preset",
            "the settings of the selected rows (none: of every row)",
            ("Choose a preset file…", self.preset_dialog),
            ("Use the main window's settings", lambda: self.set_preset(None)),
        )
        self.remove_button = self._button(
            "&Remove", self.remove_selected, "remove the selected rows (Delete)"
        )
        top = QHBoxLayout()
        for b in (
            self.add_files_button,
            self.add_folder_button,
            self.avatar_button,
            self.preset_button,
            self.remove_button,
        ):
            top.addWidget(b)
        top.addStretch(1)
        self.defaults_label = _squeezable(QLabel())
        self.defaults_label.setStyleSheet(f"color: {theme.MUTED}")
        self.defaults_label.setIndent(12)  # after the buttons; a narrow window cuts its end
        top.addWidget(self.defaults_label, 1)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.table.verticalHeader().setVisible(False)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # names differ at their ends
        header = self.table.horizontalHeader()
        for col, width in enumerate(WIDTHS):
            self.table.setColumnWidth(col, width)
        header.setStretchLastSection(True)
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.table.setItemDelegateForColumn(PROGRESS, ProgressDelegate(self.table))
        self.table.itemChanged.connect(self._item_changed)
        self.table.cellDoubleClicked.connect(self._double_clicked)
        self.table.itemSelectionChanged.connect(self._update)

        self.out_dir = QLineEdit()
        self.out_dir.setPlaceholderText("the folder the MP4s, the report and the state go to")
        self.out_dir.textChanged.connect(self._update)
        self.out_dir.editingFinished.connect(self._out_dir_edited)
        self.browse_button = self._button("Browse…", self.output_dialog, "choose the output folder")
        self.open_folder_button = self._button(
            "Open output folder", self.open_output_folder, "show the output folder"
        )
        out = QHBoxLayout()
        out.addWidget(QLabel("Output folder:"))
        out.addWidget(self.out_dir, 1)
        out.addWidget(self.browse_button)
        out.addWidget(self.open_folder_button)

        self.retry_failed = QCheckBox("Retry failed")
        self.retry_failed.setToolTip(
            "run again the clips that failed last time (otherwise a rerun skips them as it "
            "skips finished ones)"
        )
        self.run_button = self._button("R&un", self.run, "render every clip not done yet")
        self.stop_button = self._button(
            "&Stop", self.stop, "stop after the running clip's next frames; finished videos stay"
        )
        self.summary = _squeezable(QLabel())
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        run_row = QHBoxLayout()
        run_row.addWidget(self.summary, 1)
        run_row.addWidget(self.retry_failed)
        run_row.addWidget(self.run_button)
        run_row.addWidget(self.stop_button)

        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setStyleSheet(f"color: {theme.TRANSITION}")
        self.message.hide()
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(2000)
        self.log.setMinimumHeight(40)
        self.log.setMaximumHeight(90)
        self.log.setPlaceholderText("the batch's progress lines")

        below = QWidget()  # the folder, Run and the log: a short window shrinks the queue first
        lower = QVBoxLayout(below)
        lower.setContentsMargins(0, 0, 0, 0)
        lower.addLayout(out)
        lower.addLayout(run_row)
        lower.addWidget(self.message)
        lower.addWidget(self.log)
        rows = 3 * self.table.verticalHeader().defaultSectionSize()  # three rows stay seen
        self.table.setMinimumHeight(rows + 2 * self.table.horizontalHeader().sizeHint().height())
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table)
        split.addWidget(below)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 0)
        split.setChildrenCollapsible(False)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        remove = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.table)
        remove.setContext(Qt.ShortcutContext.WidgetShortcut)
        remove.activated.connect(self.remove_selected)

    # --- the queue -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a batch is running now."""
        return self._thread is not None

    def set_defaults(
        self, settings: RenderSettings, checkpoints: str | None, avatar: str | None
    ) -> None:
        """The main window's current settings, checkpoints and avatar (for rows added or run
        from now on; rows keep an avatar or preset given here)."""
        self.base_settings, self.checkpoints = settings, checkpoints
        self.avatar = avatar or self.avatar
        self._update()

    def add_files(self, paths: Iterable[str | Path]) -> int:
        """Add a row per audio file (output: its stem, ``.mp4``, made unique); how many."""
        if self._busy():
            return 0
        added = 0
        for p in paths:
            path = Path(p)
            name = unique_name(path.stem + ".mp4", (r.name for r in self.rows))
            self.rows.append(QueueRow(str(path), self.avatar, self.preset, name))
            added += 1
            if not self.out_dir.text().strip():
                self.out_dir.setText(str(path.parent / "batch_out"))
        if added:
            self._changed(())
        return added

    def add_folder(self, folder: str | Path) -> int:
        """Add every audio file of ``folder`` (a message when there is none); how many."""
        files = audio_files(folder)
        if not files:
            self.show_message(
                f"{folder}: no audio files in the folder ({', '.join(AUDIO_SUFFIXES)})"
            )
            return 0
        return self.add_files(files)

    def selected_rows(self) -> list[int]:
        """The selected rows' indexes, in order."""
        return sorted({i.row() for i in self.table.selectionModel().selectedRows()})

    def _targets(self, rows: Iterable[int] | None) -> list[int]:
        """``rows``, else the selected rows, else every row."""
        chosen = list(rows) if rows is not None else self.selected_rows()
        return chosen or list(range(len(self.rows)))

    def set_avatar(self, path: str | None, rows: Iterable[int] | None = None) -> None:
        """The avatar of ``rows`` (default: the selected ones, or all when none is selected);
        with nothing selected also of the rows added from now on."""
        if self._busy():
            return
        if rows is None and not self.selected_rows():
            self.avatar = path
        targets = self._targets(rows)
        for i in targets:
            self.rows[i].avatar = path
        self._changed(targets)

    def set_preset(self, path: str | None, rows: Iterable[int] | None = None) -> bool:
        """The preset file of ``rows`` (as :meth:`set_avatar`; None: the base settings);
        False with a message when the file is not a preset."""
        if self._busy():
            return False
        if path is not None:
            try:
                RenderSettings.load(path)
            except StudioError as e:
                self.show_message(one_line(e))
                return False
        if rows is None and not self.selected_rows():
            self.preset = path
        targets = self._targets(rows)
        for i in targets:
            self.rows[i].preset = path
        self._changed(targets)
        return True

    def remove_rows(self, rows: Iterable[int]) -> None:
        """Remove these rows from the queue (their videos stay on disk)."""
        if self._busy():
            return
        gone = set(rows)
        self.rows = [r for i, r in enumerate(self.rows) if i not in gone]
        self._changed(())

    def remove_selected(self) -> None:
        self.remove_rows(self.selected_rows())

    def set_output_dir(self, path: str | Path) -> None:
        self.out_dir.setText(str(path))
        self._out_dir_edited()

    def _changed(self, rows: Iterable[int]) -> None:
        """The queue was changed (``rows``: those whose clip is now another): the last run's
        outcome and those rows' results no longer hold, nor does an earlier message."""
        for i in rows:
            self.rows[i].reset()
        self.outcome, self.report = "", None
        self.show_message("")
        self._show_table()

    def _out_dir_edited(self) -> None:
        """Another output folder than the last run's (once typed, or chosen): no row's result
        is known there (a Run reads that folder's state)."""
        folder = self.out_dir.text().strip()
        if not self.running and self._ran_in is not None and folder != self._ran_in:
            self._ran_in = None
            self._changed(range(len(self.rows)))

    def jobs(self) -> list[Job]:
        """The queue as batch jobs (a row's settings: its preset, else the base settings);
        a preset that cannot be read is an InputError naming it."""
        presets: dict[str, RenderSettings] = {}
        jobs = []
        for number, row in enumerate(self.rows, 1):
            settings = self.base_settings
            if row.preset:
                if row.preset not in presets:
                    presets[row.preset] = RenderSettings.load(row.preset)
                settings = presets[row.preset]
            if settings.background == "transparent":
                row.name = self._with_alpha(row)
            extra = {"audio": row.audio, "avatar": row.avatar, "preset": row.preset}
            jobs.append(
                Job(
                    row.name,
                    row.audio,
                    row.avatar,
                    settings,
                    f"batch queue row {number}",
                    extra,
                    preset=row.preset,
                )
            )
        return jobs

    def _with_alpha(self, row: QueueRow) -> str:
        """The row's output name, as a WebM where its file type has no alpha channel (a
        transparent background), unique in the queue."""
        if Path(row.name).suffix.lower() in ALPHA_SUFFIXES:
            return row.name
        taken = {r.name.lower() for r in self.rows if r is not row}
        stem, n = Path(row.name).stem, 2
        name = f"{stem}.webm"
        while name.lower() in taken:
            name, n = f"{stem}_{n}.webm", n + 1
        return name

    # --- running ------------------------------------------------------------------------

    def run(self) -> bool:
        """Start the batch on a worker thread; False (with a message) when it cannot start."""
        if self.running:
            return False
        out = self.out_dir.text().strip()
        if not self.rows:
            return self._refuse("Add audio files first (Add files… or Add folder…).")
        if not out:
            return self._refuse("Choose an output folder first.")
        options = EngineOptions(self.checkpoints, device=None, avatar_cache=None)
        try:
            jobs = self.jobs()
            check_outputs(jobs, out, None)  # as the command checks them, before any work
        except StudioError as e:
            return self._refuse(one_line(e))
        try:
            notes = check_engines(jobs, options)  # as the command checks them, before any work
        except JobOptionError as e:
            return self._refuse(self._option_text(e))
        except StudioError as e:
            return self._refuse(one_line(e))
        for row in self.rows:
            row.reset()
        self._index = {row.name: i for i, row in enumerate(self.rows)}
        self._ran_in = out
        self._running_name, self._seconds, self.report, self.outcome = None, {}, None, ""
        self._started = time.perf_counter()
        self.show_message("")
        self.log.clear()
        for note in notes:
            self.log.appendPlainText(f"note: {note}")
        self._cancel = threading.Event()
        worker = BatchWorker(self._cancel)
        worker.planned.connect(self._planned)
        worker.jobStarted.connect(self._job_started)
        worker.progress.connect(self._progress)
        worker.jobDone.connect(self._job_done)
        worker.line.connect(self.log.appendPlainText)
        worker.batchDone.connect(self._batch_done)
        self._worker = worker
        self._thread = start_in_thread(worker, "studio-batch")
        worker.requested.emit(
            BatchRequest(tuple(jobs), out, options, self.retry_failed.isChecked())
        )
        self._show_table()
        self.batchStarted.emit()
        return True

    def _option_text(self, error: JobOptionError) -> str:
        """An engine's refusal of a row, in this window's words (the command's are options)."""
        job = error.job
        if error.option != "--avatar":
            return one_line(error)
        row = job.source[0].upper() + job.source[1:]
        if capabilities(job.settings.backend).takes_avatar:  # it needs one, and has none
            return NEEDS_AN_AVATAR.format(row=row, engine=job.settings.backend)
        return NO_AVATAR_ON_DEMO.format(row=row)

    def stop(self) -> None:
        """Stop the batch: the running clip stops at its next frames, finished ones stay."""
        if self.running and not self._cancel.is_set():
            self._cancel.set()
            self._update()

    def left(self) -> int:
        """How many clips of a running batch are not finished yet (0 when none runs)."""
        if not self.running:
            return 0
        return sum(r.status in ("queued", *ACTIVE) for r in self.rows)

    def shutdown(self, timeout_ms: int = 10_000) -> None:
        """Stop a running batch and wait for its thread (the app is closing)."""
        thread = self._thread
        if thread is None:
            return
        self._cancel.set()
        thread.quit()
        thread.wait(timeout_ms)

    def _busy(self) -> bool:
        """Whether a batch runs (with a message): the queue is not changed while it does."""
        if self.running:
            self.show_message("The queue cannot change while the batch runs: Stop it first.")
        return self.running

    def _refuse(self, message: str) -> bool:
        self.show_message(message)
        return False

    def _row_of(self, name: str) -> QueueRow | None:
        i = self._index.get(name)
        return None if i is None or i >= len(self.rows) else self.rows[i]

    @Slot(object)
    def _planned(self, seconds: dict) -> None:
        self._seconds = dict(seconds)

    @Slot(str)
    def _job_started(self, name: str) -> None:
        before = self._row_of(self._running_name or "")
        if before is not None and before.status == "running":  # its file's tail is written
            before.status, before.note, before.progress = "writing", "the file's end", 1.0
            self._show_row(self._index[before.name])
        row = self._row_of(name)
        if row is not None:
            row.status, row.note, row.progress = "running", "", 0.0
            self._running_name = name
            self._show_row(self._index[name])
        self._show_summary()
        self.jobStarted.emit(name)

    @Slot(str, int, int)
    def _progress(self, stage: str, done: int, total: int) -> None:
        row = self._row_of(self._running_name or "")
        if row is None:
            return
        if stage == "render" and total > 0:
            row.progress, row.note = min(done / total, 1.0), ""
        else:
            row.note = stage
        self._show_row(self._index[row.name])
        self._show_summary()

    @Slot(object)
    def _job_done(self, rec: dict) -> None:
        row = self._row_of(rec["name"])
        if row is not None:
            row.record = dict(rec)
            row.status = rec["status"]
            row.error = rec.get("error", "") if rec["status"] == "failed" else ""
            row.note = {"done": "done before", "failed": "before, not retried"}.get(
                rec.get("was", ""), ""
            )
            row.progress = 1.0 if rec["status"] in OPENABLE else row.progress
            row.time = _time_text(rec)
            self._show_row(self._index[row.name])
        if self._running_name == rec["name"]:
            self._running_name = None
        self._show_summary()
        self.jobFinished.emit(rec)

    @Slot(str, str, object)
    def _batch_done(self, outcome: str, message: str, report: object) -> None:
        if self._thread is not None:  # its worker has returned: the thread ends at once
            self._thread.quit()
            self._thread.wait(10_000)
            self._ended = self._thread  # kept, never destroyed while it may still run
        self._thread = self._worker = None
        self.outcome = outcome
        self.report = report if isinstance(report, dict) else None
        for row in self.rows:
            if row.status in ACTIVE:
                row.status, row.note = "stopped", ""
        self._running_name = None
        self.show_message(message)
        self._show_table()
        self.batchFinished.emit(outcome)

    # --- showing -------------------------------------------------------------------------

    def show_message(self, text: str) -> None:
        """One line about what went wrong (empty: none)."""
        self.message.setText(text)
        self.message.setVisible(bool(text))

    def _show_table(self) -> None:
        self.table.blockSignals(True)
        self.table.setRowCount(len(self.rows))
        self.table.blockSignals(False)
        for i in range(len(self.rows)):
            self._show_row(i)
        self._update()

    def _show_row(self, i: int) -> None:
        row = self.rows[i]
        status = row.status if not row.note else f"{row.status} ({row.note})"
        if row.status == "failed" and row.note:
            status = f"failed {row.note}"
        cells = {
            AUDIO: (Path(row.audio).name, row.audio),
            AVATAR: (Path(row.avatar).name if row.avatar else "—", row.avatar or "no avatar"),
            PRESET: (
                Path(row.preset).name if row.preset else "main window",
                row.preset or "the main window's settings",
            ),
            OUTPUT: (row.name, "double-click to rename" if not self.running else row.name),
            STATUS: (status, status),
            PROGRESS: ("", ""),
            TIME: (row.time, row.time),
            ERROR: (row.error, row.error),
        }
        self.table.blockSignals(True)
        for col, (text, tip) in cells.items():
            item = self.table.item(i, col)
            if item is None:
                item = QTableWidgetItem()
                self.table.setItem(i, col, item)
            item.setText(text)
            item.setToolTip(tip)
            editable = col == OUTPUT and not self.running
            flags = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
            item.setFlags(flags | Qt.ItemFlag.ItemIsEditable if editable else flags)
        colour = STATUS_COLOURS.get(row.status)
        self.table.item(i, STATUS).setForeground(QColor(colour or theme.TEXT))
        shown = row.status in (*ACTIVE, *OPENABLE)  # a stopped clip leaves nothing
        self.table.item(i, PROGRESS).setData(
            Qt.ItemDataRole.UserRole, round(row.progress * 100) if shown else None
        )
        self.table.blockSignals(False)

    def _show_summary(self) -> None:
        counts = {s: sum(r.status == s for r in self.rows) for s in STATUS_COLOURS}
        left = sum(r.status == "queued" for r in self.rows)
        writing = sum(r.status == "writing" for r in self.rows)
        parts = [
            f"{counts['done']} done",
            f"{counts['skipped']} skipped (done before)",
            f"{counts['failed']} failed",
        ]
        if self.running and self._cancel.is_set():
            text = "Stopping after the running clip's next frames…"
        elif self.running:
            parts.append(f"{left + counts['running']} to go")
            if writing:
                parts.append(f"{writing} being written")
            parts.extend(self._rate_and_eta())
            text = "Running: " + ", ".join(parts)
        elif self.outcome == "done" and self.report:
            s = self.report["summary"]
            rate = f" ({s['realtime']:.1f}x real time)" if s.get("realtime") else ""
            speech = f" · {s['audio_s']:.1f} s of speech in {s['wall_s']:.1f} s{rate}"
            text = (
                f"Finished: {', '.join(parts)} of {s['total']}{speech * bool(s['audio_s'])}"
                f" · {REPORT_FILE} written"
            )
        elif self.outcome == "stopped":
            text = (
                f"Stopped: {', '.join(parts)}, {left + counts['stopped']} not run · finished "
                f"videos are kept; "
                f"Run again to go on"
            )
        elif self.outcome == "error":
            text = "Not finished: " + ", ".join(parts)
        elif not self.rows:
            text = EMPTY_HINT
        else:
            text = f"{len(self.rows)} clip{'s' * (len(self.rows) != 1)} in the queue"
        self.summary.setText(text)
        self.summary.setToolTip(text)

    def _rate_and_eta(self) -> list[str]:
        """This run's rate (x real time: the speech its clips rendered so far, the running
        one's part too) and the time left; none before a second of speech is rendered."""
        speech = 0.0
        todo = 0.0
        for r in self.rows:
            seconds = self._seconds.get(r.name, 0.0)
            if r.status in ("done", "writing"):
                speech += r.record.get("duration_s", seconds)
            elif r.status in ("queued", "running"):
                speech += seconds * r.progress
                todo += seconds * (1.0 - r.progress)
        now = pace(speech, todo, time.perf_counter() - self._started) if speech >= 1.0 else None
        if now is None:
            return []
        rate, eta = now
        return [f"{rate:.1f}x real time", *([f"ETA {eta}"] if eta else [])]

    def _update(self) -> None:
        self._update_buttons()
        self._update_defaults()
        self._show_summary()

    def _update_buttons(self) -> None:
        idle = not self.running
        for b in (
            self.add_files_button,
            self.add_folder_button,
            self.avatar_button,
            self.preset_button,
            self.browse_button,
            self.retry_failed,
        ):
            b.setEnabled(idle)
        self.out_dir.setReadOnly(not idle)
        self.remove_button.setEnabled(idle and bool(self.selected_rows()))
        self.run_button.setEnabled(idle and bool(self.rows) and bool(self.out_dir.text().strip()))
        self.stop_button.setEnabled(self.running and not self._cancel.is_set())
        self.open_folder_button.setEnabled(bool(self.out_dir.text().strip()))

    def _update_defaults(self) -> None:
        avatar = Path(self.avatar).name if self.avatar else "none"
        preset = Path(self.preset).name if self.preset else "main window's settings"
        self.defaults_label.setText(f"New rows: avatar {avatar} · {preset}")
        self.defaults_label.setToolTip(
            f"New rows: avatar {self.avatar or 'none'} · {self.preset or preset}"
        )

    # --- user actions --------------------------------------------------------------------

    def _item_changed(self, item: QTableWidgetItem) -> None:
        """A renamed output: a file name ending .mp4, unique in the queue."""
        if item.column() != OUTPUT or self.running or item.row() >= len(self.rows):
            return
        row = self.rows[item.row()]
        text = item.text().strip()
        if text and text != row.name:
            others = (r.name for r in self.rows if r is not row)
            row.name = unique_name(text, others)
            self._changed([item.row()])
        else:
            self._show_row(item.row())

    def _double_clicked(self, i: int, col: int) -> None:
        if col != OUTPUT or self.running:
            self.open_result(i)

    def open_result(self, i: int) -> bool:
        """Open row ``i``'s MP4 in the system's player, when it is done and there."""
        if not 0 <= i < len(self.rows) or self.rows[i].status not in OPENABLE:
            return False
        path = written_path(Path(self.out_dir.text().strip()) / self.rows[i].name)
        if not path.exists():
            self.show_message(f"{path}: not there any more")
            return False
        return self._open(path)

    def open_output_folder(self) -> bool:
        """Show the output folder in the system's file manager."""
        folder = Path(self.out_dir.text().strip())
        if not folder.is_dir():
            self.show_message(f"{folder}: no such folder yet (Run makes it)")
            return False
        return self._open(folder)

    def _open(self, path: Path) -> bool:
        """``path`` in the system's program for it; a message where none could be started."""
        if QDesktopServices.openUrl(QUrl.fromLocalFile(str(path))):
            return True
        what = "folder" if path.is_dir() else "file"
        self.show_message(f"No program here opens {path.name}: the {what} is {path}")
        return False

    def _start_folder(self) -> str:
        return str(Path(self.rows[-1].audio).parent) if self.rows else str(Path.home())

    def add_files_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Add audio files", self._start_folder(), AUDIO_FILTER
        )
        self.add_files(paths)

    def add_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Add a folder of audio", self._start_folder()
        )
        if folder:
            self.add_folder(folder)

    def avatar_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Avatar", self._start_folder(), AVATAR_FILTER)
        if path:
            self.set_avatar(path)

    def preset_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Preset", self._start_folder(), PRESET_FILTER)
        if path:
            self.set_preset(path)

    def output_dialog(self) -> None:
        start = self.out_dir.text().strip() or self._start_folder()
        folder = QFileDialog.getExistingDirectory(self, "Output folder", start)
        if folder:
            self.set_output_dir(folder)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt API
        if event.mimeData().hasUrls() and not self.running:
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt API
        for url in event.mimeData().urls():
            p = Path(url.toLocalFile())
            if p.is_dir():
                self.add_folder(p)
            elif p.suffix.lower() in AUDIO_SUFFIXES:
                self.add_files([p])

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt API
        if self.parent() is None:  # standalone: nothing would be left to show the batch
            self.shutdown()
        super().closeEvent(event)


def _time_text(rec: dict[str, Any]) -> str:
    """A record's wall time and real-time factor ("2.1 s · 0.5x")."""
    if "wall_s" not in rec or rec.get("status") != "done":  # a skipped one: another run's
        return ""
    rate = f" · {rec['realtime']:.1f}x" if rec.get("realtime") else ""
    return f"{rec['wall_s']:.1f} s{rate}"


def _squeezable(label: QLabel) -> QLabel:
    """``label`` that never widens its window: cut at the window's edge (its tool tip shows
    the whole text)."""
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setMinimumWidth(40)
    return label
