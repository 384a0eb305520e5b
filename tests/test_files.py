"""Output files are written whole or not at all."""

from __future__ import annotations

import pytest

from studio.errors import OutputError
from studio.files import check_writable_folder, write_atomic


def test_write_atomic_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path) -> None:
    target = tmp_path / "a.json"
    write_atomic(target, "one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    write_atomic(tmp_path / "made" / "b.md", "x", make_parents=True)
    assert (tmp_path / "made" / "b.md").read_text() == "x"
    (tmp_path / "dir").mkdir()
    with pytest.raises(OutputError, match="cannot write .*dir"):
        write_atomic(tmp_path / "dir", "y")  # a folder cannot be replaced by a file
    with pytest.raises(OutputError, match="cannot write"):
        write_atomic(tmp_path / "missing" / "c.json", "z")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "dir", "made"]


def test_check_writable_folder(tmp_path) -> None:
    check_writable_folder(tmp_path, "--json")
    assert list(tmp_path.iterdir()) == []  # the probe is gone
    with pytest.raises(OutputError, match="--json: cannot write in"):
        check_writable_folder(tmp_path / "missing", "--json")
