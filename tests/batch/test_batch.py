"""`studio batch`: the job list, a batch of demo jobs with bad ones among them, reruns, the
report, and the CLI's outcomes (demo engine, real files, real PyAV)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import numpy as np
import pytest
from conftest import PYTORCH_FILES, demo_speech_piece, make_tree, run_cli

from studio.batch.jobs import read_jobs
from studio.batch.run import REPORT_FILE, EngineOptions, check_engines, engine_key, run_batch
from studio.batch.state import STATE_FILE, BatchState
from studio.errors import InputError, OutputError
from studio.settings import RenderSettings

SIZE = 96  # small frames: the batch logic is what is tested


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    """A folder with two short speech clips, a text file named .wav, and a jobs file naming
    them and a missing one."""
    demo_speech_piece(tmp_path, "a.wav", 0.0, 1.2)
    demo_speech_piece(tmp_path, "b.wav", 1.2, 1.0)
    (tmp_path / "bad.wav").write_text("not audio\n")
    lines = [
        {"audio": "a.wav", "size": SIZE},
        {"audio": "b.wav", "output": "second.mp4", "settings": {"smooth_window": 9}, "size": SIZE},
        {"audio": "bad.wav", "size": SIZE},
        {"audio": "missing.wav", "size": SIZE},
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return tmp_path


def _frames(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


# --- the list -------------------------------------------------------------------------


def test_jobs_from_jsonl_csv_and_a_folder(clips: Path, monkeypatch) -> None:
    jobs = read_jobs(clips / "jobs.jsonl")
    assert [j.name for j in jobs] == ["a.mp4", "second.mp4", "bad.mp4", "missing.mp4"]
    assert jobs[1].settings.smooth_window == 9 and jobs[0].settings.smooth_window != 9
    assert jobs[0].audio == str(clips / "a.wav") and jobs[0].settings.size == SIZE
    (clips / "jobs.csv").write_text(
        "audio,output,cadence.max_warp_px,stride\na.wav,x.mp4,12,auto\nb.wav,,,2\n"
    )
    csv_jobs = read_jobs(clips / "jobs.csv", RenderSettings(size=SIZE))
    assert [j.name for j in csv_jobs] == ["x.mp4", "b.mp4"]
    assert csv_jobs[0].settings.cadence.max_warp_px == 12.0
    assert csv_jobs[1].settings.stride == "2" and csv_jobs[1].settings.size == SIZE
    here = clips / "here"
    here.mkdir()
    monkeypatch.chdir(here)  # the command's --avatar is where the command runs, as for render
    folder = read_jobs(clips, avatar="face.png")  # every audio file (bad.wav too: it fails later)
    assert [j.name for j in folder] == ["a.mp4", "b.mp4", "bad.mp4"]
    assert all(j.avatar == str(here / "face.png") for j in folder)
    # "preset": a preset file where it ends in .json, else x264's speed preset (a setting)
    RenderSettings(size=SIZE, smooth_window=11).save(clips / "calm.json")
    lines = [{"audio": "a.wav", "preset": "calm.json"}, {"audio": "b.wav", "preset": "veryfast"}]
    (clips / "presets.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    calm, fast = read_jobs(clips / "presets.jsonl")
    assert calm.settings.smooth_window == 11 and calm.settings.preset == RenderSettings().preset
    assert fast.settings.preset == "veryfast" and fast.settings.smooth_window != 11
    (clips / "presets.csv").write_text("audio,preset\na.wav,calm.json\nb.wav,veryfast\n")
    assert [j.settings for j in read_jobs(clips / "presets.csv")] == [calm.settings, fast.settings]
    (clips / "own.jsonl").write_text(json.dumps({"audio": "a.wav", "avatar": "me.png"}) + "\n")
    assert read_jobs(clips / "own.jsonl", avatar="face.png")[0].avatar == str(clips / "me.png")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"audio": "a.wav"}\n{"audio": \n', "jobs.jsonl:2: not a JSON object"),
        ('{"audo": "a.wav"}\n', "jobs.jsonl:1: unknown key 'audo' (did you mean 'audio'?)"),
        ('{"audio": "a.wav", "smoothwindow": 9}\n', "settings' keys: smooth, smooth_window,"),
        ('{"output": "x.mp4"}\n', "jobs.jsonl:1: no audio"),
        ('{"audio": "a.wav", "size": -3}\n', "jobs.jsonl:1: size"),
        ('{"audio": "a.wav"}\n{"audio": "a.wav"}\n', "jobs.jsonl:2: output 'a.mp4' is also"),
        (  # one folder x/ for both
            '{"audio": "a.wav", "output": "x.png"}\n{"audio": "b.wav", "output": "x.PNG"}\n',
            "jobs.jsonl:2: output 'x.PNG' is also written by",
        ),
        ('{"audio": "a.wav", "output": "../x.mp4"}\n', "must be a file name"),
        ('{"audio": "a.wav", "output": ".x.partial-1.mp4"}\n', "starts with a letter or digit"),
        ('{"audio": "a.wav", "output": "a\\u0000b.mp4"}\n', "no control characters"),
        ('{"audio": "a.wav", "output": "clip.avi"}\n', "the batch writes .mp4, .webm, .mov"),
        ('{"audio": "a.wav", "output": ["x"]}\n', "output: give a file name as a string"),
        ('{"audio": "a.wav", "size": 64, "size": 96}\n', "jobs.jsonl:1: 'size' is given twice"),
        ("\n# nothing\n", "no jobs in it"),
    ],
)
def test_a_bad_job_list_is_one_line_naming_the_line(clips: Path, text: str, words: str) -> None:
    (clips / "jobs.jsonl").write_text(text)
    with pytest.raises(InputError, match=re.escape(words)):
        read_jobs(clips / "jobs.jsonl")


def test_the_cli_refuses_a_bad_list_before_any_work(clips: Path, capsys) -> None:
    (clips / "jobs.jsonl").write_text('{"audio": "a.wav", "smooth_window": "wide"}\n')
    code, out, err = run_cli(
        ["batch", str(clips / "jobs.jsonl"), "--out-dir", str(clips / "o")], capsys
    )
    assert code == 2 and "jobs.jsonl:1: smooth_window" in err and "Traceback" not in err
    assert not (clips / "o").exists()
    (clips / "file").write_text("x")
    code, _, err = run_cli(["batch", str(clips), "--out-dir", str(clips / "file")], capsys)
    assert code == 2 and "--out-dir" in err
    code, _, err = run_cli(["batch", str(clips), "--out-dir", ""], capsys)
    assert code == 2 and "--out-dir" in err and "is empty" in err
    argv = ["batch", str(clips), "--checkpoints", str(clips / "none"), "--out-dir"]
    code, _, err = run_cli([*argv, str(clips / "o")], capsys)  # every job's engine: one line
    assert code == 2 and "checkpoint folder" in err and "does not exist" in err
    assert not (clips / "o").exists()
    # an option the jobs' engine cannot take: the command's error, as for render
    argv = ["batch", str(clips), "--avatar", str(clips / "a.wav"), "--out-dir", str(clips / "o")]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "--avatar: needs --checkpoints" in err and "(job " in err
    assert not (clips / "o").exists()
    # the same when only a later job names one (the demo engine's jobs share one engine)
    lines = [{"audio": "a.wav"}, {"audio": "b.wav", "avatar": "a.wav"}]
    (clips / "mixed.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    argv = ["batch", str(clips / "mixed.jsonl"), "--out-dir", str(clips / "o")]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "--avatar: needs --checkpoints" in err and "mixed.jsonl:2" in err
    assert not (clips / "o").exists()
    # a checkpoint folder missing files fails the command once, not every job
    tree = make_tree(clips / "ck", [f for f in PYTORCH_FILES if "aux_models" not in f])
    argv = ["batch", str(clips), "--checkpoints", str(tree), "--avatar", "face.png"]
    code, _, err = run_cli([*argv, "--out-dir", str(clips / "o")], capsys)
    assert code == 2 and "det_10g.onnx" in err and len(err.strip().splitlines()) == 1, err
    assert not (clips / "o").exists()


def test_each_jobs_settings_are_checked_though_the_jobs_share_an_engine(clips: Path) -> None:
    """The demo engine's jobs share one engine, each under its own settings: a later job's
    setting the engine ignores is said too (a precision a GPU cannot run is refused so)."""
    lines = [{"audio": "a.wav"}, {"audio": "b.wav", "settings": {"compile": True}}]
    (clips / "two.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    jobs = read_jobs(clips / "two.jsonl")
    assert engine_key(jobs[0], EngineOptions()) == engine_key(jobs[1], EngineOptions())
    notes = check_engines(jobs, EngineOptions())
    assert notes == [n for n in notes if "--compile is ignored by the demo engine" in n] != []
    assert check_engines(jobs[:1], EngineOptions()) == []


# --- running ----------------------------------------------------------------------------


def test_a_batch_finishes_the_good_jobs_records_the_bad_and_a_rerun_skips(clips: Path) -> None:
    out = clips / "out"
    jobs = read_jobs(clips / "jobs.jsonl")
    lines: list[str] = []
    report = run_batch(jobs, out, say=lines.append)
    status = {r["name"]: r["status"] for r in report["jobs"]}
    assert status == {
        "a.mp4": "done",
        "second.mp4": "done",
        "bad.mp4": "failed",
        "missing.mp4": "failed",
    }
    errors = {r["name"]: r.get("error", "") for r in report["jobs"]}
    assert "bad.wav" in errors["bad.mp4"] and "not audio" in errors["bad.mp4"]
    assert "missing.wav" in errors["missing.mp4"] and "\n" not in errors["missing.mp4"]
    assert not (out / "bad.mp4").exists() and not (out / "missing.mp4").exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "a.mp4",
        REPORT_FILE,
        "second.mp4",
    ]
    for name, seconds in (("a.mp4", 1.2), ("second.mp4", 1.0)):
        frames = _frames(out / name)
        assert len(frames) == round(seconds * 25) and frames[0].shape == (SIZE, SIZE, 3)
    assert json.loads((out / REPORT_FILE).read_text()) == json.loads(json.dumps(report))
    s = report["summary"]
    assert (s["done"], s["failed"], s["total"]) == (2, 2, 4) and s["frames"] == 55
    assert s["peak_host_mb"] > 0 and any("real time so far" in line for line in lines)
    assert s["actors"] == [
        {"actor": "here", "jobs": 2, "peak_host_mb": s["peak_host_mb"], "peak_gpu_mb": None}
    ]  # the batch's own process rendered both (no GPU here)
    done = report["jobs"][0]
    assert done["realtime"] > 0 and done["frames"] == 30 and "render" in done["timings_ms"]
    assert done["warmup_ms"]["open_engine"] > 0  # the first job opened the engine
    assert report["jobs"][1]["warmup_ms"]["open_engine"] == 0.0  # the second found it warm

    # a rerun: the finished jobs are skipped (their files untouched), the failed stay failed
    before = {n: (out / n).stat().st_mtime_ns for n in ("a.mp4", "second.mp4")}
    again = run_batch(jobs, out, say=lines.append)
    assert [r["status"] for r in again["jobs"]] == ["skipped", "skipped", "failed", "failed"]
    assert {n: (out / n).stat().st_mtime_ns for n in before} == before
    # --retry-failed runs them: a fixed file is made
    demo_speech_piece(clips, "missing.wav", 0.5, 0.8)
    retried = run_batch(jobs, out, retry_failed=True, say=lines.append)
    assert [r["status"] for r in retried["jobs"]] == ["skipped", "skipped", "failed", "done"]
    assert len(_frames(out / "missing.mp4")) == 20


def test_the_report_names_files_wherever_it_is_read_from(clips: Path, monkeypatch) -> None:
    monkeypatch.chdir(clips)
    report = run_batch(read_jobs("jobs.jsonl")[:1], Path("out"), say=lambda _: None)
    (job,) = report["jobs"]
    assert (job["audio"], job["output"]) == (str(clips / "a.wav"), str(clips / "out" / "a.mp4"))


def test_a_changed_job_or_a_lost_output_runs_again(clips: Path) -> None:
    out = clips / "out"
    jobs = read_jobs(clips / "jobs.jsonl")[:1]
    run_batch(jobs, out, say=lambda _: None)
    changed = read_jobs(clips / "jobs.jsonl", RenderSettings(seed=7))[:1]
    lines: list[str] = []
    assert run_batch(changed, out, say=lines.append)["jobs"][0]["status"] == "done"
    assert "done, " in lines[0]
    assert "made again (its files, settings or checkpoints changed)" in lines[0]
    (out / "a.mp4").unlink()
    report = run_batch(changed, out, say=lines.append)
    rec = report["jobs"][0]
    assert rec["status"] == "done" and rec["again"] == "its video was gone"
    assert "made again (its video was gone)" in lines[1]
    state = BatchState(out)
    assert "again" not in state.jobs["a.mp4"]  # what this run said, not what the job is
    assert state.jobs["a.mp4"]["status"] == "done" and (out / STATE_FILE).is_file()


@pytest.mark.timeout(60)  # a FIFO read as a file would wait for a writer
def test_a_list_that_is_not_a_file_tab_separated_or_a_folder_of_one_name(clips: Path) -> None:
    import os

    os.mkfifo(clips / "jobs_fifo.jsonl")  # would be read until a writer closes it, if ever
    with pytest.raises(InputError, match="jobs_fifo.jsonl: not a file"):
        read_jobs(clips / "jobs_fifo.jsonl")
    (clips / "jobs.tsv").write_text("audio\toutput\tsmooth_window\na.wav\tx.mp4\t9\n")
    (job,) = read_jobs(clips / "jobs.tsv")
    assert (job.name, job.settings.smooth_window) == ("x.mp4", 9)
    (clips / "twice.csv").write_text("audio,size,size\na.wav,64,96\n")
    with pytest.raises(InputError, match="twice.csv:1: the column 'size' is named twice"):
        read_jobs(clips / "twice.csv")
    (clips / "latin.csv").write_bytes("audio,output\na.wav,caf\xe9.mp4\n".encode("latin-1"))
    with pytest.raises(InputError, match="latin.csv: not UTF-8 text; save the list"):
        read_jobs(clips / "latin.csv")
    folder = clips / "takes"
    folder.mkdir()
    for name in ("a.wav", "a.flac"):
        (folder / name).write_bytes((clips / "a.wav").read_bytes())
    with pytest.raises(InputError, match="rename one of the two audio files"):
        read_jobs(folder)


def test_no_output_or_report_overwrites_what_the_batch_reads_or_writes(clips: Path, capsys) -> None:
    """Refused before any work, the files left as they were: a job's output that is its own
    audio (a video's sound), a PNG sequence whose folder holds other files (the jobs' own
    folder), a --report that is the jobs file, an audio file or a job's output."""
    import shutil

    shutil.copy(clips / "a.wav", clips / "talk.mp4")  # speech in an .mp4, as phones save it
    (clips / "own.jsonl").write_text(json.dumps({"audio": "talk.mp4", "size": SIZE}) + "\n")
    before = (clips / "talk.mp4").read_bytes()
    argv = ["batch", str(clips / "own.jsonl"), "--out-dir", str(clips), "--demo"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "own.jsonl:1: output" in err and "is also the audio of" in err
    assert (clips / "talk.mp4").read_bytes() == before and "Traceback" not in err
    assert not (clips / STATE_FILE).exists()
    inside = clips / "victim"
    inside.mkdir()
    shutil.copy(clips / "a.wav", inside / "a.wav")
    line = {"audio": "a.wav", "output": "victim.png", "size": SIZE}
    (inside / "jobs.jsonl").write_text(json.dumps(line) + "\n")
    argv = ["batch", str(inside / "jobs.jsonl"), "--out-dir", str(clips), "--demo"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "holds 'a.wav', not only an earlier PNG sequence" in err
    assert sorted(p.name for p in inside.iterdir()) == ["a.wav", "jobs.jsonl"]
    (clips / "solo").mkdir()  # a folder holding only the sequence's own sound file's name
    shutil.copy(clips / "a.wav", clips / "solo" / "solo.wav")
    line = {"audio": "solo/solo.wav", "output": "solo.png", "size": SIZE}
    (clips / "solo.jsonl").write_text(json.dumps(line) + "\n")
    argv = ["batch", str(clips / "solo.jsonl"), "--out-dir", str(clips), "--demo"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "is also the audio of" in err and "solo" in err, err
    assert (clips / "solo" / "solo.wav").read_bytes() == (clips / "a.wav").read_bytes()
    jobs_file = clips / "jobs.jsonl"
    text = jobs_file.read_text()
    out = clips / "o"
    out.mkdir()
    (clips / "own.jsonl").write_text(json.dumps({"audio": "a.wav", "output": f"{REPORT_FILE}.png"}))
    code, _, err = run_cli(["batch", str(clips / "own.jsonl"), "--out-dir", str(out)], capsys)
    assert code == 2 and f"is also the batch's own {REPORT_FILE}" in err, err
    reports = [jobs_file, clips / "a.wav", out / "second.mp4"]  # the last: not yet made
    reports += [out / ".." / "o" / "second.mp4", out / STATE_FILE]
    for report in reports:
        argv = ["batch", str(jobs_file), "--out-dir", str(out), "--demo", "--report", str(report)]
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and f"--report {report}: is also" in err, err
        assert jobs_file.read_text() == text and not any(out.iterdir())


def test_a_full_disk_under_the_state_says_the_jobs_line_first(clips: Path, monkeypatch) -> None:
    """The state cannot be saved (the disk is full): the job's own line is said, and the
    report's failing write (the same disk) does not hide the state's error."""
    from studio.batch import run as batch_run

    def full(path: object, *_: object, **__: object) -> None:
        raise OutputError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(batch_run.BatchState, "save", lambda self: full(self.path))
    monkeypatch.setattr(batch_run, "write_json", full)  # the report, on the same disk
    lines: list[str] = []
    with pytest.raises(OutputError, match=re.escape(STATE_FILE)):
        run_batch(read_jobs(clips / "jobs.jsonl")[:1], clips / "out", say=lines.append)
    assert any("a.mp4" in line for line in lines), lines


def test_other_weights_make_the_jobs_again_and_stale_partial_files_go(clips: Path) -> None:
    """A rerun skips a finished job only while the checkpoint folder's files are the same;
    partial outputs an interrupted batch left are removed when the next one starts (those of
    its jobs' outputs: another program's, a render writing into the folder, stay)."""
    from studio.batch.run import EngineOptions, plan

    out = clips / "out"
    jobs = read_jobs(clips / "jobs.jsonl")[:1]
    (out / ".a.partial-1234abcd.mp4").parent.mkdir(parents=True)
    (out / ".a.partial-1234abcd.mp4").write_bytes(b"half a video")
    others = [".take.partial-5678abcd.mp4", ".a.partial-0099abcd", ".a.partial-0099abcd.webm"]
    (out / others[0]).write_bytes(b"a render's video, being written")
    (out / others[1]).mkdir()  # a render's PNG sequence a.png, and its a.webm
    (out / others[2]).write_bytes(b"a render's video, being written")
    run_batch(jobs, out, say=lambda _: None)
    assert sorted(p.name for p in out.glob(".*partial*")) == sorted(others)
    # a job the state remembers, though this list no longer names it: its partial goes too
    (out / ".a.partial-4321dcba.mp4").write_bytes(b"half a video")
    run_batch(read_jobs(clips / "jobs.jsonl")[1:2], out, say=lambda _: None)
    assert sorted(p.name for p in out.glob(".*partial*")) == sorted(others)
    one, two = clips / "ck1", clips / "ck2"
    for root in (one, two):
        (root / "ditto_pytorch" / "models").mkdir(parents=True)
        (root / "ditto_pytorch" / "models" / "decoder.pth").write_bytes(root.name.encode())
    with BatchState.open(out) as state:
        assert plan(jobs, state, False)[0] == []  # as made: skipped
        record = {
            **state.jobs["a.mp4"],
            "fingerprint": jobs[0].fingerprint(EngineOptions(str(one)).identity),
        }
        state.record("a.mp4", record)
        assert plan(jobs, state, False, EngineOptions(str(one)))[0] == []
        assert plan(jobs, state, False, EngineOptions(str(two)))[0] == jobs  # other weights
        (one / "ditto_pytorch" / "models" / "decoder.pth").write_bytes(b"retrained")
        assert plan(jobs, state, False, EngineOptions(str(one)))[0] == jobs  # changed weights


def test_a_batch_output_is_the_render_commands_video(clips: Path, capsys) -> None:
    out = clips / "out"
    run_batch(read_jobs(clips / "jobs.jsonl")[:1], out, say=lambda _: None)
    code, _, err = run_cli(
        [
            "render",
            "--demo",
            "--audio",
            str(clips / "a.wav"),
            "--size",
            str(SIZE),
            "--out",
            str(clips / "single.mp4"),
        ],
        capsys,
    )
    assert code == 0, err
    ours, theirs = _frames(out / "a.mp4"), _frames(clips / "single.mp4")
    assert len(ours) == len(theirs) and all(
        np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.parametrize("stop", ["cancel", "ctrl-c"])
def test_a_stopped_batch_keeps_its_finished_jobs(clips: Path, stop: str) -> None:
    from studio.errors import Cancelled

    out = clips / "out"
    jobs = read_jobs(clips / "jobs.jsonl")[:2]
    seen: list[str] = []
    started: list[str] = []

    def cancel() -> bool:  # stop while the second job renders (the first one's file is
        if len(started) >= 2 and stop == "ctrl-c":  # finished beside it: kept, recorded)
            raise KeyboardInterrupt
        return len(started) >= 2

    with pytest.raises(Cancelled if stop == "cancel" else KeyboardInterrupt):
        run_batch(jobs, out, say=seen.append, cancel=cancel, on_start=started.append)
    assert (out / "a.mp4").is_file() and not (out / "second.mp4").exists()
    assert not [p.name for p in out.iterdir() if ".partial" in p.name]
    report = json.loads((out / REPORT_FILE).read_text())
    assert [r["status"] for r in report["jobs"]] == ["done", "pending"]
    assert len(_frames(out / "a.mp4")) == report["jobs"][0]["frames"]
    assert [r["status"] for r in run_batch(jobs, out, say=seen.append)["jobs"]] == [
        "skipped",
        "done",
    ]


def test_an_error_between_jobs_keeps_the_job_rendered_before(clips: Path) -> None:
    """The last job's file is written beside the next one's start: an error there (here a
    caller's hook) still finishes and records it before the error goes up."""
    out = clips / "out"
    jobs = read_jobs(clips / "jobs.jsonl")[:2]

    def on_start(job) -> None:
        if job.name == "second.mp4":
            raise RuntimeError("a hook failed")

    with pytest.raises(RuntimeError, match="a hook failed"):
        run_batch(jobs, out, say=lambda _: None, on_start=on_start)
    report = json.loads((out / REPORT_FILE).read_text())
    assert [r["status"] for r in report["jobs"]] == ["done", "pending"]
    assert len(_frames(out / "a.mp4")) == report["jobs"][0]["frames"]
    assert [r["status"] for r in run_batch(jobs, out, say=lambda _: None)["jobs"]] == [
        "skipped",
        "done",
    ]


def test_one_batch_at_a_time_in_a_folder(tmp_path: Path) -> None:
    with BatchState.open(tmp_path / "o"):
        with pytest.raises(OutputError, match="another batch"):
            with BatchState.open(tmp_path / "o"):
                pass
    with BatchState.open(tmp_path / "o"):  # released
        pass


def test_a_folder_it_cannot_write_or_a_broken_state_is_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    (blocked / f"{STATE_FILE}.lock").mkdir(parents=True)  # its lock cannot be made there
    with pytest.raises(OutputError, match="cannot write into the output folder"):
        with BatchState.open(blocked):
            pass
    out = tmp_path / "o"
    out.mkdir()
    for jobs in ('{"a.mp4": "oops"}', '["a.mp4"]'):
        (out / STATE_FILE).write_text(f'{{"format": "studio-batch/1", "jobs": {jobs}}}')
        with pytest.raises(InputError, match="not a studio batch state file; delete it"):
            BatchState(out)


def test_the_cli_runs_a_batch_and_says_what_failed(clips: Path, capsys) -> None:
    out = clips / "out"
    code, stdout, err = run_cli(
        ["batch", str(clips / "jobs.jsonl"), "--out-dir", str(out), "--report", "-"], capsys
    )
    assert code == 1 and "Traceback" not in err
    report = json.loads(stdout)
    assert report["summary"]["done"] == 2 and report["summary"]["failed"] == 2
    assert "2 done, 0 skipped (done before), 2 failed of 4" in err
    assert "[4/4]" in err
    (clips / "jobs.jsonl").write_text(json.dumps({"audio": "a.wav", "size": SIZE}) + "\n")
    code, stdout, _ = run_cli(["batch", str(clips / "jobs.jsonl"), "--out-dir", str(out)], capsys)
    assert code == 0 and "0 done, 1 skipped (done before), 0 failed of 1" in stdout
    assert stdout.splitlines()[1].split() == ["a.mp4", "skipped", "1.2", "s"]  # no old rate
    argv = ["batch", str(clips / "jobs.jsonl"), "--out-dir", str(out), "--compile"]
    code, _, err = run_cli(argv, capsys)  # another setting: the job is made again
    assert code == 0 and err.count("note: --compile is ignored by the demo engine") == 1


def test_quiet_keeps_a_failed_jobs_line(clips: Path, capsys) -> None:
    argv = ["-q", "batch", str(clips / "jobs.jsonl"), "--out-dir", str(clips / "out")]
    code, _, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 2 and "[1/4]" not in err  # no progress, two errors
    assert lines[0].startswith("studio batch: bad.mp4: ") and "bad.wav" in lines[0]
    assert lines[1].startswith("studio batch: missing.mp4: ") and "missing.wav" in lines[1]


def test_each_jobs_stage_timings_are_its_own(clips: Path) -> None:
    """A renderer kept from job to job accumulates its stage clock: the report takes the
    difference (Ditto's split; the demo renderer's is the pipeline's own)."""
    from studio.render.pipeline import analyze, start_video

    class Clocked:
        def __init__(self, renderer) -> None:
            self.inner, self.total = renderer, 0.0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        @property
        def timings_ms(self) -> dict[str, float]:
            self.total += 100.0
            return {"warp_decode": self.total}

    from studio.audio.io import load_audio
    from studio.engines.demo.engine import DemoEngine

    s = RenderSettings(size=SIZE)
    engine = DemoEngine(s)
    renderer = Clocked(engine.renderer(s))
    result = analyze(load_audio(clips / "a.wav"), s, engine)
    for name in ("one.mp4", "two.mp4"):
        report = start_video(result, renderer, str(clips / name), s).finish()
        assert report["timings_ms"]["warp_decode"] == 100.0


def test_a_job_with_control_tracks_is_directed_by_them(clips: Path) -> None:
    (clips / "calm.json").write_text(json.dumps({"tracks": {"mouth": [{"t": 0, "value": 0}]}}))
    (clips / "broken.json").write_text(json.dumps({"tracks": {"mouth": [{"t": 0, "value": 9}]}}))
    lines = [
        {"audio": "a.wav", "size": SIZE, "output": "plain.mp4"},
        {"audio": "a.wav", "size": SIZE, "output": "calm.mp4", "controls": "calm.json"},
        {"audio": "a.wav", "size": SIZE, "output": "broken.mp4", "controls": "broken.json"},
    ]
    (clips / "jobs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    jobs = read_jobs(clips / "jobs.jsonl")
    assert jobs[1].controls == str(clips / "calm.json")
    report = run_batch(jobs, clips / "out", say=lambda _: None)
    assert [r["status"] for r in report["jobs"]] == ["done", "done", "failed"]
    assert "broken.json: mouth[0]: value 9" in report["jobs"][2]["error"]
    plain, calm = _frames(clips / "out" / "plain.mp4"), _frames(clips / "out" / "calm.mp4")
    assert any(not np.array_equal(a, b) for a, b in zip(plain, calm, strict=True))
    # the tracks file is part of what a finished job was made from: changed, it runs again
    (clips / "calm.json").write_text(json.dumps({"tracks": {"mouth": [{"t": 0, "value": 0.5}]}}))
    again = run_batch(read_jobs(clips / "jobs.jsonl"), clips / "out", say=lambda _: None)
    assert [r["status"] for r in again["jobs"]] == ["skipped", "done", "failed"]


def test_jobs_for_compositing_write_files_with_alpha_and_png_folders(tmp_path: Path) -> None:
    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.6)
    lines = [
        {"audio": "a.wav", "size": SIZE, "background": "transparent"},
        {"audio": "a.wav", "output": "seq.png", "size": SIZE, "background": "green"},
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    jobs = read_jobs(tmp_path / "jobs.jsonl")
    assert [j.name for j in jobs] == ["a.webm", "seq.png"]  # transparent: WebM by default
    out = tmp_path / "out"
    report = run_batch(jobs, out, say=lambda _: None)
    assert [r["status"] for r in report["jobs"]] == ["done", "done"]
    assert (out / "a.webm").is_file() and len(list((out / "seq").glob("seq_*.png"))) == 15
    again = run_batch(jobs, out, say=lambda _: None)
    assert [r["status"] for r in again["jobs"]] == ["skipped", "skipped"]  # the folder counts
    bad = {"audio": "a.wav", "output": "b.mp4", "background": "transparent"}
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(InputError, match=r"bad\.jsonl:1: output: .*no alpha channel"):
        read_jobs(tmp_path / "bad.jsonl")


@pytest.mark.parametrize("ahead", [True, False])
def test_the_next_job_is_analysed_while_this_one_renders(
    clips: Path, monkeypatch, ahead: bool
) -> None:
    """With AHEAD, a group's next job gets its motion on the analysis thread beside this
    job's render; without it every job is analysed in turn on the batch's thread. Every
    output is the one the job renders alone."""
    import threading
    import time

    import studio.batch.run as batch_run
    import studio.render.pipeline as pipeline

    jobs = read_jobs(clips / "jobs.jsonl")[:2]
    demo_speech_piece(clips, "c.wav", 2.2, 1.0)
    jobs += read_jobs(_jobs_file(clips, [{"audio": "c.wav", "size": SIZE}]))
    alone = {}
    for job in jobs:
        run_batch([job], clips / f"alone_{job.name}", say=lambda _: None)
        alone[job.name] = _frames(clips / f"alone_{job.name}" / job.name)
    events: list[tuple[str, str, float, str]] = []
    analyze, start_video = pipeline.analyze, pipeline.start_video

    def spy_analyze(audio, *a, **k):
        events.append(("analyse", Path(audio.path).stem, time.perf_counter(), _thread()))
        return analyze(audio, *a, **k)

    def spy_render(result, renderer, path, *a, **k):
        video = start_video(result, renderer, path, *a, **k)
        events.append(("rendered", Path(path).stem, time.perf_counter(), _thread()))
        return video

    def _thread() -> str:
        return threading.current_thread().name

    monkeypatch.setattr(pipeline, "analyze", spy_analyze)
    monkeypatch.setattr(pipeline, "start_video", spy_render)
    monkeypatch.setattr(batch_run, "AHEAD", ahead)
    report = run_batch(jobs, clips / "out", say=lambda _: None)
    assert [r["status"] for r in report["jobs"]] == ["done"] * 3
    when = {(kind, name): (t, thread) for kind, name, t, thread in events}
    assert not when["analyse", "a"][1].startswith("studio-analysis")  # the first opens it
    for this, nxt in (("a", "second"), ("second", "c")):
        source = "b" if nxt == "second" else nxt
        started, thread = when["analyse", source]
        assert thread.startswith("studio-analysis") == ahead
        assert (started < when["rendered", this][0]) == ahead  # while this one rendered
    for job in jobs:
        ours = _frames(clips / "out" / job.name)
        assert len(ours) == len(alone[job.name])
        differ = [
            (i, int(np.abs(a.astype(int) - b).max()))
            for i, (a, b) in enumerate(zip(ours, alone[job.name], strict=True))
            if not np.array_equal(a, b)
        ]
        assert not differ, f"{job.name}: (frame, largest difference) {differ[:8]}"


def test_a_jobs_file_is_finished_beside_the_next_jobs_render(clips: Path, monkeypatch) -> None:
    """The batch does not wait for x264's last frames: a job's file is finished on a thread
    of its own while the next job renders (held here until that render has begun: done one
    after the other, this would wait in vain), and every output is whole."""
    import threading

    import studio.render.pipeline as pipeline

    jobs = read_jobs(clips / "jobs.jsonl")[:2]
    next_began = threading.Event()
    finishes: list[tuple[str, str, bool, bool]] = []
    finish, start = pipeline.EncodingVideo.finish, pipeline.start_video

    def spy_finish(self, aside: bool = False) -> dict:
        name = Path(self.writer.path).name
        waited = name != "a.mp4" or next_began.wait(30)
        finishes.append((name, threading.current_thread().name, aside, waited))
        return finish(self, aside)

    def spy_start(result, renderer, path, *a, **k):
        if Path(path).name == "second.mp4":
            next_began.set()
        return start(result, renderer, path, *a, **k)

    monkeypatch.setattr(pipeline.EncodingVideo, "finish", spy_finish)
    monkeypatch.setattr(pipeline, "start_video", spy_start)
    report = run_batch(jobs, clips / "out", say=lambda _: None)
    assert [r["status"] for r in report["jobs"]] == ["done", "done"]
    assert [f[0] for f in finishes] == ["a.mp4", "second.mp4"]
    for name, thread, aside, waited in finishes:
        assert thread.startswith("studio-encode-tail") and aside and waited, name
    for rec in report["jobs"]:
        assert "encode_tail" in rec["timings_ms"]
        assert len(_frames(clips / "out" / rec["name"])) == rec["frames"]


def _jobs_file(folder: Path, lines: list[dict]) -> Path:
    path = folder / "more.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_progress_rates_the_speech_rendered_not_the_jobs_that_failed():
    """A failed job takes its speech off what is left, but the rate is of rendered speech:
    a batch whose first jobs fail fast does not claim to run many times real time."""
    from studio.batch.run import BatchProgress

    lines: list[str] = []
    p = BatchProgress(total=3, audio_total_s=30.0, say=lines.append)
    p.started -= 2.0  # two seconds into the batch
    p.job({"name": "a.mp4", "status": "failed", "error": "bad file"}, 10.0)
    assert lines[-1] == "[1/3] a.mp4: FAILED: bad file"
    p.job({"name": "b.mp4", "status": "done", "duration_s": 10.0, "wall_s": 1.0}, 10.0)
    rate = float(lines[-1].split("(")[1].split("x real time")[0])
    assert 4.0 < rate <= 5.0  # 10 s rendered in just over 2 s, not 20 s
    assert lines[-1].endswith(", ETA 0:02)")  # the 10 s left at that rate
    p.job({"name": "c.mp4", "status": "done", "duration_s": 10.0, "wall_s": 1.0}, 10.0)
    assert lines[-1].endswith("x real time so far)")  # nothing left: no "ETA 0:00"


def test_pace_is_the_rate_of_rendered_speech_and_the_time_left_at_it():
    """The CLI's lines and the queue window share one rule: no rate before anything is
    rendered, an ETA as a clock, none under half a second (never 'ETA 0:00')."""
    from studio.batch.run import pace

    assert pace(0.0, 60.0, 5.0) is None and pace(10.0, 60.0, 0.0) is None
    assert pace(30.0, 90.0, 3.0) == (10.0, "0:09")  # 90 s more at 10x
    assert pace(30.0, 4.0, 3.0) == (10.0, "")  # 0.4 s left: no ETA
    assert pace(30.0, -5.0, 3.0) == (10.0, "")  # more done than planned: nothing left


@pytest.mark.usefixtures("one_torch_thread")
def test_a_ditto_job_whose_avatar_has_no_face_fails_alone(
    ditto_assets: dict, tmp_path: Path, capsys
) -> None:
    """The issue's other bad input: an avatar without a face is that job's one-line failure;
    the job with a face is rendered by the Ditto engine (reduced random tree, CPU)."""
    from conftest import write_png

    from studio.fixtures.face_standins import face_image

    wall = write_png(tmp_path / "wall.png", face_image((200, 300), []))  # no face drawn
    audio = str(ditto_assets["audio"])
    lines = [
        {"audio": audio, "avatar": str(wall), "output": "wall.mp4"},
        {"audio": audio, "avatar": str(ditto_assets["face"]), "output": "face.mp4"},
    ]
    (tmp_path / "jobs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "out"
    argv = ["batch", str(tmp_path / "jobs.jsonl"), "--out-dir", str(out), "--checkpoints"]
    argv += [str(ditto_assets["tree"]), "--avatar-cache", str(tmp_path / "avatars")]
    argv += ["--steps", "2", "--device", "cpu", "--x264-preset", "ultrafast"]
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "Traceback" not in err
    report = json.loads((out / REPORT_FILE).read_text())
    wall_job, face_job = report["jobs"]
    assert wall_job["status"] == "failed" and "no face found in" in wall_job["error"]
    assert "wall.png" in wall_job["error"] and "wall.mp4" not in {p.name for p in out.iterdir()}
    assert face_job["status"] == "done" and len(_frames(out / "face.mp4")) == face_job["frames"]


def test_the_batch_builds_its_engines_for_every_jobs_frames(clips: Path, monkeypatch) -> None:
    """The engines are built knowing the frames of the whole batch (their cuDNN search pays
    off over many frames), not only the first job's."""
    from studio.engines.base import Renderer

    seen: list[tuple[int, int | None]] = []
    build = Renderer.build_engines

    def spy(self, frames, progress=None, ahead=None):
        seen.append((frames, ahead))
        return build(self, frames, progress, ahead)

    monkeypatch.setattr(Renderer, "build_engines", spy)
    jobs = read_jobs(clips / "jobs.jsonl")[:2]
    report = run_batch(jobs, clips / "out", say=lambda _: None)
    assert [r["status"] for r in report["jobs"]] == ["done"] * 2
    total = sum(round(r["duration_s"] * 25) for r in report["jobs"])
    assert [a for _, a in seen] == [total, total]
    assert all(f <= total for f, _ in seen)
