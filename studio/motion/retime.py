"""Motion at another frame rate: the rows at the output's frame times, interpolated.

The motion is made at 25 fps; a 24, 30, 50 or 60 fps video is rendered from rows at its own
frame times (k / fps): each row linear between the two 25 fps rows around it, the head's
angles interpolated in degrees (re-encoded onto their bins, as cadence sampling does), so a
30 fps export moves as the 25 fps one does, with every frame rendered, not repeated.
"""

from __future__ import annotations

import numpy as np

from studio import layout
from studio.motion.cadence import blend_rows


def output_frames(num_frames: int, fps: int, fps_in: int = layout.FPS) -> int:
    """Frames at ``fps`` covering ``num_frames`` frames at ``fps_in`` (the same duration)."""
    return int(round(num_frames * fps / fps_in))


def retime(motion: np.ndarray, fps: int, fps_in: int = layout.FPS) -> np.ndarray:
    """``motion`` [N, 265] at ``fps_in`` -> [M, 265] at ``fps`` (module docstring)."""
    motion = np.asarray(motion, dtype=np.float32)
    n = motion.shape[0]
    if fps == fps_in or n == 0:
        return motion
    m = output_frames(n, fps, fps_in)
    pos = np.minimum(np.arange(m) * (fps_in / fps), n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    return blend_rows(motion, lo, hi, pos - lo)
