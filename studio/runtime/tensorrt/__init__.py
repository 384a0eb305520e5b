"""The TensorRT backend, split as Polygraphy splits loaders from runners; every import points
down this list:

- :mod:`~studio.runtime.tensorrt.cache`: a current engine for an ONNX file, built only when
  the cached one is missing or stale (the entry point of the factory and ``studio compile``).
- :mod:`~studio.runtime.tensorrt.run`: the runner (bind buffers, enqueue, CUDA graph).
- :mod:`~studio.runtime.tensorrt.load`: the loader (engine file -> deserialized engine).
- :mod:`~studio.runtime.tensorrt.build`: the builder (ONNX -> engine file) and its cache key.
- :mod:`~studio.runtime.tensorrt.quantize`: fp8/int8 Q/DQ graphs through ModelOpt.
- :mod:`~studio.runtime.tensorrt.plugins`: the GridSample3D plugin and the graph edits for it.
- :mod:`~studio.runtime.tensorrt.support`: the lazy import, versions, typing and precision
  flags, builder settings.
"""
