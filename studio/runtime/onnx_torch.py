"""A static-shape ONNX executor on torch: run an ONNX-only network on any torch device.

Why: where ONNX Runtime has only its CPU provider (no onnxruntime-gpu), a network shipped
only as ONNX (HuBERT) would run on the CPU; this runs the same file on the GPU with torch.

How: the graph is planned once for fixed input shapes. Nodes are walked in order; a node
whose tensor inputs are all known on the host (initializers, Constant, the Shape of a tensor
whose shape is now static, and anything computed from those) is evaluated there (constant
folding, so shape subgraphs disappear); every other node becomes a step, a torch function
from :mod:`studio.runtime.onnx_torch_ops` with its static parameters baked in. Shapes are
propagated by running the steps on meta tensors. Constants the steps read become buffers
on the device. An op without a mapping raises :class:`UnsupportedOnnxOp`, naming the op and
the file. :meth:`OnnxTorchGraph.batched` runs many independent inputs as one call through
``torch.func.vmap`` (graphs without a batch axis included) when the graph allows it.

A plan's shapes can be kept in a folder (``plan_cache``; :class:`PlanShapes`): a later process
planning the same file for the same inputs takes every step's output shapes from there instead
of running the steps on meta tensors. Several ops' meta kernels are torch decompositions whose
first call imports Dynamo and SymPy (about 1 s of a new process's engine opening).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from studio.errors import InputError, OutputError, StudioError
from studio.files import write_atomic
from studio.paths import code_digest
from studio.runtime.onnx_mapped import Initializers, read_mapped
from studio.runtime.onnx_torch_ops import CONVERTERS, Node, Unsupported, onnx_dtype

__all__ = ["OnnxTorchGraph", "PlanShapes", "Port", "UnsupportedOnnxOp", "onnx_ports", "read_onnx"]

_DEFAULT_DOMAINS = ("", "ai.onnx")
_TYPE_NAMES = {1: "float", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "double"}


class UnsupportedOnnxOp(StudioError):
    """A node the torch executor cannot run; the message names the op, the node and the file."""

    def __init__(self, source: str, op: str, node: str, reason: str = "") -> None:
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"ONNX op {op} (node '{node}') in '{source}' is not supported by the torch "
            f"executor{why}"
        )
        self.op, self.node, self.source = op, node, source


@dataclass(frozen=True)
class Port:
    """A graph input or output as ONNX Runtime describes one: name, type, shape."""

    name: str
    type: str  # "tensor(float)", ...
    shape: tuple[int | str | None, ...]


def read_onnx(path: str | os.PathLike[str]) -> Any:
    """The ``onnx.ModelProto`` in ``path``; InputError if unreadable.

    Initializers stay in the file as external data (:mod:`studio.runtime.onnx_mapped`): the
    planner maps them from there instead of parsing and copying gigabytes."""
    import onnx

    p = Path(path)
    try:
        return read_mapped(p)
    except Exception:  # noqa: BLE001, S110 - a malformed file: onnx.load words what is wrong
        pass
    try:
        return onnx.load(str(p))
    except Exception as e:  # protobuf and onnx raise several types for bad files
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise InputError(f"'{p}' could not be read as an ONNX model ({reason})") from None


def onnx_ports(model: Any) -> tuple[list[Port], list[Port]]:
    """The graph's runtime inputs (initializers excluded) and its outputs."""
    inits = {i.name for i in model.graph.initializer}

    def port(v: Any) -> Port:
        t = v.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim
        )
        return Port(v.name, f"tensor({_TYPE_NAMES.get(t.elem_type, t.elem_type)})", dims)

    inputs = [port(v) for v in model.graph.input if v.name not in inits]
    return inputs, [port(v) for v in model.graph.output]


@dataclass(frozen=True)
class _Step:
    fn: Any
    args: tuple[int, ...]  # register slots of the tensor inputs
    outs: tuple[tuple[int, int], ...]  # (output position, slot) of each used output
    multi: bool  # fn returns a tuple
    free: tuple[int, ...]  # slots whose last reader this step is


class OnnxTorchGraph(nn.Module):
    """``model`` planned for ``input_shapes`` ({name: shape}) and run with torch on ``device``.

    ``forward(*inputs)`` takes the runtime inputs in graph order and returns the outputs
    (the graph's, or only ``outputs``) as a tuple. ``output_shapes`` are static. ``batched``
    maps a leading item axis over ``forward``. ``source`` is the model's file (in messages,
    and its folder holds any external data, as :func:`read_onnx` leaves the weights).
    ``plan_cache``: a folder where the plan's shapes are kept for later processes
    (:class:`PlanShapes`; ``version``: the model file's (size, mtime_ns), taken before
    ``model`` was read);
    ``planned_from`` then says whether they came from there.
    """

    def __init__(
        self,
        model: Any,
        input_shapes: Mapping[str, Sequence[int]],
        device: str | torch.device = "cpu",
        source: str = "<model>",
        outputs: Sequence[str] | None = None,
        plan_cache: str | os.PathLike[str] | None = None,
        version: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.device = torch.device(device)
        inputs, ports = onnx_ports(model)
        self.input_names = tuple(p.name for p in inputs)
        self.output_names = tuple(p.name for p in ports) if outputs is None else tuple(outputs)
        shapes = PlanShapes.of(plan_cache, source, input_shapes, self.output_names, version)
        self.planned_from = "cache" if shapes.loaded else "meta tensors"
        # weights bound for another device may stay mapped from the file until they move
        plan = _Planner(model, source, shapes, mapped=self.device.type != "cpu")
        metas = {p.name: plan.add_input(p, input_shapes) for p in inputs}
        plan.run()
        self.input_shapes = tuple(tuple(m.shape) for m in metas.values())
        self.input_dtypes = tuple(m.dtype for m in metas.values())
        self.output_shapes = tuple(plan.shape_of(n) for n in self.output_names)
        consts, self._steps, self._input_slots, self._output_slots, self._n_slots = plan.compile(
            self.input_names, self.output_names
        )
        for i, value in enumerate(consts):
            self.register_buffer(f"c{i}", value.to(self.device), persistent=False)
        if shapes.batching is None:
            shapes.batching = self._check_batching([v.to("meta") for v in consts])
        self.batchable, self.batch_note = shapes.batching
        shapes.save()

    @property
    def num_steps(self) -> int:
        """Torch ops left after constant folding and dead-code removal."""
        return len(self._steps)

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        return self._execute(list(self._buffers.values()), inputs)  # type: ignore[arg-type]

    def batched(self, *inputs: Tensor, chunk_size: int | None = None) -> tuple[Tensor, ...]:
        """``forward`` over the leading axis of every input (independent items) as one call
        through ``torch.func.vmap`` (``chunk_size`` items at a time) when ``batchable``,
        else item by item on the device (no host sync), outputs stacked."""
        if self.batchable:
            return torch.func.vmap(self.forward, chunk_size=chunk_size)(*inputs)
        per_item = [self.forward(*(x[i] for x in inputs)) for i in range(inputs[0].shape[0])]
        return tuple(torch.stack(outs) for outs in zip(*per_item, strict=True))

    def _execute(self, consts: list[Tensor], inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
        if len(inputs) != len(self._input_slots):
            raise ValueError(f"{self.source}: {len(self._input_slots)} inputs, got {len(inputs)}")
        regs: list[Any] = consts + [None] * (self._n_slots - len(consts))
        for slot, x in zip(self._input_slots, inputs, strict=True):
            regs[slot] = x
        for step in self._steps:
            result = step.fn(*[regs[i] for i in step.args])
            if step.multi:
                for pos, slot in step.outs:
                    regs[slot] = result[pos]
            else:
                regs[step.outs[0][1]] = result
            for slot in step.free:
                regs[slot] = None
        return tuple(regs[s] for s in self._output_slots)

    def _check_batching(self, meta_consts: list[Tensor]) -> tuple[bool, str]:
        """Whether vmap runs the graph (tried once on meta tensors, two items)."""
        items = [
            torch.empty((2, *s), dtype=d, device="meta")
            for s, d in zip(self.input_shapes, self.input_dtypes, strict=True)
        ]
        try:
            outs = torch.func.vmap(lambda *xs: self._execute(meta_consts, xs))(*items)
        except Exception as e:  # noqa: BLE001 - any failure means: loop the items instead
            return False, f"vmap failed ({type(e).__name__}: {str(e)[:120]}); items run in turn"
        want = [(2, *s) for s in self.output_shapes]
        if [tuple(o.shape) for o in outs] != want:
            return False, "vmap changed the output shapes; items run in turn"
        return True, "one vmapped call"


PLAN_FORMAT = 1  # PlanShapes' file layout; a file of another is planned again


@functools.cache
def _planner_code() -> str:
    """The planner's and the converters' source, digested: a plan kept by other code (an
    upgrade) is planned again."""
    from studio.runtime import onnx_torch_ops

    return code_digest(__file__, onnx_torch_ops.__file__)


def _shape(value: Any) -> tuple[int, ...]:
    """A kept shape: a list of non-negative integers (ValueError for anything else)."""
    if not isinstance(value, list) or not all(type(d) is int and d >= 0 for d in value):
        raise ValueError(f"not a shape: {value!r}")
    return tuple(value)


def _dtype(name: Any) -> torch.dtype:
    """A kept dtype by its torch name (ValueError for anything else)."""
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {name!r}")
    return dtype


class PlanShapes:
    """The shapes and dtypes of a plan's step outputs, whether each step returns a tuple, and
    the batching check's outcome, kept as JSON under a folder for one model file (path, size,
    modification time), its input shapes and outputs, and this torch. A file that is missing,
    unreadable or of another key is planned again (and rewritten); a folder that cannot be
    written keeps nothing."""

    def __init__(self, path: Path | None, key: dict[str, Any]) -> None:
        self.path, self.key = path, key
        self.values: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.multi: set[str] = set()
        self.batching: tuple[bool, str] | None = None
        self.loaded = False  # read from its file

    @classmethod
    def of(
        cls,
        folder: str | os.PathLike[str] | None,
        source: str,
        input_shapes: Mapping[str, Sequence[int]],
        outputs: Sequence[str],
        version: tuple[int, int] | None = None,
    ) -> PlanShapes:
        """The kept shapes of ``source`` planned for these inputs (none: an empty record, kept
        once planned); without ``folder`` or a model file, a record that is never saved.
        ``version``: the file's (size, mtime_ns), taken before it was read (else now)."""
        if version is None:
            try:
                st = Path(source).stat()
            except OSError:
                return cls(None, {})
            version = (st.st_size, st.st_mtime_ns)
        key = {
            "format": PLAN_FORMAT,
            "source": str(Path(source).resolve()),
            "size": version[0],
            "mtime_ns": version[1],
            "inputs": {n: [int(d) for d in s] for n, s in sorted(input_shapes.items())},
            "outputs": list(outputs),
            "torch": torch.__version__,
            "code": _planner_code(),
        }
        if folder is None:
            return cls(None, key)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        shapes = cls(Path(folder) / f"{digest}.json", key)
        shapes._load()
        return shapes

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
            if data["key"] != self.key:
                return
            values = {str(n): (_shape(s), _dtype(d)) for n, (s, d) in data["values"].items()}
            ok, note = data["batching"]
            multi = data["multi"]
            if type(ok) is not bool or not isinstance(note, str):
                raise ValueError(f"not a batching check: {data['batching']!r}")
            if not isinstance(multi, list) or not all(isinstance(n, str) for n in multi):
                raise ValueError(f"not output names: {multi!r}")
        except Exception:  # noqa: BLE001 - absent or damaged in any way: planned again
            return
        batching, multi = (ok, note), set(multi)
        self.values, self.multi, self.batching, self.loaded = values, multi, batching, True

    def results(self, outs: Sequence[str]) -> tuple[bool, dict[str, Tensor]] | None:
        """(whether the step returns a tuple, meta tensors of its used outputs) when all are
        kept, else None."""
        used = [o for o in outs if o]
        if not used or any(o not in self.values for o in used):
            return None
        metas = {
            o: torch.empty(self.values[o][0], dtype=self.values[o][1], device="meta") for o in used
        }
        return used[0] in self.multi, metas

    def record(self, outs: Sequence[str], multi: bool, results: Mapping[str, Tensor]) -> None:
        """A step planned on meta tensors: its used outputs' shapes and dtypes."""
        for o, t in results.items():
            self.values[o] = (tuple(t.shape), t.dtype)
        first = next((o for o in outs if o), None)  # a step whose outputs all go unused has none
        if multi and first is not None:
            self.multi.add(first)

    def save(self) -> None:
        """Write the record (atomically) unless it was read from there or has no place."""
        if self.path is None or self.loaded or self.batching is None:
            return
        data = {
            "key": self.key,
            "values": {
                n: [list(shape), str(dtype).removeprefix("torch.")]
                for n, (shape, dtype) in self.values.items()
            },
            "multi": sorted(self.multi),
            "batching": list(self.batching),
        }
        try:
            write_atomic(self.path, json.dumps(data), make_parents=True)
        except OutputError:
            pass  # a cache that cannot be written: the next process plans again


class _Planner:
    """Walks the graph once: folds what the host knows, records the rest as steps."""

    def __init__(self, model: Any, source: str, shapes: PlanShapes, mapped: bool = False) -> None:
        self.model, self.source, self.shapes = model, source, shapes
        self.opset = next(
            (o.version for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), 1
        )
        self.known: dict[str, Tensor] = {}  # host values (CPU)
        self.meta: dict[str, Tensor] = {}  # runtime values, as meta tensors
        self.steps: list[tuple[Any, tuple[str, ...], tuple[str, ...], bool]] = []
        if len(model.graph.sparse_initializer):
            raise UnsupportedOnnxOp(source, "sparse_initializer", "<graph>")
        folder = Path(source).parent if Path(source).is_file() else None  # external data's
        values = Initializers(folder, mapped)
        for init in model.graph.initializer:
            try:
                self.known[init.name] = torch.from_numpy(values.array(init))
            except (OSError, ValueError) as e:
                raise InputError(f"'{source}': {e}") from None

    def add_input(self, port: Port, shapes: Mapping[str, Sequence[int]]) -> Tensor:
        if port.name not in shapes:
            raise ValueError(f"{self.source}: no shape given for input '{port.name}'")
        shape = tuple(int(d) for d in shapes[port.name])
        fixed = [d if isinstance(d, int) and d > 0 else None for d in port.shape]
        if len(shape) != len(fixed) or any(
            f not in (None, s) for f, s in zip(fixed, shape, strict=True)
        ):
            raise ValueError(
                f"{self.source}: input '{port.name}' is {list(port.shape)}, not {list(shape)}"
            )
        elem = next(v for v in self.model.graph.input if v.name == port.name)
        dtype = onnx_dtype(elem.type.tensor_type.elem_type)
        self.meta[port.name] = torch.empty(shape, dtype=dtype, device="meta")
        return self.meta[port.name]

    def shape_of(self, name: str) -> tuple[int, ...]:
        value = self.meta.get(name, self.known.get(name))
        if value is None:
            raise ValueError(f"{self.source}: output '{name}' is never computed")
        return tuple(value.shape)

    def value(self, name: str) -> Tensor | None:
        if name in self.meta:
            return self.meta[name]
        return self.known.get(name)

    def run(self) -> None:
        from onnx import helper, numpy_helper

        for index, node in enumerate(self.model.graph.node):
            label = node.name or f"#{index}"
            op = (
                node.op_type
                if node.domain in _DEFAULT_DOMAINS
                else f"{node.domain}::{node.op_type}"
            )
            if op not in CONVERTERS:
                raise UnsupportedOnnxOp(self.source, op, label)
            attrs = {}
            for a in node.attribute:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    v = v.decode()
                elif a.type == a.TENSOR:
                    v = numpy_helper.to_array(v)
                attrs[a.name] = v
            ins = tuple(node.input)
            missing = [x for x in ins if x and self.value(x) is None]
            if missing:
                raise ValueError(f"{self.source}: node '{label}' reads undefined '{missing[0]}'")
            view = Node(
                op=op,
                attrs=attrs,
                opset=self.opset,
                inputs=ins,
                outputs=tuple(node.output),
                shapes=tuple(tuple(self.value(x).shape) if x else None for x in ins),
                values=tuple(self.known.get(x) if x else None for x in ins),
            )
            try:
                fn, arg_idx = CONVERTERS[op](view)
                self._place(fn, tuple(ins[i] for i in arg_idx), tuple(node.output))
            except Unsupported as e:
                raise UnsupportedOnnxOp(self.source, op, label, str(e)) from None
            except (RuntimeError, ValueError, TypeError, IndexError) as e:
                reason = f"torch could not run it: {' '.join(str(e).split())[:160]}"
                raise UnsupportedOnnxOp(self.source, op, label, reason) from None

    def _place(self, fn: Any, args: tuple[str, ...], outs: tuple[str, ...]) -> None:
        """Fold the node on the host when all its tensor inputs are known, else record it
        (its outputs' shapes from :attr:`shapes` where kept, else from a run on meta)."""
        on_host = all(a in self.known for a in args)
        kept = None if on_host else self.shapes.results(outs)
        if kept is not None:
            multi, metas = kept
            self.meta.update(metas)
            self.steps.append((fn, args, outs, multi))
            return
        with torch.no_grad():
            if on_host:
                result = fn(*[self.known[a] for a in args])
            else:
                result = fn(
                    *[self.meta[a] if a in self.meta else self.known[a].to("meta") for a in args]
                )
        multi = isinstance(result, tuple | list)
        results = list(result) if multi else [result]
        wanted = [(i, o) for i, o in enumerate(outs) if o]
        if any(i >= len(results) for i, _ in wanted):
            raise Unsupported(f"{len(outs)} outputs (only {len(results)} are computed)")
        for i, o in wanted:
            (self.known if on_host else self.meta)[o] = results[i]
        if not on_host:
            self.steps.append((fn, args, outs, multi))
            self.shapes.record(outs, multi, {o: results[i] for i, o in wanted})

    def compile(
        self, input_names: Sequence[str], output_names: Sequence[str]
    ) -> tuple[list[Tensor], list[_Step], tuple[int, ...], tuple[int, ...], int]:
        """Drop dead steps, give every value a register slot (constants first)."""
        needed = set(output_names)
        live = []
        for fn, args, outs, multi in reversed(self.steps):
            if needed.intersection(outs):
                live.append((fn, args, outs, multi))
                needed.update(args)
        live.reverse()
        const_names = [n for n in dict.fromkeys(a for s in live for a in s[1]) if n in self.known]
        const_names += [n for n in output_names if n in self.known and n not in const_names]
        slots = {n: i for i, n in enumerate(const_names)}
        for name in [*input_names, *(o for s in live for o in s[2] if o)]:
            slots.setdefault(name, len(slots))
        last_read: dict[str, int] = {}
        for k, (_, args, _, _) in enumerate(live):
            for a in args:
                last_read[a] = k
        keep = set(const_names) | set(output_names)
        steps = []
        for k, (fn, args, outs, multi) in enumerate(live):
            used = tuple((i, slots[o]) for i, o in enumerate(outs) if o and o in needed)
            dead = {a for a in args if last_read[a] == k and a not in keep}
            steps.append(
                _Step(fn, tuple(slots[a] for a in args), used, multi, tuple(slots[a] for a in dead))
            )
        return (
            [self.known[n] for n in const_names],
            steps,
            tuple(slots[n] for n in input_names),
            tuple(slots[n] for n in output_names),
            len(slots),
        )
