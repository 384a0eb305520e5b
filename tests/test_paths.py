"""Where the caches live (studio.paths), and the build lock that makes processes build once."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
from conftest import slow_down

from studio import paths


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No studio or compiler cache variables; XDG_CACHE_HOME under tmp_path."""
    for name in (paths.CACHE_ENV, paths.ENGINE_ENV, paths.AVATAR_ENV, *paths.COMPILED_ENVS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_every_cache_sits_under_the_user_cache_folder_by_default(clean_env: Path) -> None:
    root = clean_env / "xdg" / paths.APP_NAME
    assert paths.cache_root() == root
    assert paths.avatar_cache_dir() == root / "avatars"
    assert paths.engine_cache_dir() == root / "engines"
    assert paths.compiled_cache_dir() == root / "compiled"
    assert paths.log_dir() == root / "logs"
    assert paths.lock_dir() == root / "locks"
    assert not root.exists()  # naming a folder creates nothing


def test_the_root_variable_moves_everything_and_narrow_variables_win(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from studio.avatar import register  # the older entry points follow the same rules
    from studio.runtime import base

    monkeypatch.setenv(paths.CACHE_ENV, str(clean_env / "root"))
    assert register.default_cache_dir() == clean_env / "root" / "avatars"
    assert base.default_cache_dir() == clean_env / "root" / "engines"
    monkeypatch.setenv(paths.ENGINE_ENV, str(clean_env / "shared-engines"))
    monkeypatch.setenv(paths.AVATAR_ENV, str(clean_env / "faces"))
    assert paths.engine_cache_dir() == clean_env / "shared-engines"
    assert paths.avatar_cache_dir() == clean_env / "faces"
    assert paths.log_dir() == clean_env / "root" / "logs"


def test_use_cache_root_sets_the_variable_for_the_block_only(clean_env: Path) -> None:
    import os

    with paths.use_cache_root(clean_env / "cli"):
        assert os.environ[paths.CACHE_ENV] == str(clean_env / "cli")
        assert paths.engine_cache_dir() == clean_env / "cli" / "engines"
    assert paths.CACHE_ENV not in os.environ
    with paths.use_cache_root(None):
        assert paths.CACHE_ENV not in os.environ


def test_compiled_caches_are_placed_unless_the_user_placed_them(clean_env: Path) -> None:
    env: dict[str, str] = {"TRITON_CACHE_DIR": "/mine"}
    placed = paths.place_compiled_caches(env)
    inductor = str(paths.compiled_cache_dir() / "inductor")
    assert placed == {"TORCHINDUCTOR_CACHE_DIR": inductor}
    assert env == {"TRITON_CACHE_DIR": "/mine", "TORCHINDUCTOR_CACHE_DIR": inductor}


def test_write_log_keeps_the_newest_files(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "KEEP_LOGS", 3)
    written = [paths.write_log("studio-error", f"log {i}\n") for i in range(5)]
    assert len(set(written)) == 5  # one file each, even within the same second
    assert all(p.parent == paths.log_dir() for p in written)
    kept = sorted(paths.log_dir().glob("studio-error-*.log"))
    assert len(kept) == 3 and written[-1] in kept
    assert written[-1].read_text() == "log 4\n"


def _build_once(target: str, counter: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    """A cache build as the studio does one: check, lock, check again, build (slowly)."""
    import logging

    logging.basicConfig(level=logging.INFO)
    out = Path(target)
    barrier.wait()
    if out.exists():
        return
    with paths.build_lock(out):
        if out.exists():
            return
        with open(counter, "a") as f:
            f.write("built\n")
        time.sleep(1.0)  # a long build: the other process arrives while it runs
        out.write_text("engine")


def test_two_processes_on_a_cold_cache_build_once(clean_env: Path) -> None:
    target, counter = clean_env / "cache" / "x.engine", clean_env / "builds.txt"
    target.parent.mkdir()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_build_once, args=(str(target), str(counter), barrier)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counter.read_text() == "built\n" and target.read_text() == "engine"
    assert [p.name for p in target.parent.iterdir()] == ["x.engine"]  # the lock lives apart


def test_build_lock_runs_unlocked_where_no_lock_file_can_be_made(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(target: Path) -> Path:
        raise OSError("read-only")

    monkeypatch.setattr(paths, "_lock_file", refuse)
    ran = []
    with paths.build_lock(clean_env / "x"):
        ran.append(True)
    assert ran == [True]


def _register_in_a_process(image: str, tree: str, cache: str, barrier, results) -> None:
    """One process of the cold avatar cache race; the build slowed down so that the other
    process arrives while it runs."""
    import torch

    import studio.avatar.register as reg
    from studio.models.checkpoints import discover

    torch.set_num_threads(1)
    slow_down(reg, "_build")
    stages: list[str] = []
    barrier.wait()
    avatar = reg.register_avatar(
        image, discover(tree), cache_dir=cache, progress=lambda s, d, t: stages.append(s)
    )
    results.put((avatar.cached, str(avatar.folder), stages[0]))


def test_two_processes_register_the_same_avatar_once(clean_env: Path) -> None:
    pytest.importorskip("onnxruntime")
    from conftest import write_png

    from studio.fixtures.face_standins import face_image, write_aux_standins
    from studio.fixtures.random_tree import write_checkpoint_tree

    tree = write_checkpoint_tree(
        clean_env / "ckpt",
        reduced=True,
        networks=("appearance_extractor", "motion_extractor"),
        cfg=False,
    )
    write_aux_standins(tree)
    image = write_png(clean_env / "face.png", face_image((360, 300), [(90, 40, 270, 260)]))
    cache = clean_env / "avatars"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    args = (str(image), str(tree), str(cache), barrier, results)
    procs = [ctx.Process(target=_register_in_a_process, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    (built, reused) = got[0], got[1]  # False sorts first: one built, the other reopened
    assert built[0] is False and reused[0] is True and built[1] == reused[1]
    assert built[2] == "registering avatar" and reused[2].endswith("reused from cache")
    assert [p.name for p in cache.iterdir()] == [Path(built[1]).name]  # the lock lives apart
