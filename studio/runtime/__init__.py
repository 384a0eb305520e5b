"""Engines of single networks: a base that knows no backend, the precision policy, the torch,
ONNX Runtime and TensorRT backends, the factory above them, and their caches on disk."""
