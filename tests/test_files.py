"""Output files are written whole or not at all."""

from __future__ import annotations

import pytest

from studio.errors import OutputError
from studio.files import check_writable_folder, unused_name, write_atomic


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


def test_unused_name_suggests_the_next_free_number(tmp_path) -> None:
    target = tmp_path / "talk.mp4"
    assert unused_name(target) == target  # free: itself
    target.write_bytes(b"x")
    assert unused_name(target) == tmp_path / "talk_2.mp4"
    (tmp_path / "talk_2.mp4").write_bytes(b"x")
    (tmp_path / "talk_3.mp4").write_bytes(b"x")
    assert unused_name(target) == tmp_path / "talk_4.mp4"
    assert unused_name(tmp_path / "talk_2.mp4") == tmp_path / "talk_4.mp4"
