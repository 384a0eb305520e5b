"""`studio batch --ray`: the same jobs through Ray Data in a real local Ray instance (demo
engine, CPU actors), against the local path's videos."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

from conftest import demo_speech_piece  # noqa: E402
from test_batch import SIZE, _frames  # noqa: E402

from studio.batch.jobs import read_jobs  # noqa: E402
from studio.batch.ray_run import RaySetup, ray_runner  # noqa: E402
from studio.batch.run import REPORT_FILE, run_batch  # noqa: E402
from studio.batch.state import BatchState  # noqa: E402
from studio.errors import OptionError  # noqa: E402

pytestmark = pytest.mark.slow


def test_ray_actors_make_the_local_paths_videos(tmp_path: Path) -> None:
    demo_speech_piece(tmp_path, "a.wav", 0.0, 1.2)
    demo_speech_piece(tmp_path, "b.wav", 1.2, 1.0)
    (tmp_path / "bad.wav").write_text("not audio\n")
    lines = [{"audio": n, "size": SIZE} for n in ("a.wav", "b.wav", "bad.wav")]
    (tmp_path / "jobs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    jobs = read_jobs(tmp_path / "jobs.jsonl")
    local = run_batch(jobs, tmp_path / "local", say=lambda _: None)
    said: list[str] = []
    runner = ray_runner(RaySetup(actors=2, gpus_per_actor=0))
    remote = run_batch(jobs, tmp_path / "ray", say=said.append, runner=runner)
    status = {r["name"]: r["status"] for r in remote["jobs"]}
    assert status == {"a.mp4": "done", "b.mp4": "done", "bad.mp4": "failed"}
    assert remote["jobs"][2]["error"] == local["jobs"][2]["error"]
    assert len(said) == 3 and {r["actor"] for r in remote["jobs"]}  # ran in Ray's workers
    for name in ("a.mp4", "b.mp4"):
        ours, theirs = _frames(tmp_path / "ray" / name), _frames(tmp_path / "local" / name)
        assert len(ours) == len(theirs) > 0
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    report = json.loads((tmp_path / "ray" / REPORT_FILE).read_text())
    assert report["summary"]["done"] == 2 and report["summary"]["peak_host_mb"] > 0
    assert BatchState(tmp_path / "ray").jobs["a.mp4"]["status"] == "done"
    # the same state file: a rerun on Ray skips what is done, without starting Ray at all
    again = run_batch(jobs, tmp_path / "ray", say=said.append, runner=runner)
    assert [r["status"] for r in again["jobs"]] == ["skipped", "skipped", "failed"]


def test_more_actors_than_the_cluster_holds_is_a_clear_error(tmp_path: Path) -> None:
    demo_speech_piece(tmp_path, "a.wav", 0.0, 0.4)
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"audio": "a.wav", "size": SIZE}) + "\n")
    runner = ray_runner(RaySetup(actors=512, gpus_per_actor=0))
    with pytest.raises(OptionError, match="512 actors of 1 CPU need 512 CPUs; the cluster has"):
        run_batch(read_jobs(tmp_path / "jobs.jsonl"), tmp_path / "o", say=print, runner=runner)
    with pytest.raises(OptionError, match="--actors"):
        ray_runner(RaySetup(actors=0))
