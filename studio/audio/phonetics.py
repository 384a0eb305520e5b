"""Per-video-frame phonetic measurements of a speech clip (numpy/scipy only).

The demo engine and the motion heuristics need a few robust cues at the video rate (25 fps,
frame j = samples [640 j, 640 j + 640)): how loud, whether voiced and at what pitch, how bright,
whether silent, and where a speech onset or a plosive burst happens (a burst is where the lips
or tongue release a closure, which a talking head must show as an opening).

The spectral measures come from one STFT at a 10 ms hop (four sub-frames per video frame, their
centres inside it), aggregated per frame. Its window is 40 ms rather than the usual 25 ms because
the windowed autocorrelation behind `voicing` needs about three periods of the lowest f0 (70 Hz).
Bursts use a second, 6 ms STFT (see `burst_times`): at 25-40 ms a burst and the vowel 10 ms after
it fall into one window. Thresholds are relative to the clip (its 95th-percentile frame level and
its noise floor), so quiet and noisy recordings work; all are module-level constants.

Each cue is a local measure (read from a bounded window of samples around the frame) followed
by a normalisation that takes the clip's statistics as parameters. `analyze` composes them over
a whole clip; `PhoneticStream` composes the same stages for live audio, a chunk at a time, with
running statistics over the last seconds instead of the clip's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from scipy import fft as sfft
from scipy.ndimage import maximum_filter1d

from studio.layout import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

# --- analysis grid -------------------------------------------------------------------------
HOP = 160  # 10 ms
WIN = 640  # 40 ms: >= ~3 periods of a 80 Hz voice, as a windowed autocorrelation needs
NFFT = 1024  # >= WIN + max lag, so the autocorrelation from the power spectrum is not circular
SUBFRAMES = SAMPLES_PER_FRAME // HOP  # 4 sub-frames per video frame
assert SUBFRAMES * HOP == SAMPLES_PER_FRAME
# The spectra are computed a block of video frames at a time and only per-frame measures (and
# the 24 flux bands per sub-frame) are kept, so memory follows the block, not the clip.
BLOCK_FRAMES = 750  # 30 s

# --- levels and silence ----------------------------------------------------------------------
DB_FLOOR = -120.0  # dBFS of digital silence
SILENCE_BELOW_P95_DB = 35.0  # a frame this far below the clip's 95th percentile is silent,
SILENCE_ABOVE_NOISE_DB = 6.0  # and so is one this close to the clip's noise floor;
SILENCE_MIN_BELOW_P95_DB = 12.0  # but the threshold stays at least this far below p95,
SILENCE_ABS_DB = -80.0  # and a frame below this is always silent (inaudible at any sane gain)
MIN_SILENCE_FRAMES = 2  # a shorter silent run inside speech (a stop closure) is not a pause
LEVEL_RANGE_DB = 40.0  # level 0..1 spans at most this many dB below p95...
LEVEL_MIN_RANGE_DB = 6.0  # ...and at least this many
NOISE_PERCENTILE = 5.0

# --- voicing and pitch -----------------------------------------------------------------------
F0_MIN_HZ = 70.0
F0_MAX_HZ = 400.0
VOICING_TOP_HZ = 4000.0  # autocorrelate RUMBLE_HZ..this: less fricative noise
VOICED_THRESHOLD = 0.45  # voicing above which pitch_hz is reported
OCTAVE_RATIO = 0.9  # prefer the shortest lag whose peak is this close to the best one

# --- spectrum --------------------------------------------------------------------------------
RUMBLE_HZ = 60.0  # centroid, low_ratio and voicing ignore energy below this (DC, rumble, hum)
LOW_BAND_HZ = 1000.0
HF_BAND_HZ = (1500.0, 8000.0)  # the "broadband burst" band, above any voice bar or nasal murmur
FLUX_BANDS = 24  # flux compares log energies in log-spaced bands (per-bin noise averages out)
FLUX_BAND_HZ = (80.0, 8000.0)
FLUX_FLOOR_DB = 60.0  # band energies are floored this far below the clip's loud level
FLUX_FULL_DB = 30.0  # a mean band rise of this many dB within a frame gives flux 1

# --- onsets and bursts -----------------------------------------------------------------------
ONSET_RISE_DB = 9.0  # frame-to-frame rms rise that counts as an onset inside speech
BURST_WIN = 96  # 6 ms: the burst detector's own short STFT
BURST_HOP = 32  # 2 ms
BURST_NFFT = 128
MID_BAND_HZ = 500.0  # above a voice bar: must rise at a release, falls from a vowel
BURST_CLOSURE_S = 0.024  # closure window (plus the 6 ms analysis window: ~30 ms of closure)
BURST_ATTACK_S = 0.006  # the rise must happen within this ("within a few ms")
BURST_FOLLOW_S = 0.04  # sound above the silence threshold must follow within this
BURST_RISE_DB = 16.0  # >1.5 kHz energy: attack level over the closure maximum,
BURST_RISE_OVER_NOISE_DB = 10.0  # or over the noise floor where the closure is at that floor
BURST_NOISE_MARGIN_DB = 3.0  # "at the floor": within this of it
BURST_MID_RISE_DB = 4.0  # >500 Hz energy: attack level over the closure maximum
BURST_HF_FRACTION_DB = -12.0  # >1.5 kHz share of the attack (a vowel onset is ~-15..-25 dB)
BURST_MIN_SEPARATION_S = 0.03  # one burst per closure


@dataclass(frozen=True)
class PhoneticFrames:
    """Per-video-frame measurements; every array has one entry per frame."""

    rms_db: np.ndarray  # [N] float32 frame RMS in dBFS
    level: np.ndarray  # [N] float32 0..1 loudness relative to the clip (the speech envelope)
    flux: np.ndarray  # [N] float32 spectral flux, ~0..1, gain-invariant (log spectra)
    voicing: np.ndarray  # [N] float32 0..1 normalised autocorrelation peak, 70-400 Hz lags
    pitch_hz: np.ndarray  # [N] float32 f0 estimate, 0 where unvoiced
    centroid_hz: np.ndarray  # [N] float32 spectral centroid
    low_ratio: np.ndarray  # [N] float32 fraction of energy below 1 kHz (lip rounding cue)
    silence: np.ndarray  # [N] bool, frame is silent / a pause
    onset: np.ndarray  # [N] bool, speech onset (silence -> sound, or a sharp energy rise)
    burst: np.ndarray  # [N] bool, a plosive burst (closure then abrupt broadband rise)

    @property
    def num_frames(self) -> int:
        return int(self.rms_db.shape[0])


def frame_count(num_samples: int) -> int:
    """Video frames covering num_samples at SAMPLE_RATE (a partial last frame counts)."""
    return -(-num_samples * FPS // SAMPLE_RATE)


def _db(power: np.ndarray) -> np.ndarray:
    return 10.0 * np.log10(np.maximum(power, 10.0 ** (DB_FLOOR / 10.0)))


def _windows(
    x: np.ndarray, first: int, count: int, hop: int, win: int, offset: int = 0
) -> np.ndarray:
    """[count, win] windows of ``x`` centred at ``hop * i + hop / 2`` for ``i`` from ``first``
    (zero outside the signal): a block of a whole-signal framing, sample for sample. ``x[0]``
    is the signal's sample ``offset`` (a stream's buffer holds only its recent samples)."""
    start = hop * first - (win // 2 - hop // 2) - offset
    xp = np.zeros(hop * (count - 1) + win, np.float32)
    lo, hi = max(start, 0), min(start + len(xp), len(x))
    if hi > lo:
        xp[lo - start : hi - start] = x[lo:hi]
    return np.lib.stride_tricks.sliding_window_view(xp, win)[::hop][:count]


def _blocks(total: int, size: int) -> list[tuple[int, int]]:
    """(first, count) pairs covering ``range(total)`` in blocks of ``size``."""
    return [(b, min(size, total - b)) for b in range(0, total, size)]


def _spectra(x: np.ndarray, first_sub: int, num_sub: int, offset: int = 0) -> np.ndarray:
    """Power spectra [num_sub, NFFT//2+1] of Hann windows centred at HOP*i + HOP/2, for the
    sub-frames ``first_sub`` .. ``first_sub + num_sub - 1`` of ``x`` (starting at ``offset``)."""
    frames = _windows(x, first_sub, num_sub, HOP, WIN, offset)
    win = _hann(WIN).astype(np.float32)
    spec = sfft.rfft(frames * win, n=NFFT, axis=1)
    power = spec.real**2 + spec.imag**2
    # scale so that a band's sum is the mean square of the windowed signal in that band
    weights = np.full(power.shape[1], 2.0, np.float32)
    weights[0] = weights[-1] = 1.0
    return power * (weights / (NFFT * float(np.sum(win**2))))


@cache
def _hann(n: int) -> np.ndarray:
    """A Hann window of n nonzero samples (float64, read-only: cached)."""
    win = np.hanning(n + 2)[1:-1]
    win.flags.writeable = False
    return win


@lru_cache(maxsize=1)
def _band_matrix() -> np.ndarray:
    """[bins, FLUX_BANDS] 0/1 matrix pooling FFT bins into log-spaced bands (read-only)."""
    freqs = np.fft.rfftfreq(NFFT, 1.0 / SAMPLE_RATE).astype(np.float32)
    edges = np.geomspace(FLUX_BAND_HZ[0], FLUX_BAND_HZ[1], FLUX_BANDS + 1)
    band = np.searchsorted(edges, freqs, side="right") - 1
    matrix = (band[:, None] == np.arange(FLUX_BANDS)[None, :]).astype(np.float32)
    matrix.flags.writeable = False
    return matrix


def _frame_power(x: np.ndarray, first: int, count: int, offset: int = 0) -> np.ndarray:
    """Mean square (float64) of the video frames first .. first + count - 1 of x (zero-padded;
    ``x[0]`` is sample ``offset``, at or before the first frame's)."""
    block = np.zeros(count * SAMPLES_PER_FRAME, np.float64)
    start = first * SAMPLES_PER_FRAME - offset
    part = x[start : start + count * SAMPLES_PER_FRAME]
    block[: len(part)] = part
    return np.mean(block.reshape(count, SAMPLES_PER_FRAME) ** 2, 1)


def _frame_rms_db(x: np.ndarray, n: int) -> np.ndarray:
    """RMS in dBFS of n video frames of x (zero-padded), a block of frames at a time."""
    power = np.zeros(n, np.float64)
    for first, count in _blocks(n, BLOCK_FRAMES):
        power[first : first + count] = _frame_power(x, first, count)
    return _db(power)


def _threshold_db(p95: float | np.ndarray, noise: float | np.ndarray) -> np.ndarray:
    """The silence threshold (dBFS) given the loud level (p95) and the noise floor (scalars
    for a clip, per-frame arrays for a stream)."""
    thr = np.maximum(p95 - SILENCE_BELOW_P95_DB, noise + SILENCE_ABOVE_NOISE_DB)
    return np.maximum(np.minimum(thr, p95 - SILENCE_MIN_BELOW_P95_DB), SILENCE_ABS_DB)


def _silence_threshold(rms_db: np.ndarray) -> tuple[float, float, float]:
    """(threshold, p95, noise floor) in dBFS, relative to the clip."""
    p95 = float(np.percentile(rms_db, 95))
    noise = float(np.percentile(rms_db, NOISE_PERCENTILE))
    return float(_threshold_db(p95, noise)), p95, noise


def _level(rms_db: np.ndarray, p95: float | np.ndarray, noise: float | np.ndarray) -> np.ndarray:
    """Loudness 0..1: rms_db between a floor (noise, within the LEVEL_*RANGE_DB) and p95."""
    lo = np.minimum(np.maximum(noise, p95 - LEVEL_RANGE_DB), p95 - LEVEL_MIN_RANGE_DB)
    return np.clip((rms_db - lo) / (p95 - lo), 0.0, 1.0)


def _fill_short_runs(mask: np.ndarray, min_len: int) -> np.ndarray:
    """Clear True runs shorter than min_len that have False on both sides."""
    out = mask.copy()
    n = len(mask)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        if stop - start < min_len and start > 0 and stop < n:
            out[start:stop] = False
    return out


@lru_cache(maxsize=1)
def _window_autocorrelation() -> np.ndarray:
    """The analysis window's autocorrelation at lags 0 .. WIN - 1 (read-only)."""
    win = _hann(WIN)
    wac = np.correlate(win, win, "full")[WIN - 1 :]
    wac.flags.writeable = False
    return wac


def _voicing(power: np.ndarray, num_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Per video frame: energy-weighted mean of the sub-frames' normalised autocorrelation
    peaks (70-400 Hz lags, window-corrected as in Boersma 1993), and the median f0 of its
    voiced sub-frames."""
    freqs = np.fft.rfftfreq(NFFT, 1.0 / SAMPLE_RATE)
    lag_min = int(np.floor(SAMPLE_RATE / F0_MAX_HZ))
    lag_max = int(np.ceil(SAMPLE_RATE / F0_MIN_HZ))
    in_band = (freqs >= RUMBLE_HZ) & (freqs <= VOICING_TOP_HZ)
    band = power * in_band.astype(np.float32)
    ac = sfft.irfft(band, n=NFFT, axis=1)[:, : lag_max + 2]
    wac = _window_autocorrelation()[: lag_max + 2]
    energy = ac[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = ac / energy[:, None] / (wac / wac[0])
    r[~(energy > 1e-12)] = 0.0
    seg = r[:, lag_min - 1 : lag_max + 2]  # one guard lag on each side for the peak test
    inner = seg[:, 1:-1]
    is_peak = (inner >= seg[:, :-2]) & (inner > seg[:, 2:])
    cand = np.where(is_peak, inner, -np.inf)
    best = cand.max(axis=1)
    idx = np.argmax(cand >= OCTAVE_RATIO * best[:, None], axis=1)  # shortest lag near the best
    rows = np.arange(len(r))
    peak = inner[rows, idx]
    left, right = seg[rows, idx], seg[rows, idx + 2]
    denom = left - 2.0 * peak + right
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where(denom < -1e-9, 0.5 * (left - right) / denom, 0.0)
    lag = lag_min + idx + np.clip(shift, -0.5, 0.5)
    v_sub = np.clip(np.where(np.isfinite(best), peak, 0.0), 0.0, 1.0)

    # aggregate: energy-weighted voicing, median f0 of the voiced sub-frames
    e = np.maximum(energy, 0.0).reshape(num_frames, SUBFRAMES)
    v = v_sub.reshape(num_frames, SUBFRAMES)
    esum = e.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        voicing = np.where(esum > 0, (e * v).sum(axis=1) / esum, 0.0)
    f0 = np.where(v >= VOICED_THRESHOLD, SAMPLE_RATE / lag.reshape(num_frames, SUBFRAMES), np.nan)
    any_voiced = np.isfinite(f0).any(axis=1)
    pitch = np.zeros(num_frames)
    if any_voiced.any():
        pitch[any_voiced] = _nanmedian_rows(f0[any_voiced])
    pitch[voicing < VOICED_THRESHOLD] = 0.0
    return voicing.astype(np.float32), pitch.astype(np.float32)


def _nanmedian_rows(a: np.ndarray) -> np.ndarray:
    """np.nanmedian(a, axis=1) for rows with a finite value, without its per-call overhead
    (a stream measures a frame at a time): the middle value, or the mean of the middle two."""
    s = np.sort(a, axis=1)  # NaN last
    k = np.isfinite(a).sum(axis=1)
    rows = np.arange(len(a))
    return (s[rows, (k - 1) // 2] + s[rows, k // 2]) / 2


def _trailing_max(a: np.ndarray, size: int) -> np.ndarray:
    """out[k] = max(a[k - size + 1 .. k])."""
    return maximum_filter1d(a, size, origin=(size - 1) // 2, mode="nearest")


def _leading_max(a: np.ndarray, size: int) -> np.ndarray:
    """out[k] = max(a[k .. k + size - 1])."""
    return maximum_filter1d(a, size, origin=-(size // 2), mode="nearest")


def _burst_bands(
    x: np.ndarray, first: int, count: int, offset: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The burst detector's band levels (dB, float32) at the 2 ms hops first .. first + count - 1
    of x (``x[0]`` is sample ``offset``): >1.5 kHz, >500 Hz and total."""
    win = _hann(BURST_WIN).astype(np.float32)
    scale = 2.0 / (BURST_NFFT * float(np.sum(win**2)))
    freqs = np.fft.rfftfreq(BURST_NFFT, 1.0 / SAMPLE_RATE)
    frames = _windows(x, first, count, BURST_HOP, BURST_WIN, offset)
    spec = sfft.rfft(frames * win, BURST_NFFT, 1)
    power = (spec.real**2 + spec.imag**2) * scale
    hf = _db(power[:, freqs >= HF_BAND_HZ[0]].sum(axis=1))
    mid = _db(power[:, freqs >= MID_BAND_HZ].sum(axis=1))
    return hf, mid, _db(power.sum(axis=1))


# hops of context a burst decision needs on each side (see _burst_hops): the closure window,
# then twice the separation (the score's maximum filter, and the previous candidate's)
_BURST_STEP_S = BURST_HOP / SAMPLE_RATE
_BURST_CLOSURE = max(1, int(round(BURST_CLOSURE_S / _BURST_STEP_S)))
_BURST_ATTACK = max(1, int(round(BURST_ATTACK_S / _BURST_STEP_S)))
_BURST_FOLLOW = max(1, int(round(BURST_FOLLOW_S / _BURST_STEP_S)))
_BURST_SEP = max(1, int(round(BURST_MIN_SEPARATION_S / _BURST_STEP_S)))
BURST_CONTEXT_BEFORE = _BURST_CLOSURE + 2 * _BURST_SEP
BURST_CONTEXT_AFTER = _BURST_SEP + max(_BURST_FOLLOW, _BURST_ATTACK)


def _burst_hops(
    hf: np.ndarray,
    mid: np.ndarray,
    tot: np.ndarray,
    floors: tuple,
    silence_db: float | np.ndarray,
) -> np.ndarray:
    """Indices of the hops where a burst starts (see `burst_times`), given the band levels, their
    noise floors (hf, mid, tot) and the silence threshold: scalars for a clip, per-hop arrays
    for a stream. A decision at hop k reads hops k - BURST_CONTEXT_BEFORE .. k +
    BURST_CONTEXT_AFTER - 1 (the first BURST_CONTEXT_BEFORE hops of a block are context only,
    unless the block starts the clip)."""
    hf_floor, mid_floor, tot_floor = floors
    # floor at the noise, so that closures in a noisy recording read as level
    hf = np.maximum(hf, hf_floor)
    mid = np.maximum(mid, mid_floor)
    tot = np.maximum(tot, tot_floor)

    c, a = _BURST_CLOSURE, _BURST_ATTACK
    closure_hf = np.concatenate([[np.inf], _trailing_max(hf, c)[:-1]])
    closure_mid = np.concatenate([[np.inf], _trailing_max(mid, c)[:-1]])
    closure_hf[:c] = np.inf  # need a full closure window
    rise = _leading_max(hf, a) - closure_hf
    # a closure at the noise floor cannot show a deep rise; 10 dB over it is already no fluctuation
    at_floor = closure_hf <= hf_floor + BURST_NOISE_MARGIN_DB
    ok = (
        (rise >= np.where(at_floor, BURST_RISE_OVER_NOISE_DB, BURST_RISE_DB))
        & (_leading_max(mid, a) - closure_mid >= BURST_MID_RISE_DB)
        & (_leading_max(hf - tot, a) >= BURST_HF_FRACTION_DB)
        & (_leading_max(tot, _BURST_FOLLOW) >= silence_db)
    )
    # one burst per closure: the strongest rise within BURST_MIN_SEPARATION_S, the first of ties
    sep = _BURST_SEP
    score = np.where(ok, rise, -np.inf)
    idx = np.flatnonzero(ok & (score >= maximum_filter1d(score, 2 * sep + 1, mode="nearest")))
    if len(idx) > 1:
        idx = idx[np.concatenate([[True], np.diff(idx) > sep])]
    return idx


def _hop_times(idx: np.ndarray) -> np.ndarray:
    """Seconds of the burst hops ``idx`` (their centres)."""
    return (idx * BURST_HOP + BURST_HOP / 2) / SAMPLE_RATE


def burst_times(
    samples: np.ndarray, silence_db: float | None = None, length: int | None = None
) -> np.ndarray:
    """Plosive burst onsets (seconds, 2 ms resolution) in a mono clip at SAMPLE_RATE.

    A burst is where a closure is released: a 25-40 ms window cannot tell it from the vowel that
    follows 5-20 ms later, so this uses its own short STFT (6 ms window, 2 ms hop). A burst at t:
    over the BURST_CLOSURE_S before t the >1.5 kHz energy stays >= BURST_RISE_DB below its level
    in the BURST_ATTACK_S from t (a closure, then an abrupt rise: a fricative ramps up slower),
    the >500 Hz energy rises as well (a voice bar may fill the closure, a vowel may not), the
    attack is HF-rich (a vowel or nasal onset is not), and sound above the silence threshold
    (default: the clip's, as in `analyze`) follows within BURST_FOLLOW_S. ``length`` (samples)
    reads the clip as that long: zeros past its end, or cut.
    """
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    if length is not None:
        x = x[:length]
    if silence_db is None:
        silence_db = _silence_threshold(_frame_rms_db(x, frame_count(len(x))))[0]
    m = (len(x) if length is None else int(length)) // BURST_HOP
    if m < 2:
        return np.zeros(0)
    x = x[: m * BURST_HOP]  # whole hops only, as the framing below has always read it
    hf, mid, tot = (np.empty(m, np.float32) for _ in range(3))
    per_block = BLOCK_FRAMES * SAMPLES_PER_FRAME // BURST_HOP
    for first, count in _blocks(m, per_block):
        part = slice(first, first + count)
        hf[part], mid[part], tot[part] = _burst_bands(x, first, count)
    floors = (
        float(np.percentile(hf, NOISE_PERCENTILE)),
        np.percentile(mid, NOISE_PERCENTILE),
        np.percentile(tot, NOISE_PERCENTILE),
    )
    return _hop_times(_burst_hops(hf, mid, tot, floors, silence_db))


def _spectral_frames(
    x: np.ndarray, first: int, count: int, offset: int = 0, per_frame: bool = False
) -> tuple[np.ndarray, ...]:
    """The STFT measures of the video frames first .. first + count - 1 of x (``x[0]`` is
    sample ``offset``): centroid, low_ratio, voicing, pitch (float32 per frame, voicing and
    pitch before the silence gate) and the FLUX_BANDS band energies per sub-frame. The sums
    over frequency round differently by block size: ``per_frame`` pools a frame at a time, so
    that a stream's values do not depend on how its audio was chunked."""
    power = _spectra(x, first * SUBFRAMES, count * SUBFRAMES, offset)
    if per_frame:
        pooled = [_pooled_measures(p) for p in power.reshape(count, SUBFRAMES, -1)]
        centroid, low_ratio, bands = (np.concatenate(m) for m in zip(*pooled, strict=True))
    else:
        centroid, low_ratio, bands = _pooled_measures(power)
    voicing, pitch = _voicing(power, count)
    return centroid, low_ratio, voicing, pitch, bands


def _pooled_measures(power: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centroid and low_ratio per frame, band energies per sub-frame, of the sub-frames'
    power spectra [frames * SUBFRAMES, bins]."""
    freqs = np.fft.rfftfreq(NFFT, 1.0 / SAMPLE_RATE).astype(np.float32)
    pooled = power.reshape(-1, SUBFRAMES, power.shape[1]).sum(axis=1) * (freqs >= RUMBLE_HZ)
    total = pooled.sum(axis=1)
    safe = np.maximum(total, 1e-20)
    has_energy = total > 10.0 ** (DB_FLOOR / 10.0)
    centroid = np.where(has_energy, pooled @ freqs / safe, 0.0)
    low_ratio = np.where(has_energy, pooled[:, freqs < LOW_BAND_HZ].sum(axis=1) / safe, 0.0)
    return centroid, low_ratio, power @ _band_matrix()


def _log_bands(bands: np.ndarray, loud: float | np.ndarray) -> np.ndarray:
    """Band energies in dB, floored FLUX_FLOOR_DB below ``loud`` (a band's loud energy), so
    that silence reads as flat."""
    return _db(np.maximum(bands, loud * 10.0 ** (-FLUX_FLOOR_DB / 10.0)))


def _flux(logbands: np.ndarray, lead: int) -> np.ndarray:
    """Spectral flux per frame: the positive change of the band log energies from sub-frame to
    sub-frame, summed over the frame. ``logbands`` starts with ``lead`` (0 at the clip's start,
    else 1) rows of the sub-frame before the first frame's."""
    diff = np.zeros(len(logbands) - lead, np.float32)
    diff[1 - lead :] = np.maximum(logbands[1:] - logbands[:-1], 0.0).mean(axis=1)
    return np.clip(diff.reshape(-1, SUBFRAMES).sum(axis=1) / FLUX_FULL_DB, 0.0, 1.0)


def _onsets(silence: np.ndarray, rms_db: np.ndarray) -> np.ndarray:
    """Speech onsets: silence -> sound, or a rise of ONSET_RISE_DB (a rise over two frames is
    one onset). Frame k reads frames k - ONSET_CONTEXT .. k; the first frames are the clip's."""
    after_silence = ~silence & np.concatenate([[True], silence[:-1]])
    rising = ~silence & (np.diff(rms_db, prepend=rms_db[0]) >= ONSET_RISE_DB)
    rising[1:] &= ~(rising[:-1] | after_silence[:-1])
    return after_silence | rising


ONSET_CONTEXT = 2  # frames before a frame that its onset flag reads


def analyze(samples: np.ndarray, num_frames: int | None = None) -> PhoneticFrames:
    """Measure a mono float clip at SAMPLE_RATE per video frame (see PhoneticFrames).

    num_frames defaults to ceil(len * FPS / SAMPLE_RATE); shorter audio is zero-padded, longer
    audio is cut. voicing and pitch_hz are 0 in silent frames (a hum is not a voice). The local
    measures come from the frames' samples; the normalisation from the whole clip's statistics.
    """
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    n = frame_count(len(x)) if num_frames is None else int(num_frames)
    if n <= 0:
        return _empty_frames()
    x = x[: n * SAMPLES_PER_FRAME]  # frames past the audio read zeros (no padded copy)

    # level and silence, from the samples of each frame
    rms_db = _frame_rms_db(x, n)
    silence_db, p95, noise = _silence_threshold(rms_db)
    level = _level(rms_db, p95, noise)
    silence = _fill_short_runs(rms_db < silence_db, MIN_SILENCE_FRAMES)

    # spectral measures, pooled over each frame's sub-frames, a block of frames at a time
    centroid, low_ratio, voicing, pitch = (np.zeros(n, np.float32) for _ in range(4))
    bands = np.empty((n * SUBFRAMES, FLUX_BANDS), np.float32)
    for first, count in _blocks(n, BLOCK_FRAMES):
        frames = slice(first, first + count)
        sub = slice(first * SUBFRAMES, (first + count) * SUBFRAMES)
        centroid[frames], low_ratio[frames], voicing[frames], pitch[frames], bands[sub] = (
            _spectral_frames(x, first, count)
        )

    # spectral flux, gain-invariant, floored relative to the clip's loud band energy
    loud = float(np.percentile(bands.sum(axis=1), 95)) / FLUX_BANDS
    flux = _flux(_log_bands(bands, loud), lead=0)

    voicing[silence] = 0.0  # periodic background (hum) is not voice
    pitch[silence] = 0.0

    burst = np.zeros(n, bool)
    frames_of_bursts = (burst_times(x, silence_db, n * SAMPLES_PER_FRAME) * FPS).astype(int)
    burst[frames_of_bursts[frames_of_bursts < n]] = True

    return _frames(
        rms_db, level, flux, voicing, pitch, centroid, low_ratio, silence,
        _onsets(silence, rms_db), burst,
    )  # fmt: skip


def _frames(*fields: np.ndarray) -> PhoneticFrames:
    """PhoneticFrames of the fields in order, float fields as float32."""
    names = list(PhoneticFrames.__dataclass_fields__)
    cast = [v if v.dtype == bool else v.astype(np.float32) for v in fields]
    return PhoneticFrames(**dict(zip(names, cast, strict=True)))


def _empty_frames() -> PhoneticFrames:
    empty_f = np.zeros(0, np.float32)
    empty_b = np.zeros(0, bool)
    return PhoneticFrames(*(empty_f,) * 7, empty_b, empty_b, empty_b)


# --- streaming -------------------------------------------------------------------------------
# The same local measures and normalisation as `analyze`, composed for audio that arrives in
# chunks: each frame's measures read a bounded window of samples around it, and the statistics
# the normalisation needs (p95 level, noise floors, loud band energy) are running percentiles
# over the last `history_s` seconds before the frame, instead of the whole clip's.
HOPS_PER_FRAME = SAMPLES_PER_FRAME // BURST_HOP  # 20 burst hops per video frame
_SPEC_REACH = WIN // 2 - HOP // 2  # samples past a frame's end that its spectra read
_HOP_REACH = BURST_WIN // 2 + BURST_HOP // 2  # samples past a hop's start that its window reads
_HOP_BACK = BURST_WIN // 2 - BURST_HOP // 2  # and before it
STREAM_WARMUP_S = 1.0  # until this much audio is seen, the loud level is at least...
DEFAULT_LOUD_DB = -30.0  # ...this (dBFS), and the noise floor at least...
DEFAULT_NOISE_DB = -60.0  # ...this: a quiet room before the first words is silence
_HIST_RANGE_DB = (DB_FLOOR, 40.0)  # running percentiles: dB range and resolution
_HIST_STEP_DB = 0.05


def _stream_lookahead() -> int:
    """Frames after frame j whose audio frame j needs (for j = 0; the same for every j): its
    silence reads the next MIN_SILENCE_FRAMES - 1 frames' levels, its bursts the hops up to
    BURST_CONTEXT_AFTER past it and the statistics of their frame (the frames before)."""
    last_hop = HOPS_PER_FRAME - 1 + BURST_CONTEXT_AFTER - 1
    needs = max(
        MIN_SILENCE_FRAMES * SAMPLES_PER_FRAME,
        SAMPLES_PER_FRAME + _SPEC_REACH,
        last_hop * BURST_HOP + _HOP_REACH,
        (last_hop // HOPS_PER_FRAME) * SAMPLES_PER_FRAME + _SPEC_REACH,
    )
    return -(-(needs - SAMPLES_PER_FRAME) // SAMPLES_PER_FRAME)


class _RunningPercentile:
    """Percentiles of the last ``capacity`` values (dB) from a histogram over a ring buffer:
    adding a value and reading a percentile cost the same however long the history. Linear
    interpolation between order statistics as np.percentile, to _HIST_STEP_DB."""

    def __init__(self, capacity: int) -> None:
        lo, hi = _HIST_RANGE_DB
        self._ring = np.zeros(max(1, capacity), np.int32)
        self._hist = np.zeros(int(round((hi - lo) / _HIST_STEP_DB)) + 1, np.int64)
        self._written = 0

    @property
    def count(self) -> int:
        return min(self._written, len(self._ring))

    def add(self, values: np.ndarray) -> None:
        lo, hi = _HIST_RANGE_DB
        bins = np.rint((np.clip(values, lo, hi) - lo) / _HIST_STEP_DB).astype(np.int32)
        cap = len(self._ring)
        for i in range(0, len(bins), cap):  # positions unique within a piece
            piece = bins[i : i + cap]
            w = self._written + np.arange(len(piece))
            pos = w % cap
            np.subtract.at(self._hist, self._ring[pos[w >= cap]], 1)
            self._ring[pos] = piece
            np.add.at(self._hist, piece, 1)
            self._written += len(piece)

    def percentiles(self, *qs: float) -> list[float]:
        cum = np.cumsum(self._hist)
        ranks = np.array([q / 100.0 * (self.count - 1) for q in qs])
        below = np.floor(ranks)
        lo_bin = np.searchsorted(cum, below, side="right")
        hi_bin = np.searchsorted(cum, np.minimum(below + 1, self.count - 1), side="right")
        value = lo_bin + (ranks - below) * (hi_bin - lo_bin)
        return list(_HIST_RANGE_DB[0] + value * _HIST_STEP_DB)


class _Track:
    """A window of a per-frame (per-sub-frame, per-hop) series, indexed by absolute position:
    appended at the end, trimmed at the front."""

    def __init__(self, dtype: type, width: int | None = None) -> None:
        self.data = np.zeros((0,) if width is None else (0, width), dtype)
        self.start = 0

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def append(self, values: np.ndarray) -> None:
        self.data = np.concatenate([self.data, values.astype(self.data.dtype, copy=False)])

    def get(self, a: int, b: int) -> np.ndarray:
        return self.data[a - self.start : b - self.start]

    def trim(self, a: int) -> None:
        if a > self.start:
            self.data = self.data[a - self.start :].copy()
            self.start = a


# columns of the per-frame statistics
_P95, _NOISE, _THR, _LOUD, _HF_FLOOR, _MID_FLOOR, _TOT_FLOOR = range(7)


class PhoneticStream:
    """`analyze` for live audio: push 16 kHz mono float32 chunks of any size and get the
    frames that became final, in order from frame 0, none twice; `finish` flushes the rest
    (frame_count(total samples) in all, frames past the audio reading zeros as in `analyze`).

    Frame j is final once the audio up to the end of frame j + ``lookahead_frames`` is in.
    The local measures (rms_db, centroid, low_ratio, voicing, pitch) are the offline ones; the
    clip-relative ones (level, silence, flux, bursts) use the statistics of the ``history_s``
    seconds before the frame (at least DEFAULT_LOUD_DB and DEFAULT_NOISE_DB in the first
    STREAM_WARMUP_S, so that the first frames are usable). The result does not depend on how
    the audio is chunked, a push costs in proportion to its audio (plus a bounded context),
    and memory is bounded by the history."""

    lookahead_frames: int = _stream_lookahead()

    def __init__(self, history_s: float = 10.0) -> None:
        frames = max(1, int(round(history_s * FPS)))
        self._level_hist = _RunningPercentile(frames)
        self._band_hist = _RunningPercentile(frames * SUBFRAMES)
        self._hop_hist = [_RunningPercentile(frames * HOPS_PER_FRAME) for _ in range(3)]
        self._warmup = int(round(STREAM_WARMUP_S * FPS))
        self._buf = np.zeros(0, np.float32)  # samples from absolute index _buf_start on
        self._buf_start = 0
        self._total = 0
        self._finished = False
        self._emitted = 0
        self._rms = _Track(np.float64)  # per frame
        self._spec = _Track(np.float32, 4)  # per frame: centroid, low_ratio, voicing, pitch
        self._bands = _Track(np.float32, FLUX_BANDS)  # per sub-frame
        self._hops = _Track(np.float32, 3)  # per burst hop: hf, mid, tot
        self._stats = _Track(np.float64, 7)  # per frame, from the frames before it
        self._silence = _Track(bool)  # per emitted frame (the onsets' context)

    @property
    def frames_emitted(self) -> int:
        return self._emitted

    def push(self, samples: np.ndarray) -> PhoneticFrames:
        """Take the next samples; the frames that became final."""
        if self._finished:
            raise RuntimeError("PhoneticStream.push() after finish()")
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if x.size:
            self._buf = np.concatenate([self._buf, x])
            self._total += x.size
        return self._advance()

    def finish(self) -> PhoneticFrames:
        """The audio has ended: the remaining frames."""
        if self._finished:
            return _empty_frames()
        self._finished = True
        return self._advance()

    # --- internals -----------------------------------------------------------------------

    def _advance(self) -> PhoneticFrames:
        total, spf = self._total, SAMPLES_PER_FRAME
        if self._finished:
            n = frame_count(total)
            rms_to, spec_to, hops_to, stats_to, ready = n, n, n * HOPS_PER_FRAME, n, n
        else:
            rms_to = total // spf
            spec_to = max(0, (total - _SPEC_REACH) // spf)
            hops_to = max(0, (total - _HOP_REACH) // BURST_HOP + 1)
            # frame f's statistics come from the frames before it
            stats_to = min(rms_to, spec_to, hops_to // HOPS_PER_FRAME) + 1
            ready = max(0, rms_to - self.lookahead_frames)
        self._measure(rms_to, spec_to, hops_to)
        self._update_stats(stats_to)
        out = _empty_frames()
        if ready > self._emitted:
            out = self._finalise(self._emitted, ready)
            self._emitted = ready
        self._trim()
        return out

    def _measure(self, rms_to: int, spec_to: int, hops_to: int) -> None:
        """The local measures of the frames (hops) that the samples now cover."""
        buf, off = self._buf, self._buf_start
        first = self._rms.end
        if rms_to > first:
            self._rms.append(_db(_frame_power(buf, first, rms_to - first, off)))
        for _, count in _blocks(spec_to - self._spec.end, BLOCK_FRAMES):
            *measures, bands = _spectral_frames(buf, self._spec.end, count, off, per_frame=True)
            self._spec.append(np.stack(measures, axis=1))
            self._bands.append(bands)
        per_block = BLOCK_FRAMES * HOPS_PER_FRAME
        for _, count in _blocks(hops_to - self._hops.end, per_block):
            self._hops.append(np.stack(_burst_bands(buf, self._hops.end, count, off), axis=1))

    def _update_stats(self, stats_to: int) -> None:
        """Statistics for the frames up to stats_to: frame f's from the history before it."""
        for f in range(self._stats.end, stats_to):
            if f > 0:
                g = f - 1
                self._level_hist.add(self._rms.get(g, f))
                bands = self._bands.get(g * SUBFRAMES, f * SUBFRAMES)
                self._band_hist.add(_db(bands.sum(axis=1)))
                hops = self._hops.get(g * HOPS_PER_FRAME, f * HOPS_PER_FRAME)
                for k, hist in enumerate(self._hop_hist):
                    hist.add(hops[:, k])
            self._stats.append(self._stats_row(f)[None])

    def _stats_row(self, seen: int) -> np.ndarray:
        """[p95, noise, threshold, loud band energy, hf/mid/tot noise floors] after ``seen``
        frames (defaults before any)."""
        if self._level_hist.count:
            p95, noise = self._level_hist.percentiles(95.0, NOISE_PERCENTILE)
            (loud_db,) = self._band_hist.percentiles(95.0)
            floors = [h.percentiles(NOISE_PERCENTILE)[0] for h in self._hop_hist]
        else:
            p95 = loud_db = DEFAULT_LOUD_DB
            noise, floors = DB_FLOOR, [DB_FLOOR] * 3
        if seen < self._warmup:
            p95, loud_db = max(p95, DEFAULT_LOUD_DB), max(loud_db, DEFAULT_LOUD_DB)
            noise = max(noise, DEFAULT_NOISE_DB)
        thr = float(_threshold_db(p95, noise))
        return np.array([p95, noise, thr, 10.0 ** (loud_db / 10.0) / FLUX_BANDS, *floors])

    def _finalise(self, j0: int, j1: int) -> PhoneticFrames:
        """Normalise frames j0 .. j1 - 1 with their statistics and context."""
        stats = self._stats.get(j0, j1)
        rms_db = self._rms.get(j0, j1)
        # silence: runs shorter than MIN_SILENCE_FRAMES read up to that many frames around
        ctx = MIN_SILENCE_FRAMES - 1
        a, b = max(0, j0 - ctx), j1 + ctx
        if self._finished:
            b = min(b, frame_count(self._total))
        raw = self._rms.get(a, b) < self._stats.get(a, b)[:, _THR]
        silence = _fill_short_runs(raw, MIN_SILENCE_FRAMES)[j0 - a : j1 - a]
        level = _level(rms_db, stats[:, _P95], stats[:, _NOISE])

        a = max(0, j0 - ONSET_CONTEXT)
        sil_ctx = np.concatenate([self._silence.get(a, j0), silence])
        onset = _onsets(sil_ctx, self._rms.get(a, j1))[j0 - a :]
        self._silence.append(silence)

        lead = 1 if j0 > 0 else 0
        sub = np.arange(j0 * SUBFRAMES - lead, j1 * SUBFRAMES)
        loud = self._stats.get(sub[0] // SUBFRAMES, j1)[sub // SUBFRAMES - sub[0] // SUBFRAMES]
        logbands = _log_bands(
            self._bands.get(sub[0], sub[-1] + 1), loud[:, _LOUD, None].astype(np.float32)
        )
        flux = _flux(logbands, lead)

        spec = self._spec.get(j0, j1)
        voicing, pitch = spec[:, 2].copy(), spec[:, 3].copy()
        voicing[silence] = 0.0
        pitch[silence] = 0.0
        burst = self._bursts(j0, j1)
        return _frames(
            rms_db, level, flux, voicing, pitch, spec[:, 0], spec[:, 1], silence, onset, burst
        )

    def _bursts(self, j0: int, j1: int) -> np.ndarray:
        """Burst flags of frames j0 .. j1 - 1, from their hops with the context around them."""
        h0 = max(0, j0 * HOPS_PER_FRAME - BURST_CONTEXT_BEFORE)
        h1 = j1 * HOPS_PER_FRAME + BURST_CONTEXT_AFTER
        if self._finished:
            h1 = min(h1, self._hops.end)
        hops = self._hops.get(h0, h1)
        f = np.arange(h0, h1) // HOPS_PER_FRAME
        stats = self._stats.get(f[0], f[-1] + 1)[f - f[0]]
        floors = (stats[:, _HF_FLOOR], stats[:, _MID_FLOOR], stats[:, _TOT_FLOOR])
        idx = _burst_hops(hops[:, 0], hops[:, 1], hops[:, 2], floors, stats[:, _THR]) + h0
        frames = (_hop_times(idx) * FPS).astype(int)
        burst = np.zeros(j1 - j0, bool)
        burst[frames[(frames >= j0) & (frames < j1)] - j0] = True
        return burst

    def _trim(self) -> None:
        """Drop the samples and measures no later frame reads."""
        e = self._emitted
        keep = min(
            self._rms.end * SAMPLES_PER_FRAME,
            self._spec.end * SAMPLES_PER_FRAME - _SPEC_REACH,
            self._hops.end * BURST_HOP - _HOP_BACK,
        )
        if keep > self._buf_start:
            self._buf = self._buf[keep - self._buf_start :].copy()
            self._buf_start = keep
        hop0 = e * HOPS_PER_FRAME - BURST_CONTEXT_BEFORE
        self._rms.trim(e - max(ONSET_CONTEXT, MIN_SILENCE_FRAMES - 1))
        self._spec.trim(e)
        self._bands.trim(e * SUBFRAMES - 1)
        self._hops.trim(hop0)
        self._stats.trim(min(e - MIN_SILENCE_FRAMES + 1, e - 1, hop0 // HOPS_PER_FRAME))
        self._silence.trim(e - ONSET_CONTEXT)

    def _state_size(self) -> int:
        """Values held (samples, measures, histories): bounded whatever the session's length."""
        tracks = (self._rms, self._spec, self._bands, self._hops, self._stats, self._silence)
        hists = (self._level_hist, self._band_hist, *self._hop_hist)
        return (
            self._buf.size
            + sum(t.data.size for t in tracks)
            + sum(h._ring.size + h._hist.size for h in hists)
        )
