"""Project files: audio, avatar, settings and control tracks in one file that reopens exactly,
and `studio render --project`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from studio.engines.demo import demo_audio_path
from studio.errors import InputError
from studio.motion.controls import ControlTracks
from studio.render.project import Project
from studio.settings import RenderSettings

TRACKS = {
    "tracks": {"yaw": [{"t": 0.5, "value": 12.0, "interp": "linear"}, {"t": 1.5, "value": 0.0}]}
}


def test_a_project_reopens_exactly_and_moves_with_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    shutil.copy(demo_audio_path(), folder / "talk.wav")
    project = Project(
        str(folder / "talk.wav"),
        None,
        RenderSettings(size=96, smooth_window=9, stride="2"),
        ControlTracks.from_dict(TRACKS),
    )
    project.save(folder / "talk.json")
    data = json.loads((folder / "talk.json").read_text())
    assert data["audio"] == "talk.wav" and data["format"] == "studio-project/1"
    assert Project.load(folder / "talk.json") == project
    moved = shutil.move(folder, tmp_path / "elsewhere")
    again = Project.load(Path(moved) / "talk.json")
    assert again.audio == str(Path(moved) / "talk.wav") and again.settings == project.settings
    assert again.controls == project.controls


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"format": "studio-project/1", "audio": 3}, "audio must be a file path"),
        ({"format": "other"}, "format 'other'"),
        ({"format": "studio-project/1", "zoom": 2}, "unknown key 'zoom'"),
        ({"format": "studio-project/1", "settings": {"size": -1}}, "settings: size"),
        ({"format": "studio-project/1", "controls": {"tracks": {"yaw": 1}}}, "controls: yaw"),
    ],
)
def test_a_bad_project_names_the_key(tmp_path: Path, data: dict, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=words):
        Project.load(path)


def test_render_a_project(tmp_path: Path, capsys) -> None:
    shutil.copy(demo_audio_path(), tmp_path / "talk.wav")
    Project(
        str(tmp_path / "talk.wav"),
        None,
        RenderSettings(size=96, smooth_window=9),
        ControlTracks.from_dict(TRACKS),
    ).save(tmp_path / "talk.json")
    argv = ["render", "--demo", "--project", str(tmp_path / "talk.json"), "--report"]
    code, _, err = run_cli(
        [*argv, str(tmp_path / "r.json"), "--out", str(tmp_path / "t.mp4")], capsys
    )
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["audio"] == str(tmp_path / "talk.wav")
    assert report["settings"]["smooth_window"] == 9 and report["settings"]["size"] == 96
    assert report["controls"] == ControlTracks.from_dict(TRACKS).to_dict()
    # an option given as well wins over the project
    code, _, err = run_cli(
        [
            *argv,
            str(tmp_path / "r2.json"),
            "--out",
            str(tmp_path / "t2.mp4"),
            "--smooth-window",
            "7",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads((tmp_path / "r2.json").read_text())["settings"]["smooth_window"] == 7
    code, _, err = run_cli(
        [
            *argv,
            str(tmp_path / "r3.json"),
            "--out",
            str(tmp_path / "t3.mp4"),
            "--preset",
            str(tmp_path / "talk.json"),
        ],
        capsys,
    )
    assert code == 2 and "--preset" in err
