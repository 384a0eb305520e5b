"""PasteBack vs a literal numpy transcription of Ditto's putback (design doc §6), and the
per-frame FramePasteBack (video avatars) vs PasteBack."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from studio.avatar.putback import FramePasteBack, PasteBack, paste_mask

S = 512

# --- numpy reference ------------------------------------------------------------------------


def ref_get_mask(W: int, H: int, ratio_w: float = 0.9, ratio_h: float = 0.9) -> np.ndarray:
    """Literal transcription of Ditto's get_mask (returns [H, W] float32)."""
    w, h = int(W * ratio_w), int(H * ratio_h)
    x1 = (W - w) // 2
    x2 = x1 + w
    y1 = (H - h) // 2
    y2 = y1 + h
    mask = np.ones((H, W), dtype=np.float32)

    def rad(row: np.ndarray, col: np.ndarray) -> np.ndarray:
        return np.sqrt(row[None, :] ** 2 + col[:, None] ** 2).astype(np.float32)

    mask[0:y1, x1:x2] = rad(np.linspace(0, 0, w), np.linspace(0, 1, y1))
    mask[y2:H, x1:x2] = rad(np.linspace(0, 0, w), np.linspace(1, 0, H - y2))
    mask[y1:y2, 0:x1] = rad(np.linspace(0, 1, x1), np.linspace(0, 0, h))
    mask[y1:y2, x2:W] = rad(np.linspace(1, 0, W - x2), np.linspace(0, 0, h))
    mask[0:y1, 0:x1] = 1 - np.clip(rad(np.linspace(1, 0, x1), np.linspace(1, 0, y1)), 0, 1)
    mask[0:y1, x2:W] = 1 - np.clip(rad(np.linspace(0, 1, W - x2), np.linspace(1, 0, y1)), 0, 1)
    mask[y2:H, 0:x1] = 1 - np.clip(rad(np.linspace(1, 0, x1), np.linspace(0, 1, H - y2)), 0, 1)
    mask[y2:H, x2:W] = 1 - np.clip(rad(np.linspace(0, 1, W - x2), np.linspace(0, 1, H - y2)), 0, 1)
    return mask


def ref_warp(img: np.ndarray, M: np.ndarray, h: int, w: int) -> np.ndarray:
    """Exact bilinear warpAffine(img, M[:2], (w, h)), INTER_LINEAR, BORDER_CONSTANT 0."""
    img = img.astype(np.float64)
    if img.ndim == 2:
        img = img[:, :, None]
    sh, sw = img.shape[:2]
    inv = np.linalg.inv(M)
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    u = inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]
    v = inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    u0, v0 = np.floor(u).astype(np.int64), np.floor(v).astype(np.int64)
    fu, fv = (u - u0)[..., None], (v - v0)[..., None]
    out = np.zeros((h, w, img.shape[2]))
    for dy, wy in ((0, 1 - fv), (1, fv)):
        for dx, wx in ((0, 1 - fu), (1, fu)):
            yy, xx = v0 + dy, u0 + dx
            ok = (yy >= 0) & (yy < sh) & (xx >= 0) & (xx < sw)
            val = np.where(ok[..., None], img[yy.clip(0, sh - 1), xx.clip(0, sw - 1)], 0.0)
            out += wy * wx * val
    return out


def ref_putback(frame: np.ndarray, render01: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Ditto PutBackNumpy with the exact warp; render01 is [3, s, s] in 0..1."""
    h, w = frame.shape[:2]
    s = render01.shape[-1]
    render = np.transpose(render01, (1, 2, 0)).clip(0, 1) * 255
    m = ref_warp(ref_get_mask(s, s), M, h, w).clip(0, 1)
    r = ref_warp(render, M, h, w)
    out = m * r + (1 - m) * frame
    return np.clip(out, 0, 255).astype(np.uint8)


# --- fixtures -------------------------------------------------------------------------------


def rot_scale(angle_deg: float, scale: float, tx: float, ty: float) -> np.ndarray:
    a = math.radians(angle_deg)
    c, s = scale * math.cos(a), scale * math.sin(a)
    return np.array([[c, -s, tx], [s, c, ty], [0.0, 0.0, 1.0]])


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def make_frame(rng: np.random.Generator, h: int = 600, w: int = 640) -> np.ndarray:
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def make_renders(rng: np.random.Generator, b: int, s: int = S) -> torch.Tensor:
    # Smooth-ish content plus noise, a few values outside 0..1 to exercise the clip.
    base = rng.random((b, 3, s // 8, s // 8))
    r = np.kron(base, np.ones((1, 1, 8, 8))) + 0.05 * rng.standard_normal((b, 3, s, s))
    return torch.from_numpy(r.astype(np.float32))


# --- mask -----------------------------------------------------------------------------------


def test_mask_matches_reference_exactly() -> None:
    m = paste_mask(512, 0.9)
    assert m.dtype == torch.float32 and m.shape == (512, 512)
    ref = ref_get_mask(512, 512, 0.9, 0.9)
    assert np.array_equal(m.numpy(), ref)
    for size in (256, 97):
        assert np.array_equal(paste_mask(size, 0.9).numpy(), ref_get_mask(size, size))


def test_mask_values_and_symmetry() -> None:
    m = paste_mask().numpy()
    assert np.all(m[26:486, 26:486] == 1)
    ramp = m[:26, 256]
    np.testing.assert_allclose(ramp, np.arange(26) / 25, atol=1e-7)
    assert m[0, 0] == 0 and m[25, 25] == 1
    assert np.array_equal(m, m[::-1]) and np.array_equal(m, m[:, ::-1])
    assert np.array_equal(m, m.T)
    assert m.min() >= 0 and m.max() <= 1


# --- putback --------------------------------------------------------------------------------


def test_identity_interior_reproduces_render(rng: np.random.Generator) -> None:
    frame = make_frame(rng)
    ox, oy = 40, 30
    M = np.array([[1.0, 0, ox], [0, 1.0, oy], [0, 0, 1.0]])
    # Values k + 0.5 after x255 so truncation is robust to float noise.
    k = rng.integers(0, 255, size=(1, 3, S, S))
    renders = torch.from_numpy(((k + 0.5) / 255).astype(np.float32))
    out = PasteBack(frame, M)(renders)
    assert out.shape == (1, 600, 640, 3) and out.dtype == torch.uint8
    inner = out[0, oy + 26 : oy + 486, ox + 26 : ox + 486].numpy()
    assert np.array_equal(inner, k[0, :, 26:486, 26:486].transpose(1, 2, 0).astype(np.uint8))
    # Crop border row has mask 0: the frame shows through.
    assert np.array_equal(out[0, oy, ox : ox + S].numpy(), frame[oy, ox : ox + S])


@pytest.mark.parametrize(
    "M",
    [rot_scale(17.0, 0.83, 160.0, -20.0), rot_scale(-35.0, 1.21, 250.0, 80.0)],
    ids=["rot17_s0.83_partly_outside", "rot-35_s1.21"],
)
def test_rotation_scale_vs_reference(rng: np.random.Generator, M: np.ndarray) -> None:
    frame = make_frame(rng)
    renders = make_renders(rng, 1)
    out = PasteBack(frame, M)(renders)[0].numpy()
    ref = ref_putback(frame, renders[0].numpy(), M)
    diff = np.abs(out.astype(np.int16) - ref.astype(np.int16))
    assert diff.max() <= 1
    assert (diff > 0).mean() < 0.01


def test_outside_bbox_is_background(rng: np.random.Generator) -> None:
    frame = make_frame(rng, 700, 900)
    M = rot_scale(25.0, 0.7, 300.0, 50.0)
    pb = PasteBack(frame, M)
    out = pb(make_renders(rng, 2)).numpy()
    y0, y1, x0, x1 = pb.box
    assert 0 < y0 < y1 < 700 and 0 < x0 < x1 < 900
    outside = np.ones((700, 900), dtype=bool)
    outside[y0:y1, x0:x1] = False
    for i in range(2):
        assert np.array_equal(out[i][outside], frame[outside])
    # Everywhere the reference mask is 0 the output is the frame exactly.
    m = ref_warp(ref_get_mask(S, S), M, 700, 900)[..., 0]
    assert np.array_equal(out[0][m == 0], frame[m == 0])


def test_batch_equals_per_frame_and_buffer_reuse(rng: np.random.Generator) -> None:
    frame = make_frame(rng)
    M = rot_scale(10.0, 0.9, 120.0, 40.0)
    renders = make_renders(rng, 3)
    pb = PasteBack(torch.from_numpy(frame), torch.from_numpy(M))
    batch = pb(renders).clone()
    singles = [pb(renders[i : i + 1]).clone() for i in range(3)]
    assert torch.equal(batch, torch.cat(singles))
    first = pb(renders)
    again = pb(renders.flip(0))
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, batch.flip(0))


def test_no_item_in_call(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    pb = PasteBack(make_frame(rng), rot_scale(5.0, 1.0, 60.0, 40.0))
    renders = make_renders(rng, 2)

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("host sync via Tensor.item")

    for name in ("item", "tolist", "__bool__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    pb(renders)
    pb(renders)


def test_crop_entirely_outside_frame(rng: np.random.Generator) -> None:
    frame = make_frame(rng, 100, 120)
    out = PasteBack(frame, rot_scale(0.0, 0.1, 500.0, 500.0))(make_renders(rng, 1))
    assert np.array_equal(out[0].numpy(), frame)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(rng: np.random.Generator) -> None:
    frame = make_frame(rng)
    M = rot_scale(17.0, 0.83, 160.0, -20.0)
    renders = make_renders(rng, 2)
    cpu = PasteBack(frame, M)(renders)
    gpu = PasteBack(frame, M, device="cuda")(renders.cuda()).cpu()
    assert (cpu.short() - gpu.short()).abs().max() <= 1


# --- per-frame paste-back (video avatars) ---------------------------------------------------

FS, FH, FW = 64, 120, 160  # crop side, frame height and width of the video tests


def video_c2o(rng: np.random.Generator) -> np.ndarray:
    """[6, 3, 3] crop -> frame matrices: rotation, scale, translation, a little shear; the crop
    inside, partly outside (each side) and fully outside the frame."""
    placements = [(40, 20), (-30, 10), (120, -25), (30, 80), (-10, -10), (400, 300)]
    ms = []
    for tx, ty in placements:
        m = rot_scale(rng.uniform(-40, 40), rng.uniform(0.6, 1.4), tx, ty)
        m[:2, :2] += rng.normal(0, 0.03, (2, 2))
        ms.append(m)
    return np.stack(ms)


def make_video(rng: np.random.Generator, n: int = 6) -> np.ndarray:
    return rng.integers(0, 256, size=(n, FH, FW, 3), dtype=np.uint8)


def per_frame(frames: np.ndarray, m: np.ndarray, renders: torch.Tensor, index) -> torch.Tensor:
    """The per-render PasteBack result FramePasteBack must reproduce."""
    outs = [PasteBack(frames[i], m[i], FS)(renders[b : b + 1]) for b, i in enumerate(index)]
    return torch.cat(outs)


def test_frames_equal_paste_back_per_frame(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    index = np.array([3, 0, 3, 5, 1, 2, 4, 0, 1])  # repeated, unsorted, incl. the outside one
    renders = make_renders(rng, len(index), FS)
    fpb = FramePasteBack(frames, m, FS)
    assert (fpb.height, fpb.width) == (FH, FW) and fpb.count == 6
    out = fpb(renders, index)
    assert out.shape == (9, FH, FW, 3) and out.dtype == torch.uint8
    assert torch.equal(out, per_frame(frames, m, renders, index))  # bit-exact, not just <= 1
    # the union box is smaller than the frame, and [n, 2, 3] matrices and tensors work too
    assert fpb.box != (0, FH, 0, FW)
    fpb2 = FramePasteBack(torch.from_numpy(frames), torch.from_numpy(m[:, :2]), FS)
    assert torch.equal(fpb2(renders, torch.from_numpy(index)), out)


def test_frames_within_one_level_of_float64_reference(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    index = np.arange(6)[::-1].copy()
    renders = make_renders(rng, 6, FS)
    out = FramePasteBack(frames, m, FS)(renders, index).numpy()
    for b, i in enumerate(index):
        ref = ref_putback(frames[i], renders[b].numpy(), m[i])
        diff = np.abs(out[b].astype(np.int16) - ref.astype(np.int16))
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01


def test_frames_buffer_reuse_has_no_stale_pixels(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    renders = make_renders(rng, 3, FS)
    fpb = FramePasteBack(frames, m, FS)
    first = fpb(renders, [0, 1, 2])
    again = fpb(renders, [2, 5, 3])
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, per_frame(frames, m, renders, [2, 5, 3]))


def test_colour_background_equals_paste_back_over_solid_image(rng: np.random.Generator) -> None:
    m = video_c2o(rng)
    colour = (0, 177, 64)
    solid = np.broadcast_to(np.array(colour, dtype=np.uint8), (6, FH, FW, 3)).copy()
    fpb = FramePasteBack(None, m, FS, colour=colour, size_hw=(FH, FW))
    assert (fpb.height, fpb.width) == (FH, FW)
    for index in ([4, 1, 1, 0], [2, 3, 5, 0]):  # the second call reuses the buffer
        renders = make_renders(rng, 4, FS)
        assert torch.equal(fpb(renders, index), per_frame(solid, m, renders, index))


def test_crop_fully_outside_returns_background(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    fpb = FramePasteBack(frames, m, FS)
    assert tuple(fpb.boxes[5]) == (0, 0, 0, 0)
    out = fpb(make_renders(rng, 2, FS), [5, 5])
    assert np.array_equal(out.numpy(), frames[[5, 5]])
    # every crop outside: nothing is warped at all
    far = FramePasteBack(frames[:2], m[[5, 5]], FS)
    assert far.box == (0, 0, 0, 0)
    assert np.array_equal(far(make_renders(rng, 3, FS), [1, 0, 1]).numpy(), frames[[1, 0, 1]])


def test_frames_bad_index_and_renders_raise(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    fpb = FramePasteBack(frames, m, FS)
    renders = make_renders(rng, 2, FS)
    for index in ([0, 6], [-1, 0], [0], [[0, 1]], np.array([0.0, 1.0])):
        with pytest.raises(ValueError):
            fpb(renders, index)
    with pytest.raises(ValueError, match="out of range"):
        fpb(renders, torch.tensor([2, 7]))
    for bad in (torch.zeros(2, 3, FS, FS + 1), torch.zeros(2, 4, FS, FS), torch.zeros(3, FS, FS)):
        with pytest.raises(ValueError, match="renders"):
            fpb(bad, [0, 1])


def test_frames_bad_construction_raises(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    with pytest.raises(ValueError):
        FramePasteBack(frames[:5], m, FS)  # one frame per matrix
    with pytest.raises(ValueError):
        FramePasteBack(frames, m[0], FS)  # not a batch of matrices
    with pytest.raises(ValueError):
        FramePasteBack(None, m, FS, colour=(0, 0, 0))  # no size
    with pytest.raises(ValueError):
        FramePasteBack(frames, m, FS, colour=(0, 0, 0), size_hw=(FH, FW))  # both
    with pytest.raises(ValueError):
        FramePasteBack(frames, m, FS, size_hw=(FH, FW + 2))  # size disagrees


def test_frames_no_host_sync_in_call(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    fpb = FramePasteBack(make_video(rng), video_c2o(rng), FS)
    renders = make_renders(rng, 3, FS)

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("host sync via a Tensor read-back")

    for name in ("item", "tolist", "__bool__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    fpb(renders, np.array([1, 0, 4]))
    fpb(renders, np.array([2, 2, 3]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_frames_cuda_matches_cpu(rng: np.random.Generator) -> None:
    m, frames = video_c2o(rng), make_video(rng)
    index = np.array([3, 0, 3, 5, 1, 2, 4])
    renders = make_renders(rng, len(index), FS)
    cpu = FramePasteBack(frames, m, FS)(renders, index)
    gpu = FramePasteBack(frames, m, FS, device="cuda")
    out = gpu(renders.cuda(), torch.from_numpy(index).cuda()).cpu()
    assert (cpu.short() - out.short()).abs().max() <= 1
    assert torch.equal(out, per_frame(frames, m, renders.cuda(), index).cpu())
