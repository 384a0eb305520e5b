"""Synthesize the demo speech clip and its phoneme ground truth with espeak-ng.

Run ``python resources/demo/make_speech.py``. It writes, next to this file:

* ``speech.wav``: 16 kHz mono PCM_16, peak-normalised to -1 dBFS, a few plosive-rich
  sentences separated by inserted pauses, with a lead-in and a tail of silence.
* ``speech_phonemes.json``: the phoneme segmentation (from espeak-ng's phoneme events), the
  word starts, the plosive release times, and the inserted silences.

The espeak-ng C API is used through ctypes (the Debian ``libespeak-ng.so.1``, or the library
bundled in the ``espeakng-loader`` wheel), in synchronous mode with a synth callback that
collects both the samples and the events, so the timings are sample-exact.

Why releases are measured and not read off the phoneme events: espeak-ng emits the event of a
voiceless stop at its release (the closure silence is charged to the previous segment), but the
event of a voiced stop at its closure, and a stop's segment can run on for another 100 ms of
aspiration and silence. So neither the start nor the end of a stop segment is its release in
general. The release is found on the synthesizer's own 22.05 kHz output inside the stop's
segment: the first abrupt rise of the >2 kHz energy after >= 20 ms of closure. Stops with no
such rise (unreleased, or released into a nasal) are listed under ``unreleased_plosives``.

The output is deterministic for a given espeak-ng version (recorded in the JSON).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import butter, resample_poly, sosfiltfilt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from studio.layout import SAMPLE_RATE  # noqa: E402

SENTENCES = (
    "Peter picked a bright purple pepper.",
    "Bob bought a big blue boat, but it could not get past the dock.",
    "Good job, keep it up!",
)
VOICE = b"en-us"
RATE_WPM = 155
LEAD_IN_S = 0.35
PAUSES_S = (0.6, 0.5)  # between consecutive sentences
TAIL_S = 0.5
PEAK_DBFS = -1.0

WAV_PATH = HERE / "speech.wav"
JSON_PATH = HERE / "speech_phonemes.json"

# espeak-ng mnemonics (en) by class; flaps (t#, d#) are not plosives: they have no burst.
PLOSIVES = frozenset({"p", "b", "t", "d", "k", "g", "t2", "d2", "k2", "g2"})
AFFRICATES = frozenset({"tS", "dZ"})  # a stop released into a fricative: also a burst
PAUSES = frozenset({"_", "_:", "_!", "_|", "_^_", "_!_"})
VOWEL_START = "aeiouAEIOUV03@"

# --- espeak-ng C API (speak_lib.h) -------------------------------------------------------
AUDIO_OUTPUT_SYNCHRONOUS = 2
INITIALIZE_PHONEME_EVENTS = 0x0001
CHARS_UTF8 = 1
POS_CHARACTER = 1
PARAM_RATE = 1
EVENT_LIST_TERMINATED = 0
EVENT_WORD = 1
EVENT_PHONEME = 7


class _EventId(ctypes.Union):
    _fields_ = [
        ("number", ctypes.c_int),
        ("name", ctypes.c_char_p),
        ("string", ctypes.c_char * 8),
    ]


class _Event(ctypes.Structure):
    """espeak_EVENT: six 4-byte ints, a pointer at offset 24, the 8-byte id union at 32."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),  # ms from the start of this message
        ("sample", ctypes.c_int),  # samples from the start of this message
        ("user_data", ctypes.c_void_p),
        ("id", _EventId),
    ]


assert ctypes.sizeof(_Event) == 40 and _Event.id.offset == 32

_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


def _load_espeak() -> tuple[ctypes.CDLL, bytes | None]:
    """Find libespeak-ng: the system library first, else the espeakng-loader wheel's."""
    candidates: list[tuple[str, bytes | None]] = []
    for name in ("libespeak-ng.so.1", ctypes.util.find_library("espeak-ng")):
        if name:
            candidates.append((name, None))
    try:
        import espeakng_loader  # type: ignore[import-not-found]

        candidates.append(
            (str(espeakng_loader.get_library_path()), str(espeakng_loader.get_data_path()).encode())
        )
    except ImportError:
        pass
    for name, data_path in candidates:
        try:
            return ctypes.CDLL(name), data_path
        except OSError:
            continue
    raise SystemExit(
        "espeak-ng not found: apt-get install espeak-ng, or pip install espeakng-loader"
    )


@dataclass
class _Utterance:
    samples: np.ndarray  # int16 at the espeak rate
    phonemes: list[tuple[str, int]]  # (mnemonic, start sample)
    words: list[tuple[str, int]]  # (word, start sample)


class Espeak:
    """A minimal synchronous espeak-ng synthesizer that returns audio plus events."""

    def __init__(self) -> None:
        lib, data_path = _load_espeak()
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_Info.restype = ctypes.c_char_p
        lib.espeak_Info.argtypes = [ctypes.c_void_p]
        self.rate = lib.espeak_Initialize(
            AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path, INITIALIZE_PHONEME_EVENTS
        )
        if self.rate <= 0:
            raise RuntimeError("espeak_Initialize failed")
        self.version = lib.espeak_Info(None).decode()
        self._lib = lib
        self._chunks: list[np.ndarray] = []
        self._events: list[tuple[int, int, int, int, bytes]] = []
        self._callback = _CALLBACK(self._on_synth)  # keep a reference for the C side
        lib.espeak_SetSynthCallback(self._callback)
        if lib.espeak_SetVoiceByName(VOICE) != 0:
            raise RuntimeError(f"espeak voice {VOICE!r} not found")
        lib.espeak_SetParameter(PARAM_RATE, RATE_WPM, 0)

    def _on_synth(self, wav, num_samples, events) -> int:
        if wav and num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, (num_samples,)).copy())
        i = 0
        while events[i].type != EVENT_LIST_TERMINATED:
            ev = events[i]
            # `sample` gives sample-exact times; it must agree with the ms `audio_position`
            # (a check on the struct layout as much as on the library)
            if abs(ev.sample * 1000 / self.rate - ev.audio_position) > 1.5:
                raise RuntimeError("espeak_EVENT layout mismatch (sample vs audio_position)")
            name = bytes(ev.id.string).split(b"\0")[0] if ev.type == EVENT_PHONEME else b""
            self._events.append((ev.type, ev.sample, ev.text_position, ev.length, name))
            i += 1
        return 0

    def close(self) -> None:
        self._lib.espeak_Terminate()

    def synth(self, text: str) -> _Utterance:
        """Speak one sentence; event sample positions are relative to its first sample."""
        self._chunks, self._events = [], []
        data = text.encode("utf-8") + b"\0"
        err = self._lib.espeak_Synth(data, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed: {err}")
        self._lib.espeak_Synchronize()
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        phonemes = [(n.decode(), s) for t, s, _, _, n in self._events if t == EVENT_PHONEME]
        raw = text.encode("utf-8")
        words = [
            (raw[p - 1 : p - 1 + n].decode(errors="replace"), s)
            for t, s, p, n, _ in self._events
            if t == EVENT_WORD
        ]
        return _Utterance(samples, phonemes, words)


def _kind(ph: str) -> str:
    ph = ph.lstrip("',")  # espeak-ng 1.52 prefixes stressed vowels with ' or ,
    if ph in PAUSES or ph.startswith("_"):
        return "pause"
    if ph in PLOSIVES:
        return "plosive"
    if ph in AFFRICATES:
        return "affricate"
    if ph[0] in VOWEL_START:
        return "vowel"
    return "other"


def find_release(x: np.ndarray, hf_db: np.ndarray, start: int, end: int, rate: int) -> int | None:
    """The burst onset (sample) of a stop segment [start, end) in the espeak-rate signal.

    hf_db is the >2 kHz energy in dB on a 2 ms grid. A release is the first grid point in
    [start - 5 ms, end - 5 ms) (espeak starts a voiceless stop's segment a few ms after its
    burst; a burst at the very end belongs to the next segment) where that energy, over the next
    4 ms, is >= 20 dB above its maximum over the preceding 20 ms (the closure).
    """
    step = int(round(0.002 * rate))
    margin = int(round(0.005 * rate))
    lo = max(0, (start - margin) // step)
    hi = min(len(hf_db), (end - margin) // step)
    need = int(round(0.020 * rate / step))
    for k in range(max(lo, need), hi):
        if hf_db[k : k + 2].max() >= hf_db[k - need : k].max() + 20.0:
            # refine to the first sample above 10% of the burst's peak amplitude
            seg = np.abs(x[k * step : (k + 2) * step])
            first = int(np.argmax(seg >= 0.1 * seg.max()))
            return k * step + first
    return None


def main() -> None:
    tts = Espeak()
    rate = tts.rate
    utts = [tts.synth(s) for s in SENTENCES]

    pieces: list[np.ndarray] = [np.zeros(int(round(LEAD_IN_S * rate)), np.int16)]
    silences: list[tuple[int, int]] = [(0, len(pieces[0]))]
    phonemes: list[dict] = []
    words: list[dict] = []
    offset = len(pieces[0])
    for i, utt in enumerate(utts):
        nz = np.flatnonzero(utt.samples)
        first, last = int(nz[0]), int(nz[-1]) + 1  # trim espeak's own leading/trailing silence
        pieces.append(utt.samples[first:last])
        starts = [s for _, s in utt.phonemes] + [len(utt.samples)]
        for (ph, s), e in zip(utt.phonemes, starts[1:], strict=True):
            s0, e0 = max(s, first), min(e, last)
            if e0 > s0:
                phonemes.append(
                    {
                        "phoneme": ph,
                        "kind": _kind(ph),
                        "s": offset + s0 - first,
                        "e": offset + e0 - first,
                    }
                )
        for w, s in utt.words:
            words.append({"word": w, "s": offset + max(s, first) - first})
        offset += last - first
        gap = PAUSES_S[i] if i < len(PAUSES_S) else TAIL_S
        pieces.append(np.zeros(int(round(gap * rate)), np.int16))
        silences.append((offset, offset + len(pieces[-1])))
        offset += len(pieces[-1])
    x = np.concatenate(pieces).astype(np.float64) / 32768.0

    # plosive releases, measured on the exact synthesizer output
    step = int(round(0.002 * rate))
    hp = sosfiltfilt(butter(4, 2000, "highpass", fs=rate, output="sos"), x)
    n = len(hp) // step
    hf_db = 10 * np.log10(np.mean(hp[: n * step].reshape(n, step) ** 2, axis=1) + 1e-12)
    releases: list[int] = []
    affricate_releases: list[int] = []
    unreleased: list[dict] = []
    for ph in phonemes:
        if ph["kind"] not in ("plosive", "affricate"):
            continue
        r = find_release(x, hf_db, ph["s"], ph["e"], rate)
        if r is not None:
            ph["release"] = r
            (releases if ph["kind"] == "plosive" else affricate_releases).append(r)
        elif ph["kind"] == "plosive":
            unreleased.append(ph)

    y = resample_poly(x, SAMPLE_RATE, rate)  # 22050 -> 16000 (320/441)
    y *= 10 ** (PEAK_DBFS / 20) / np.max(np.abs(y))
    sf.write(WAV_PATH, y.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")

    def sec(s: int) -> float:
        return round(s / rate, 5)

    def ph_out(p: dict) -> dict:
        out = {
            "phoneme": p["phoneme"],
            "kind": p["kind"],
            "start_s": sec(p["s"]),
            "end_s": sec(p["e"]),
        }
        if "release" in p:
            out["release_s"] = sec(p["release"])
        return out

    doc = {
        "sample_rate": SAMPLE_RATE,
        "duration_s": round(len(y) / SAMPLE_RATE, 5),
        "text": list(SENTENCES),
        "synthesizer": f"espeak-ng {tts.version}, voice {VOICE.decode()}, {RATE_WPM} wpm",
        "notes": (
            "times in seconds from the start of speech.wav; phoneme end = next phoneme start; "
            "release_s / plosive_releases_s = measured burst onset inside the stop's segment "
            "(see make_speech.py); silences = the inserted pauses (lead-in, between sentences, "
            "tail)"
        ),
        "phonemes": [ph_out(p) for p in phonemes],
        "words": [{"word": w["word"], "start_s": sec(w["s"])} for w in words],
        "plosive_releases_s": [sec(r) for r in releases],
        "unreleased_plosives": [ph_out(p) for p in unreleased],
        "affricate_releases_s": [sec(r) for r in affricate_releases],
        "silences": [[sec(a), sec(b)] for a, b in silences],
    }
    JSON_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    tts.close()

    kinds = [p["kind"] for p in phonemes]
    print(f"espeak-ng {tts.version} ({rate} Hz) -> {WAV_PATH.name}: {doc['duration_s']:.2f} s")
    n_vowel, n_plosive = kinds.count("vowel"), kinds.count("plosive")
    print(f"  {len(phonemes)} phonemes, {n_vowel} vowels, {n_plosive} plosives")
    print(
        f"  {len(releases)} plosive releases ({len(affricate_releases)} affricate), "
        f"{len(unreleased)} unreleased:",
        ", ".join(f"{p['phoneme']}@{sec(p['s']):.2f}" for p in unreleased) or "-",
    )
    print("  silences:", ", ".join(f"{a:.2f}-{b:.2f}" for a, b in doc["silences"]))
    print(f"  {WAV_PATH.stat().st_size / 1000:.0f} kB wav, {JSON_PATH.name} written")


if __name__ == "__main__":
    main()
