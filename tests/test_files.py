"""Output files are written whole or not at all."""

from __future__ import annotations

import pytest

from studio.errors import OutputError
from studio.files import check_writable_folder, file_in_the_way, unused_name, write_atomic


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


def test_write_atomic_syncs_the_file_then_its_folder(tmp_path, monkeypatch) -> None:
    import os
    import stat

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_atomic(tmp_path / "a.json", "{}")
    assert synced == ["file", "folder"]  # the data before the rename is made durable


def test_long_but_legal_names_are_written_and_too_long_ones_say_so(tmp_path) -> None:
    from studio.files import check_file_name, check_output_file

    longest = tmp_path / ("n" * 250 + ".json")  # 255 bytes: the most ext4 takes
    write_atomic(longest, "x")
    assert longest.read_text() == "x" and check_output_file(longest, "--json") == longest
    assert [p.name for p in tmp_path.iterdir()] == [longest.name]  # no partial left
    too_long = tmp_path / ("n" * 251 + ".json")
    with pytest.raises(OutputError, match="--json .*file name too long"):
        check_file_name(too_long, "--json")
    with pytest.raises(OutputError, match="file name too long"):
        write_atomic(too_long, "x")
    with pytest.raises(OutputError, match="file name too long"):
        check_output_file(too_long, "--json")


def test_an_output_is_never_an_input_through_symlinks_and_hard_links(tmp_path) -> None:
    import os

    from studio.files import check_output_file

    audio = tmp_path / "speech.wav"
    audio.write_bytes(b"RIFF")
    link = tmp_path / "link.json"
    link.symlink_to(audio)
    hard = tmp_path / "hard.json"
    os.link(audio, hard)
    inputs = {"--audio": str(audio), "--avatar": None}
    for target in (audio, link, hard):
        with pytest.raises(OutputError, match="also the --audio file and would be overwritten"):
            check_output_file(target, "--report", inputs)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "lmdm.pth").write_bytes(b"w")
    with pytest.raises(OutputError, match="inside the --checkpoints folder"):
        check_output_file(ckpt / "lmdm.pth", "--json", {"--checkpoints": str(ckpt)})
    fresh = ckpt / "new.json"  # a new file beside the checkpoints overwrites nothing
    assert check_output_file(fresh, "--json", {"--checkpoints": str(ckpt)}) == fresh
    assert audio.read_bytes() == b"RIFF"


def test_dash_is_stdout(tmp_path, capsys) -> None:
    import json

    from studio.files import check_output_file, write_json

    assert check_output_file("-", "--json") is None
    with pytest.raises(OutputError, match="cannot go to stdout"):
        check_output_file("-", "--out", stdout=False)
    write_json("-", {"a": 1})
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_or_device_target_is_written_through_not_replaced(tmp_path):
    import os
    import stat
    import threading

    from studio.files import check_output_file, write_json

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert check_output_file(str(fifo), "--json") == fifo
    write_json(fifo, {"a": 1})  # as `--report /dev/null` would: the target stays what it is
    reader.join(timeout=10)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and '"a": 1' in got[0]
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]


def test_the_file_in_the_way_of_a_folder(tmp_path):
    (tmp_path / "f").write_text("")
    assert file_in_the_way(tmp_path / "new" / "deeper") is None  # can be made
    assert file_in_the_way(tmp_path) is None
    assert file_in_the_way(tmp_path / "f") == tmp_path / "f"
    assert file_in_the_way(tmp_path / "f" / "sub" / "more") == tmp_path / "f"
