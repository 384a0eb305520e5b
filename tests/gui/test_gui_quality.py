"""The metrics panel's Quality group and the timeline's in-between marks (pytest-qt, offscreen,
demo engine)."""

import numpy as np
import pytest

pytest.importorskip("PySide6")

from studio import layout  # noqa: E402
from studio.gui.widgets.metrics import QUALITY_ROWS, MetricsPanel, quality_texts  # noqa: E402
from studio.render.pipeline import quality_of  # noqa: E402

RENDER_TIMEOUT_MS = 120_000


def _number(text: str) -> float:
    return float(text.split()[0])


def test_quality_rows_hold_the_reports_numbers(window, qtbot):
    result = window.result
    q = quality_of(result, window.engine)
    m = window.metrics
    assert {m.text(key) for key, _ in QUALITY_ROWS} == set(
        quality_texts(q, result.plan.warp_forced).values()
    )
    for key, _ in QUALITY_ROWS:
        assert m.text(key) == quality_texts(q, result.plan.warp_forced)[key]
    assert _number(m.text("head_smoothness")) == pytest.approx(q["head"]["smoothness"], rel=1e-2)
    assert _number(m.text("silent_lips")) == pytest.approx(q["silent_lips"]["deviation"], rel=1e-2)
    assert f"speech {q['silent_lips']['speech_deviation']:.3g}" in m.text("silent_lips")
    assert _number(m.text("blink_rate")) == pytest.approx(q["blinks"]["rate_per_min"], abs=0.05)
    share = q["blinks"]["in_schedule"]
    assert _number(m.text("blink_schedule")) == pytest.approx(100 * share, abs=0.5)
    assert "of intervals" in m.text("blink_schedule")
    sync = q["lip_sync"]
    assert _number(m.text("lip_sync")) == pytest.approx(sync["envelope_correlation"], abs=5e-3)
    lag_ms = 1000 * sync["best_lag_frames"] / layout.FPS
    assert f"best lag {lag_ms:+.0f} ms" in m.text("lip_sync")
    assert int(m.text("warp_forced")) == result.plan.warp_forced
    # A new motion (another smoothing window) refreshes the rows with its own report.
    with qtbot.waitSignal(window.renderFinished, timeout=RENDER_TIMEOUT_MS):
        window.controls.window.setValue(15)
    q2 = quality_of(window.result, window.engine)
    assert m.text("head_smoothness") == quality_texts(q2, 0)["head_smoothness"]


def test_quality_texts_say_when_a_value_is_missing(qtbot):
    q = {
        "head": {"diff_var": dict.fromkeys(layout.POSE_ANGLES, 0.0), "smoothness": 0.0},
        "silent_lips": {"deviation": None, "stretches": 0, "frames": 0, "speech_deviation": 0.1},
        "blinks": {
            "count": 0,
            "rate_per_min": 0.0,
            "interval_mean_s": None,
            "in_schedule": None,
            "schedule_s": [2.4, 4.0],
        },
        "lip_sync": {
            "envelope_correlation": None,
            "best_lag_frames": None,
            "best_lag_correlation": None,
        },
    }
    texts = quality_texts(q, 3)
    assert texts["silent_lips"].startswith("–") and texts["blink_schedule"].startswith("–")
    assert texts["lip_sync"].startswith("–") and texts["warp_forced"] == "3"
    panel = MetricsPanel()
    qtbot.addWidget(panel)
    panel.set_quality(q, 3)
    assert panel.text("head_smoothness").split()[0] == "0"
    panel.set_quality(None)
    assert all(panel.text(key) == "–" for key, _ in QUALITY_ROWS)


def test_inbetween_marks_toggle_and_the_frame_label(window, qtbot):
    plan, tl = window.result.plan, window.timeline
    n, keys = window.result.num_frames, plan.keyframes
    assert n > keys.size, "the demo clip's plan has in-betweens"
    assert not tl.inbetween_marks.isVisible() and tl.marked_frames().size == 0
    window.act_inbetweens.trigger()
    assert window.act_inbetweens.isChecked() and tl.inbetween_marks.isVisible()
    marked = tl.marked_frames()
    assert marked.size == n - keys.size == tl.inbetween_marks.opts["x"].size
    assert np.intersect1d(marked, keys).size == 0
    # The user steps onto an in-between: the label says so; a keyframe's does not.
    window.playback.seek(int(marked[0]))
    qtbot.waitUntil(lambda: window.playback.frame == int(marked[0]), timeout=5000)
    assert window.frame_label.text().endswith("in-between")
    window.playback.seek(int(keys[0]))
    qtbot.waitUntil(lambda: window.playback.frame == int(keys[0]), timeout=5000)
    assert "in-between" not in window.frame_label.text()
    window.act_inbetweens.trigger()
    assert not tl.inbetween_marks.isVisible() and tl.marked_frames().size == 0
    # Live mode turns the clip's toggle off with its other actions; back in Clip it works.
    window.set_mode("live")
    assert not window.act_inbetweens.isEnabled()
    window.set_mode("clip")
    assert window.act_inbetweens.isEnabled()


def test_the_preview_measures_its_inbetweens_against_full_renders(window, qtbot):
    from studio.gui.widgets.metrics import inbetween_psnr_text
    from studio.render.fidelity import PSNR_SAMPLE, inbetween_psnr, sample_inbetweens

    result = window.result
    picked = sample_inbetweens(result.plan, PSNR_SAMPLE)
    assert 0 < picked.size <= PSNR_SAMPLE
    renderer = window.engine.renderer(window.controls.settings())
    made = {int(f): window.frames[int(f)] for f in picked}
    want = inbetween_psnr(result, renderer, made)
    assert want["measured"] == picked.size and want["inbetweens"] >= picked.size
    assert 30.0 < want["p5"] <= want["mean"] < 80.0  # warped, not rendered: close, not equal
    text = window.metrics.text("inbetween_psnr")
    assert text == inbetween_psnr_text(want, 0, 1)
    assert text.startswith(f"{want['mean']:.1f} dB mean")
    assert inbetween_psnr_text(None, 10, 10) == "none: every frame rendered"


def test_a_failing_quality_metric_is_logged_not_raised(window, monkeypatch, caplog):
    import studio.gui.window as gui_window

    def broken(result, engine):
        raise ValueError("no keypoints")

    monkeypatch.setattr(gui_window, "quality_of", broken)
    with caplog.at_level("WARNING", logger="studio.gui.window"):
        assert window._quality(window.result, window.engine) is None
    assert "quality metrics failed" in caplog.text and "no keypoints" in caplog.text
