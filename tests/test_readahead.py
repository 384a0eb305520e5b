"""Files read into the page cache ahead of their use, on a thread of their own."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from studio.readahead import CHUNK, read_ahead


def test_every_file_is_read_once_and_what_cannot_be_read_is_passed_over(tmp_path, monkeypatch):
    import builtins

    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (2 * CHUNK + 5))  # three reads
    small = tmp_path / "small.bin"
    small.write_bytes(b"y")
    opened: list[str] = []
    reads: Counter[str] = Counter()  # reads that returned data, per file
    real_open = builtins.open

    class Counted:
        def __init__(self, f, name: str) -> None:
            self.f, self.name = f, name

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def fileno(self) -> int:
            return self.f.fileno()

        def readinto(self, buffer) -> int:
            n = self.f.readinto(buffer)
            reads[self.name] += bool(n)
            return n

    def counting_open(file, *args, **kwargs):
        opened.append(Path(file).name)
        return Counted(real_open(file, *args, **kwargs), Path(file).name)

    monkeypatch.setattr(builtins, "open", counting_open)
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: failures.append(a.exc_value))
    thread = read_ahead([tmp_path / "missing.bin", big, tmp_path, small])
    assert thread.daemon and thread.name == "read-ahead"
    thread.join(timeout=30)
    assert not thread.is_alive() and failures == []
    assert [n for n in opened if n.endswith(".bin")] == ["missing.bin", "big.bin", "small.bin"]
    assert reads == {"big.bin": 3, "small.bin": 1}
    # read once a process: an unchanged file is not read again, a changed one is
    small.write_bytes(b"yy")
    read_ahead([big, small]).join(timeout=30)
    assert reads == {"big.bin": 3, "small.bin": 2}


def test_a_ditto_engine_reads_its_weights_ahead_in_the_order_it_loads_them(
    ditto_assets, monkeypatch
):
    """Checked before any work, the engine's files go to the read-ahead thread: the networks
    and HuBERT as the engine opens them, the avatar's networks last (a cached avatar needs
    none)."""
    from studio.avatar.register import REGISTRATION_ROLES
    from studio.engines.base import EngineRequest
    from studio.engines.ditto import engine
    from studio.models.checkpoints import discover
    from studio.render.engines import prepare_engine
    from studio.settings import RenderSettings

    asked: list[list[Path]] = []
    monkeypatch.setattr(engine, "read_ahead", lambda paths: asked.append(list(paths)))
    tree = ditto_assets["tree"]
    request = EngineRequest(RenderSettings(backend="ditto"), str(tree), str(ditto_assets["face"]))
    prepare_engine(request)
    found = discover(tree)
    roles = (*engine.NETWORK_ROLES, "hubert", *REGISTRATION_ROLES)
    assert asked == [[found.path(role) for role in roles]]
    assert all(p.is_file() for p in asked[0])
