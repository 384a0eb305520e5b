"""The Export dialog's file types and backgrounds: a transparent WebM and a PNG sequence from
the window (pytest-qt, offscreen, demo engine, real PyAV)."""

from __future__ import annotations

import av
import pytest

pytest.importorskip("PySide6")

EXPORT_TIMEOUT_MS = 120_000


def _export(qtbot, window, dlg) -> None:
    with qtbot.waitSignal(window.render_worker.exportDone, timeout=EXPORT_TIMEOUT_MS):
        dlg.export_button.click()
    qtbot.waitUntil(lambda: not dlg.running, timeout=5000)


def test_transparent_webm_and_a_png_sequence_from_the_dialog(window, qtbot, tmp_path):
    dlg = window.open_export_dialog()
    dlg.path.setText(str(tmp_path / "head.mp4"))
    dlg.size.setCurrentIndex(dlg.size.findData(256))
    assert dlg.suffix() == ".mp4" and dlg.codec.isEnabled()
    dlg.background.setCurrentIndex(dlg.background.findData("transparent"))
    # transparent needs alpha: the file type follows
    assert dlg.suffix() == ".webm" and dlg.path.text() == str(tmp_path / "head.webm")
    assert not dlg.codec.isEnabled()
    _export(qtbot, window, dlg)
    assert "Wrote" in dlg.status.text()
    with av.open(str(tmp_path / "head.webm")) as c:
        stream = c.streams.video[0]
        assert stream.metadata.get("alpha_mode") == "1"
        ctx = av.codec.CodecContext.create("libvpx-vp9", "r")
        frames = [f for p in c.demux(stream) if p.size for f in ctx.decode(p)]
    assert len(frames) == window.result.num_frames
    rgba = frames[10].to_ndarray(format="rgba")
    assert rgba[:6, :6, 3].max() <= 2 and rgba[124:132, 124:132, 3].min() >= 250

    dlg.format.setCurrentIndex(dlg.format.findData(".png"))
    assert dlg.path.text() == str(tmp_path / "head.png")
    assert dlg.background.currentData() == "transparent"  # a PNG keeps alpha
    _export(qtbot, window, dlg)
    folder = tmp_path / "head"
    assert str(folder) in dlg.status.text()
    assert len(list(folder.glob("head_*.png"))) == window.result.num_frames
    assert (folder / "head.wav").is_file()

    dlg.format.setCurrentIndex(dlg.format.findData(".mp4"))
    assert dlg.background.currentData() == "avatar"  # MP4 has no alpha
    dlg.reject()


def test_the_hardware_encoder_box_reaches_the_export(window, qtbot, tmp_path):
    """Encode on the GPU's encoder: for MP4 only; the export's report names the encoder it
    used (the software one where no NVENC opens, as on this machine)."""
    import json

    from studio.export.video import hardware_encoder

    dlg = window.open_export_dialog()
    dlg.path.setText(str(tmp_path / "hw.mp4"))
    dlg.size.setCurrentIndex(dlg.size.findData(256))
    assert dlg.hw_encode.isEnabled() and not dlg.hw_encode.isChecked()
    dlg.hw_encode.setChecked(True)
    seen = []
    window.render_worker.exportDone.connect(lambda *a: seen.append(a))
    _export(qtbot, window, dlg)
    with av.open(str(tmp_path / "hw.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == window.result.num_frames
    report = next(a for a in seen[0] if isinstance(a, dict))
    found, why = hardware_encoder("h264")
    assert report["encoder"] == (found or "libx264")
    if found is None:  # the box reached the writer: it says why the CPU encoded
        assert any(why in note for note in report["notes"])
    assert json.dumps(report)  # plain data
    dlg.format.setCurrentIndex(dlg.format.findData(".webm"))
    assert not dlg.hw_encode.isEnabled()
    dlg.reject()
