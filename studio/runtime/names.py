"""The runtime names the options and settings use, without importing torch."""

from __future__ import annotations

RUNTIMES = ("torch", "onnxruntime", "tensorrt")  # the engine backends, in the order offered
