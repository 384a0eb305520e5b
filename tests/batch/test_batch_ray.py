"""`studio batch --ray`: the same jobs through Ray Data in a real local Ray instance (demo
engine, CPU actors), against the local path's videos.

Ray runs in a `studio batch` child process, as a user runs it: its threads, gRPC channels
and handlers never live in the test process that later drives Qt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from conftest import demo_speech_piece, run_cli  # noqa: E402
from test_batch import SIZE, _frames  # noqa: E402

from studio.batch.jobs import read_jobs  # noqa: E402
from studio.batch.ray_run import RaySetup, ray_runner  # noqa: E402
from studio.batch.run import REPORT_FILE, run_batch, summary_table  # noqa: E402
from studio.batch.state import BatchState  # noqa: E402
from studio.errors import OptionError  # noqa: E402

pytestmark = pytest.mark.slow
RAY_TIMEOUT_S = 300


def _batch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "studio", "batch", *argv],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=RAY_TIMEOUT_S,
    )


def test_ray_actors_make_the_local_paths_videos(tmp_path: Path) -> None:
    demo_speech_piece(tmp_path, "a.wav", 0.0, 1.2)
    demo_speech_piece(tmp_path, "b.wav", 1.2, 1.0)
    (tmp_path / "bad.wav").write_text("not audio\n")
    lines = [{"audio": n, "size": SIZE} for n in ("a.wav", "b.wav", "bad.wav")]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    local = run_batch(read_jobs(jobs), tmp_path / "local", say=lambda _: None)
    ray_out = tmp_path / "ray"
    args = (str(jobs), "--out-dir", str(ray_out), "--ray", "--actors", "2")
    done = _batch(*args, "--gpus-per-actor", "0")
    assert done.returncode == 1, done.stderr  # a job failed: bad.wav
    assert "Traceback" not in done.stdout + done.stderr
    assert "Warning" not in done.stderr  # Ray's own notes are not the user's concern
    report = json.loads((ray_out / REPORT_FILE).read_text())
    status = {r["name"]: r["status"] for r in report["jobs"]}
    assert status == {"a.mp4": "done", "b.mp4": "done", "bad.mp4": "failed"}
    assert report["jobs"][2]["error"] == local["jobs"][2]["error"]
    assert all(r.get("actor") for r in report["jobs"])  # ran in Ray's workers
    for name in ("a.mp4", "b.mp4"):
        ours, theirs = _frames(ray_out / name), _frames(tmp_path / "local" / name)
        assert len(ours) == len(theirs) > 0
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert report["summary"]["done"] == 2 and report["summary"]["peak_host_mb"] > 0
    actors = report["summary"]["actors"]  # each rendering actor's jobs and peak memory
    assert {a["actor"] for a in actors} == {
        r["actor"] for r in report["jobs"] if r["status"] == "done"
    }
    assert sum(a["jobs"] for a in actors) == 2 and all(a["peak_host_mb"] > 100 for a in actors)
    table = summary_table(report)
    assert all(f"actor {a['actor']}: {a['jobs']} job" in table for a in actors)
    assert BatchState(ray_out).jobs["a.mp4"]["status"] == "done"
    # the same state file: a rerun on Ray skips what is done, without starting Ray at all
    runner = ray_runner(RaySetup(actors=2, gpus_per_actor=0))
    again = run_batch(read_jobs(jobs), ray_out, say=lambda _: None, runner=runner)
    assert [r["status"] for r in again["jobs"]] == ["skipped", "skipped", "failed"]
    import ray

    assert not ray.is_initialized()


def test_more_actors_than_the_cluster_holds_is_a_clear_error(tmp_path: Path) -> None:
    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.4)
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"audio": "a.wav", "size": SIZE}) + "\n")
    jobs, out = str(tmp_path / "jobs.jsonl"), str(tmp_path / "o")
    refused = _batch(jobs, "--out-dir", out, "--ray", "--actors", "512", "--gpus-per-actor", "0")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "512 actors of 1 CPU need 512 CPUs; the cluster has" in refused.stderr
    assert not (tmp_path / "o").exists()  # refused before any job: no folder, no report
    refused = _batch(jobs, "--out-dir", out, "--ray", "--gpus-per-actor", "1")  # no GPU here
    assert refused.returncode == 2 and "give --gpus-per-actor 0 to run on CPUs" in refused.stderr
    with pytest.raises(OptionError, match="--actors"):
        ray_runner(RaySetup(actors=0))


def test_a_cluster_address_nothing_answers_at_is_one_line_before_any_file(tmp_path, capsys):
    """Ray would retry an unreachable head for minutes: it is tried first, and the batch
    writes nothing."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo_speech_piece(tmp_path, "a.wav", 0.0, 1.0)
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["batch", str(tmp_path), "--demo", "--out-dir", str(out), "--ray", f"127.0.0.1:{port}"],
        capsys,
    )
    assert code == 2 and f"nothing answers at 127.0.0.1:{port}" in err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("address", ["head", "127.0.0.1", "http://127.0.0.1:6379", "h:p"])
def test_what_is_no_cluster_address_is_refused_before_any_work(tmp_path, capsys, address):
    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.4)
    out = tmp_path / "out"
    code, _, err = run_cli(
        ["batch", str(tmp_path), "--demo", "--out-dir", str(out), "--ray", address], capsys
    )
    assert code == 2 and f"--ray: {address!r} is not a cluster's address: give HOST:PORT" in err
    assert "Traceback" not in err and not out.exists()


def test_an_address_where_something_else_listens_is_one_line_after_a_while(
    tmp_path: Path, monkeypatch
) -> None:
    """Something that is not Ray's head answers at the address (Ray's connect would retry
    for ever): the batch gives up after CONNECT_TIMEOUT_S, kills its driver and leaves no
    folder or report."""
    import contextlib
    import socket
    import threading

    from studio.batch import ray_run
    from studio.errors import StudioError

    monkeypatch.setattr(ray_run, "CONNECT_TIMEOUT_S", 3.0)
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []  # accepted, never answered

    def hold() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.4)
    out = tmp_path / "out"
    address = f"127.0.0.1:{server.getsockname()[1]}"
    runner = ray_runner(RaySetup(address, gpus_per_actor=0))
    try:
        with pytest.raises(StudioError, match="no Ray cluster answered within 3 s"):
            run_batch(read_jobs(str(tmp_path)), out, say=lambda _: None, runner=runner)
    finally:
        server.close()
    assert held and not out.exists()


def _stat(pid: str) -> tuple[bytes, int, int]:
    """(command line, parent pid, process group) of a process; empty when it is gone."""
    try:
        cmd = (Path("/proc") / pid / "cmdline").read_bytes()
        fields = (Path("/proc") / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return b"", 0, 0
    return cmd, int(fields[1]), int(fields[2])


def _processes() -> dict[int, tuple[bytes, int, int]]:
    found = {int(p.name): _stat(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    return {pid: facts for pid, facts in found.items() if facts[0]}


def _ray_processes(kind: bytes = b"") -> set[int]:
    """The pids of Ray's own processes on this machine (its daemons and agents; with
    ``kind``, those whose command line holds it)."""
    found = set()
    for pid, (cmd, _, _) in _processes().items():
        ray = b"raylet" in cmd or b"gcs_server" in cmd or b"ray::" in cmd or b"/ray/" in cmd
        if ray and kind in cmd:
            found.add(pid)
    return found


def test_ctrl_c_while_ray_starts_leaves_none_of_its_processes(tmp_path: Path) -> None:
    """Interrupted inside ``ray.init`` (its raylet up and spawning its agents, the driver not
    yet connected: what left two agents orphaned before), the local instance still goes."""
    import signal
    import time

    from conftest import sigint_as_from_a_terminal

    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.4)
    before = _ray_processes()
    child = subprocess.Popen(
        [sys.executable, "-m", "studio", "batch", str(tmp_path), "--demo", "--size", str(SIZE)]
        + ["--out-dir", str(tmp_path / "o"), "--ray", "--gpus-per-actor", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_from_a_terminal,
    )
    deadline = time.monotonic() + 120
    while not (_ray_processes(b"raylet") - before) and child.poll() is None:
        assert time.monotonic() < deadline, "Ray's raylet never started"
        time.sleep(0.05)
    time.sleep(1.0)  # its agents starting (here a start takes 2-3 s more)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=RAY_TIMEOUT_S)
    assert child.returncode == 130 and "Traceback" not in err, err
    deadline = time.monotonic() + 30
    while _ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes() - before, "Ray processes outlived the interrupted batch"


def _batch_with_its_driver(tmp_path: Path) -> tuple[subprocess.Popen[str], int, Path]:
    """A `studio batch --ray` of one demo clip, once its Ray driver's instance has its agents
    up: (the batch's process, its driver's pid, the output folder)."""
    import time

    demo_speech_piece(tmp_path, "a.wav", 0.0, 1.0)
    out = tmp_path / "o"
    child = subprocess.Popen(
        [sys.executable, "-m", "studio", "batch", str(tmp_path), "--demo", "--size", str(SIZE)]
        + ["--out-dir", str(out), "--ray", "--gpus-per-actor", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline, driver, group = time.monotonic() + 120, 0, {}
    while not any(b"Agent" in cmd for cmd, _, _ in group.values()) and child.poll() is None:
        assert time.monotonic() < deadline, "Ray's agents never started"
        time.sleep(0.05)
        procs = _processes()
        driver = driver or next(
            (p for p, (cmd, parent, _) in procs.items() if parent == child.pid), 0
        )
        group = {p: f for p, f in procs.items() if driver and f[2] == driver}
    assert b"studio.batch.ray_driver" in group[driver][0]
    return child, driver, out


def _group_left(driver: int) -> list[str]:
    """The pids and command lines of the processes left in the driver's group."""
    return [
        f"{pid} {cmd[:120]!r}" for pid, (cmd, _, group) in _processes().items() if group == driver
    ]


def _group_gone(driver: int, wait_s: float = 0.0) -> bool:
    """Whether no process is left in the driver's process group (within ``wait_s``)."""
    import time

    deadline = time.monotonic() + wait_s
    while any(f[2] == driver for f in _processes().values()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def test_a_ray_driver_that_dies_mid_batch_is_one_line_and_the_batch_keeps_its_report(
    tmp_path: Path,
) -> None:
    """Ray's driver is a child of the batch in a process group of its own: killed (or
    crashing in Ray's teardown), the batch still ends with its report and one line (the
    driver's stderr in the error's log file), and its local instance's processes go too."""
    import os
    import signal

    child, driver, out = _batch_with_its_driver(tmp_path)
    os.kill(driver, signal.SIGKILL)
    _, err = child.communicate(timeout=RAY_TIMEOUT_S)
    assert child.returncode == 1 and "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert "Ray's driver process died of signal 9 mid-batch; the finished jobs are kept" in line
    log = Path(line.split(" — details in ", 1)[1])
    assert "Ray's driver process died of signal 9; on stderr it said:" in log.read_text()
    report = json.loads((out / REPORT_FILE).read_text())
    assert [r["status"] for r in report["jobs"]] == ["pending"]
    assert not list(out.glob("*.mp4"))
    assert _group_gone(driver), "Ray processes outlived their driver"


def test_a_batch_killed_outright_takes_its_ray_driver_and_instance_with_it(
    tmp_path: Path,
) -> None:
    """The OOM killer or SIGKILL gives the batch no chance to stop its driver: the driver
    sees its parent gone and kills its process group (itself and its local instance)."""
    import os
    import signal

    child, driver, out = _batch_with_its_driver(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=RAY_TIMEOUT_S)
    assert _group_gone(driver, wait_s=10.0), (
        f"the driver and its instance outlived the batch: {_group_left(driver)}"
    )
    assert not (out / "a.mp4").exists()  # stopped then, not after rendering on for nobody
