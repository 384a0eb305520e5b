"""The embedded demo engine: procedural motion and a procedural avatar, no checkpoints.

It runs the same pipeline as the Ditto engine; only the motion source
(:mod:`studio.engines.demo.motion`) and the renderer (:mod:`studio.engines.demo.avatar`)
differ.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np

from studio.audio.io import Audio
from studio.audio.phonetics import PhoneticFrames
from studio.engines.demo.avatar import DemoAvatar
from studio.engines.demo.motion import generate_motion


def demo_audio_path() -> Path:
    """The built-in demo speech (16 kHz mono WAV shipped with the package)."""
    return Path(str(resources.files("studio.resources") / "demo" / "speech.wav"))


class DemoEngine:
    """Motion from speech by rule, rendered by the procedural avatar."""

    name = "demo"

    def generate(self, audio: Audio, phon: PhoneticFrames, seed: int) -> np.ndarray:
        return generate_motion(phon, seed)

    def renderer(self, size: int) -> DemoAvatar:
        return DemoAvatar(size)
