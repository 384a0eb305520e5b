"""The interface a HuBERT model must have, checked the same way for every runner.

``hubert_streaming_fix_kv.onnx``: one input ``input_values`` float32 [1, N] and an output
``encoding_out`` float32 [T_h, 1024] (no batch axis). ONNX Runtime's session ports and
:func:`studio.runtime.onnx_torch.onnx_ports` both describe ports by ``name``, ``type``
("tensor(float)") and ``shape``, so one check serves both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from studio.errors import InputError
from studio.layout import HUBERT_DIM

INPUT_NAME = "input_values"
OUTPUT_NAME = "encoding_out"


def check_signature(
    inputs: Sequence[Any], outputs: Sequence[Any], path: Path, split_len: int
) -> None:
    """InputError unless the model has input_values [1, N] f32 and encoding_out [T, 1024] f32."""
    expected = (
        f"expected one input '{INPUT_NAME}' float32 [1, N] and an output '{OUTPUT_NAME}' "
        f"float32 [T_h, {HUBERT_DIM}] (hubert_streaming_fix_kv.onnx)"
    )
    by_name = {o.name: o for o in outputs}

    def fail(found: str) -> None:
        raise InputError(f"HuBERT model '{path}' has {found}; {expected}.")

    if len(inputs) != 1 or inputs[0].name != INPUT_NAME:
        fail("inputs " + ", ".join(f"'{i.name}'" for i in inputs))
    inp = inputs[0]
    if inp.type != "tensor(float)" or len(inp.shape) != 2:
        fail(f"input '{INPUT_NAME}' of type {inp.type} shaped {list(inp.shape)}")
    batch, length = inp.shape
    if isinstance(batch, int) and batch != 1:
        fail(f"input batch {batch}")
    if isinstance(length, int) and length != split_len:
        fail(f"a fixed input length of {length} samples (chunks need {split_len})")
    if OUTPUT_NAME not in by_name:
        fail("outputs " + ", ".join(f"'{n}'" for n in by_name))
    out = by_name[OUTPUT_NAME]
    if out.type != "tensor(float)" or len(out.shape) != 2:
        fail(f"output '{OUTPUT_NAME}' of type {out.type} shaped {list(out.shape)}")
    if isinstance(out.shape[1], int) and out.shape[1] != HUBERT_DIM:
        fail(f"output '{OUTPUT_NAME}' of width {out.shape[1]}")


def check_encoding(shape: Sequence[int], path: Path, split_len: int, min_frames: int) -> None:
    """InputError unless one chunk's ``encoding_out`` is [>= min_frames, 1024]."""
    if len(shape) != 2 or shape[1] != HUBERT_DIM or shape[0] < min_frames:
        raise InputError(
            f"HuBERT model '{path}' returned '{OUTPUT_NAME}' shaped {list(shape)} "
            f"for {split_len} samples; expected [>= {min_frames}, {HUBERT_DIM}] "
            "(hubert_streaming_fix_kv.onnx gives [20, 1024] for 6480)."
        )
