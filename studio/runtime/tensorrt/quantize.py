"""FP8/INT8 by explicit quantization: ModelOpt's ONNX PTQ
(``modelopt.onnx.quantization.quantize``) writes Q/DQ nodes into a copy of the graph, GridSample
excluded. Its own module because ModelOpt is an optional dependency that only these two
precisions need.

``modelopt`` is imported when a quantized build runs; calibration uses random data unless
``calibration`` (an ``.npz`` of input arrays) is given. Quantization runs on the standard-op
graph, before the plugin rewrite, so ModelOpt's ONNX Runtime calibration never meets the plugin
op. Weakly typed Q/DQ builds set ``INT8`` (int8) and ``FP16``; never ``BuilderFlag.FP8``, which
only enables plugins with FP8 I/O and is refused with ``HardwareCompatibilityLevel.AMPERE_PLUS``
(NvInfer.h, 10.16).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from studio.runtime.base import BackendUnavailable
from studio.runtime.tensorrt.plugins import PLUGIN_OP

__all__ = ["quantize_onnx"]


def quantize_onnx(
    src: Path, dst: Path, precision: str, calibration: str | None, log: Callable[[str], None]
) -> Path:
    """Q/DQ-quantize ``src`` for fp8/int8 with ModelOpt into ``dst`` (GridSample excluded)."""
    try:
        from modelopt.onnx.quantization import quantize
    except Exception as e:  # noqa: BLE001
        raise BackendUnavailable(
            f"{precision} needs ModelOpt's ONNX quantization ({type(e).__name__}: {e}): "
            "pip install 'nvidia-modelopt[onnx]'"
        ) from None
    import numpy as np
    import onnx

    if calibration is not None:
        with np.load(Path(calibration).expanduser()) as z:
            data = {k: z[k] for k in z.files}
    else:
        from studio.models.onnx_export import random_inputs
        from studio.runtime.base import torch_dtype

        model = onnx.load(str(src), load_external_data=False)
        from onnx.helper import tensor_dtype_to_np_dtype

        names, example = [], []
        for v in model.graph.input:
            shape = [d.dim_value or 1 for d in v.type.tensor_type.shape.dim]
            dtype = torch_dtype(str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))
            names.append(v.name)
            example.append(torch.zeros(shape, dtype=dtype))
        data = {n: t.numpy() for n, t in zip(names, random_inputs(names, example, 0), strict=True)}
        log(f"{src.name}: {precision} calibration on random inputs (give --calibration for real)")
    kwargs: dict[str, Any] = {
        "onnx_path": str(src),
        "quantize_mode": precision,
        "calibration_data": data,
        "op_types_to_exclude": ["GridSample", PLUGIN_OP],
        "output_path": str(dst),
    }
    try:
        quantize(**kwargs, op_types_to_exclude_fp16=["GridSample"])
    except TypeError:  # an older ModelOpt without op_types_to_exclude_fp16
        quantize(**kwargs)
    return dst
