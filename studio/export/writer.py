"""The writer for an export target, by its suffix: a video file (:class:`VideoWriter`: .mp4,
.webm, .mov) or a PNG sequence (:class:`PngSequenceWriter`: NAME.png, a folder NAME/)."""

from __future__ import annotations

import os
from pathlib import Path

from studio.audio.io import Audio
from studio.export.png_sequence import PngSequenceWriter
from studio.export.video import PNG_SEQUENCE, VideoWriter
from studio.layout import FPS

Writer = VideoWriter | PngSequenceWriter


def open_writer(
    path: str | os.PathLike,
    width: int,
    height: int,
    *,
    audio: Audio | None = None,
    crf: int = 18,
    preset: str = "medium",
    fps: int = FPS,
    codec: str = "h264",
    alpha: bool = False,
    hardware: bool = False,
) -> Writer:
    """A writer of ``width`` x ``height`` frames (RGBA with ``alpha``) to ``path``, with the
    clip's ``audio`` (``hardware``: the GPU's video encoder where one opens); use it as a
    context manager (atomic: all or nothing)."""
    if Path(path).suffix.lower() == PNG_SEQUENCE:
        return PngSequenceWriter(path, width, height, audio=audio, fps=fps, alpha=alpha)
    return VideoWriter(
        path, width, height, audio=audio, crf=crf, preset=preset, fps=fps, codec=codec,
        alpha=alpha, hardware=hardware,
    )
