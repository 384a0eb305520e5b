"""``studio bench``: measured suites with the published reference figures beside ours.

Suites live in their own modules (:mod:`studio.bench.lmdm`, ...) and share the timing
helpers of :mod:`studio.bench.timing`: warm-up, CUDA events on a GPU (``perf_counter``
on the CPU), the median of repeats, rotating input sets and CUDA-graph capture.
"""

from __future__ import annotations

__all__ = ["SUITES"]

SUITES = ("lmdm",)
