"""The Ditto engine's parts: LMDM clip motion, memory plan, precision, missing files."""

import numpy as np
import pytest
import torch

from studio.engines.ditto.engine import ENGINE_ROLES, plan_memory, render_dtype, require
from studio.errors import InputError, OptionError
from studio.fixtures.random_tree import random_network, write_checkpoint_tree
from studio.layout import COND_DIM, MOTION_DIM, OVERLAP_OFFLINE, SEQ_FRAMES
from studio.models.checkpoints import discover
from studio.motion.fast_lmdm import graphs_made_ms
from studio.motion.generator import generate_motion
from studio.motion.windows import offline_starts

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def lmdm():
    return random_network("lmdm", reduced=True, cond_dim=COND_DIM)


def test_clip_motion_shape_windows_and_seed(lmdm) -> None:
    n = 2 * (SEQ_FRAMES - OVERLAP_OFFLINE) + 17  # three windows, the last one padded
    cond = torch.randn(n, COND_DIM, generator=torch.Generator().manual_seed(1))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(2))
    seen = []
    a = generate_motion(lmdm, cond, kp, steps=3, seed=7, on_window=lambda d, t: seen.append((d, t)))
    assert a.shape == (n, MOTION_DIM) and torch.isfinite(a).all()
    windows = len(offline_starts(n))
    assert windows == 3 and seen == [(k + 1, windows) for k in range(windows)]
    b = generate_motion(lmdm, cond, kp, steps=3, seed=7)
    c = generate_motion(lmdm, cond, kp, steps=3, seed=8)
    assert torch.equal(a, b)  # reproducible from the seed
    assert not torch.allclose(a, c)  # and the seed matters
    d = generate_motion(lmdm, cond, kp, steps=1, seed=7)
    assert not torch.allclose(a, d)  # so do the steps


def test_clip_motion_reads_nothing_back(lmdm, host_reads) -> None:
    cond = torch.randn(SEQ_FRAMES + 5, COND_DIM)
    kp = torch.zeros(MOTION_DIM)
    lmdm.schedule(2)  # host-side constants, built once per step count
    with host_reads() as calls:
        generate_motion(lmdm, cond, kp, steps=2, seed=0)
    assert calls == []


def test_clip_motion_fast_path_matches_the_eager_loop(lmdm, host_reads) -> None:
    """The fast path (hoisted embeddings, static buffers; captured on CUDA) run uncaptured."""
    n = SEQ_FRAMES + (SEQ_FRAMES - OVERLAP_OFFLINE) + 9  # two windows, the last one padded
    cond = torch.randn(n, COND_DIM, generator=torch.Generator().manual_seed(4))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(5))
    eager = generate_motion(lmdm, cond, kp, steps=4, seed=3)
    fast = generate_motion(lmdm, cond, kp, steps=4, seed=3, fast=True)
    torch.testing.assert_close(fast, eager, rtol=1e-4, atol=1e-5)
    made = graphs_made_ms()
    with host_reads() as calls:  # the window graph is built: nothing is read back
        again = generate_motion(lmdm, cond, kp, steps=4, seed=3, fast=True)
    assert calls == [] and torch.equal(again, fast)
    assert graphs_made_ms() == made  # the kept graph: no time spent making one
    other = generate_motion(lmdm, cond, kp, steps=2, seed=3, fast=True)  # a second graph
    torch.testing.assert_close(other, generate_motion(lmdm, cond, kp, steps=2, seed=3))
    assert graphs_made_ms() > made


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
def test_clip_motion_captured_on_cuda_matches_the_cpu_eager_loop(lmdm) -> None:
    """The product's CUDA path (window constants, two captured graphs per step count, fp32)
    against the eager loop on the CPU, over two windows and replayed graphs; the time spent
    capturing is counted once."""
    import copy

    n = SEQ_FRAMES + (SEQ_FRAMES - OVERLAP_OFFLINE) + 9
    cond = torch.randn(n, COND_DIM, generator=torch.Generator().manual_seed(4))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(5))
    gpu = copy.deepcopy(lmdm).cuda()
    eager = generate_motion(lmdm, cond, kp, steps=4, seed=3)
    made, before = [], graphs_made_ms()
    for _ in range(2):  # capture, then replay the kept graph
        got = generate_motion(gpu, cond.cuda(), kp.cuda(), steps=4, seed=3)
        assert got.is_cuda
        torch.testing.assert_close(got.cpu(), eager, rtol=1e-3, atol=1e-4)
        made.append(graphs_made_ms() - before)
    assert made[0] > 0 and made[1] == made[0]


def test_clip_motion_rejects_a_condition_of_the_wrong_width(lmdm) -> None:
    with pytest.raises(ValueError, match=f"\\[N, {COND_DIM}\\]"):
        generate_motion(lmdm, torch.zeros(10, 37), torch.zeros(MOTION_DIM), steps=2)


def test_memory_plan() -> None:
    cpu = plan_memory("auto", 0, torch.device("cpu"), torch.float32)
    assert (cpu.mode, cpu.batch) == ("resident", 4)
    assert plan_memory("streamed", 3, torch.device("cpu"), torch.float32).batch == 3
    gpu = torch.device("cuda")
    big = plan_memory("auto", 0, gpu, torch.float16, free_bytes=120 * 2**30)
    assert big.mode == "resident" and big.batch == 32 and "120.0 GiB" in big.reason
    small = plan_memory("auto", 0, gpu, torch.float16, free_bytes=3 * 2**30)
    assert small.mode == "streamed" and 1 <= small.batch <= 4
    fp32 = plan_memory("resident", 0, gpu, torch.float32, free_bytes=12 * 2**30)
    half = plan_memory("resident", 0, gpu, torch.float16, free_bytes=12 * 2**30)
    assert fp32.batch < half.batch  # half precision fits twice the frames
    assert plan_memory("resident", 5, gpu, torch.float16, free_bytes=2**30).batch == 5


def test_device_names() -> None:
    from studio.runtime.base import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    with pytest.raises(InputError, match="--device tpu: not a device"):
        resolve_device("tpu")
    with pytest.raises(InputError, match="runs on cpu or cuda"):
        resolve_device("meta")


def test_precision_choice() -> None:
    cpu = torch.device("cpu")
    assert render_dtype("auto", cpu) == torch.float32  # the fp16 defaults fall back on the CPU
    assert render_dtype("bf16", cpu) == torch.bfloat16
    assert render_dtype("warp_network=bf16", cpu) == torch.float32  # the decoder's fallback
    with pytest.raises(OptionError, match="--precision: warp_network=fp16: .*fp16 kernels"):
        render_dtype("fp16", cpu)
    if torch.cuda.is_available():
        assert render_dtype("auto", torch.device("cuda")) == torch.float16
    else:  # the same plan as the engines: no CUDA, no CUDA render
        with pytest.raises(OptionError, match="--runtime: torch cannot run on cuda"):
            render_dtype("auto", torch.device("cuda"))


def test_every_missing_file_is_named_with_its_stage(tmp_path) -> None:
    write_checkpoint_tree(tmp_path, reduced=True, networks=["lmdm", "decoder"], cfg=False)
    with pytest.raises(InputError) as err:
        require(discover(tmp_path), ENGINE_ROLES)
    msg = str(err.value)
    for name, stage in (
        ("aux_models/hubert_streaming_fix_kv.onnx", "audio / HuBERT"),
        ("models/stitch_network.pth", "render / stitching"),
        ("models/warp_network.pth", "render / warp"),
    ):
        assert f"missing ditto_pytorch/{name} (stage: {stage})" in msg
    assert "lmdm_v0.4_hubert.pth" not in msg and "decoder.pth" not in msg
    assert np.char.count(msg, "missing ") == 3


# --- the renderer, on reduced networks and an avatar made from them ------------------------


class _Avatar:
    """What registration hands the engine, built here from the real (reduced) extractors."""

    def __init__(self) -> None:
        from studio.fixtures.random_tree import random_network

        gen = torch.Generator().manual_seed(3)
        crop = torch.rand(1, 3, 256, 256, generator=gen)
        with torch.no_grad():
            heads = random_network("motion_extractor", reduced=True)(crop)
            self.f_s = random_network("appearance_extractor", reduced=True)(crop).numpy()
        names = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
        self.x_s_info = {k: v.numpy() for k, v in zip(names, heads, strict=True)}
        rng = np.random.default_rng(0)
        self.image = rng.integers(0, 256, (300, 420, 3), dtype=np.uint8)
        # crop -> image: the 512 crop shrunk to 200 px at (100, 40)
        s = 200 / 512
        self.m_c2o = np.array([[s, 0, 100], [0, s, 40], [0, 0, 1]], dtype=np.float32)


@pytest.fixture(scope="module")
def render_nets():
    from studio.engines.ditto.engine import DittoNetworks

    names = ("stitch_network", "warp_network", "decoder")
    nets = {n: random_network(n, reduced=True) for n in names}
    return DittoNetworks(
        random_network("lmdm", reduced=True, cond_dim=COND_DIM),
        nets["stitch_network"],
        nets["warp_network"],
        nets["decoder"],
        torch.device("cpu"),
    )


def _renderer(nets, settings=None, mode="resident", batch=2, size=512):
    from studio.engines.ditto.engine import DittoRenderer, MemoryPlan
    from studio.settings import RenderSettings

    s = settings or RenderSettings(backend="ditto")
    return DittoRenderer(nets, _Avatar(), s, size, MemoryPlan(mode, batch, "test"))


def _motion(n=5):
    from studio.layout import motion_from_info

    base = motion_from_info(_Avatar().x_s_info)
    rng = np.random.default_rng(1)
    return (base + rng.normal(0, 0.05, (n, MOTION_DIM))).astype(np.float32)


def test_full_frames_paste_the_face_into_the_avatar_image(render_nets) -> None:
    r = _renderer(render_nets)
    motion = _motion()
    r.prepare(motion)
    frames = r.render_frames(np.arange(5))
    img = _Avatar().image
    assert frames.shape == (5, 300, 420, 3) and frames.dtype == np.uint8
    assert (r.height, r.width) == (300, 420)
    # outside the pasted square the avatar image is untouched; inside it changes
    assert np.array_equal(frames[:, :, :95], np.broadcast_to(img[:, :95], (5, 300, 95, 3)))
    assert np.array_equal(frames[:, 250:], np.broadcast_to(img[250:], (5, 50, 420, 3)))
    assert (frames[:, 60:220, 120:280] != img[60:220, 120:280]).mean() > 0.5
    assert not np.array_equal(frames[0], frames[4])  # the motion moves the face
    t = r.timings_ms
    assert set(t) == {"stitching", "warp_decode", "putback"} and all(v > 0 for v in t.values())


class _VideoAvatar:
    """A video avatar of 6 source frames: per-frame features, keypoints, eye info, crop
    matrices (the face square moves right 4 px a frame) and frames (noise)."""

    def __init__(self, n: int = 6) -> None:
        from studio.fixtures.random_tree import random_network

        gen = torch.Generator().manual_seed(5)
        crops = torch.rand(n, 3, 256, 256, generator=gen)
        with torch.no_grad():
            heads = random_network("motion_extractor", reduced=True)(crops)
            self.f_s = random_network("appearance_extractor", reduced=True)(crops).numpy()
        names = ("pitch", "yaw", "roll", "t", "exp", "scale", "kp")
        self.x_s_info = {k: v.numpy().reshape(n, -1) for k, v in zip(names, heads, strict=True)}
        rng = np.random.default_rng(2)
        self.frames = rng.integers(0, 256, (n, 300, 420, 3), dtype=np.uint8)
        self.image = self.frames[0]
        s = 200 / 512
        self.m_c2o = np.stack(
            [np.array([[s, 0, 100 + 4 * i], [0, s, 40], [0, 0, 1]], np.float32) for i in range(n)]
        )


def _video_renderer(nets, mode="resident", batch=2, avatar=None, loop="pingpong"):
    from studio.engines.ditto.engine import DittoRenderer, MemoryPlan
    from studio.settings import RenderSettings

    s = RenderSettings(backend="ditto", video_loop=loop)
    return DittoRenderer(nets, avatar or _VideoAvatar(), s, 512, MemoryPlan(mode, batch, "test"))


def test_a_video_avatars_device_copy_is_shared_and_its_frames_go_up_for_full_frames_only(
    render_nets,
) -> None:
    from studio.engines.ditto.engine import DeviceAvatar, DittoRenderer, MemoryPlan
    from studio.settings import RenderSettings

    video = _VideoAvatar()
    shared = DeviceAvatar(video, torch.device("cpu"))
    plan = MemoryPlan("resident", 2, "test")
    crop = DittoRenderer(
        render_nets, video, RenderSettings(backend="ditto", frame="crop"), 512, plan, shared
    )
    assert shared._frames is None  # a crop renderer pastes nothing back
    full = DittoRenderer(render_nets, video, RenderSettings(backend="ditto"), 512, plan, shared)
    assert shared._frames is not None and crop.f_s is full.f_s is shared.f_s
    own = _video_renderer(render_nets, avatar=video)  # its own upload: the same pictures
    motion = _motion(4)
    for r in (full, own):
        r.prepare(motion)
    np.testing.assert_array_equal(full.render_frames(np.arange(4)), own.render_frames(np.arange(4)))


def test_a_video_avatar_pastes_each_frame_onto_its_mirrored_source_frame(render_nets) -> None:
    from studio.motion.condition import mirror_indices

    video = _VideoAvatar()
    motion = np.repeat(_motion(1), 12, axis=0)  # one pose: every change comes from the source
    r = _video_renderer(render_nets, avatar=video)
    r.prepare(motion)
    frames = r.render_frames(np.arange(12))
    src = mirror_indices(np.arange(12), 6)
    assert src.tolist() == [0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0]
    for g, i in enumerate(src):  # the background is source frame i's, outside the square
        np.testing.assert_array_equal(frames[g, :, :95], video.frames[i, :, :95])
        np.testing.assert_array_equal(frames[g, 260:], video.frames[i, 260:])
    _same_frames(frames[6], frames[5])  # the same source frame and motion: the same frame
    _same_frames(frames[11], frames[0])
    assert np.abs(frames[1].astype(int) - frames[0]).mean() > 1.0
    # the streamed plan, row calls with their indices and one chunk ahead agree
    streamed = _video_renderer(render_nets, "streamed", 1, video)
    streamed.prepare(motion)
    _same_frames(streamed.render_frames(np.array([7, 2])), frames[[7, 2]])
    rows = _video_renderer(render_nets, avatar=video)
    rows.prepare(motion)
    _same_frames(rows.render_batch(motion[[3, 9]], np.array([3, 9])), frames[[3, 9]])
    _same_frames(rows.render_batch(motion[:2]), frames[10:12])  # counting on from 10
    chunks = list(rows.iter_render([np.arange(4), np.arange(4, 8)]))
    _same_frames(np.concatenate(chunks), frames[:8])
    # looped instead: frame 6 starts the video again
    looped = _video_renderer(render_nets, avatar=video, loop="loop")
    looped.prepare(motion)
    again = looped.render_frames(np.array([6, 7]))
    for g, i in ((0, 0), (1, 1)):
        np.testing.assert_array_equal(again[g, :, :95], video.frames[i, :, :95])
    # a 50 fps export: the video keeps its pace, each source frame shown twice
    r.frame_rate = 50
    doubled = r.render_frames(np.arange(4))
    for g, i in enumerate([0, 0, 1, 1]):
        np.testing.assert_array_equal(doubled[g, :, :95], video.frames[i, :, :95])


def test_a_video_avatar_follows_its_own_pose_and_eyes(render_nets) -> None:
    """Only the lips are driven: motion rows that differ in head pose give the same frame."""
    base = _motion(3)
    turned = base.copy()
    turned[:, 1:202] = base[:1, 1:202] + 0.8  # another pose and translation on every row
    r = _video_renderer(render_nets)
    r.prepare(base)
    a = r.render_frames(np.arange(3))
    turned[0] = base[0]  # the same frame 0 (d0)
    r.prepare(turned)
    _same_frames(r.render_frames(np.arange(3)), a)


def test_video_inbetweens_are_rendered_where_no_crops_are_kept(render_nets) -> None:
    """Live (rows rendered directly) a video's in-between is rendered, never a cross-fade of
    two keyframes over two different backgrounds."""
    video = _VideoAvatar()
    motion = _motion(5)
    r = _video_renderer(render_nets, avatar=video)
    r.prepare(motion)
    want = r.render_frames(np.arange(5))
    keys = r.render_batch(motion[[0, 4]], np.array([0, 4]))
    rows = np.stack([motion[0], motion[4], motion[2]])
    made = r.inbetween(keys[0], keys[1], rows, 0.5, keys=(0, 4, 2))
    _same_frames(made[None], want[2:3])
    np.testing.assert_array_equal(made[:, :95], video.frames[2, :, :95])


def test_memory_modes_batches_and_row_calls_agree(render_nets) -> None:
    motion = _motion(3)
    ref = _renderer(render_nets, batch=3)
    ref.prepare(motion)
    want = ref.render_frames(np.arange(3))
    for mode, batch, frames in (("resident", 2, [2, 0]), ("streamed", 1, [1, 2])):
        r = _renderer(render_nets, mode=mode, batch=batch)
        r.prepare(motion)
        _same_frames(r.render_frames(np.array(frames)), want[frames])
    rows = _renderer(render_nets)
    rows.prepare(motion)
    _same_frames(rows.render_batch(motion[[1, 2]]), want[[1, 2]])


def _same_frames(a: np.ndarray, b: np.ndarray) -> None:
    """Equal up to float rounding of a different batch size (a level here and there)."""
    diff = np.abs(a.astype(int) - b)
    assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


def test_crop_frames_and_pose_delta(render_nets) -> None:
    from studio.settings import RenderSettings

    motion = _motion(2)
    s = RenderSettings(backend="ditto", frame="crop")
    r = _renderer(render_nets, s, size=256)
    r.prepare(motion)
    crop = r.render_frames(np.arange(2))
    assert crop.shape == (2, 256, 256, 3)
    turned = _renderer(render_nets, s.replace(delta_yaw=20.0), size=256)
    turned.prepare(motion)
    assert np.abs(turned.render_frames(np.arange(2)).astype(int) - crop).mean() > 1.0
    with pytest.raises(RuntimeError, match="prepare"):
        _renderer(render_nets).render_frames(np.arange(1))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ),
    ],
)
def test_streamed_chunks_equal_frame_calls(render_nets, device) -> None:
    """iter_render (one chunk ahead, double-buffered on a GPU) gives render_frames' frames."""
    import copy

    from studio.engines.ditto.engine import DittoNetworks

    dev = torch.device(device)
    nets = render_nets
    if dev.type == "cuda":
        nets = DittoNetworks(
            *(copy.deepcopy(m).to(dev) for m in (nets.lmdm, nets.stitch, nets.warp, nets.decoder)),
            dev,
        )
    motion = _motion(7)
    r = _renderer(nets, batch=3)
    r.prepare(motion)
    chunks = [np.arange(0, 3), np.arange(3, 6), np.arange(6, 7)]
    wants = [r.render_frames(c) for c in chunks]  # before streaming: no buffer shared with it
    streamed = list(r.iter_render(iter([*chunks[:2], np.arange(0), chunks[2]])))
    assert [len(c) for c in streamed] == [3, 3, 1]  # the empty chunk yields nothing
    assert not any(np.shares_memory(a, b) for a in streamed for b in streamed if a is not b)
    assert r.render_frames(np.arange(0)).shape == (0, *wants[0].shape[1:])
    for got, want in zip(streamed, wants, strict=True):
        if dev.type == "cuda":  # fp16 kernels may differ by a level on a few pixels
            diff = np.abs(got.astype(int) - want)
            assert diff.max() <= 3 and diff.mean() < 0.1
        else:
            _same_frames(got, want)


def test_yuv_frames_are_the_rgb_frames_converted(render_nets) -> None:
    """What start_video asks for: the encoder's planes, made on the device."""
    from studio.export.yuv import rgb_to_yuv420p

    r = _renderer(render_nets, batch=2)
    r.prepare(_motion(2))
    rgb = r.render_frames(np.arange(2))
    r.pixel_format = "yuv420p"
    planes = r.render_frames(np.arange(2))
    assert planes.shape == (2, 450, 420)
    np.testing.assert_array_equal(planes, rgb_to_yuv420p(torch.from_numpy(rgb)).numpy())


def test_render_engine_sets_of_old_settings_are_dropped(render_nets) -> None:
    from studio.engines.ditto.engine import RENDER_CONFIGS

    nets = render_nets
    nets._render.clear()
    first = nets.warp_decode("auto")
    assert nets.warp_decode("auto") is first  # cached
    nets.warp_decode("fp32")
    nets.warp_decode("auto")  # used again: "fp32" is now the oldest
    nets.warp_decode("bf16")
    assert len(nets._render) == RENDER_CONFIGS
    assert set(nets._render) == {"torch:auto", "torch:bf16"}
    assert nets.warp_decode("auto") is first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (events)")
def test_stage_clock_holds_a_bounded_number_of_events():
    from studio.engines.ditto.engine import StageClock

    clock = StageClock(torch.device("cuda"))
    for _ in range(3 * StageClock.KEEP):
        with clock.stage("x"):
            torch.ones(8, device="cuda").sum()
    assert len(clock._pending) <= StageClock.KEEP
    assert clock.ms()["x"] > 0 and not clock._pending


# --- in-betweens warped on the crop, before paste-back --------------------------------------


def test_inbetweens_warp_the_kept_crops_and_paste_back_exactly(render_nets) -> None:
    from studio.engines.base import crossfade
    from studio.render.inbetween import motion_inbetweens

    motion = _motion(4)
    motion[1] = motion[0]  # frame 1 is frame 0 again: its in-between of (0, 1) is the keyframe
    r = _renderer(render_nets, batch=2)
    r.prepare(motion)
    keys = r.render_frames(np.array([0, 1, 3]))
    assert len(r.crops) == 3
    rows = motion[[[0, 1, 1], [1, 3, 2]]]
    made = r.inbetweens(
        [keys[0], keys[1]],
        [keys[1], keys[2]],
        rows,
        np.array([0.5, 0.5]),
        warp=motion_inbetweens,
        keys=np.array([[0, 1, 1], [1, 3, 2]]),
    )
    assert "inbetween" in r.timings_ms
    # identical keyframes and keypoints: nothing moves (the crop kept as uint8: a level off)
    assert np.abs(made[0].astype(int) - keys[0]).max() <= 1
    img = _Avatar().image  # outside the pasted square the avatar image stays exact
    assert np.array_equal(made[1][:, :95], img[:, :95]) and np.array_equal(made[1][250:], img[250:])
    fade = crossfade(keys[1], keys[2], 0.5)
    assert np.abs(made[1].astype(int) - fade).mean() > 0.05  # moved, not faded in place


def test_inbetweens_without_kept_crops_cross_fade(render_nets) -> None:
    from studio.engines.base import crossfade
    from studio.render.inbetween import motion_inbetweens

    motion = _motion(3)
    r = _renderer(render_nets, batch=2)
    r.prepare(motion)
    a, b = r.render_batch(motion[[0, 2]])  # rows rendered directly: no crops kept
    made = r.inbetweens(
        [a], [b], motion[None, [0, 2, 1]], np.array([0.5]), motion_inbetweens, np.array([[0, 2, 1]])
    )
    assert np.array_equal(made[0], crossfade(a, b, 0.5))


def test_a_live_sessions_inbetweens_are_warped_like_a_clips(render_nets) -> None:
    """A live session prepares its first row only and renders its keyframes by index as they
    come: their crops are kept and the in-between's keypoints are stitched from its rows, so
    it is warped, as in a clip, not cross-faded."""
    from studio.engines.base import crossfade
    from studio.render.inbetween import motion_inbetweens

    motion = _motion(4)
    keys, rows, w = np.array([[0, 3, 1]]), motion[None, [0, 3, 1]], np.array([1 / 3])
    clip = _renderer(render_nets, batch=2)
    clip.prepare(motion)
    a, b = clip.render_frames(np.array([0, 3]))
    want = clip.inbetweens([a], [b], rows, w, motion_inbetweens, keys)[0]
    live = _renderer(render_nets, batch=2)
    live.prepare(motion[:1])
    (la,) = live.render_batch(motion[[0]], np.array([0]))
    (lb,) = live.render_batch(motion[[3]], np.array([3]))
    # one row a call, not two: the float sums round a level off at most
    assert np.abs(la.astype(int) - a).max() <= 1 and np.abs(lb.astype(int) - b).max() <= 1
    made = live.inbetweens([la], [lb], rows, w, motion_inbetweens, keys)[0]
    assert np.abs(made.astype(int) - want).max() <= 1
    assert np.abs(made.astype(int) - crossfade(a, b, 1 / 3)).mean() > 0.05  # warped, not faded


def test_kept_crops_follow_the_chunks(render_nets) -> None:
    from studio.engines.ditto.crops import KEPT_CHUNKS

    r = _renderer(render_nets, batch=2)
    r.prepare(_motion(12))
    chunks = [np.arange(s, s + 2) for s in range(0, 12, 2)]
    for _ in r.iter_render(iter(chunks)):
        pass
    assert len(r.crops) == 2 * KEPT_CHUNKS
    assert r.crops.get(np.array([11, 8])) is not None and r.crops.get(np.array([0])) is None


@pytest.mark.parametrize("frame", ["full", "crop"])
def test_a_clip_with_cadence_makes_its_inbetweens_on_the_crop(render_nets, frame) -> None:
    from studio.motion.cadence import plan_cadence
    from studio.render.pipeline import MotionResult, iter_frames
    from studio.settings import RenderSettings

    motion = _motion(7)
    plan = plan_cadence(None, 3, num_frames=7)  # keyframes 0, 3, 6
    result = MotionResult(None, None, motion, plan, motion, {}, {})
    r = _renderer(render_nets, RenderSettings(backend="ditto", frame=frame), batch=2)
    frames = list(iter_frames(result, r))
    assert len(frames) == 7 and "inbetween" in r.timings_ms
    assert {f.shape for f in frames} == {(300, 420, 3) if frame == "full" else (512, 512, 3)}
    r.prepare(motion)
    full = r.render_frames(np.arange(7))
    _same_frames(frames[3], full[3])  # keyframes are the renders
    assert not np.array_equal(frames[1], full[1])  # an in-between is made, not rendered


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graphed_warp_replays_the_eager_warp() -> None:
    from studio.engines.ditto.warp_graphs import WarpGraphs
    from studio.render.inbetween import motion_inbetweens

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    graphs = WarpGraphs(dev)
    for count in (3, 3, 2, 9):  # a bucket of 4 twice, then 2, then 8 + 1
        crops = torch.randint(0, 256, (2, count, 64, 64, 3), generator=gen, dtype=torch.uint8)
        kp = 8 + 48 * torch.rand(count, 1, 21, 2, generator=gen, dtype=torch.float64)
        kp = kp + torch.rand(count, 3, 21, 2, generator=gen, dtype=torch.float64)
        w = np.linspace(0.2, 0.8, count)
        a, b = crops[0].to(dev), crops[1].to(dev)
        want = motion_inbetweens(a, b, *kp.to(dev).unbind(1), torch.as_tensor(w))
        got = graphs(motion_inbetweens, list(a), list(b), kp.to(dev), w)
        assert got.shape == want.shape
        assert (got.int() - want.int()).abs().max().item() <= 1


def test_a_clip_without_inbetweens_keeps_no_crops(render_nets) -> None:
    from studio.settings import RenderSettings

    motion = _motion(3)
    for frame in ("full", "crop"):
        r = _renderer(render_nets, RenderSettings(backend="ditto", frame=frame), batch=2)
        r.prepare(motion, inbetweens=False)
        plain = r.render_frames(np.arange(3))
        assert len(r.crops) == 0
        r.prepare(motion)
        kept = r.render_frames(np.arange(3))
        assert len(r.crops) == 3 and np.array_equal(plain, kept)  # the same frames either way


def test_transparent_frames_are_the_paste_back_mask(render_nets) -> None:
    r = _renderer(render_nets)
    r.prepare(_motion(2))
    over_avatar = r.render_frames(np.arange(2))
    rgba = r.render_rgba(np.arange(2))
    assert rgba.shape == (2, 300, 420, 4) and r.backdrop is None  # the avatar's back again
    y0, y1, x0, x1 = r.paste.box
    mask = np.zeros((300, 420))
    mask[y0:y1, x0:x1] = r.paste.mask[..., 0].numpy() * 255
    alpha = rgba[..., 3].astype(int)
    assert alpha[:, mask == 0].max() == 0  # transparent wherever the paste-back mask is zero
    assert np.abs(alpha - mask).max() <= 2
    inside = mask >= 254.5  # the face itself: the colour the avatar frame shows there
    assert np.abs(rgba[:, inside, :3].astype(int) - over_avatar[:, inside]).max() <= 1
    r.set_backdrop((0, 177, 64))
    green = r.render_frames(np.arange(1))[0]
    assert (green[mask == 0] == (0, 177, 64)).all()
    assert np.array_equal(green[inside], over_avatar[0][inside])


def test_crop_frames_over_a_backdrop_through_the_feather_mask(render_nets) -> None:
    from studio.settings import RenderSettings

    r = _renderer(render_nets, RenderSettings(backend="ditto", frame="crop"), size=128)
    r.prepare(_motion(1))
    plain = r.render_frames(np.arange(1))[0]
    r.set_backdrop((0, 0, 255))
    blue = r.render_frames(np.arange(1))[0]
    assert np.abs(blue[:2, :2].astype(int) - (0, 0, 255)).max() <= 2  # the feathered corner
    assert np.abs(blue[60:68, 60:68].astype(int) - plain[60:68, 60:68]).max() <= 1
    rgba = r.render_rgba(np.arange(1))[0]
    assert rgba[0, 0, 3] <= 2 and rgba[64, 64, 3] >= 253


def test_emotion_keys_change_the_lmdm_condition_and_motion_only_inside_their_windows(
    lmdm,
) -> None:
    from studio.layout import EMOTIONS, HUBERT_DIM
    from studio.motion.condition import (
        ConditionConfig,
        ConditionSource,
        assemble,
        emotion_from_weights,
    )
    from studio.motion.controls import ControlTracks

    n = 2 * (SEQ_FRAMES - OVERLAP_OFFLINE) + 17  # three windows: from 0, 70 and 140
    keys = [{"t": 0, "value": "Neutral", "interp": "hold"}, {"t": 4.4, "value": "Happy"}]
    rows = ControlTracks.from_dict({"tracks": {"emotion": keys}}).emotion_rows(n)
    feats = np.random.default_rng(3).normal(size=(n, HUBERT_DIM)).astype(np.float32)
    source = ConditionSource(np.zeros((1, 2)), np.zeros((1, 6)), np.zeros(63), True)
    plain = assemble(feats, 0, source, ConditionConfig())
    keyed = assemble(feats, 0, source, ConditionConfig(emotion=emotion_from_weights(rows)))
    emo = slice(HUBERT_DIM, HUBERT_DIM + len(EMOTIONS))
    changed = np.flatnonzero((plain != keyed).any(axis=1))
    assert changed.min() == 110 and changed.max() == n - 1  # from the key at 4.4 s on
    assert np.array_equal(np.delete(plain, emo, axis=1), np.delete(keyed, emo, axis=1))
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(2))
    a = generate_motion(lmdm, torch.from_numpy(plain), kp, steps=2, seed=7)
    b = generate_motion(lmdm, torch.from_numpy(keyed), kp, steps=2, seed=7)
    moved = torch.nonzero((a != b).any(dim=1)).flatten()
    # the first window (frames 0..79) does not see the key: the motion there is the same,
    # up to the cross-fade into the second window (70..79) and its box smoothing
    assert torch.equal(a[:65], b[:65]) and moved.min() >= 65
    assert (a[110:] != b[110:]).any(dim=1).all()


def test_an_emotion_edit_samples_only_the_windows_from_the_first_it_changes(lmdm) -> None:
    from studio.motion.generator import WindowMemo

    n = 3 * (SEQ_FRAMES - OVERLAP_OFFLINE) + 17  # four windows: from 0, 70, 140 and 210
    gen = torch.Generator().manual_seed(5)
    cond = torch.randn(n, COND_DIM, generator=gen)
    kp = torch.randn(MOTION_DIM, generator=torch.Generator().manual_seed(2))
    memo = WindowMemo()
    first = generate_motion(lmdm, cond, kp, steps=2, seed=7, memo=memo)
    assert (memo.reused, memo.windows) == (0, 4)
    assert torch.equal(generate_motion(lmdm, cond, kp, steps=2, seed=7, memo=memo), first)
    assert memo.reused == 4  # nothing changed: no window sampled
    keyed = cond.clone()
    keyed[180:, 1024:1032] += 1.0  # an emotion from 7.2 s: windows 140 and 210 see it
    calls = []
    again = generate_motion(
        lmdm, keyed, kp, steps=2, seed=7, memo=memo, on_window=lambda d, t: calls.append(d)
    )
    assert memo.reused == 2 and len(calls) == 4
    fresh = generate_motion(lmdm, keyed, kp, steps=2, seed=7)  # the same motion, sampled whole
    assert torch.equal(again, fresh) and not torch.equal(again, first)
    other_seed = generate_motion(lmdm, keyed, kp, steps=2, seed=8, memo=memo)
    assert memo.reused == 0 and not torch.equal(other_seed, fresh)


def test_a_video_avatars_own_motion_is_its_frames_in_playback_order() -> None:
    """What cadence bounds its gaps by (Engine.source_motion): the video's keypoint rows in
    the order its frames are shown; a photo has none."""
    from types import SimpleNamespace

    from studio.engines.ditto.engine import DittoEngine
    from studio.layout import motion_from_info
    from studio.settings import RenderSettings

    video = _VideoAvatar()
    s = RenderSettings(backend="ditto")
    rows = DittoEngine.source_motion(SimpleNamespace(avatar=video), 9, s)
    frame = [
        motion_from_info({k: v[i : i + 1] for k, v in video.x_s_info.items()}) for i in range(6)
    ]
    for g, i in enumerate([0, 1, 2, 3, 4, 5, 5, 4, 3]):
        np.testing.assert_array_equal(rows[g], frame[i])
    looped = DittoEngine.source_motion(
        SimpleNamespace(avatar=video), 9, s.replace(video_loop="loop")
    )
    np.testing.assert_array_equal(looped[6], frame[0])
    assert DittoEngine.source_motion(SimpleNamespace(avatar=_Avatar()), 9, s) is None


def test_engines_for_a_short_clip_skip_cudnns_kernel_search(render_nets) -> None:
    """cuDNN's search pays for itself only over many frames: a render's own clip under
    AUTOTUNE_MIN_FRAMES builds without it, a batch with many frames ahead builds with it.
    The choice is reported only where it runs (a GPU)."""
    from studio.engines.ditto.warp_decode import AUTOTUNE_MIN_FRAMES

    r = _renderer(render_nets)
    assert r.warp_decode.autotune  # engines built on demand (a preview) search as before
    r.build_engines(5)
    assert not r.warp_decode.autotune
    r.build_engines(5, ahead=AUTOTUNE_MIN_FRAMES)
    assert r.warp_decode.autotune
    r.build_engines(AUTOTUNE_MIN_FRAMES - 1)
    assert not r.warp_decode.autotune
    assert r.warp_decode.describe()["cudnn_autotune"] is False  # the CPU has no cuDNN


def test_a_faster_motion_precision_is_a_note_on_the_cpu(ditto_assets):
    """--motion-precision acts on a GPU's LMDM windows: the CPU runs its eager fp32 loop and
    says so before any work; fp32 (the default) says nothing."""
    from studio.engines.base import EngineRequest
    from studio.render.engines import prepare_engine
    from studio.settings import RenderSettings

    def notes(precision: str) -> tuple[str, ...]:
        settings = RenderSettings(backend="ditto", motion_precision=precision)
        request = EngineRequest(settings, str(ditto_assets["tree"]), str(ditto_assets["face"]))
        return prepare_engine(request).notes

    assert notes("fp32") == ()
    (note,) = notes("fp16")
    assert note == "--motion-precision fp16 is ignored on the CPU: LMDM runs in fp32 there"


def test_the_live_plans_sample_in_tf32_at_least_and_the_clip_layout_as_the_clip():
    from studio.engines.ditto.engine import _live_precision

    assert _live_precision("fp32", live=True) == "tf32"
    assert _live_precision("fp16", live=True) == "fp16"
    assert _live_precision("fp32", live=False) == "fp32"
    assert _live_precision("bf16", live=False) == "bf16"


def test_the_window_memo_keeps_one_precision_apart_from_another(lmdm) -> None:
    """A clip sampled at another precision is not the memo's: its windows are sampled again."""
    from studio.motion.generator import WindowMemo

    gen = torch.Generator().manual_seed(5)
    cond = torch.randn(150, COND_DIM, generator=gen)
    kp = torch.randn(MOTION_DIM, generator=gen)
    memo = WindowMemo()
    generate_motion(lmdm, cond, kp, steps=2, seed=7, fast=True, memo=memo)
    assert memo.reused == 0 and memo.windows > 1
    generate_motion(lmdm, cond, kp, steps=2, seed=7, fast=True, memo=memo)
    assert memo.reused == memo.windows
    half = generate_motion(lmdm, cond, kp, steps=2, seed=7, fast=True, precision="bf16", memo=memo)
    assert memo.reused == 0
    full = generate_motion(lmdm, cond, kp, steps=2, seed=7, fast=True)
    assert not torch.equal(half, full)
    cos = torch.nn.functional.cosine_similarity(half.flatten(), full.flatten(), dim=0)
    assert cos.item() > 0.999


def test_each_engines_checks_read_only_the_settings_it_declares(ditto_assets) -> None:
    """A batch checks one job per avatar and values of the settings an engine declares its
    checks read (Capabilities.checked): a check that read another setting would let a job's
    bad value through unchecked."""
    from studio.engines.base import EngineRequest
    from studio.render.engines import capabilities, prepare_engine
    from studio.settings import RenderSettings

    class Reading:
        """The settings, noting each field read."""

        def __init__(self, settings: RenderSettings) -> None:
            self.settings, self.read = settings, set()

        def __getattr__(self, name: str):
            self.read.add(name)
            return getattr(self.settings, name)

    tree, face = str(ditto_assets["tree"]), str(ditto_assets["face"])
    for backend, args in (("ditto", (tree, face)), ("demo", (None, None))):
        settings = Reading(RenderSettings(backend=backend, compile=True, motion_precision="fp16"))
        prepare_engine(EngineRequest(settings, *args))  # type: ignore[arg-type]
        assert settings.read - {"backend"} <= capabilities(backend).checked, backend
        assert "compile" in settings.read  # the spy sees what a check reads
