"""Read an ONNX file's graph without copying its weights, then map the weights from the file.

``onnx.load`` parses the whole file: for HuBERT (1.2 GB of weights) that is seconds of protobuf
parsing and copying in every new process, before torch copies the weights once more.
:func:`read_mapped` walks the protobuf wire format instead, skipping each initializer's
``raw_data`` and noting where its bytes lie in the file. The result is a regular
``ModelProto`` whose big initializers are *external data* (ONNX's own convention: ``location``,
``offset``, ``length``) that points back into the file itself, so any ONNX tool reading
external data would find them. :class:`Initializers` gives initializers' values, mapped from
the file (each file mapped once; no read until used) or, for embedded ones, as
``onnx.numpy_helper`` does.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Initializers", "read_mapped"]

# field numbers of onnx.proto
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_RAW_DATA = 9
_LENGTH_DELIMITED = 2


def _varint(buf: Any, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field's tag, start of a length-delimited value, end)."""
    pos = start
    while pos < end:
        tag_start = pos
        key, pos = _varint(buf, pos)
        wire = key & 7
        value_start = pos
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == _LENGTH_DELIMITED:
            size, value_start = _varint(buf, pos)
            pos = value_start + size
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"wire type {wire} at byte {tag_start}")
        if pos > end:
            raise ValueError(f"field at byte {tag_start} runs past its message")
        yield key >> 3, tag_start, value_start, pos


def _stripped_tensor(buf: Any, start: int, end: int, location: str) -> Any:
    """The TensorProto at buf[start:end], its raw_data left in the file as external data."""
    from onnx import TensorProto

    kept = []
    raw: tuple[int, int] | None = None
    for field, tag_start, value_start, stop in _fields(buf, start, end):
        if field == _TENSOR_RAW_DATA:
            raw = (value_start, stop - value_start)
        else:
            kept.append(buf[tag_start:stop])
    tensor = TensorProto()
    tensor.ParseFromString(b"".join(kept))
    if raw is not None:
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", raw[0]), ("length", raw[1])):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    return tensor


def read_mapped(path: str | os.PathLike[str]) -> Any:
    """The ``onnx.ModelProto`` in ``path``, each initializer's raw bytes left in the file.

    ValueError where the file is not a well-formed protobuf (the caller may then let
    ``onnx.load`` word the error).
    """
    from onnx import GraphProto, ModelProto

    p = Path(path)
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError("the file is empty")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        model_rest, graph_rest, tensors = [], [], []
        for field, tag_start, value_start, stop in _fields(buf, 0, len(buf)):
            if field != _MODEL_GRAPH:
                model_rest.append(buf[tag_start:stop])
                continue
            for g_field, g_tag, g_value, g_stop in _fields(buf, value_start, stop):
                if g_field == _GRAPH_INITIALIZER:
                    tensors.append(_stripped_tensor(buf, g_value, g_stop, p.name))
                else:
                    graph_rest.append(buf[g_tag:g_stop])
    finally:
        buf.close()
    model = ModelProto()
    model.ParseFromString(b"".join(model_rest))
    graph = GraphProto()
    graph.ParseFromString(b"".join(graph_rest))
    graph.initializer.extend(tensors)
    model.graph.CopyFrom(graph)
    return model


class Initializers:
    """Initializers' values (:meth:`array`); external data read from the files in ``folder``,
    each file mapped once (copy-on-write) and shared by its tensors.

    ``mapped`` False copies every value out of its file (what a model kept on the CPU wants:
    a mapped file rewritten in place would change its weights under it). ``folder`` None:
    the model has no file, and external data is an error."""

    def __init__(self, folder: str | os.PathLike[str] | None, mapped: bool = True) -> None:
        self.folder = None if folder is None else Path(folder)
        self.mapped = mapped
        self._files: dict[Path, np.ndarray] = {}

    def _file(self, name: str) -> np.ndarray:
        if self.folder is None:
            raise ValueError(
                f"an initializer's data is in '{name}', outside the model: give the model's "
                "file as its source"
            )
        path = self.folder / name
        if path not in self._files:
            self._files[path] = np.memmap(path, np.uint8, mode="c")
        return self._files[path]

    def array(self, tensor: Any) -> np.ndarray:
        """A writable array of ``tensor``'s values: with ``mapped`` a view of its file, also
        at an offset its dtype does not divide (torch takes the unaligned view, and a weight
        bound for a GPU is copied once, by the move), else a copy."""
        from onnx import TensorProto, helper, numpy_helper

        if tensor.data_location != TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor).copy()  # a writable copy of the message's bytes
        info = {e.key: e.value for e in tensor.external_data}
        data = self._file(info["location"])
        offset = int(info.get("offset", 0))
        end = offset + int(info["length"]) if "length" in info else data.size
        raw = data[offset:end]
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
        if dtype.kind not in "biuf" or tensor.data_type == TensorProto.BFLOAT16:
            # bfloat16, float8, 4-bit...: numpy_helper knows their packing
            copy = TensorProto()
            copy.CopyFrom(tensor)
            copy.data_location = TensorProto.DEFAULT
            del copy.external_data[:]
            copy.raw_data = raw.tobytes()
            return numpy_helper.to_array(copy).copy()
        dtype = dtype.newbyteorder("<")  # ONNX stores raw data little-endian
        count = int(np.prod(tensor.dims, dtype=np.int64))
        if raw.size < count * dtype.itemsize:
            raise ValueError(f"initializer '{tensor.name}' runs past the end of its data")
        array = raw[: count * dtype.itemsize].view(dtype).reshape(tuple(tensor.dims))
        return array if self.mapped else np.array(array)
