"""RGB -> yuv420p on the device: swscale's BT.709 limited-range result, and the writer takes
the planes directly (the MP4 decodes to the same colours as from RGB)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch
from av.video.reformatter import ColorRange, Colorspace, VideoReformatter

from studio.export.video import VideoWriter
from studio.export.yuv import rgb_to_yuv420p

PORTRAIT = (
    Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "ditto_example_portrait.png"
)


def _portrait(side: int = 256) -> np.ndarray:
    if PORTRAIT.exists():
        with av.open(str(PORTRAIT)) as c:
            frame = next(c.decode(video=0))
        return frame.reformat(width=side, height=side).to_ndarray(format="rgb24")
    yy, xx = np.mgrid[0:side, 0:side]  # a smooth colour field where the fixture is absent
    return np.stack([xx, yy, (xx + yy) // 2], -1).astype(np.uint8) * (255 // side or 1)


def _swscale(rgb: np.ndarray) -> np.ndarray:
    vf = av.VideoFrame.from_ndarray(rgb, format="rgb24")
    return (
        VideoReformatter()
        .reformat(
            vf,
            format="yuv420p",
            dst_colorspace=Colorspace.ITU709,
            src_color_range=ColorRange.JPEG,
            dst_color_range=ColorRange.MPEG,
        )
        .to_ndarray()
    )


def test_planes_match_swscale_on_a_real_portrait() -> None:
    rgb = _portrait()
    got = rgb_to_yuv420p(torch.from_numpy(rgb)[None])[0].numpy()
    want = _swscale(rgb)
    assert got.shape == want.shape == (384, 256) and got.dtype == np.uint8
    diff = np.abs(got.astype(int) - want)
    assert diff[:256].max() <= 1  # luma: the same matrix and rounding
    assert diff[256:].mean() < 1.0  # chroma: 2x2 mean vs swscale's filter


def test_primaries_land_on_their_limited_range_codes() -> None:
    rgb = np.zeros((4, 8, 3), np.uint8)
    rgb[:, :2] = 255  # white
    rgb[:, 2:4, 0] = 255  # red
    rgb[:, 6:] = 0  # black
    y = rgb_to_yuv420p(torch.from_numpy(rgb)[None])[0].numpy()
    assert y[0, 0] == 235 and y[0, 6] == 16 and y[0, 2] == 63  # 16 + 219 * 0.2126
    v = y[4 + 1 :, :]  # V plane: row 5 (after Y 0..3 and U row 4)
    assert v[0, 1] == 240  # the red 2x2 block: Cr at its maximum


def test_odd_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="even H and W"):
        rgb_to_yuv420p(torch.zeros(1, 5, 8, 3, dtype=torch.uint8))


def test_writer_takes_planes_and_they_decode_like_rgb(tmp_path) -> None:
    rgb = _portrait(128)
    planes = rgb_to_yuv420p(torch.from_numpy(rgb)[None])[0].numpy()
    decoded = {}
    for name, frame in (("rgb", rgb), ("yuv", planes)):
        path = tmp_path / f"{name}.mp4"
        with VideoWriter(path, 128, 128, crf=12, preset="ultrafast") as w:
            w.write_many([frame] * 2)
        with av.open(str(path)) as c:
            f = next(c.decode(video=0))
            assert (f.colorspace, f.color_range) == (1, 1)  # BT.709, limited (MPEG) range
            decoded[name] = f.to_ndarray(format="rgb24").astype(int)
    assert np.abs(decoded["yuv"] - rgb).mean() < 3.0
    assert np.abs(decoded["yuv"] - decoded["rgb"]).mean() < 2.0
    with pytest.raises(ValueError, match=r"\[192, 128\] yuv420p"):
        with VideoWriter(tmp_path / "bad.mp4", 128, 128, preset="ultrafast") as w:
            w.write(planes[:-2])
    assert not (tmp_path / "bad.mp4").exists()


@pytest.mark.parametrize(("h", "w"), [(258, 510), (6, 4), (134, 108)])
def test_heights_that_are_not_multiples_of_four_pack_as_pyav_reads_them(h, w) -> None:
    """Each chroma plane is (H/2)(W/2) bytes, not whole rows of W when H/2 is odd."""
    yy, xx = np.mgrid[0:h, 0:w]
    rgb = np.stack([xx * 255 // (w - 1), yy * 255 // (h - 1), (xx + yy) * 255 // (w + h)], -1)
    rgb = rgb.astype(np.uint8)
    got = rgb_to_yuv420p(torch.from_numpy(rgb)[None])[0].numpy()
    diff = np.abs(got.astype(int) - _swscale(rgb))
    assert got.shape == (h * 3 // 2, w) and diff[:h].max() <= 1 and diff[h:].mean() < 1.5
    vf = av.VideoFrame.from_ndarray(got, format="yuv420p")  # PyAV takes the planes back
    back = vf.reformat(format="rgb24", src_colorspace=Colorspace.ITU709).to_ndarray()
    if h > 16:  # a 6x4 ramp is too steep for 2x2 chroma to come back close
        assert np.abs(back.astype(int) - rgb).mean() < 3.0
