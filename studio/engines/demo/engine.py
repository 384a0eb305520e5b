"""The embedded demo engine: procedural motion and a procedural avatar, no checkpoints.

It runs the same pipeline as the Ditto engine; only the motion source
(:mod:`studio.engines.demo.motion`) and the renderer (:mod:`studio.engines.demo.avatar`)
differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from studio import layout
from studio.audio.io import Audio
from studio.audio.phonetics import PhoneticFrames
from studio.engines.base import LATENCIES, Progress
from studio.engines.demo import CAPABILITIES, rig
from studio.engines.demo.avatar import DemoAvatar
from studio.engines.demo.motion import LOOKAHEAD, OFFLINE_LATENCY, DemoMotion, generate_motion
from studio.settings import RenderSettings


class DemoEngine:
    """Motion from speech by rule, rendered by the procedural avatar."""

    name = "demo"
    capabilities = CAPABILITIES

    def __init__(
        self, settings: RenderSettings | None = None, emotion: np.ndarray | None = None
    ) -> None:
        self.settings = settings or RenderSettings()
        self.emotion = emotion  # per-frame emotion rows [N, 8] of a keyed track, or None
        self.progress: Progress | None = None
        self.last_timings: dict[str, float] = {}

    def generate(self, audio: Audio, phon: PhoneticFrames, seed: int) -> np.ndarray:
        """The rule-based motion; a keyed emotion track adds each label's expression
        (:data:`~studio.engines.demo.rig.EMOTION_OFFSETS`) in its rows' proportions."""
        motion = generate_motion(phon, seed)
        if self.emotion is not None:
            rows = np.asarray(self.emotion, np.float32)[: len(motion)]
            exp = np.einsum("ne,ekd->nkd", rows, rig.EMOTION_OFFSETS).reshape(len(rows), -1)
            motion[: len(rows), layout.EXP] += exp
        return motion

    def with_emotion(self, rows: np.ndarray | None) -> DemoEngine:
        """The engine with per-frame emotion ``rows`` [N, 8] (None: none keyed)."""
        return DemoEngine(self.settings, rows)

    def motion_stream(self, seed: int, latency: str = OFFLINE_LATENCY) -> DemoMotion:
        """Live motion from the phonetic frames (the samples are not read): 1, 2 or 4 frames
        of lookahead for "low", "balanced", "smooth"; "balanced" is :meth:`generate` frame for
        frame."""
        if latency not in LATENCIES:
            raise ValueError(f"latency must be one of {', '.join(LATENCIES)}, got {latency!r}")
        return DemoMotion(seed, LOOKAHEAD[latency])

    def with_settings(self, settings: RenderSettings) -> DemoEngine:
        return DemoEngine(settings, self.emotion)

    def motion_key(self, settings: RenderSettings) -> tuple:
        return ("demo",)  # the rule-based motion reads only the audio and the seed

    def source_motion(self, num_frames: int, settings: RenderSettings) -> None:
        return None  # the character moves only as the motion says

    def renderer(self, settings: RenderSettings) -> DemoAvatar:
        return DemoAvatar(settings.size)

    def renderer_key(self, settings: RenderSettings) -> tuple:
        return ("demo", settings.size)

    def frame_size(self, settings: RenderSettings) -> tuple[int, int]:
        return settings.size, settings.size

    def canonical_keypoints(self) -> np.ndarray:
        return rig.CANONICAL_KP.copy()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "device": "CPU"}
