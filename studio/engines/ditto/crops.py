"""The latest keyframes' crops, kept on the device for their in-betweens.

An in-between of the Ditto renderer is warped on the 512² crop the decoder made, before
paste-back, so that the paste-back stays exact. The crops of the last few rendered chunks
(a device renderer works one chunk ahead of the frames being blended) are kept as uint8
[H, W, 3], indexed by frame.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from torch import Tensor

KEPT_CHUNKS = 3  # the chunk being blended, the one before it (its last keyframe), the one ahead


class KeyframeCrops:
    """Frame index -> its crop, for the last :data:`KEPT_CHUNKS` chunks put."""

    def __init__(self, chunks: int = KEPT_CHUNKS) -> None:
        self._chunks: deque[list[int]] = deque()
        self._crops: dict[int, Tensor] = {}
        self._limit = chunks

    def start_chunk(self) -> None:
        """What :meth:`put` keeps next belongs to a new chunk; forget the oldest chunk."""
        self._chunks.append([])
        while len(self._chunks) > self._limit:
            old = self._chunks.popleft()
            live = {k for chunk in self._chunks for k in chunk}
            for k in old:
                if k not in live:
                    self._crops.pop(k, None)

    def put(self, frames: np.ndarray, crops: Tensor) -> None:
        """Keep ``crops`` [K, H, W, 3] uint8 of ``frames`` [K] in the current chunk."""
        if not self._chunks:
            self.start_chunk()
        keys = [int(f) for f in frames]
        self._crops.update(zip(keys, crops, strict=True))
        self._chunks[-1].extend(keys)

    def get(self, frames: np.ndarray) -> list[Tensor] | None:
        """The crops of ``frames``, or None when any of them is not kept."""
        try:
            return [self._crops[int(f)] for f in frames]
        except KeyError:
            return None

    def clear(self) -> None:
        self._chunks.clear()
        self._crops.clear()

    def __len__(self) -> int:
        return len(self._crops)
