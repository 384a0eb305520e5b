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
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _windows(x: np.ndarray, first: int, count: int, hop: int, win: int) -> np.ndarray:
    """[count, win] windows of ``x`` centred at ``hop * i + hop / 2`` for ``i`` from ``first``
    (zero outside the signal): a block of a whole-signal framing, sample for sample."""
    start = hop * first - (win // 2 - hop // 2)
    xp = np.zeros(hop * (count - 1) + win, np.float32)
    lo, hi = max(start, 0), min(start + len(xp), len(x))
    if hi > lo:
        xp[lo - start : hi - start] = x[lo:hi]
    return np.lib.stride_tricks.sliding_window_view(xp, win)[::hop][:count]


def _blocks(total: int, size: int) -> list[tuple[int, int]]:
    """(first, count) pairs covering ``range(total)`` in blocks of ``size``."""
    return [(b, min(size, total - b)) for b in range(0, total, size)]


def _spectra(x: np.ndarray, first_sub: int, num_sub: int) -> np.ndarray:
    """Power spectra [num_sub, NFFT//2+1] of Hann windows centred at HOP*i + HOP/2, for the
    sub-frames ``first_sub`` .. ``first_sub + num_sub - 1`` of ``x``."""
    frames = _windows(x, first_sub, num_sub, HOP, WIN)
    win = np.hanning(WIN + 2)[1:-1].astype(np.float32)
    spec = sfft.rfft(frames * win, n=NFFT, axis=1)
    power = spec.real**2 + spec.imag**2
    # scale so that a band's sum is the mean square of the windowed signal in that band
    weights = np.full(power.shape[1], 2.0, np.float32)
    weights[0] = weights[-1] = 1.0
    return power * (weights / (NFFT * float(np.sum(win**2))))


def _band_matrix(freqs: np.ndarray) -> np.ndarray:
    """[bins, FLUX_BANDS] 0/1 matrix pooling FFT bins into log-spaced bands."""
    edges = np.geomspace(FLUX_BAND_HZ[0], FLUX_BAND_HZ[1], FLUX_BANDS + 1)
    band = np.searchsorted(edges, freqs, side="right") - 1
    return (band[:, None] == np.arange(FLUX_BANDS)[None, :]).astype(np.float32)


def _frame_rms_db(x: np.ndarray, n: int) -> np.ndarray:
    """RMS in dBFS of n video frames of x (zero-padded), a block of frames at a time."""
    power = np.zeros(n, np.float64)
    for first, count in _blocks(n, BLOCK_FRAMES):
        block = np.zeros(count * SAMPLES_PER_FRAME, np.float64)
        part = x[first * SAMPLES_PER_FRAME : (first + count) * SAMPLES_PER_FRAME]
        block[: len(part)] = part
        power[first : first + count] = np.mean(block.reshape(count, SAMPLES_PER_FRAME) ** 2, 1)
    return _db(power)


def _silence_threshold(rms_db: np.ndarray) -> tuple[float, float, float]:
    """(threshold, p95, noise floor) in dBFS, relative to the clip."""
    p95 = float(np.percentile(rms_db, 95))
    noise = float(np.percentile(rms_db, NOISE_PERCENTILE))
    thr = max(p95 - SILENCE_BELOW_P95_DB, noise + SILENCE_ABOVE_NOISE_DB)
    thr = max(min(thr, p95 - SILENCE_MIN_BELOW_P95_DB), SILENCE_ABS_DB)
    return thr, p95, noise


def _fill_short_runs(mask: np.ndarray, min_len: int) -> np.ndarray:
    """Clear True runs shorter than min_len that have False on both sides."""
    out = mask.copy()
    n = len(mask)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    for start, stop in zip(edges[::2], edges[1::2], strict=True):
        if stop - start < min_len and start > 0 and stop < n:
            out[start:stop] = False
    return out


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
    win = np.hanning(WIN + 2)[1:-1]
    wac = np.correlate(win, win, "full")[WIN - 1 : WIN + lag_max + 1]
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
        pitch[any_voiced] = np.nanmedian(f0[any_voiced], axis=1)
    pitch[voicing < VOICED_THRESHOLD] = 0.0
    return voicing.astype(np.float32), pitch.astype(np.float32)


def _trailing_max(a: np.ndarray, size: int) -> np.ndarray:
    """out[k] = max(a[k - size + 1 .. k])."""
    return maximum_filter1d(a, size, origin=(size - 1) // 2, mode="nearest")


def _leading_max(a: np.ndarray, size: int) -> np.ndarray:
    """out[k] = max(a[k .. k + size - 1])."""
    return maximum_filter1d(a, size, origin=-(size // 2), mode="nearest")


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
    win = np.hanning(BURST_WIN + 2)[1:-1].astype(np.float32)
    scale = 2.0 / (BURST_NFFT * float(np.sum(win**2)))
    freqs = np.fft.rfftfreq(BURST_NFFT, 1.0 / SAMPLE_RATE)
    hf, mid, tot = (np.empty(m, np.float32) for _ in range(3))
    per_block = BLOCK_FRAMES * SAMPLES_PER_FRAME // BURST_HOP
    for first, count in _blocks(m, per_block):
        spec = sfft.rfft(_windows(x, first, count, BURST_HOP, BURST_WIN) * win, BURST_NFFT, 1)
        power = (spec.real**2 + spec.imag**2) * scale
        part = slice(first, first + count)
        hf[part] = _db(power[:, freqs >= HF_BAND_HZ[0]].sum(axis=1))
        mid[part] = _db(power[:, freqs >= MID_BAND_HZ].sum(axis=1))
        tot[part] = _db(power.sum(axis=1))
    # floor at the clip's noise, so that closures in a noisy recording read as level
    hf_floor = float(np.percentile(hf, NOISE_PERCENTILE))
    hf = np.maximum(hf, hf_floor)
    mid = np.maximum(mid, np.percentile(mid, NOISE_PERCENTILE))
    tot = np.maximum(tot, np.percentile(tot, NOISE_PERCENTILE))

    step_s = BURST_HOP / SAMPLE_RATE
    c = max(1, int(round(BURST_CLOSURE_S / step_s)))
    a = max(1, int(round(BURST_ATTACK_S / step_s)))
    after = max(1, int(round(BURST_FOLLOW_S / step_s)))
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
        & (_leading_max(tot, after) >= silence_db)
    )
    # one burst per closure: the strongest rise within BURST_MIN_SEPARATION_S, the first of ties
    sep = max(1, int(round(BURST_MIN_SEPARATION_S / step_s)))
    score = np.where(ok, rise, -np.inf)
    idx = np.flatnonzero(ok & (score >= maximum_filter1d(score, 2 * sep + 1, mode="nearest")))
    if len(idx) > 1:
        idx = idx[np.concatenate([[True], np.diff(idx) > sep])]
    return (idx * BURST_HOP + BURST_HOP / 2) / SAMPLE_RATE


def analyze(samples: np.ndarray, num_frames: int | None = None) -> PhoneticFrames:
    """Measure a mono float clip at SAMPLE_RATE per video frame (see PhoneticFrames).

    num_frames defaults to ceil(len * FPS / SAMPLE_RATE); shorter audio is zero-padded, longer
    audio is cut. voicing and pitch_hz are 0 in silent frames (a hum is not a voice).
    """
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    n = frame_count(len(x)) if num_frames is None else int(num_frames)
    if n <= 0:
        empty_f = np.zeros(0, np.float32)
        empty_b = np.zeros(0, bool)
        return PhoneticFrames(*(empty_f,) * 7, empty_b, empty_b, empty_b)
    x = x[: n * SAMPLES_PER_FRAME]  # frames past the audio read zeros (no padded copy)

    # level and silence, from the samples of each frame
    rms_db = _frame_rms_db(x, n)
    silence_db, p95, noise = _silence_threshold(rms_db)
    lo = min(max(noise, p95 - LEVEL_RANGE_DB), p95 - LEVEL_MIN_RANGE_DB)
    level = np.clip((rms_db - lo) / (p95 - lo), 0.0, 1.0)
    silence = _fill_short_runs(rms_db < silence_db, MIN_SILENCE_FRAMES)

    # spectral measures, pooled over each frame's sub-frames, a block of frames at a time
    freqs = np.fft.rfftfreq(NFFT, 1.0 / SAMPLE_RATE).astype(np.float32)
    band_matrix = _band_matrix(freqs)
    centroid, low_ratio, voicing, pitch = (np.zeros(n, np.float32) for _ in range(4))
    bands = np.empty((n * SUBFRAMES, FLUX_BANDS), np.float32)
    for first, count in _blocks(n, BLOCK_FRAMES):
        power = _spectra(x, first * SUBFRAMES, count * SUBFRAMES)
        frames = slice(first, first + count)
        pooled = power.reshape(count, SUBFRAMES, -1).sum(axis=1) * (freqs >= RUMBLE_HZ)
        total = pooled.sum(axis=1)
        safe = np.maximum(total, 1e-20)
        has_energy = total > 10.0 ** (DB_FLOOR / 10.0)
        centroid[frames] = np.where(has_energy, pooled @ freqs / safe, 0.0)
        low_ratio[frames] = np.where(
            has_energy, pooled[:, freqs < LOW_BAND_HZ].sum(axis=1) / safe, 0.0
        )
        bands[first * SUBFRAMES : (first + count) * SUBFRAMES] = power @ band_matrix
        voicing[frames], pitch[frames] = _voicing(power, count)

    # spectral flux: positive change of the band log energies from sub-frame to sub-frame,
    # summed over the frame; gain-invariant, floored so that silence reads as flat
    loud = float(np.percentile(bands.sum(axis=1), 95)) / FLUX_BANDS
    logbands = _db(np.maximum(bands, loud * 10.0 ** (-FLUX_FLOOR_DB / 10.0)))
    diff = np.zeros(len(logbands), np.float32)
    diff[1:] = np.maximum(logbands[1:] - logbands[:-1], 0.0).mean(axis=1)
    flux = np.clip(diff.reshape(n, SUBFRAMES).sum(axis=1) / FLUX_FULL_DB, 0.0, 1.0)

    voicing[silence] = 0.0  # periodic background (hum) is not voice
    pitch[silence] = 0.0

    burst = np.zeros(n, bool)
    frames_of_bursts = (burst_times(x, silence_db, n * SAMPLES_PER_FRAME) * FPS).astype(int)
    burst[frames_of_bursts[frames_of_bursts < n]] = True

    after_silence = ~silence & np.concatenate([[True], silence[:-1]])
    rising = ~silence & (np.diff(rms_db, prepend=rms_db[0]) >= ONSET_RISE_DB)
    rising[1:] &= ~(rising[:-1] | after_silence[:-1])  # a rise over two frames is one onset
    onset = after_silence | rising

    f32 = np.float32
    return PhoneticFrames(
        rms_db=rms_db.astype(f32),
        level=level.astype(f32),
        flux=flux.astype(f32),
        voicing=voicing,
        pitch_hz=pitch,
        centroid_hz=centroid.astype(f32),
        low_ratio=low_ratio.astype(f32),
        silence=silence,
        onset=onset,
        burst=burst,
    )
