"""A/B comparison in the viewer: take A held, tracks keyed for B, both shown frame for frame
under the one playhead (pytest-qt, offscreen, demo engine)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("PySide6")

from studio.gui.compare import GAP, LINE, compose, difference  # noqa: E402
from studio.motion.controls import ControlTracks  # noqa: E402
from studio.settings import RenderSettings  # noqa: E402

TIMEOUT_MS = 120_000
NOD = {
    "tracks": {"pitch": [{"t": 2.0, "value": 0}, {"t": 2.3, "value": 9}, {"t": 2.6, "value": 0}]}
}


def test_compose_side_by_side_and_split() -> None:
    a = np.full((4, 6, 3), 10, np.uint8)
    b = np.full((8, 12, 3), 200, np.uint8)  # another size: fitted to A's
    side = compose(a, b, "side")
    assert side.shape == (4, 12 + GAP, 3)
    assert (side[:, :6] == 10).all() and (side[:, 6 + GAP :] == 200).all()
    split = compose(a, b, "split", 0.5)
    assert split.shape == a.shape and (split[:, :2] == 10).all() and (split[:, 4:] == 200).all()
    assert (split[:, 2:4] == LINE).all()


def test_difference_says_what_changed() -> None:
    a, b = RenderSettings(), RenderSettings(smooth=False, cadence={"max_warp_px": 4.0})
    text = difference(a, None, b, ControlTracks.from_dict(NOD))
    assert text == "smooth: on → off; cadence.max_warp_px: 26.0 → 4.0; tracks: none → pitch"
    assert difference(a, None, a, None) == "the same settings and tracks"


def test_a_held_take_beside_the_keyed_preview_in_step(window, qtbot, tmp_path):
    assert not window.act_compare.isEnabled()
    assert window.hold_take() and window.comparing and window.compare_bar.isVisible()
    before = [f.copy() for f in window.held.frames]
    path = tmp_path / "nod.json"
    path.write_text(json.dumps(NOD))
    with qtbot.waitSignal(window.renderFinished, timeout=TIMEOUT_MS):
        window.load_tracks(str(path))
    assert "tracks: none → pitch" in window.compare_bar.label.text()
    h, w = before[0].shape[:2]
    for index in (10, 57):  # before the nod the two agree; at its peak they differ
        window.playback.seek(index)
        shown = window.viewer.frame
        assert shown.shape == (h, 2 * w + GAP, 3)
        assert np.array_equal(shown[:, :w], before[index])  # A: the held take
        assert np.array_equal(shown[:, w + GAP :], window.frames[index])  # B: now
    assert not np.array_equal(before[57], window.frames[57])
    assert np.array_equal(before[10], window.frames[10])
    window.compare_bar.mode.setCurrentIndex(window.compare_bar.mode.findData("split"))
    assert window.viewer.frame.shape == before[0].shape
    window.compare_bar.closed.emit()
    assert not window.comparing and not window.compare_bar.isVisible()
    assert np.array_equal(window.viewer.frame, window.frames[57])
