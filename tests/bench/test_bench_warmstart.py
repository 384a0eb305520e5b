"""``studio bench --suite warmstart``: real new processes of the studio, timed whole."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np

from studio.bench.warmstart import check_outputs, run_process, to_markdown
from studio.cli import main as cli_main


def test_renders_and_a_batch_as_new_processes_with_their_figures(tmp_path: Path) -> None:
    js, md = tmp_path / "w.json", tmp_path / "w.md"
    argv = ["bench", "--suite", "warmstart", "--engine", "demo", "--clips", "0.6,1"]
    argv += ["--batch-jobs", "2", "--batch-seconds", "0.6", "--size", "96", "--device", "cpu"]
    # the same jobs analysed ahead, and through a real local Ray instance
    argv += ["--batch-runs", "local,ahead,ray:1"]
    argv += ["--x264-preset", "ultrafast", "--json", str(js), "--markdown", str(md)]
    assert cli_main(argv) == 0
    data = json.loads(js.read_text())
    rows = {r["row"]: r for r in data["rows"]}
    batches = [f"batch 2 x speech_0.6s ({way})" for way in ("local", "ahead", "ray:1")]
    assert list(rows) == ["render 0.6 s", "render 1 s", *batches]
    for name in ("render 0.6 s", "render 1 s"):
        r = rows[name]
        assert r["exit"] == 0 and r["wall_s"] > 0 and r["peak_host_mb"] > 50  # torch is in it
        assert r["frames"] == round(float(name.split()[1]) * 25)
        assert set(r["warmup_ms"]) == {
            "inputs",
            "imports",
            "open_engine",
            "renderer",
            "build_engines",
        }
        # the interpreter and imports, before the engine opens: part of the wall, not all
        assert 0 < r["startup_ms"] < r["wall_s"] * 1000.0
        # the wall is the start, the command's total, its report, and the exit (10 ms steps)
        parts = r["startup_ms"] + r["timings_ms"]["total"] + r["report_ms"] + r["exit_ms"]
        assert r["report_ms"] > 0 and r["exit_ms"] >= 0
        assert abs(parts - r["wall_s"] * 1000.0) < 50.0, (parts, r["wall_s"])
        assert "target_s" not in r  # the targets are for 10 s and 60 s clips
        assert r["compiled"] is None  # the demo engine compiles nothing
    for name in batches:
        batch = rows[name]
        assert batch["exit"] == 0 and batch["done"] == 2 and batch["failed"] == 0, batch
        assert batch["valid"] and batch["problems"] == []
        assert batch["realtime"] == round(batch["audio_s"] / batch["wall_s"], 2)
        assert batch["meets_target"] is (batch["realtime"] >= 15.0)
    assert data["config"]["batch_runs"] == ["local", "ahead", "ray:1"]
    # ahead: the second job's motion was made while the first rendered (STUDIO_BATCH_AHEAD=1)
    assert [rows[name]["analysed_ahead"] for name in batches] == [0, 1, 0]
    text = md.read_text()
    assert text.startswith("## New processes against the caches on disk")
    assert "| render 1 s | ok |" in text and "x real time" in text


def test_a_batch_output_that_does_not_decode_or_lost_frames_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.mp4"
    with av.open(str(good), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width = s.height = 32
        s.pix_fmt = "yuv420p"
        for _ in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    jobs = [
        {"name": "a", "status": "done", "output": str(good), "frames": 3},
        {"name": "b", "status": "done", "output": str(good), "frames": 4},
        {"name": "c", "status": "done", "output": str(bad), "frames": 3},
        {"name": "d", "status": "failed", "error": "no face in x.png"},
    ]
    problems = check_outputs({"jobs": jobs})
    assert [p.split(":")[0] for p in problems] == ["b", "c", "d"]
    assert "3 frames decoded, 4 recorded" in problems[0]
    assert "does not decode" in problems[1] and "no face in x.png" in problems[2]


def test_a_process_past_its_time_is_killed_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "gui.log"
    run = run_process(["live", "--demo", "--help-nothing"], log, timeout=60)
    assert run["exit"] == 2  # a bad option: argparse's status, the process's own
    run = run_process(["render", "--demo", "--out", str(tmp_path / "x.mp4")], log, timeout=0.3)
    assert run["exit"] is None and run["wall_s"] < 5
    assert not (tmp_path / "x.mp4").exists()


def test_a_kept_process_leaves_its_log_and_profile_and_a_failure_is_said(
    tmp_path: Path, capsys
) -> None:
    """--keep DIR: each process's log there as it ends, with --profile its main thread's
    profile (the command's own calls in it) and a summary; a failed render's last line is in
    the suite's progress, not only in the table written at its end."""
    keep = tmp_path / "kept"
    argv = ["bench", "--suite", "warmstart", "--engine", "demo", "--clips", "0.6"]
    argv += ["--batch-jobs", "0", "--size", "96", "--device", "cpu", "--x264-preset", "ultrafast"]
    assert cli_main([*argv, "--keep", str(keep), "--profile"]) == 0
    assert sorted(p.name for p in keep.iterdir()) == ["r0.6.log", "r0.6.prof", "r0.6.txt"]
    summary = (keep / "r0.6.txt").read_text()
    assert "cmd_render" in summary and "Ordered by: cumulative time" in summary
    capsys.readouterr()
    bad = tmp_path / "bad"  # a size the renderer refuses: the process ends with status 2
    assert cli_main([*argv[:-4], "--size", "7", "--keep", str(bad)]) == 0
    err = capsys.readouterr().err
    assert "[warmstart] render 0.6 s: exit 2: " in err
    assert "--size" in (bad / "r0.6.log").read_text()


def test_the_table_shows_targets_and_failures() -> None:
    result = {
        "facts": {"name": "GPU", "torch": "2", "date": "d", "commit": "c"},
        "config": {
            "engine": "ditto",
            "reduced": False,
            "compile": True,
            "size": 512,
            "x264_preset": "veryfast",
        },
        "rows": [
            {
                "row": "prebuild",
                "exit": 1,
                "wall_s": 3.0,
                "peak_host_mb": 900.0,
                "last_line": "boom",
            },
            {
                "row": "prebuild (cache kept)",
                "exit": None,
                "wall_s": 300.0,
                "peak_host_mb": 900.0,
                "last_line": "  warnings.warn(",
                "compiled": ["decoder-fp16-b32 (artifact)"],
            },
            {
                "row": "render 60 s",
                "exit": 0,
                "wall_s": 7.5,
                "peak_host_mb": 2000.0,
                "render_fps": 300.0,
                "startup_ms": 2000.0,
                "warmup_ms": {"open_engine": 1000.0},
                "timings_ms": {"render": 4500.0, "total": 4500.0},
                "report_ms": 300.0,
                "exit_ms": 700.0,
                "target_s": 8.0,
                "meets_target": True,
                "compiled": ["loaded", "off"],
            },
        ],
        "notes": [],
    }
    text = to_markdown(result)
    assert "| prebuild | exit 1: boom | 3.00 s |" in text
    killed = "| prebuild (cache kept) | killed at the --timeout (300 s) | 300.00 s |"
    assert killed in text and "compiled engines: decoder-fp16-b32 (artifact) |" in text
    text_split = "startup 2.00, open_engine 1.00, render 4.50, report 0.30, exit 0.70"
    assert f"{text_split}; compiled engines: loaded |" in text
    assert "≤ 8 s: met" in text


def test_bad_options_are_one_line_before_any_process_runs(tmp_path: Path, capsys) -> None:
    for argv, said in (
        (["--checkpoints", str(tmp_path / "none")], "is not a folder"),
        (["--clips", "abc"], "is not a list of numbers"),
        (["--batch-runs", "local,ray:x"], "is not local, ahead or ray:N"),
        (["--engine", "demo", "--clips", "0.2"], "too short"),
        (["--engine", "demo", "--profile"], "give --keep DIR"),
    ):
        assert cli_main(["bench", "--suite", "warmstart", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err


def test_a_list_option_that_is_not_numbers_is_named(capsys) -> None:
    """The suites' lists of numbers share one parser: a bad item names its option."""
    for argv, said in (
        (["--suite", "streaming", "--streams", "1,two"], "--streams: '1,two' is not a list"),
        (["--suite", "warmstart", "--clips", "ten"], "--clips: 'ten' is not a list"),
    ):
        assert cli_main(["bench", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err


def test_the_prebuild_row_names_the_engines_it_left(tmp_path: Path) -> None:
    from studio.bench.warmstart import kept_engines

    aot = tmp_path / "compiled" / "aot"
    aot.mkdir(parents=True)
    for name in (
        "warp_network-fp16-b32-0123456789abcdef.art",
        "warp_network-fp16-b32-0123456789abcdef.art.json",
        "decoder-fp16-b1-fedcba9876543210.pt2",
        "decoder-fp16-b2-fedcba9876543210.art.failed.json",
        ".decoder-fp16-b2-fedcba9876543210.art.77.partial.art",
        "probe-0011223344556677.json",
    ):
        (aot / name).write_text("x")
    assert kept_engines(tmp_path) == [
        "decoder-fp16-b1 (package)",
        "warp_network-fp16-b32 (artifact)",
    ]
    assert kept_engines(tmp_path / "none") == []


def test_a_sampled_process_says_its_steps_in_order_and_where_each_thread_was(
    tmp_path: Path,
) -> None:
    """--sample: py-spy samples each process from outside (every thread, waits included);
    the summary names the main thread's steps in the order they ran."""
    keep = tmp_path / "kept"
    argv = ["bench", "--suite", "warmstart", "--engine", "demo", "--clips", "0.6"]
    argv += ["--batch-jobs", "0", "--size", "96", "--device", "cpu", "--x264-preset", "ultrafast"]
    assert cli_main([*argv, "--keep", str(keep), "--sample"]) == 0
    assert sorted(p.name for p in keep.iterdir()) == [
        "r0.6.log",
        "r0.6.samples.txt",
        "r0.6.speedscope.json",
    ]
    text = (keep / "r0.6.samples.txt").read_text()
    main = text.split("== ")[1]  # the main thread's part comes first
    assert json.loads((keep / "r0.6.speedscope.json").read_text())["profiles"]
    steps = [ln.split(" s  ", 1)[1] for ln in main.splitlines()[1:] if " s  " in ln]
    # the two long steps (a step under 50 ms, as starting the video can be, is folded away)
    prepared = next(i for i, s in enumerate(steps) if s.startswith("_prepare_engine > prep"))
    opened = next(i for i, s in enumerate(steps) if s.startswith("_open_engine"))
    assert prepared < opened
    assert text.count("== Thread") >= 2  # the others (the encoder's, the VAD's) sampled too


def test_sampling_without_py_spy_is_one_line(monkeypatch, capsys) -> None:
    import shutil
    import sys

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n: None if n == "py-spy" else real(n))
    monkeypatch.setattr(sys, "executable", "/nowhere/python")  # none beside it either
    assert cli_main(["bench", "--suite", "warmstart", "--engine", "demo", "--sample"]) == 2
    err = capsys.readouterr().err
    assert "give --keep DIR" in err and "Traceback" not in err
    argv = ["bench", "--suite", "warmstart", "--engine", "demo", "--sample", "--keep", "k"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "needs py-spy: pip install py-spy" in err and "Traceback" not in err


def test_the_summary_finds_the_main_thread_wherever_py_spy_lists_it(tmp_path: Path) -> None:
    """py-spy may list another thread first, and names the main thread only in the samples
    taken once Python named it: the summary still starts with the main thread's steps."""
    from studio.bench.warmstart import write_sample_summary

    cli = "/x/studio/cli.py"
    frames = [
        {"name": "thread (7): import-aside", "file": "<thread>"},
        {"name": "run", "file": "/x/studio/imports.py", "line": 27},
        {"name": "thread (5)", "file": "<thread>"},
        {"name": "thread (5): MainThread", "file": "<thread>"},
        {"name": "_run_module_as_main", "file": "<frozen runpy>"},
        {"name": "cmd_render", "file": cli, "line": 10},
        {"name": "analyze", "file": "/x/studio/render/pipeline.py", "line": 1},
        {"name": "start_video", "file": "/x/studio/render/pipeline.py", "line": 2},
    ]
    step = 0.005
    aside = [[0, 1]] * 10
    main = [[2, 4, 5, 6]] * 20 + [[3, 4, 5, 6]] * 40 + [[3, 4, 5, 7]] * 80

    def prof(name: str, samples: list[list[int]]) -> dict:
        return {"name": name, "samples": samples, "weights": [step] * len(samples)}

    data = {
        "shared": {"frames": frames},
        "profiles": [prof('Thread 7 "import-aside"', aside), prof('Thread 5 ""', main)],
    }
    (tmp_path / "s.json").write_text(json.dumps(data))
    write_sample_summary(tmp_path / "s.json", tmp_path / "s.txt")
    first = (tmp_path / "s.txt").read_text().split("== ")[1]
    assert first.startswith('Thread 5 "": 0.70 s sampled')
    steps = [ln.split(" s  ", 1)[1] for ln in first.splitlines()[1:3]]
    assert steps == ["cmd_render > analyze", "cmd_render > start_video"]


def test_inputs_kept_in_the_cache_are_written_once(tmp_path: Path, monkeypatch) -> None:
    """With a kept --cache the random tree and face are written once and reused by later runs
    (as a user's checkpoint folder is: what the studio keeps by a file's path and time serves
    a later run's first render too); a tree a stopped run left unfinished, other fixtures
    wrote, or whose record is damaged, is written again."""
    from studio.bench import warmstart
    from studio.bench.warmstart import _inputs

    kept = tmp_path / "cache" / "bench-inputs"

    def inputs(work: str) -> tuple[list[str], dict, dict]:
        (tmp_path / work).mkdir()
        return _inputs(tmp_path / work, "ditto", None, True, "standin", [0.5], kept)

    args, hub, speech = inputs("w1")
    files = sorted(p for p in kept.rglob("*") if p.is_file())
    times = [p.stat().st_mtime_ns for p in files]
    assert any(p.suffix == ".onnx" for p in files) and speech[0.5].parent == tmp_path / "w1"
    again, hub2, _ = inputs("w2")
    assert (again, hub2) == (args, hub)
    assert [p.stat().st_mtime_ns for p in files] == times  # nothing written again
    (kept / "reduced-standin" / "inputs.json").unlink()  # as a run stopped while writing
    third, _, _ = inputs("w3")
    assert third == args and (kept / "reduced-standin" / "inputs.json").is_file()
    assert files[0].stat().st_mtime_ns != times[0]
    times = [p.stat().st_mtime_ns for p in files]
    monkeypatch.setattr(warmstart, "_inputs_code", lambda: "other fixtures")
    assert inputs("w4")[1] == hub and files[0].stat().st_mtime_ns != times[0]
    times = [p.stat().st_mtime_ns for p in files]
    for damaged in ("{not json", "[]"):
        (kept / "reduced-standin" / "inputs.json").write_text(damaged)
        assert inputs(f"w5{len(damaged)}")[1] == hub and files[0].stat().st_mtime_ns != times[0]
        times = [p.stat().st_mtime_ns for p in files]
