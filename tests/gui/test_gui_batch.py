"""The Batch queue window under offscreen Qt: real clips on the demo engine, a bad file among
them, a rerun that skips, Stop, and the main window's File → Batch queue… action."""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import pytest
from conftest import demo_speech_piece

pytest.importorskip("PySide6")

from PySide6.QtGui import QDesktopServices  # noqa: E402

from studio.batch.run import REPORT_FILE  # noqa: E402
from studio.gui.batch_window import BatchWindow, unique_name  # noqa: E402
from studio.settings import RenderSettings  # noqa: E402

SIZE = 96  # small frames: the queue is what is tested
BATCH_TIMEOUT_MS = 60_000


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    """Two short speech clips and a text file named bad.wav."""
    folder = tmp_path / "clips"
    folder.mkdir()
    demo_speech_piece(folder, "a.wav", 0.0, 1.2)
    demo_speech_piece(folder, "b.wav", 1.2, 1.0)
    (folder / "bad.wav").write_text("not audio\n")
    return folder


@pytest.fixture
def batch(qtbot, clips: Path, tmp_path: Path) -> BatchWindow:
    """The window on 96-pixel base settings, the clips' folder added, output in tmp_path."""
    w = BatchWindow(RenderSettings(size=SIZE))
    qtbot.addWidget(w)
    w.show()
    assert w.add_folder(clips) == 3
    w.set_output_dir(tmp_path / "out")
    return w


def _run(qtbot, w: BatchWindow) -> str:
    with qtbot.waitSignal(w.batchFinished, timeout=BATCH_TIMEOUT_MS) as blocker:
        assert w.run()
    return blocker.args[0]


def _status(w: BatchWindow) -> dict[str, str]:
    return {r.name: r.status for r in w.rows}


def test_unique_output_names() -> None:
    assert unique_name("a.mp4", []) == "a.mp4"
    assert unique_name("a", ["a.mp4"]) == "a_2.mp4"
    assert unique_name("dir/A.mp4", ["a.mp4", "a_2.mp4"]) == "A_3.mp4"


def test_a_batch_runs_records_the_bad_clip_and_a_rerun_skips(qtbot, batch, clips, monkeypatch):
    w = batch
    w.add_files([clips / "a.wav"])  # the same audio again: its own output name
    assert [r.name for r in w.rows] == ["a.mp4", "b.mp4", "bad.mp4", "a_2.mp4"]
    w.remove_rows([3])
    started: list[str] = []
    w.jobStarted.connect(started.append)
    seen: dict[str, dict[str, str]] = {}  # each clip's start: how the others stand
    w.jobStarted.connect(lambda name: seen.setdefault(name, _status(w)))
    said: dict[str, str] = {}  # the summary line as each clip starts
    w.jobStarted.connect(lambda name: said.setdefault(name, w.summary.text()))
    assert _run(qtbot, w) == "done"
    # no rate before a second of speech is rendered; then the rate, and the time left unless
    # under half a second (b's 1 s at the demo's pace): never "ETA 0:00"
    assert "real time" not in said["a.mp4"] and said["a.mp4"].startswith("Running: 0 done")
    running = r"Running: 0 done, .*, 1 being written, \d+\.\dx real time(, ETA \d+:\d\d)?"
    assert re.fullmatch(running, said["b.mp4"]) and "ETA 0:00" not in said["b.mp4"]
    # when b starts, a is rendered and its file's end is being written beside b
    assert seen["b.mp4"] == {"a.mp4": "writing", "b.mp4": "running", "bad.mp4": "queued"}
    out = Path(w.out_dir.text())
    assert _status(w) == {"a.mp4": "done", "b.mp4": "done", "bad.mp4": "failed"}
    assert started == ["a.mp4", "b.mp4", "bad.mp4"]
    assert (out / "a.mp4").stat().st_size > 0 and (out / "b.mp4").stat().st_size > 0
    bad = w.rows[2]
    assert "bad.wav" in bad.error and "Traceback" not in bad.error
    assert w.table.item(2, 7).toolTip() == bad.error
    assert w.table.item(0, 5).data(256) == 100  # the progress bar full
    assert "x" in w.table.item(0, 6).text()  # wall time and real-time factor
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["summary"]["done"] == 2 and report["summary"]["failed"] == 1
    assert w.summary.text().startswith("Finished: 2 done") and not w.message.isVisible()
    assert any("bad.mp4: FAILED" in line for line in w.log.toPlainText().splitlines())

    opened: list[str] = []

    def open_url(url) -> bool:
        opened.append(url.toLocalFile())
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", open_url)
    w.table.cellDoubleClicked.emit(0, 0)  # a done row: its MP4
    w.table.cellDoubleClicked.emit(2, 0)  # the failed row: nothing
    assert w.open_output_folder()
    assert opened == [str(out / "a.mp4"), str(out)]

    # Again: the finished clips are skipped (the state file), the bad one is not retried...
    assert _run(qtbot, w) == "done"
    assert _status(w) == {"a.mp4": "skipped", "b.mp4": "skipped", "bad.mp4": "failed"}
    assert "failed before" in w.table.item(2, 4).text() and "bad.wav" in w.rows[2].error
    # ...unless asked to.
    w.retry_failed.setChecked(True)
    ran: list[str] = []
    w.jobStarted.connect(ran.append)
    assert _run(qtbot, w) == "done" and ran == ["bad.mp4"]

    # A changed row is a new clip: renamed, it is queued again and the finished summary goes
    w.table.item(0, 3).setText("renamed")
    assert w.rows[0].name == "renamed.mp4" and _status(w)["renamed.mp4"] == "queued"
    assert w.rows[0].time == "" and w.summary.text() == "3 clips in the queue"
    w.table.item(1, 3).setText("b.webm")  # a file type the batch writes is kept
    assert w.rows[1].name == "b.webm" and _status(w)["b.webm"] == "queued"
    w.set_output_dir(str(out))  # the run's own folder again: its results still hold
    assert _status(w)["bad.mp4"] == "failed"
    w.set_output_dir(out.parent / "elsewhere")  # another folder: nothing known of it
    assert set(_status(w).values()) == {"queued"}
    w.remove_rows([0, 1, 2])
    assert "No clips yet" in w.summary.text()


def test_an_avatar_the_demo_engine_cannot_take_is_refused_before_the_run(qtbot, batch, clips):
    w = batch
    w.set_avatar(str(clips / "a.wav"), rows=[2])  # only the last row: still refused
    assert not w.run() and not w.running
    assert "row 3" in w.message.text() and "No avatar" in w.message.text()
    assert "--" not in w.message.text()  # the window's words, not the command's options
    w.table.selectRow(2)
    w.set_avatar(None)  # Avatar → No avatar
    assert w.rows[2].avatar is None and not w.message.isVisible()
    assert _run(qtbot, w) == "done"


def test_a_ditto_row_without_an_avatar_is_asked_for_one(qtbot, batch, ditto_assets):
    w = batch
    w.checkpoints = str(ditto_assets["tree"])
    w.base_settings = RenderSettings(size=SIZE, backend="ditto")
    assert not w.run() and not w.running
    assert "row 1: the ditto engine animates a face" in w.message.text()
    assert "Choose an avatar" in w.message.text() and "takes no avatar" not in w.message.text()


def test_a_result_no_program_opens_is_said(qtbot, batch, monkeypatch):
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: False)
    w = batch
    Path(w.out_dir.text()).mkdir(parents=True)
    assert not w.open_output_folder()
    assert "No program here opens" in w.message.text() and w.out_dir.text() in w.message.text()


def test_stop_keeps_the_finished_videos(qtbot, batch):
    w = batch
    w.rows.insert(0, w.rows.pop(2))  # bad.mp4 first: it fails at once, a then b
    w.jobStarted.connect(lambda name: name == "a.mp4" and w.stop())
    w.batchStarted.connect(lambda: w.add_files([w.rows[0].audio]))  # refused while running
    assert _run(qtbot, w) == "stopped"
    out = Path(w.out_dir.text())
    status = _status(w)
    assert status["bad.mp4"] == "failed" and status["b.mp4"] == "queued"
    assert status["a.mp4"] in ("stopped", "done")  # stopped mid-clip, or it finished first
    assert (out / "a.mp4").exists() == (status["a.mp4"] == "done")
    assert not (out / "b.mp4").exists()
    assert len(w.rows) == 3 and w.summary.text().startswith("Stopped")
    assert json.loads((out / REPORT_FILE).read_text())["summary"]["pending"] >= 1
    assert w.run_button.isEnabled() and not w.stop_button.isEnabled()


def test_problems_are_one_line_in_the_window(qtbot, batch, tmp_path):
    w = batch
    bad_preset = tmp_path / "bad.json"
    bad_preset.write_text("{not json")
    assert not w.set_preset(str(bad_preset))
    assert "bad.json" in w.message.text() and "Traceback" not in w.message.text()
    good = tmp_path / "small.json"
    RenderSettings(size=SIZE, smooth_window=9).save(good)
    w.table.selectRow(1)
    assert w.set_preset(str(good))
    assert [r.preset for r in w.rows] == [None, str(good), None]
    assert [j.settings.smooth_window for j in w.jobs()][1] == 9
    blocker = tmp_path / "file"
    blocker.write_text("")
    w.set_output_dir(blocker / "out")  # under a file: the batch cannot make its folder
    assert _run(qtbot, w) == "error"
    assert w.message.isVisible() and "Traceback" not in w.message.text()
    assert "\n" not in w.message.text() and not w.running
    assert f"{blocker} is a file" in w.message.text()


def test_an_output_that_would_replace_a_folder_of_other_files_is_refused(batch, tmp_path):
    w = batch
    w.rows[0].name = "a.png"  # a PNG sequence: the folder out/a/, which holds a user's notes
    (tmp_path / "out" / "a").mkdir(parents=True)
    (tmp_path / "out" / "a" / "notes.txt").write_text("mine")
    assert not w.run() and not w.running
    assert "holds 'notes.txt', not only an earlier PNG sequence" in w.message.text()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a"]


def test_the_main_window_opens_one_batch_window(window, qtbot):
    window.act_batch.trigger()
    first = window.batch_window
    assert first.isVisible() and first.base_settings == window.controls.settings()
    assert window.act_batch.shortcut().toString() == "Ctrl+B"
    window.act_batch.trigger()
    assert window.batch_window is first
    window.close()  # the batch window goes with it
    assert not first.isVisible()


def test_closing_the_main_window_asks_before_it_stops_a_batch(window, qtbot, clips, tmp_path):
    window.act_batch.trigger()
    w = window.batch_window
    w.base_settings = RenderSettings(size=SIZE)
    assert w.add_folder(clips) == 3
    w.set_output_dir(tmp_path / "out")
    answers: list[str] = []

    def on_start(name: str) -> None:  # at each clip's start, the user closes the studio
        window.close()
        box = window.quit_box
        assert box is not None and box.isVisible() and "3 clips to go" in box.text()
        assert window.status_batch.text() == "Batch: 3 clips to go"
        choice = "Keep it running" if not answers else "Stop the batch and quit"
        answers.append(choice)
        next(b for b in box.buttons() if b.text() == choice).click()

    w.jobStarted.connect(on_start)
    with qtbot.waitSignal(w.batchFinished, timeout=BATCH_TIMEOUT_MS) as blocker:
        assert w.run()
    # kept running through the first clip; stopped (and the studio closed) at the second
    assert answers == ["Keep it running", "Stop the batch and quit"]
    assert blocker.args == ["stopped"] and not window.isVisible() and not w.isVisible()
    assert _status(w)["a.mp4"] == "done" and (tmp_path / "out" / "a.mp4").exists()


def test_a_transparent_preset_makes_its_clip_a_webm(qtbot, batch, tmp_path):
    w = batch
    clear = tmp_path / "clear.json"
    RenderSettings(size=SIZE, background="transparent").save(clear)
    w.remove_rows([1, 2])  # a.wav alone
    w.table.selectRow(0)
    assert w.set_preset(str(clear))
    assert _run(qtbot, w) == "done"
    assert [r.name for r in w.rows] == ["a.webm"] and _status(w) == {"a.webm": "done"}
    with av.open(str(Path(w.out_dir.text()) / "a.webm")) as c:
        assert c.streams.video[0].metadata.get("alpha_mode") == "1"


def test_a_signal_closes_the_studio_without_asking_and_stops_its_batch(
    window, qtbot, clips, tmp_path
):
    """Ctrl-C or a kill to `studio gui` (its handler calls close_without_asking): no question
    a terminal user cannot answer, the batch stops, the window goes."""
    window.act_batch.trigger()
    w = window.batch_window
    w.base_settings = RenderSettings(size=SIZE)
    assert w.add_folder(clips) == 3
    w.set_output_dir(tmp_path / "out")
    w.jobStarted.connect(lambda name: name == "b.mp4" and window.close_without_asking())
    with qtbot.waitSignal(w.batchFinished, timeout=BATCH_TIMEOUT_MS) as blocker:
        assert w.run()
    assert blocker.args == ["stopped"] and window.quit_box is None
    assert not window.isVisible() and _status(w)["a.mp4"] == "done"
