"""Vectorised motion stitch vs a per-frame numpy transcription of Ditto's MotionStitch.

The transcription below is deliberately literal: one frame at a time, dicts of [1, k] numpy
arrays, scipy softmax, broadcasting exactly where the reference broadcasts (so its quirks,
e.g. degrees meeting logits in a fade, come out of numpy and not of our own model of them).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from scipy.special import softmax

from studio import layout
from studio.models.stitch_network import StitchNetwork
from studio.motion import stitch as S

N = 48

# --- the per-frame reference transcription --------------------------------------------------


def ref_degrees(v: np.ndarray) -> np.ndarray:
    """66-bin logits [1, 66] -> degrees [1]; anything else passes through."""
    if v.ndim > 1 and v.shape[1] == 66:
        p = softmax(v, axis=1)
        return np.sum(p * np.arange(66, dtype=np.float32), axis=1) * 3 - 97.5
    return v


def ref_transform(info: dict) -> np.ndarray:
    """Eqn. 2 for one dict: scale * (kp @ R^T + exp) + (tx, ty, 0) -> [1, 21, 3]."""
    p, y, r = (np.deg2rad(ref_degrees(info[a]).reshape(-1)) for a in ("pitch", "yaw", "roll"))
    rx = np.array([[1, 0, 0], [0, np.cos(p[0]), -np.sin(p[0])], [0, np.sin(p[0]), np.cos(p[0])]])
    ry = np.array([[np.cos(y[0]), 0, np.sin(y[0])], [0, 1, 0], [-np.sin(y[0]), 0, np.cos(y[0])]])
    rz = np.array([[np.cos(r[0]), -np.sin(r[0]), 0], [np.sin(r[0]), np.cos(r[0]), 0], [0, 0, 1]])
    rot = (rz @ ry @ rx).astype(np.float32)
    out = info["kp"].reshape(1, 21, 3) @ rot.T + info["exp"].reshape(1, 21, 3)
    out = out * info["scale"].reshape(1, 1, 1)
    out[:, :, :2] += info["t"].reshape(1, 1, 3)[:, :, :2]
    return out


def ref_blinks(n: int, blink_n: int, open_n, rng: random.Random) -> list[int]:
    """_set_eye_blink_idx, list based."""
    idx = [0] * n
    if isinstance(open_n, int):
        if open_n < 0:
            return idx
        cycle = [open_n] if open_n > 0 else []
    else:
        cycle = list(open_n)
    start = cycle[0] if cycle else rng.randint(60, 100)
    end = cycle[-1] if cycle else rng.randint(60, 100)
    limit = n - max(end, blink_n)
    cur, k = start, 1
    while cur < limit:
        idx[cur : cur + blink_n] = list(range(blink_n))
        if cycle:
            gap = cycle[k % len(cycle)]
            k += 1
        else:
            gap = rng.randint(60, 100)
        cur = cur + blink_n + gap
    return idx


def ref_fade_ctrl(n: int, fade_in: int, fade_out: int) -> dict[int, dict]:
    """setup_Nd writing fade_alpha into a ctrl_info dict."""
    ctrl: dict[int, dict] = {}
    if fade_in > 0:
        for i in range(fade_in):
            ctrl.setdefault(i, {})["fade_alpha"] = i / fade_in
    if fade_out > 0:
        ss, ee = n - fade_out - 1, n - 1
        for i in range(ss, n):
            ctrl.setdefault(i, {})["fade_alpha"] = max((ee - i) / (ee - ss), 0)
    return ctrl


class RefStitch:
    """MotionStitch, one call per frame (image source)."""

    LIP = [6, 12, 14, 17, 19, 20]
    EYE = [11, 13, 15, 16, 18]

    def __init__(self, x_s_info: dict, cfg: S.StitchConfig, n_frames: int, net=None) -> None:
        self.s = x_s_info
        keys = ("exp", "pitch", "yaw", "roll", "t") if cfg.use_d_keys is None else cfg.use_d_keys
        if cfg.scale_ratio != 1:
            big = {"exp", "pitch", "yaw", "roll"}
            if isinstance(keys, dict):
                keys = {k: v * (cfg.scale_ratio if k in big else 1) for k, v in keys.items()}
            else:
                keys = {k: cfg.scale_ratio if k in big else 1 for k in keys}
        self.keys = keys
        self.cfg = cfg
        self.net = net
        a1 = np.zeros((21, 3), np.float32)
        a1[self.LIP] = 1
        a2: np.ndarray | int = 0
        self.eye_arr = None if cfg.delta_eye_arr is None else np.asarray(cfg.delta_eye_arr)
        if cfg.drive_eye:
            if self.eye_arr is None:
                a1[self.EYE] = 1
            else:
                a2 = np.zeros((21, 3), np.float32)
                a2[self.EYE] = 1
                a2 = a2.reshape(1, -1)
        a1 = a1.reshape(1, -1)
        self.a1, self.a2, self.a3 = a1 * (1 - a2), (1 - a1) + a1 * a2, a2
        if cfg.drive_eye and self.eye_arr is not None:
            nd = n_frames if cfg.blink_frames is None else cfg.blink_frames
            nd = 3000 if nd == -1 else nd
            rng = random.Random(cfg.blink_seed)
            self.blinks = ref_blinks(nd, len(self.eye_arr), cfg.delta_eye_open_n, rng)
        self.pose_s = [ref_degrees(x_s_info["yaw"]).item(), ref_degrees(x_s_info["pitch"]).item()]
        self.x_s = ref_transform(x_s_info)
        self.fade_dst = copy.deepcopy(x_s_info) if cfg.fade_type == "s" else None
        self.d0 = None if cfg.d0 is None else motion_dict(np.asarray(cfg.d0))
        self.idx = cfg.frame_offset

    def mix(self, d: dict) -> dict:
        s, keys = self.s, self.keys
        if self.d0 is not None:
            if isinstance(keys, dict):
                d = {k: s[k] + (v - self.d0[k]) * keys.get(k, 1) for k, v in d.items()}
            else:
                d = {k: s[k] + (v - self.d0[k]) for k, v in d.items()}
        for k, v in s.items():
            if k not in d or k not in keys:
                d[k] = v
        if isinstance(keys, dict) and self.d0 is None:
            for k, w in keys.items():
                d[k] = d[k] * w
        return d

    def __call__(self, d: dict, **kw) -> tuple[np.ndarray, np.ndarray]:
        cfg, s = self.cfg, self.s
        if cfg.relative and self.d0 is None:
            self.d0 = copy.deepcopy(d)
        d = self.mix(d)
        eye = 0
        if cfg.drive_eye and self.eye_arr is not None:
            eye = self.eye_arr[self.blinks[self.idx % len(self.blinks)]][None]
        d["exp"] = d["exp"] * self.a1 + s["exp"] * self.a2 + eye * self.a3
        va = kw.get("vad_alpha", 1)
        if va < 1:
            d["exp"] = d["exp"] * va + s["exp"] * (1 - va)
        for a in ("pitch", "yaw", "roll"):
            if f"delta_{a}" in kw:
                d[a] = ref_degrees(d[a]) + kw[f"delta_{a}"]
        for a in ("pitch", "yaw", "roll"):
            if f"alpha_{a}" in kw:
                d[a] = d[a] * kw[f"alpha_{a}"]
        if "delta_exp" in kw:
            d["exp"] = d["exp"] + kw["delta_exp"]
        if cfg.fade_type == "d0" and self.fade_dst is None:
            self.fade_dst = copy.deepcopy(d)
        if "fade_alpha" in kw and cfg.fade_type in ("d0", "s"):
            al = kw["fade_alpha"]
            for k in cfg.fade_out_keys:
                if k != "kp":
                    d[k] = d[k] * al + self.fade_dst[k] * (1 - al)
        if cfg.drive_eye:
            dx = (ref_degrees(d["yaw"]).item() - self.pose_s[0]) * 0.26
            dy = (ref_degrees(d["pitch"]).item() - self.pose_s[1]) * 0.28
            e = d["exp"]
            if dx > 0:
                e[0, 33] += dx * 0.0007
                e[0, 45] += dx * 0.001
            else:
                e[0, 33] += dx * 0.001
                e[0, 45] += dx * 0.0007
            e[0, 34] += dy * -0.001
            e[0, 46] += dy * -0.001
        x_d = ref_transform(d)
        if cfg.flag_stitching and self.net is not None:
            with torch.no_grad():
                x_d = self.net(torch.from_numpy(self.x_s), torch.from_numpy(x_d)).numpy()
        self.idx += 1
        return self.x_s, x_d


def motion_dict(row: np.ndarray) -> dict:
    """arr2dic: one 265-dim frame -> {k: [1, dim]} (scale + 1)."""
    row = row.reshape(-1).astype(np.float32)
    out, at = {}, 0
    for k, width in (("scale", 1), ("pitch", 66), ("yaw", 66), ("roll", 66), ("t", 3)):
        out[k] = row[at : at + width].reshape(1, width)
        at += width
    out["exp"] = row[at : at + 63].reshape(1, 63)
    out["scale"] = out["scale"] + 1
    return out


def frame_kwargs(controls: S.StitchControls, n: int) -> list[dict]:
    """Per-frame ctrl kwargs from controls (NaN = absent)."""
    out: list[dict] = [{} for _ in range(n)]
    for name in (
        "delta_pitch delta_yaw delta_roll alpha_pitch alpha_yaw alpha_roll vad_alpha fade_alpha"
    ).split():
        v = getattr(controls, name)
        if v is None:
            continue
        v = np.broadcast_to(np.asarray(v, np.float32), (n,))
        for i in range(n):
            if not np.isnan(v[i]):
                out[i][name] = float(v[i])
    if controls.delta_exp is not None:
        v = np.broadcast_to(np.asarray(controls.delta_exp, np.float32), (n, 63))
        for i in range(n):
            if not np.isnan(v[i]).all():
                out[i]["delta_exp"] = v[i][None].copy()
    return out


def run_reference(src: dict, motion: np.ndarray, cfg, controls=None, net=None):
    ref = RefStitch(copy.deepcopy(src), cfg, len(motion), net)
    kws = frame_kwargs(controls or S.StitchControls(), len(motion))
    outs = [ref(motion_dict(m), **kw) for m, kw in zip(motion, kws, strict=True)]
    return np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs])


# --- fixtures ------------------------------------------------------------------------------


def make_source(seed: int = 0) -> dict:
    g = np.random.default_rng(seed)
    return {
        "pitch": (g.normal(size=(1, 66)) * 1.5).astype(np.float32),
        "yaw": (g.normal(size=(1, 66)) * 1.5).astype(np.float32),
        "roll": (g.normal(size=(1, 66)) * 1.5).astype(np.float32),
        "t": (g.normal(size=(1, 3)) * 0.05).astype(np.float32),
        "exp": (g.normal(size=(1, 63)) * 0.02).astype(np.float32),
        "scale": np.array([[1.4]], np.float32),
        "kp": (g.normal(size=(1, 63)) * 0.3).astype(np.float32),
    }


def make_motion(n: int = N, seed: int = 1) -> np.ndarray:
    g = np.random.default_rng(seed)
    m = np.empty((n, 265), np.float32)
    m[:, 0] = g.normal(size=n) * 0.05
    m[:, 1:199] = g.normal(size=(n, 198)) * 1.5
    m[:, 199:202] = g.normal(size=(n, 3)) * 0.05
    m[:, 202:] = g.normal(size=(n, 63)) * 0.02
    return m


def with_gaps(x: np.ndarray, seed: int, frac: float = 0.3) -> np.ndarray:
    """NaN (absent) on a random fraction of frames."""
    x = np.array(x, np.float32, copy=True)
    x[np.random.default_rng(seed).random(len(x)) < frac] = np.nan
    return x


def rand(seed: int, scale: float, shape=(N,), offset: float = 0.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=shape) * scale + offset).astype(np.float32)


EYE_ARR = (np.random.default_rng(7).normal(size=(6, 63)) * 0.01).astype(np.float32)
EYE_ARR[0] = 0.0
FADE = S.fade_alpha_schedule(N, fade_in=6, fade_out=8)
POSE_FADE_KEYS = ("exp", "pitch", "yaw", "roll", "t", "scale", "kp")

CASES: dict[str, tuple[S.StitchConfig, S.StitchControls]] = {
    "default": (S.StitchConfig(), S.StitchControls()),
    "absolute": (S.StitchConfig(relative=False), S.StitchControls()),
    "absolute_scale": (
        S.StitchConfig(relative=False, use_d_keys=("exp", "pitch", "t", "scale")),
        S.StitchControls(),
    ),
    "weights_relative": (
        S.StitchConfig(use_d_keys={"exp": 0.5, "pitch": 1.5, "yaw": 0.7, "t": 2.0}),
        S.StitchControls(),
    ),
    "weights_absolute": (
        S.StitchConfig(relative=False, use_d_keys={"exp": 0.5, "yaw": 0.9, "scale": 1.1}),
        S.StitchControls(),
    ),
    "scale_ratio": (S.StitchConfig(scale_ratio=0.8), S.StitchControls()),
    "given_d0": (S.StitchConfig(d0=make_motion(1, seed=9)[0]), S.StitchControls()),
    "d0_overrides_absolute": (
        S.StitchConfig(relative=False, d0=make_motion(1, seed=9)[0]),
        S.StitchControls(),
    ),
    "no_drive_eye": (S.StitchConfig(drive_eye=False), S.StitchControls()),
    "no_drive_eye_with_arr": (
        S.StitchConfig(drive_eye=False, delta_eye_arr=EYE_ARR, delta_eye_open_n=5),
        S.StitchControls(),
    ),
    "blinks_fixed": (S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=7), S.StitchControls()),
    "blinks_list": (
        S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=[3, 11, 5]),
        S.StitchControls(),
    ),
    "blinks_random_short_clip": (
        S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=0, blink_frames=-1, blink_seed=3),
        S.StitchControls(),
    ),
    "blinks_never_offset": (
        S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=-1, frame_offset=5),
        S.StitchControls(),
    ),
    "vad": (
        S.StitchConfig(),
        S.StitchControls(vad_alpha=with_gaps(rand(2, 0.4, offset=0.8), 3)),
    ),
    "deltas_alphas": (
        S.StitchConfig(),
        S.StitchControls(
            delta_pitch=with_gaps(rand(4, 5.0), 5),
            delta_yaw=3.0,
            alpha_pitch=with_gaps(rand(6, 0.2, offset=1.0), 7),
            alpha_yaw=with_gaps(rand(8, 0.2, offset=1.0), 9),
            alpha_roll=0.8,
            delta_exp=with_gaps(rand(10, 0.01, shape=(N, 63)), 11),
        ),
    ),
    "fade_unused_without_type": (S.StitchConfig(), S.StitchControls(fade_alpha=FADE)),
    "fade_d0": (S.StitchConfig(fade_type="d0"), S.StitchControls(fade_alpha=FADE)),
    "fade_s": (S.StitchConfig(fade_type="s"), S.StitchControls(fade_alpha=FADE)),
    "fade_d0_pose_mixed_repr": (
        S.StitchConfig(fade_type="d0", fade_out_keys=POSE_FADE_KEYS),
        S.StitchControls(
            fade_alpha=FADE,
            delta_pitch=with_gaps(rand(12, 4.0), 13, 0.5),
            delta_roll=with_gaps(rand(14, 4.0), 15, 0.5),
            alpha_yaw=1.1,
        ),
    ),
    "fade_s_pose_mixed_repr": (
        S.StitchConfig(fade_type="s", fade_out_keys=POSE_FADE_KEYS),
        S.StitchControls(
            fade_alpha=FADE,
            delta_pitch=with_gaps(rand(16, 4.0), 17, 0.5),
            delta_yaw=with_gaps(rand(18, 4.0), 19, 0.5),
            vad_alpha=0.5,
        ),
    ),
    "everything": (
        S.StitchConfig(
            use_d_keys={"exp": 0.9, "pitch": 1.2, "yaw": 1.0, "roll": 0.8, "t": 1.0},
            delta_eye_arr=EYE_ARR,
            delta_eye_open_n=[4, 9],
            fade_type="d0",
            fade_out_keys=("exp", "yaw", "t"),
            scale_ratio=1.1,
        ),
        S.StitchControls(
            fade_alpha=FADE,
            vad_alpha=with_gaps(rand(20, 0.3, offset=0.7), 21),
            delta_yaw=with_gaps(rand(22, 6.0), 23),
            alpha_yaw=with_gaps(rand(24, 0.1, offset=1.0), 25),
            alpha_pitch=0.9,
            delta_exp=rand(26, 0.005, shape=(63,)),
        ),
    ),
}


def run_ours(src, motion, cfg, controls=None, net=None):
    x_s, x_d = S.stitch_motion(src, torch.from_numpy(motion), cfg, controls, net)
    return x_s.numpy(), x_d.detach().numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_matches_per_frame_reference(name: str) -> None:
    cfg, controls = CASES[name]
    src, motion = make_source(), make_motion()
    x_s_ref, x_d_ref = run_reference(src, motion, cfg, controls)
    x_s, x_d = run_ours(src, motion, cfg, controls)
    assert x_s.shape == (N, 21, 3) and x_d.shape == (N, 21, 3)
    np.testing.assert_allclose(x_s, x_s_ref, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(x_d, x_d_ref, atol=2e-5, rtol=1e-5)


def test_cases_exercise_the_quirks() -> None:
    """The configurations above actually change the output (no case is vacuous)."""
    src, motion = make_source(), make_motion()
    base = run_ours(src, motion, *CASES["default"])[1]
    for name in CASES:
        if name in ("default", "fade_unused_without_type", "blinks_never_offset"):
            continue
        assert np.abs(run_ours(src, motion, *CASES[name])[1] - base).max() > 1e-4, name
    same = run_ours(src, motion, *CASES["fade_unused_without_type"])[1]
    np.testing.assert_array_equal(same, base)
    # a fade_alpha of exactly 1 still turns a degree pose into logits (pitfall 5)
    one = S.StitchControls(fade_alpha=1.0, delta_pitch=10.0)
    cfg = S.StitchConfig(fade_type="s", fade_out_keys=("pitch",))
    faded = run_ours(src, motion, cfg, one)[1]
    plain = run_ours(src, motion, cfg, S.StitchControls(delta_pitch=10.0))[1]
    assert np.abs(faded - plain).max() > 1e-3


def test_x_s_is_the_transformed_source_and_first_frame_is_source_in_relative_mode() -> None:
    src, motion = make_source(), make_motion()
    x_s, x_d = run_ours(src, motion, S.StitchConfig(drive_eye=False))
    pose = {a: layout.bins_to_degrees(src[a]) for a in ("pitch", "yaw", "roll")}
    want = layout.transform_keypoints(
        src["kp"].reshape(21, 3),
        **pose,
        t=src["t"],
        scale=src["scale"][0],
        exp=src["exp"].reshape(1, 21, 3),
    )
    np.testing.assert_allclose(x_s[0], want[0], atol=1e-5)
    assert np.shares_memory(x_s[0], x_s[-1]) or np.allclose(x_s[0], x_s[-1])
    np.testing.assert_allclose(x_d[0], x_s[0], atol=1e-5)  # d - d0 = 0 on frame 0


def test_stitching_network_batched() -> None:
    torch.manual_seed(0)
    net = StitchNetwork()
    src, motion = make_source(), make_motion()
    cfg = S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=6)
    x_s, plain = run_ours(src, motion, cfg)
    _, stitched = run_ours(src, motion, cfg, net=net)
    with torch.no_grad():
        want = net(torch.from_numpy(x_s), torch.from_numpy(plain)).numpy()
    np.testing.assert_allclose(stitched, want, atol=1e-6)
    assert np.abs(stitched - plain).max() > 1e-3
    _, ref = run_reference(src, motion, cfg, net=net)
    np.testing.assert_allclose(stitched, ref, atol=2e-5, rtol=1e-5)
    off = S.StitchConfig(delta_eye_arr=EYE_ARR, delta_eye_open_n=6, flag_stitching=False)
    np.testing.assert_array_equal(run_ours(src, motion, off, net=net)[1], plain)


def test_no_host_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in the main path reads a tensor value back to the host."""
    torch.manual_seed(0)
    net = StitchNetwork()
    cfg, controls = CASES["everything"]
    src = {k: torch.from_numpy(v) for k, v in make_source().items()}
    tensor_controls = S.StitchControls(
        **{
            k: (torch.as_tensor(v) if isinstance(v, np.ndarray) else v)
            for k, v in vars(controls).items()
        }
    )
    motion = torch.from_numpy(make_motion())
    want = S.stitch_motion(src, motion, cfg, tensor_controls, net)
    calls: list[str] = []
    with monkeypatch.context() as mp:
        for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__"):

            def guard(self, *a, _name=name, **k):
                calls.append(_name)
                raise AssertionError(f"host sync: Tensor.{_name}")

            mp.setattr(torch.Tensor, name, guard)
        got = S.stitch_motion(src, motion, cfg, tensor_controls, net)
    assert calls == []
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_cuda_matches_cpu() -> None:
    cfg, controls = CASES["everything"]
    src, motion = make_source(), make_motion()
    cpu = S.stitch_motion(src, torch.from_numpy(motion), cfg, controls)[1]
    gpu = S.stitch_motion(src, torch.from_numpy(motion).cuda(), cfg, controls)[1]
    assert gpu.is_cuda
    torch.testing.assert_close(gpu.cpu(), cpu, atol=2e-5, rtol=1e-5)


def test_chunked_calls_match_whole_clip() -> None:
    """With d0 and frame_offset, later chunks continue the blink schedule of the whole clip."""
    src, motion = make_source(), make_motion()
    whole = S.StitchConfig(
        d0=motion[0], delta_eye_arr=EYE_ARR, delta_eye_open_n=[3, 8], blink_frames=N
    )
    full = run_ours(src, motion, whole)[1]
    k = 17
    cfg = S.StitchConfig(
        d0=motion[0],
        delta_eye_arr=EYE_ARR,
        delta_eye_open_n=[3, 8],
        blink_frames=N,
        frame_offset=k,
    )
    np.testing.assert_allclose(run_ours(src, motion[k:], cfg)[1], full[k:], atol=1e-6)


# --- blink schedule, fades, gaze, controls -------------------------------------------------


def _starts(idx: np.ndarray) -> list[int]:
    return [i for i in range(len(idx)) if idx[i] == 0 and i + 1 < len(idx) and idx[i + 1] == 1]


def test_blink_schedule_fixed_and_cycled_intervals() -> None:
    assert not S.blink_schedule(200, 5, -1).any()
    idx = S.blink_schedule(200, 5, 20)
    assert _starts(idx) == list(range(20, 180, 25))  # stop = 200 - max(20, 5)
    for s in _starts(idx):
        assert list(idx[s : s + 5]) == [0, 1, 2, 3, 4]
    assert idx[:20].sum() == 0 and idx[-20:].sum() == 0
    idx = S.blink_schedule(120, 4, [10, 30])
    assert _starts(idx) == [10, 44, 58]  # gaps cycle 30, 10; stop = 120 - 30 (92 too late)
    assert list(idx) == ref_blinks(120, 4, [10, 30], random.Random(0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blink_schedule_random_intervals(seed: int) -> None:
    idx = S.blink_schedule(3000, 6, 0, seed=seed)
    assert list(idx) == ref_blinks(3000, 6, 0, random.Random(seed))
    starts = _starts(idx)
    gaps = np.diff(starts) - 6
    assert len(starts) > 10 and gaps.min() >= 60 and gaps.max() <= 100
    assert 60 <= starts[0] <= 100
    assert starts[-1] < 3000 - 60 and idx[-1] == 0
    np.testing.assert_array_equal(idx, S.blink_schedule(3000, 6, 0, seed=seed))


def test_blink_schedule_no_blink_near_end() -> None:
    for n in range(1, 60):
        for open_n in (1, 3, [2, 7], 9):
            idx = S.blink_schedule(n, 4, open_n)
            assert list(idx) == ref_blinks(n, 4, open_n, random.Random(0))
            assert idx[-1] == 0
            end = open_n[-1] if isinstance(open_n, list) else open_n
            assert all(s < n - max(end, 4) for s in _starts(idx))
    assert not S.blink_schedule(10, 20, 1).any()  # blink longer than the clip


@pytest.mark.parametrize("n,fi,fo", [(30, 5, 7), (10, 8, 6), (5, 0, 9), (20, -1, -1), (4, 9, 0)])
def test_fade_alpha_schedule_matches_setup_nd(n: int, fi: int, fo: int) -> None:
    got = S.fade_alpha_schedule(n, fi, fo)
    ctrl = ref_fade_ctrl(n, fi, fo)
    for i in range(n):
        if i in ctrl:
            assert got[i] == pytest.approx(ctrl[i]["fade_alpha"])
        else:
            assert np.isnan(got[i])


def test_fix_gaze_values() -> None:
    exp = torch.zeros(2, 63)
    out = S.fix_gaze(exp, torch.tensor([10.0, -10.0]), torch.tensor([5.0, 5.0]), 0.0, 0.0)
    dx, dy = 2.6, 1.4
    want = np.zeros((2, 63), np.float32)
    want[0, [33, 45, 34, 46]] = [0.0007 * dx, 0.001 * dx, -0.001 * dy, -0.001 * dy]
    want[1, [33, 45, 34, 46]] = [-0.001 * dx, -0.0007 * dx, -0.001 * dy, -0.001 * dy]
    np.testing.assert_allclose(out.numpy(), want, atol=1e-7)
    assert not exp.any()


def test_controls_from_ctrl_info() -> None:
    ctrl = {0: {"delta_yaw": 2.0}, 3: {"fade_alpha": 0.5, "delta_exp": np.ones((1, 63))}}
    c = S.StitchControls.from_ctrl_info(ctrl, 5, overall={"vad_alpha": 0.5, "delta_yaw": 1.0})
    np.testing.assert_array_equal(c.delta_yaw, [2, 1, 1, 1, 1])
    np.testing.assert_array_equal(c.vad_alpha, [0.5] * 5)
    assert np.isnan(c.fade_alpha[[0, 1, 2, 4]]).all() and c.fade_alpha[3] == 0.5
    assert np.isnan(c.delta_exp[0]).all() and (c.delta_exp[3] == 1).all()
    assert c.alpha_pitch is None
    listed = S.StitchControls.from_ctrl_info([{"alpha_roll": 0.5}], 3)
    np.testing.assert_array_equal(listed.alpha_roll[:1], [0.5])
    assert np.isnan(listed.alpha_roll[1:]).all()
    with pytest.raises(ValueError, match="fade_out_keys"):
        S.StitchControls.from_ctrl_info({1: {"fade_out_keys": ("exp",)}}, 3)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="use_d_keys"):
        S.StitchConfig(use_d_keys=("exp", "kp"))
    with pytest.raises(ValueError, match="fade_type"):
        S.StitchConfig(fade_type="x")
    with pytest.raises(ValueError, match="delta_eye_open_n"):
        S.StitchConfig(delta_eye_open_n=[3, -1])
    with pytest.raises(ValueError, match="motion"):
        S.stitch_motion(make_source(), torch.zeros(3, 264))
    with pytest.raises(ValueError, match="source"):
        S.stitch_motion({"kp": np.zeros(63)}, torch.zeros(3, 265))
    with pytest.raises(ValueError, match="control"):
        S.stitch_motion(
            make_source(), torch.zeros(3, 265), None, S.StitchControls(vad_alpha=[1, 2])
        )
    x_s, x_d = S.stitch_motion(make_source(), torch.zeros(0, 265))
    assert x_s.shape == (0, 21, 3) and x_d.shape == (0, 21, 3)


@pytest.mark.parametrize(
    "cfg",
    [
        S.StitchConfig(),
        S.video_config(),
        S.StitchConfig(fade_type="s", fade_out_keys=("exp", "pitch", "t")),
    ],
    ids=["image_keys", "video_keys", "fade_to_source"],
)
def test_a_source_per_frame_stitches_each_row_with_its_own_source(cfg) -> None:
    """A video avatar: row i stitched against source frame i equals stitching that row
    alone against that source (same d0), for the driven keys, masks, controls and fades."""
    n = 6
    motion = make_motion(n)
    sources = [make_source(seed=i) for i in range(n)]
    stacked = {k: np.concatenate([s[k] for s in sources]) for k in sources[0]}
    controls = S.StitchControls(delta_yaw=5.0, vad_alpha=0.7, fade_alpha=0.5)
    with_d0 = S.StitchConfig(**{**cfg.__dict__, "d0": motion[0]})
    x_s, x_d = run_ours(stacked, motion, with_d0, controls)
    for i in range(n):
        one_s, one_d = run_ours(sources[i], motion[i : i + 1], with_d0, controls)
        np.testing.assert_allclose(x_s[i], one_s[0], atol=1e-6)
        np.testing.assert_allclose(x_d[i], one_d[0], atol=1e-6)
    assert np.abs(x_s[1] - x_s[0]).max() > 1e-3  # the sources differ


def test_video_keys_drive_only_the_lips() -> None:
    """A video source's pose, translation and eyes are the video's own: driving rows that
    differ only in pose (or in the eye keypoints' expression) give the same keypoints."""
    src, motion = make_source(), make_motion(4)
    turned = motion.copy()
    turned[:, 1:202] = motion[:1, 1:202]  # every row with frame 0's pose and translation
    eyes = np.zeros(63, np.float32)
    eyes[np.ravel([[3 * k, 3 * k + 1, 3 * k + 2] for k in layout.EYE_KP])] = 1
    turned[:, 202:] += 0.05 * eyes  # and other eye expressions
    cfg = S.video_config(d0=motion[0])
    _, a = run_ours(src, motion, cfg)
    _, b = run_ours(src, turned, cfg)
    np.testing.assert_allclose(a, b, atol=1e-6)
    _, c = run_ours(src, motion, S.StitchConfig(d0=motion[0]))  # an image's keys: pose moves
    assert np.abs(c - a).max() > 1e-3
