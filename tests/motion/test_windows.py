import numpy as np
import pytest
import torch

from studio import layout as L
from studio.motion import windows as W

D = L.MOTION_DIM


def _index_predictor(log=None):
    """A stub LMDM: every output frame holds its condition-frame index in all dims."""

    def predict(kp_cond, window, start):
        if log is not None:
            log.append((kp_cond.clone(), start, window[:, 0].clone()))
        return window[:, :1].expand(-1, D).clone()

    return predict


def _cond(n, width=4):
    idx = torch.arange(n, dtype=torch.float32)[:, None]
    return idx.expand(-1, width).clone()


def _policy(value=-1.0):
    return W.KpCondPolicy(torch.full((D,), value))


def test_box_smooth_reference_semantics():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, D)).astype(np.float32)
    seq = torch.tensor(x)
    W.box_smooth(seq, 2, 7, kernel=3)
    ref = x.copy()
    for i in range(2, 7):
        lo, hi = max(0, i - 1), min(9, i + 2)
        ref[i, :202] = x[lo:hi, :202].mean(0)
    np.testing.assert_allclose(seq.numpy(), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(seq.numpy()[:, 202:], x[:, 202:])  # exp is never smoothed
    edge = torch.tensor(x)
    W.box_smooth(edge, 0, 9, kernel=5)
    np.testing.assert_allclose(edge[0, :202].numpy(), x[0:3, :202].mean(0), rtol=1e-6)
    off = torch.tensor(x)
    W.box_smooth(off, 0, 9, kernel=1)
    np.testing.assert_array_equal(off.numpy(), x)


def test_crossfade_ramp_and_lengths():
    res = torch.zeros(80, D)
    pred = torch.ones(80, D)
    out = W.crossfade(res, pred, overlap=10, fuse_length=10)
    assert out.shape[0] == 150
    np.testing.assert_allclose(out[70:80, 0].numpy(), np.arange(10) / 10, atol=1e-7)
    assert out[69, 0] == 0 and out[80, 0] == 1


def test_crossfade_is_continuous_for_agreeing_windows():
    """If both windows predict the same smooth curve, the fused curve is that curve."""
    t = torch.linspace(0, 3, 150)[:, None].expand(-1, D)
    res, pred = t[:80].clone(), t[70:150].clone()
    out = W.crossfade(res, pred, 10, 10)
    torch.testing.assert_close(out, t)


def test_offline_starts_and_padding():
    assert W.offline_starts(165) == [0, 70, 140]
    assert W.offline_starts(70) == [0]
    assert W.offline_starts(71) == [0, 70]
    cond = _cond(100)
    win = W.pad_window(cond, 70)
    assert win.shape[0] == 80 and (win[30:, 0] == 99).all() and win[0, 0] == 70


@pytest.mark.parametrize("n", [37, 80, 150, 165, 301])
def test_offline_maps_output_frame_to_condition_frame(n):
    """Reference bookkeeping: output frame j comes from condition frame j; window k sees
    kp_cond = output frame 70k - 1."""
    log = []
    cond = _cond(n)
    out = W.run_offline(_index_predictor(log), cond, _policy(), smooth_kernel=1)
    assert out.shape == (n, D)
    np.testing.assert_allclose(out[:, 0].numpy(), np.arange(n), atol=1e-5)
    assert [s for _, s, _ in log] == W.offline_starts(n)
    assert (log[0][0] == -1).all()
    for k, (kp, start, _) in enumerate(log[1:], start=1):
        assert start == 70 * k
        assert kp[0].item() == pytest.approx(70 * k - 1)


def _numpy_reference_offline(predict, cond, kp0, seq=80, overlap=10, k=3):
    """A literal numpy transcription of the reference offline loop (§1.4-1.8)."""
    valid, fuse = seq - overlap, overlap
    alpha = np.arange(fuse, dtype=np.float32)[:, None] / fuse

    def smo(res, s, e):
        src, n, h = res.copy(), res.shape[0], k // 2
        for i in range(s, e):
            res[i, :202] = src[max(0, i - h) : min(n, i + h + 1), :202].mean(0)
        return res

    n, res, kp, idx = cond.shape[0], None, kp0.copy(), 0
    while idx < n:
        win = cond[idx : idx + seq]
        if win.shape[0] < seq:
            win = np.concatenate([win, np.repeat(win[-1:], seq - win.shape[0], 0)])
        pred = predict(kp, win)
        if res is None:
            res = smo(pred.copy(), 0, seq)
        else:
            L0 = res.shape[0]
            res[L0 - fuse :] = (
                res[L0 - fuse :] * (1 - alpha) + pred[overlap - fuse : overlap] * alpha
            )
            res = np.concatenate([res, pred[overlap:]])
            L1 = res.shape[0]
            res = smo(res, L1 - valid - fuse, L1 - valid + 1)
        kp = res[res.shape[0] - overlap - 1].copy()
        idx += valid
    return smo(res[:n].copy(), 0, n)


def test_offline_equals_literal_reference_with_smoothing():
    rng = np.random.default_rng(7)
    w = rng.normal(size=(4, D)).astype(np.float32) * 0.3
    v = rng.normal(size=(D, D)).astype(np.float32) * 0.01

    def np_predict(kp, win):
        return np.tanh(win @ w + kp @ v).astype(np.float32)

    def torch_predict(kp, win, start):
        return torch.from_numpy(np_predict(kp.numpy(), win.numpy()))

    cond = rng.normal(size=(223, 4)).astype(np.float32)
    kp0 = rng.normal(size=D).astype(np.float32)
    ref = _numpy_reference_offline(np_predict, cond, kp0)
    out = W.run_offline(
        torch_predict, torch.from_numpy(cond), W.KpCondPolicy(torch.from_numpy(kp0))
    )
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_kp_cond_reset_policy():
    src = torch.full((D,), -5.0)
    pol = W.KpCondPolicy(src, fix_every=2, keep_dims=(0, 3))
    res = torch.arange(10, dtype=torch.float32)[:, None].expand(-1, D).clone()
    kept = pol.next(res, 5, clip_idx=1)
    assert (kept == 4).all()
    reset = pol.next(res, 5, clip_idx=2)
    assert (reset[:3] == 4).all() and (reset[3:] == -5).all()


def _run_online(n_feats, overlap, chunk=5):
    log = []
    priming = torch.full((overlap, 4), -1.0)
    ow = W.OnlineWindows(_index_predictor(log), priming, _policy(), smooth_kernel=1)
    feats = _cond(n_feats)
    emitted, first_at = [], None
    for c, s in enumerate(range(0, n_feats, chunk)):
        out = ow.push(feats[s : s + chunk])
        if out.shape[0] and first_at is None:
            first_at = c + 1
        emitted.append(out)
    emitted.append(ow.finish())
    return torch.cat(emitted), first_at, ow, log


@pytest.mark.parametrize("overlap, first_chunks", [(75, 2), (70, 4)])
def test_online_bookkeeping(overlap, first_chunks):
    n = 200
    out, first_at, ow, log = _run_online(n, overlap)
    valid = 80 - overlap
    assert first_at == first_chunks
    assert ow.fuser.fuse_length == min(overlap, valid)
    # Emits the features plus up to V padded trailing frames, in order.
    assert n <= out.shape[0] <= n + valid
    np.testing.assert_allclose(out[:n, 0].numpy(), np.arange(n), atol=1e-5)
    assert (out[n:, 0] == n - 1).all()
    # The first window starts at the silent priming frames (negative condition index).
    assert log[0][1] == -overlap
    assert ow.d0 is not None and ow.d0[0].item() == -1
    # LMDM calls per 25 frames of audio ~ 25 / V
    assert ow.windows_run == pytest.approx(n / valid, abs=3)


def test_online_memory_stays_bounded():
    out, _, ow, _ = _run_online(1000, 75)
    assert ow.feats.shape[0] <= 160 and ow.fuser.res.shape[0] <= 160
    np.testing.assert_allclose(out[:1000, 0].numpy(), np.arange(1000), atol=1e-4)


def _tanh_predictor(width=4, seed=7):
    """A deterministic nonlinear stub LMDM that reads the window and kp_cond."""
    rng = np.random.default_rng(seed)
    w = torch.tensor(rng.normal(size=(width, D)).astype(np.float32) * 0.3)
    v = torch.tensor(rng.normal(size=(D, D)).astype(np.float32) * 0.01)
    calls = []

    def predict(kp, win, start):
        calls.append(start)
        return torch.tanh(win @ w + kp @ v)

    return predict, calls


def _feed(ow, cond, sizes):
    """Push ``cond`` in chunks of the cycled ``sizes``; (all rows, rows after each push)."""
    out, counts, i, k = [], [], 0, 0
    while i < cond.shape[0]:
        n = sizes[k % len(sizes)]
        out.append(ow.push(cond[i : i + n]))
        i, k = i + n, k + 1
        counts.append((min(i, cond.shape[0]), sum(o.shape[0] for o in out)))
    out.append(ow.finish())
    return torch.cat(out), counts


@pytest.mark.parametrize("sizes", [[1], [5], [13, 1, 70], [500]])
def test_online_with_offline_windows_is_the_offline_motion(sizes):
    """No priming, overlap 10 and the final pass: run_offline's frames and x_T order."""
    cond = torch.tensor(np.random.default_rng(3).normal(size=(223, 4)).astype(np.float32))
    kp0 = torch.linspace(-1, 1, D)
    ref_predict, ref_calls = _tanh_predictor()
    ref = W.run_offline(ref_predict, cond, W.KpCondPolicy(kp0))
    predict, calls = _tanh_predictor()
    ow = W.OnlineWindows(
        predict, torch.zeros(0, 4), W.KpCondPolicy(kp0), overlap=10, final_smooth=True
    )
    out, _ = _feed(ow, cond, sizes)
    assert calls == ref_calls == W.offline_starts(223)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("overlap, final", [(79, False), (79, True), (78, True), (75, False)])
def test_online_first_window_emits_and_lookahead_is_tight(overlap, final):
    """With online_priming rows the first window emits; frame j comes out exactly when
    frames_needed(j) rows are in, at most lookahead_frames after its own; N frames in all."""
    valid = 80 - overlap
    prime = W.online_priming(80, overlap, int(final))
    assert prime == overlap - valid - int(final)
    predict, calls = _tanh_predictor()
    ow = W.OnlineWindows(
        predict, torch.zeros(prime, 4), _policy(), overlap=overlap, final_smooth=final
    )
    assert ow.lookahead_frames == 2 * valid - 1 + int(final)
    n = 97
    cond = torch.tensor(np.random.default_rng(4).normal(size=(n, 4)).astype(np.float32))
    out, counts = _feed(ow, cond, [1])
    assert out.shape == (n, D) and calls[0] == -prime
    first = next(c for c, e in counts if e)
    assert first == ow.frames_needed(0) == 80 - prime  # the first window emits
    for given, emitted in counts:
        assert emitted == sum(ow.frames_needed(j) <= given for j in range(n))
        assert emitted >= given - ow.lookahead_frames
    again, _ = _feed(
        W.OnlineWindows(
            _tanh_predictor()[0],
            torch.zeros(prime, 4),
            _policy(),
            overlap=overlap,
            final_smooth=final,
        ),
        cond,
        [7, 30, 2],
    )
    torch.testing.assert_close(again, out, rtol=0, atol=0)  # the push sizes change nothing
    assert ow.windows_run == len(W.offline_starts(n, 80, overlap))


def test_online_priming_may_not_exceed_the_overlap():
    with pytest.raises(ValueError, match="priming"):
        W.OnlineWindows(_index_predictor(), torch.zeros(11, 4), _policy(), overlap=10)
