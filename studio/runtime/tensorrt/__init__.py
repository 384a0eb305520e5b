"""The TensorRT backend: building, caching, loading and running serialized engines."""
