"""kiln as PyTorch's compiler: `torch.compile(model, backend="kiln")`.

`import kiln.torch` registers the backend (python.md, "PyTorch"). It takes
the ATen graph of an inference forward (AOT autograd, no decompositions
beyond PyTorch's own), hands kiln the largest acyclic subgraphs it can
express (torch.fx's capability-based partitioner) and runs the rest with
PyTorch: an op kiln does not support is never an error. Each kiln subgraph
is one kiln graph whose inputs are the tensors crossing the cut
(parameters included, so identical layers share one graph and its
kernels). Static shapes give integer kiln graphs, a new shape new graphs;
dynamo's dynamic shapes give symbolic kiln graphs, compiled once for every
size where kiln's one compile serves them and per size (a bounded number)
where it does not (KilnSubgraph, _torch_sizes.py). Numbers PyTorch holds as
0-dim CPU tensors (the Python floats dynamo passes as tensors under dynamic
shapes, a constant made on the CPU in a CUDA forward) are constants of the
kiln graph, whose graphs are keyed by their values (_host_value). Tensors
whose values are known before the graph runs (those the forward makes from
numbers, factories, ops on them: _fold_constants) are constants too, on
whatever device PyTorch holds them: kiln builds them from numbers. What
PyTorch would compute from constants alone on every forward (a decoder's
masks and positions, made from arange) it computes once while the backend
compiles, and the graph holds the values (_hold_constants).

The conversion table (CONVERTERS) is generated from kiln's op table for the
ops PyTorch spells the same way, plus the hand-written entries below for
views, anchors, norms and compositions. `explain(model, *inputs)` reports
the kiln subgraphs and every ATen op left to PyTorch with its reason.
"""
from __future__ import annotations

import contextlib
import json
import math
import operator
import threading
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupport

from . import BindingError, Graph, GraphBuilder, GraphError, KilnError, OP_TABLE, compile as kiln_compile
from . import _torch_per_size as per_size
from . import _torch_sizes as sizes
from ._arrays import _contiguous
from ._graph import Tensor as _KilnTensor
from ._kiln import per_size_reason

aten = torch.ops.aten
prims = torch.ops.prims

__all__ = ["backend", "explain", "Report", "CONVERTERS"]

_KILN_DTYPE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.bool: "bool"}
_TORCH_DTYPE = {k: t for t, k in _KILN_DTYPE.items()}


class Unsupported(Exception):
    """This node stays in PyTorch; the message says why."""


# ---- conversion: one ATen node to kiln ops -----------------------------------

class Conversion:
    """Builds one kiln graph from the nodes of one partition."""

    def __init__(self, name: str):
        self.b = GraphBuilder(name)
        self.env: Dict[torch.fx.Node, Any] = {}

    def arg(self, a: Any) -> Any:
        """A node argument as a kiln operand (tensor or number); a constant (_fold_constants) as kiln
        ops that make it."""
        if isinstance(a, torch.fx.Node):
            if a not in self.env:
                raise Unsupported(f"'{a.name}' is not a tensor kiln holds")
            if isinstance(self.env[a], torch.Tensor):
                return self.constant(self.env[a])
            return self.env[a]
        if isinstance(a, bool):
            return float(a)
        if isinstance(a, (int, float)):
            if not math.isfinite(a):
                raise Unsupported(f"a constant {a} (kiln's constants are finite)")
            return float(a)
        raise Unsupported(f"an argument of type {type(a).__name__}")

    def known(self, a: Any) -> Optional[torch.Tensor]:
        """The value of a node known at conversion (a constant: _fold_constants), or None."""
        v = self.env.get(a) if isinstance(a, torch.fx.Node) else None
        return v if isinstance(v, torch.Tensor) else None

    def constant(self, value: torch.Tensor) -> Any:
        """A constant tensor as kiln builds one: a number where it has no dimension (as the
        backend's other constants), else each run of equal values (in row-major order) a number
        expanded, the runs concatenated and reshaped. Integers are read as floats where every
        kiln dtype holds them exactly (PyTorch rounds an integer operand to the op's dtype)."""
        with _real_tensors():
            return self._constant(value)

    def _constant(self, value: torch.Tensor) -> Any:
        if value.dtype not in _KILN_DTYPE:
            if value.dtype.is_floating_point and value.dim() > 0:
                raise Unsupported(f"a {value.dtype} constant (kiln: float32, float16, bfloat16, bool)")
            if not value.dtype.is_floating_point and not all(
                    torch.equal(value.to(d).to(value.dtype), value) for d in (torch.float16, torch.bfloat16)):
                raise Unsupported("an integer constant beyond what float16 and bfloat16 hold exactly")
        if value.dim() == 0:
            return self.arg(value.item())
        dtype = _KILN_DTYPE.get(value.dtype, "f32")
        runs: List[List[Any]] = []
        for v in value.flatten().tolist():
            if runs and runs[-1][0] == v:
                runs[-1][1] += 1
            else:
                runs.append([v, 1])
        if len(runs) > _MOST_PARTS:
            raise Unsupported(f"a constant of {len(runs)} runs of equal values "
                              f"(kiln builds one of at most {_MOST_PARTS})")
        parts = [filled(self, self.arg(v), [count], dtype) for v, count in runs]
        flat = parts[0] if len(parts) == 1 else concat(self, parts, 0, dtype)
        return view(self, "reshape", flat, shape=sizes.sizes(value.shape))


def val(n: torch.fx.Node) -> torch.Tensor:
    v = n.meta.get("val")
    if not isinstance(v, torch.Tensor):
        raise Unsupported("no tensor metadata")
    return v


def dtype_of(n: torch.fx.Node) -> str:
    d = val(n).dtype
    if d not in _KILN_DTYPE:
        raise Unsupported(f"dtype {d} (kiln: float32, float16, bfloat16, bool)")
    return _KILN_DTYPE[d]


def shape_of(n: torch.fx.Node) -> List[int]:
    return sizes.sizes(val(n).shape)


Converter = Callable[[Conversion, torch.fx.Node], Any]
CONVERTERS: Dict[Any, Converter] = {}


def converts(*targets):
    def register(fn: Converter) -> Converter:
        for t in targets:
            CONVERTERS[t] = fn
        return fn
    return register


def op(c: Conversion, n: torch.fx.Node, name: str, inputs: Sequence[Any], **attrs) -> Any:
    """A kiln op with the node's result dtype (each op rounds as eager PyTorch does)."""
    return c.b.op(name, list(inputs), {k: v for k, v in attrs.items() if v is not None}, dtype=dtype_of(n))


def view(c: Conversion, name: str, x: Any, **attrs) -> Any:
    return c.b.op(name, [x], attrs)


# The most parts a converter assembles with one concat (runs of a constant, of an index).
_MOST_PARTS = 256


def concat(c: Conversion, parts: List[Any], axis: int, dtype: str) -> Any:
    """parts (at least 2) concatenated, in `dtype` (bool parts give bool: only a comparison or a cast names it)."""
    return c.b.op("concat", parts, {"axis": axis}, **({} if dtype == "bool" else {"dtype": dtype}))


def filled(c: Conversion, value: Any, shape: List[int], dtype: str) -> Any:
    """A tensor of `shape` and kiln dtype `dtype` holding `value` (a number, or a 0-dim kiln tensor)
    as `dtype` holds it: the value cast, then expanded (a view, no data)."""
    if isinstance(value, float) and dtype != "bool":
        value = _rounded(value, _TORCH_DTYPE[dtype])
    one = c.b.op("cast", [value], dtype=dtype)
    return view(c, "expand", one, shape=list(shape)) if shape else one


def _overloads(name: str) -> List[Any]:
    packet = getattr(aten, name, None)
    if packet is None:
        return []
    return [getattr(packet, o) for o in ("default", "Tensor", "Scalar") if o in packet.overloads()]


# Generated from kiln's op table: pointwise ops PyTorch spells as kiln does.
_HAND_WRITTEN = {"gelu", "leaky_relu", "softplus", "clamp", "cast", "add", "sub", "where", "identity", "square"}
def _one_to_one(kiln_op: str, arity: int) -> Converter:
    return lambda c, n: op(c, n, kiln_op, [c.arg(a) for a in n.args[:arity]])


for _name, _family, _lo, _hi, _attrs in OP_TABLE:
    if _family not in ("unary", "binary", "compare") or _name in _HAND_WRITTEN:
        continue
    for _target in _overloads(_name):
        CONVERTERS[_target] = _one_to_one(_name, 1 if _family == "unary" else 2)
# PyTorch's names for catalogue ops
for _target, _kiln, _arity in ((aten.pow.Tensor_Scalar, "pow", 2), (aten.pow.Tensor_Tensor, "pow", 2),
                               (aten.pow.Scalar, "pow", 2), (aten.square.default, "square", 1)):
    CONVERTERS[_target] = _one_to_one(_kiln, _arity)


def _alpha(n: torch.fx.Node):
    """add, sub and rsub's alpha: keyword-only in the .Tensor overloads, the third argument in the .Scalar ones."""
    return n.args[2] if len(n.args) > 2 else n.kwargs.get("alpha", 1)


@converts(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def _add_sub(c, n):
    a, b = c.arg(n.args[0]), c.arg(n.args[1])
    alpha = _alpha(n)
    if alpha != 1:
        b = c.b.op("mul", [b, float(alpha)])
    return op(c, n, "add" if n.target in (aten.add.Tensor, aten.add.Scalar) else "sub", [a, b])


@converts(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(c, n):
    a, b = c.arg(n.args[0]), c.arg(n.args[1])
    alpha = _alpha(n)
    if alpha != 1:
        a = c.b.op("mul", [a, float(alpha)])
    return op(c, n, "sub", [b, a])


@converts(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(c, n):
    if n.kwargs.get("rounding_mode") is not None:
        raise Unsupported(f"division with rounding_mode={n.kwargs['rounding_mode']!r}")
    return op(c, n, "div", [c.arg(n.args[0]), c.arg(n.args[1])])


@converts(aten.gelu.default)
def _gelu(c, n):
    approximate = n.kwargs.get("approximate", "none")
    return op(c, n, "gelu_tanh" if approximate == "tanh" else "gelu", [c.arg(n.args[0])])


@converts(aten.leaky_relu.default)
def _leaky_relu(c, n):
    return op(c, n, "leaky_relu", [c.arg(n.args[0])], alpha=float(n.args[1]) if len(n.args) > 1 else 0.01)


@converts(aten.softplus.default)
def _softplus(c, n):
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (PyTorch's rule)."""
    beta = float(n.args[1]) if len(n.args) > 1 else float(n.kwargs.get("beta", 1.0))
    threshold = float(n.args[2]) if len(n.args) > 2 else float(n.kwargs.get("threshold", 20.0))
    x = c.arg(n.args[0])
    if beta == 1.0 and threshold == 20.0:
        return op(c, n, "softplus", [x])  # (past 20, x itself and softplus(x) are equal within f32 rounding)
    bx = x if beta == 1.0 else c.b.op("mul", [x, beta])
    soft = c.b.op("softplus", [bx]) if beta == 1.0 else c.b.op("div", [c.b.op("softplus", [bx]), beta])
    return op(c, n, "where", [c.b.op("gt", [bx, threshold]), x, soft])


@converts(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default)
def _clamp(c, n):
    args = list(n.args[1:]) + [None, None]
    if n.target == aten.clamp_max.default:
        lo, hi = None, args[0]
    elif n.target == aten.hardtanh.default:
        lo, hi = (args[0] if args[0] is not None else -1.0), (args[1] if args[1] is not None else 1.0)
    else:
        lo, hi = args[0], args[1]
        lo = n.kwargs.get("min", lo)
        hi = n.kwargs.get("max", hi)
    for v in (lo, hi):
        if v is not None and not isinstance(v, (int, float)):
            raise Unsupported("clamp by a tensor")
    return op(c, n, "clamp", [c.arg(n.args[0])], min=None if lo is None else float(lo), max=None if hi is None else float(hi))


# ATen's CUDA kernels compute hardsigmoid as clamp(x + 3, 0, 6) * (1.0f / 6.0f) and
# hardswish as x * clamp(x + 3, 0, 6) * (1.0f / 6.0f), in f32: a multiply, where
# a division by 6 is an IEEE division an element.
ONE_SIXTH_F32 = float(torch.tensor(1.0, dtype=torch.float32, device="cpu") / 6.0)  # 1.0f / 6.0f, as a Python float


@converts(aten.hardsigmoid.default, aten.hardswish.default)
def _hard(c, n):
    x = c.arg(n.args[0])
    relu6 = c.b.op("clamp", [c.b.op("add", [x, 3.0])], {"min": 0.0, "max": 6.0})
    if n.target == aten.hardswish.default:
        return op(c, n, "mul", [c.b.op("mul", [x, relu6]), ONE_SIXTH_F32])
    return op(c, n, "mul", [relu6, ONE_SIXTH_F32])


@converts(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(c, n):
    return op(c, n, "where", [c.arg(a) for a in n.args[:3]])


@converts(aten.masked_fill.Scalar)
def _masked_fill(c, n):
    return op(c, n, "where", [c.arg(n.args[1]), c.arg(n.args[2]), c.arg(n.args[0])])


@converts(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(c, n):
    source = val(n.args[0])
    target = val(n)
    x = c.arg(n.args[0])
    if isinstance(x, float):  # a host value (to any device): a constant of the target dtype
        return _rounded(x, target.dtype)
    if source.device != target.device:
        raise Unsupported(f"a copy from {source.device} to {target.device}")
    return x if source.dtype == target.dtype else c.b.op("cast", [x], dtype=dtype_of(n))


@converts(aten.scalar_tensor.default)
def _scalar_tensor(c, n):
    value = n.args[0]
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Unsupported(f"a scalar tensor of {value!r}")
    return float(value)  # a constant operand of the pointwise ops that read it


@converts(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def _identity(c, n):
    return c.arg(n.args[0])


# ---- views ----

@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.unsqueeze.default, aten.flatten.using_ints)
def _reshape(c, n):
    return view(c, "reshape", c.arg(n.args[0]), shape=shape_of(n))


@converts(aten.permute.default)
def _permute(c, n):
    return view(c, "transpose", c.arg(n.args[0]), perm=[int(p) for p in n.args[1]])


@converts(aten.t.default, aten.transpose.int, aten.numpy_T.default)
def _transpose(c, n):
    rank = len(shape_of(n))
    if rank < 2:
        return c.arg(n.args[0])
    perm = list(range(rank))
    d0, d1 = (n.args[1], n.args[2]) if n.target == aten.transpose.int else (rank - 2, rank - 1)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return view(c, "transpose", c.arg(n.args[0]), perm=perm)


@converts(aten.expand.default)
def _expand(c, n):
    return view(c, "expand", c.arg(n.args[0]), shape=shape_of(n))


def _from_the_end_of_a_symbolic_axis(x: torch.fx.Node, result: Any, dim: int, *positions: Any) -> bool:
    """Whether a slice or select of x's axis `dim` (giving `result`) starts at a position counted
    from the end of a symbolic size, keeping an integer extent (x[:, -1:] of [B, S, H]: from S - 1),
    a sum kiln's dim expressions do not spell (graph-format.md: products of symbols). PyTorch takes
    it: a view, no copy, which the kiln subgraph reading it is given dense (the LM head of a
    prefill: one compile for every length)."""
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor) or not sizes.is_symbolic(value.shape[dim]):
        return False
    if isinstance(result, torch.Tensor) and result.dim() == value.dim() and sizes.is_symbolic(result.shape[dim]):
        return False  # (x[:, :-1]: its extent, S - 1, is a sum too; kiln compiles it per size)
    for p in positions:
        p = p.meta.get("val") if isinstance(p, torch.fx.Node) else p
        if isinstance(p, torch.SymInt):
            if not sizes.is_product(p):
                return True
        elif isinstance(p, int) and p < 0:
            return True
    return False


def _bound_at_another_size(x: torch.fx.Node, dim: int, *positions: Any) -> Optional[str]:
    """The bound of a slice of x's axis `dim` that is a symbolic size other than the axis's own
    ("s27" of cache[:, :, :s27], a static cache of 103 or s98 positions), or None. kiln's one
    graph for every size takes no slice at a symbolic position (runtime/pipeline.cpp: its probe
    sizes may lie past the axis, where such a slice would clamp; within it by dynamo's guard,
    s27 < 103, a bound kiln's ranges do not carry to the probe). PyTorch takes the view: a kiln
    input read through its strides where they are integers (a prefill's k and v in a cache of
    fixed length, no copy), else given dense (a cache whose length is a symbol)."""
    value = x.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    axis = value.shape[dim]
    for p in positions:
        p = p.meta.get("val") if isinstance(p, torch.fx.Node) else p
        if isinstance(p, torch.SymInt) and not p.node.expr.is_number and \
                not (isinstance(axis, torch.SymInt) and p.node.expr == axis.node.expr):
            return str(p.node.expr)
    return None


@converts(aten.slice.Tensor)
def _slice(c, n):
    x = n.args[0]
    size = shape_of(x)
    dim = n.args[1] if len(n.args) > 1 else 0
    dim = dim % len(size)
    if _from_the_end_of_a_symbolic_axis(x, n.meta.get("val"), dim, *n.args[2:4]):
        raise Unsupported(f"a slice counted from the end of a symbolic size ({x.meta['val'].shape[dim]}): "
                          "PyTorch's view, given dense to the kiln subgraph reading it")
    other = _bound_at_another_size(x, dim, *n.args[2:4])
    if other is not None:
        raise Unsupported(f"a slice of an axis of {x.meta['val'].shape[dim]} at a symbolic size ({other}): PyTorch's "
                          "view, read by the kiln subgraph through its strides (given dense where they are symbolic)")
    start = sizes.size(n.args[2]) if len(n.args) > 2 and n.args[2] is not None else 0
    end = sizes.size(n.args[3]) if len(n.args) > 3 and n.args[3] is not None else size[dim]
    step = sizes.size(n.args[4]) if len(n.args) > 4 else 1
    start, end = max(min(start, size[dim]), -size[dim]), max(min(end, size[dim]), -size[dim])
    if shape_of(n)[dim] == size[dim] and step == 1:
        return c.arg(x)
    return view(c, "slice", c.arg(x), axis=dim, start=int(start), end=int(end), step=int(step))


@converts(aten.select.int)
def _select(c, n):
    size = shape_of(n.args[0])
    dim = n.args[1] % len(size)
    if _from_the_end_of_a_symbolic_axis(n.args[0], n.meta.get("val"), dim, n.args[2]):
        raise Unsupported(f"a select counted from the end of a symbolic size ({n.args[0].meta['val'].shape[dim]}): "
                          "PyTorch's view, given dense to the kiln subgraph reading it")
    index = sizes.size(n.args[2]) % size[dim]
    s = view(c, "slice", c.arg(n.args[0]), axis=dim, start=index, end=index + 1)
    return view(c, "reshape", s, shape=shape_of(n)) if shape_of(n) else view(c, "reshape", s, shape=[])


def _split_at(c, n, sizes, dim):
    x = c.arg(n.args[0])
    parts, start = [], 0
    for s in sizes:
        parts.append(view(c, "slice", x, axis=dim, start=start, end=start + s))
        start += s
    return parts


@converts(aten.split.Tensor, aten.split_with_sizes.default)
def _split(c, n):
    size = shape_of(n.args[0])
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(size)
    if n.target == aten.split.Tensor:
        step = sizes.size(n.args[1])
        parts = [min(step, size[dim] - s) for s in range(0, size[dim], step)]
    else:
        parts = sizes.sizes(n.args[1])
    return _split_at(c, n, parts, dim)


@converts(aten.unbind.int)
def _unbind(c, n):
    size = shape_of(n.args[0])
    dim = (n.args[1] if len(n.args) > 1 else 0) % len(size)
    rest = size[:dim] + size[dim + 1:]
    return [view(c, "reshape", p, shape=rest) for p in _split_at(c, n, [1] * size[dim], dim)]


@converts(aten.cat.default)
def _cat(c, n):
    tensors = [t for t in n.args[0] if sizes.numel(val(t)) > 0]
    dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % len(shape_of(n))
    if len(tensors) == 1:
        return c.arg(tensors[0])
    return c.b.op("concat", [c.arg(t) for t in tensors], {"axis": dim}, dtype=dtype_of(n))


# ---- slices put together: roll, padding, scatters into slices, constant indices ----

def _parts(c: Conversion, n: torch.fx.Node, parts: List[Any], axis: int) -> Any:
    """The parts (kiln tensors of the node's dtype, none empty) concatenated along `axis`."""
    return parts[0] if len(parts) == 1 else concat(c, parts, axis, dtype_of(n))


def _cut(c: Conversion, x: Any, axis: int, start: int, end: int) -> Any:
    return view(c, "slice", x, axis=axis, start=int(start), end=int(end))


@converts(aten.roll.default)
def _roll(c, n):
    """torch.roll: along each dimension the last `shift` elements first (a shift taken modulo the
    size, negative ones included); with no dimensions, the flattened tensor rolled, reshaped back."""
    shape = shape_of(n.args[0])
    shifts = sizes.sizes(n.args[1])
    dims = list(n.args[2]) if len(n.args) > 2 else list(n.kwargs.get("dims", []))
    x = c.arg(n.args[0])
    if not dims:
        flat = view(c, "reshape", x, shape=[sizes.numel(val(n.args[0]))])
        return view(c, "reshape", _roll_axis(c, n, flat, shifts[0], 0, sizes.numel(val(n.args[0]))), shape=shape)
    for shift, dim in zip(shifts, dims):
        x = _roll_axis(c, n, x, shift, dim % len(shape), shape[dim])
    return x


def _roll_axis(c, n, x, shift, axis, size):
    s = shift % size
    return x if s == 0 else _parts(c, n, [_cut(c, x, axis, size - s, size), _cut(c, x, axis, 0, size - s)], axis)


@converts(aten.constant_pad_nd.default)
def _constant_pad(c, n):
    """F.pad's constant mode: pad[2i], pad[2i+1] before and after dimension -1-i; a negative pad
    cuts elements off that side instead."""
    pad = sizes.sizes(n.args[1])
    value = n.args[2] if len(n.args) > 2 else n.kwargs.get("value", 0)
    shape = shape_of(n.args[0])
    x = c.arg(n.args[0])
    for i in range(len(pad) // 2):
        axis, before, after = len(shape) - 1 - i, pad[2 * i], pad[2 * i + 1]
        if before < 0 or after < 0:
            x = _cut(c, x, axis, max(-before, 0), shape[axis] - max(-after, 0))
            shape[axis] -= max(-before, 0) + max(-after, 0)
        pads = [filled(c, c.arg(value), shape[:axis] + [count] + shape[axis + 1:], dtype_of(n)) if count > 0 else None
                for count in (before, after)]
        x = _parts(c, n, [p for p in (pads[0], x, pads[1]) if p is not None], axis)
        shape[axis] += max(before, 0) + max(after, 0)
    return x


def _slice_bounds(size: int, start: Any, end: Any) -> Tuple[int, int]:
    """Python's slice bounds as ATen's slice takes them: None for the ends, negative counts from the
    end, then clamped to [0, size] (end at least start)."""
    start = 0 if start is None else sizes.size(start)
    end = size if end is None else sizes.size(end)
    start, end = (start + size if start < 0 else start), (end + size if end < 0 else end)
    start, end = min(max(start, 0), size), min(max(end, 0), size)
    return start, max(end, start)


@converts(aten.slice_scatter.default, aten.select_scatter.default)
def _scatter(c, n):
    """base with src in its slice [start:end:step] along dim (select_scatter: at one index): the
    slices of base around it and src, concatenated. With a step, the elements between src's are
    base's: each of src's elements but the last begins a window of `step` (a reshape), the last
    stands alone."""
    base, src = n.args[0], n.args[1]
    shape = shape_of(base)
    dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % len(shape)
    if n.target == aten.select_scatter.default:
        start, step = sizes.size(n.args[3]) % shape[dim], 1
        source = view(c, "reshape", c.arg(src), shape=shape[:dim] + [1] + shape[dim + 1:])
        count = 1
    else:
        a = list(n.args) + [None] * 6
        step = sizes.size(a[5] if a[5] is not None else n.kwargs.get("step", 1))
        start, _ = _slice_bounds(shape[dim], a[3] if len(n.args) > 3 else n.kwargs.get("start"),
                                 a[4] if len(n.args) > 4 else n.kwargs.get("end"))
        count = shape_of(src)[dim]
        if count == 0:
            return c.arg(base)
        source = c.arg(src)
    x = c.arg(base)
    parts = [_cut(c, x, dim, 0, start)] if start > 0 else []
    if step > 1 and count > 1:  # the windows [src[j], base[start + j*step + 1 : start + (j+1)*step]]
        windows = shape[:dim] + [count - 1, step] + shape[dim + 1:]
        between = _cut(c, view(c, "reshape", _cut(c, x, dim, start, start + (count - 1) * step), shape=windows),
                       dim + 1, 1, step)
        heads = view(c, "reshape", _cut(c, source, dim, 0, count - 1),
                     shape=shape[:dim] + [count - 1, 1] + shape[dim + 1:])
        together = concat(c, [heads, between], dim + 1, dtype_of(n))
        parts += [view(c, "reshape", together, shape=shape[:dim] + [(count - 1) * step] + shape[dim + 1:]),
                  _cut(c, source, dim, count - 1, count)]
        end = start + (count - 1) * step + 1
    else:
        parts.append(source)
        end = start + count
    if end < shape[dim]:
        parts.append(_cut(c, x, dim, end, shape[dim]))
    return _parts(c, n, parts, dim)


@converts(aten.copy.default)
def _copy(c, n):
    """The functional copy (x[...] = y on a copy): src broadcast to self's shape, in self's dtype."""
    src = c.arg(n.args[1])
    if isinstance(src, float):
        return filled(c, src, shape_of(n), dtype_of(n))
    return view(c, "expand", c.b.op("cast", [src], dtype=dtype_of(n)), shape=shape_of(n))


# Tensors of one value: target -> its value (a number, or a node of a 0-dim tensor) from the node.
_FILLED = {
    aten.fill.Scalar: lambda n: n.args[1], aten.fill.Tensor: lambda n: n.args[1],
    aten.full.default: lambda n: n.args[1], aten.full_like.default: lambda n: n.args[1],
    aten.new_full.default: lambda n: n.args[2],
    aten.zeros.default: lambda n: 0.0, aten.zeros_like.default: lambda n: 0.0, aten.new_zeros.default: lambda n: 0.0,
    aten.ones.default: lambda n: 1.0, aten.ones_like.default: lambda n: 1.0, aten.new_ones.default: lambda n: 1.0,
}


@converts(*_FILLED)
def _filled(c, n):
    return filled(c, c.arg(_FILLED[n.target](n)), shape_of(n), dtype_of(n))


def _indexed_dim(n: torch.fx.Node) -> Tuple[int, torch.fx.Node]:
    """x[..., index, ...]: the dimension indexed and the index."""
    given = [(d, i) for d, i in enumerate(n.args[1]) if i is not None]
    if len(given) != 1:
        raise Unsupported("indexing by several tensors")
    return given[0]


# Indexing along one dimension: target -> (the dimension, the index node) of the node.
_INDEXED = {aten.index.Tensor: _indexed_dim, aten.index_select.default: lambda n: (n.args[1], n.args[2])}


@converts(*_INDEXED)
def _index(c, n):
    """x[..., index, ...] (index_select) by an index tensor whose values are known at conversion (a
    constant: a list in the model's code): its positions along that dimension, each run of consecutive
    ones a slice, concatenated and reshaped to the result's shape. A bool index: its true positions.
    Several index tensors: _index_by_aranges."""
    if n.target is aten.index.Tensor and sum(i is not None for i in n.args[1]) > 1:
        return _index_by_aranges(c, n)
    dim, index = _INDEXED[n.target](n)
    dim = dim % len(shape_of(n.args[0]))
    positions = c.known(index)
    if positions is None:
        raise Unsupported(_READ_AT_CONVERSION[n.target][1])
    size = shape_of(n.args[0])[dim]
    if positions.dtype == torch.bool and positions.dim() != 1:
        raise Unsupported("indexing by a bool tensor of several dimensions")
    with _real_tensors():
        at = (positions.nonzero() if positions.dtype == torch.bool else positions).flatten().tolist()
    if any(not -size <= p < size for p in at):
        raise Unsupported(f"an index out of range for a dimension of {size}")
    runs: List[List[int]] = []
    for p in (p % size for p in at):
        if runs and runs[-1][1] == p:
            runs[-1][1] += 1
        else:
            runs.append([p, p + 1])
    if len(runs) > _MOST_PARTS:
        raise Unsupported(f"an index of {len(runs)} runs of consecutive positions (kiln takes at most {_MOST_PARTS})")
    x = c.arg(n.args[0])
    return view(c, "reshape", _parts(c, n, [_cut(c, x, dim, a, b) for a, b in runs], dim), shape=shape_of(n))


def _index_by_aranges(c, n):
    """x[i0, i1, ...] by index tensors over x's leading dimensions, each known at conversion and an
    arange over its dimension of x laid along one axis of the indices' broadcast shape, those axes
    in x's order: x itself, reshaped to the result's shape. (transformers' mask functions make a
    [B, 1, 1, S] padding mask from the [B, S] attention mask so, indexed by arange(B)[:, None, None,
    None] and arange(S)[None, None, None, :]: left to PyTorch, an indexing kernel wrote the [B, 1,
    S, S] mask that each attention kernel then read.)"""
    source = shape_of(n.args[0])
    indices = list(n.args[1])
    if None in indices:
        raise Unsupported("indexing by several tensors with a dimension between them taken whole")
    known = [c.known(i) for i in indices]
    if any(k is None for k in known):
        raise Unsupported(_NO_GATHER)
    if any(k.dtype == torch.bool or k.dtype.is_floating_point for k in known):
        raise Unsupported("indexing by several tensors, one of them a bool mask (kiln has no gather)")
    with _real_tensors():
        broadcast = list(torch.broadcast_shapes(*(k.shape for k in known)))
        last_axis = -1
        for dim, k in enumerate(known):
            size = source[dim]
            padded = k.reshape((1,) * (len(broadcast) - k.dim()) + tuple(k.shape))
            along = [a for a, s in enumerate(padded.shape) if s != 1]
            if size == 1 and not along and int(padded.flatten()[0]) in (0, -1):
                continue
            if (len(along) != 1 or padded.shape[along[0]] != size or along[0] <= last_axis
                    or not torch.equal(padded.flatten().cpu(), torch.arange(size, dtype=padded.dtype, device="cpu"))):
                raise Unsupported("indexing by several tensors that are not each an arange over its own dimension, "
                                  "in order (kiln has no gather)")
            last_axis = along[0]
    return view(c, "reshape", c.arg(n.args[0]), shape=shape_of(n))


@converts(aten.bitwise_and.Tensor, aten.logical_and.default, aten.bitwise_or.Tensor, aten.logical_or.default)
def _bool_and_or(c, n):
    """a & b and a | b of bool tensors (masks combined: transformers' padding mask and an attention's
    own). kiln reads a bool as where's condition or by cast (graph-format.md rule 3): the product
    (and) or the maximum (or) of the two as 0 and 1, compared with 0. An operand known at conversion
    and uniform gives the other operand expanded (x & true, x | false) or that constant; two known
    operands, the constant itself (known to the converters downstream)."""
    if not all(isinstance(a, torch.fx.Node) and dtype_of(a) == "bool" for a in n.args[:2]):
        raise Unsupported(f"{n.target} of tensors other than two bool ones")
    conjunction = n.target in _CONJUNCTIONS
    known = [c.known(x) for x in n.args[:2]]
    with _real_tensors():
        if None not in known:  # a constant, known downstream too
            return known[0] & known[1] if conjunction else known[0] | known[1]
        for k, other in ((known[0], n.args[1]), (known[1], n.args[0])):
            if k is not None and _uniform(k):  # (transformers' bidirectional mask: all true)
                if bool(k.flatten()[0]) == conjunction:  # x & true, x | false: x
                    return view(c, "expand", c.arg(other), shape=shape_of(n))
                return filled(c, 1.0 if not conjunction else 0.0, shape_of(n), "bool")
    a, b = (c.b.op("cast", [c.arg(x)], dtype="f32") for x in n.args[:2])
    both = c.b.op("mul" if conjunction else "maximum", [a, b])
    return c.b.op("ne", [both, 0.0])


_CONJUNCTIONS = {aten.bitwise_and.Tensor, aten.logical_and.default}


@converts(aten.bitwise_not.default, aten.logical_not.default)
def _bool_not(c, n):
    """~a of a bool tensor (a mask inverted for masked_fill): a as 0 and 1, equal to 0."""
    if not isinstance(n.args[0], torch.fx.Node) or dtype_of(n.args[0]) != "bool":
        raise Unsupported(f"{n.target} of a tensor other than a bool one")
    known = c.known(n.args[0])
    if known is not None:
        with _real_tensors():
            return ~known
    return c.b.op("eq", [c.b.op("cast", [c.arg(n.args[0])], dtype="f32"), 0.0])


def _uniform(value: torch.Tensor) -> bool:
    """Whether every element of a (non-empty) tensor is the same."""
    with _real_tensors():
        return value.numel() > 0 and bool((value == value.flatten()[0]).all())


@converts(aten.as_strided.default)
def _as_strided(c, n):
    """as_strided with the input's own sizes, strides (of dimensions longer than 1) and offset: the input."""
    x = val(n.args[0])
    shape, strides = sizes.sizes(n.args[1]), sizes.sizes(n.args[2])
    offset = n.args[3] if len(n.args) > 3 else n.kwargs.get("storage_offset")
    same = shape == sizes.sizes(x.shape) and all(
        s == t for s, t, d in zip(strides, sizes.sizes(x.stride()), shape) if d != 1)
    if not same or (offset is not None and sizes.size(offset) != sizes.size(x.storage_offset())):
        raise Unsupported("as_strided to a layout other than its input's")
    return c.arg(n.args[0])


@converts(operator.getitem)
def _getitem(c, n):
    source = c.env.get(n.args[0])
    if not isinstance(source, (list, tuple)):
        raise Unsupported("getitem of a value kiln does not hold")
    item = source[n.args[1]]
    if item is None:
        raise Unsupported(f"output {n.args[1]} of {n.args[0].target} (kiln computes only the first)")
    return item


# ---- anchors ----

def _precision(kind: str, *operands: torch.fx.Node) -> Dict[str, str]:
    """The anchor's precision as PyTorch computes it on CUDA: f32 operands of a
    matmul on TF32 tensor cores where torch.backends.cuda.matmul.allow_tf32
    says so (torch.set_float32_matmul_precision("high")), of a conv where
    torch.backends.cudnn.allow_tf32 does (PyTorch's default); else full f32,
    as on the CPU. Read when the graph is converted, as Inductor does."""
    if not all(val(x).dtype == torch.float32 and val(x).device.type == "cuda" for x in operands):
        return {}
    allowed = torch.backends.cuda.matmul.allow_tf32 if kind == "matmul" else torch.backends.cudnn.allow_tf32
    return {"precision": "tf32"} if allowed else {}


@converts(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(c, n):
    return c.b.op("matmul", [c.arg(n.args[0]), c.arg(n.args[1])], _precision("matmul", n.args[0], n.args[1]),
                  dtype=dtype_of(n))


@converts(aten.addmm.default)
def _addmm(c, n):
    """beta * input + alpha * (mat1 @ mat2). Where beta (alpha) is 0, PyTorch
    leaves that term out, NaN and inf in its operands included: so does kiln."""
    beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
    if beta == 0 and alpha == 0:
        raise Unsupported("addmm with beta=0 and alpha=0 (a tensor of zeros)")
    if alpha != 0:
        m = c.b.op("matmul", [c.arg(n.args[1]), c.arg(n.args[2])], _precision("matmul", n.args[1], n.args[2]))
        if alpha != 1:
            m = c.b.op("mul", [m, float(alpha)])
        if beta == 0:
            return op(c, n, "identity", [m])
    bias = c.arg(n.args[0])
    if beta != 1:
        bias = c.b.op("mul", [bias, float(beta)])
    if alpha == 0:
        return op(c, n, "identity", [view(c, "expand", bias, shape=shape_of(n))])
    return op(c, n, "add", [m, bias])


@converts(aten.linear.default)
def _linear(c, n):
    w = view(c, "transpose", c.arg(n.args[1]), perm=[1, 0])
    m = c.b.op("matmul", [c.arg(n.args[0]), w], _precision("matmul", n.args[0], n.args[1]))
    if len(n.args) > 2 and n.args[2] is not None:
        return op(c, n, "add", [m, c.arg(n.args[2])])
    return op(c, n, "identity", [m])


@converts(aten.convolution.default)
def _convolution(c, n):
    x, w, bias, stride, padding, dilation, transposed, _output_padding, groups = n.args
    if transposed:
        raise Unsupported("transposed convolution")
    if len(shape_of(x)) != 4:
        raise Unsupported(f"a {len(shape_of(x)) - 2}-d convolution (kiln: 2-d)")
    if len(set(padding)) > 2 or any(p < 0 for p in padding):
        raise Unsupported("asymmetric padding")
    attrs = {"stride": list(stride), "padding": list(padding), "dilation": list(dilation), "groups": int(groups),
             **_precision("conv2d", x, w)}
    if sizes.contiguous(*([sizes.sizes(s)[d] for d in (0, 2, 3, 1)] for s in (val(x).shape, val(x).stride()))):
        # Channels-last: NHWC in memory. Read it as NHWC (a view), and the weights as [K, R, S, C].
        xn = view(c, "transpose", c.arg(x), perm=[0, 2, 3, 1])
        wn = view(c, "transpose", c.arg(w), perm=[0, 2, 3, 1])
        y = c.b.op("conv2d", [xn, wn], dict(attrs, layout="NHWC"))
        if bias is not None:
            y = c.b.op("add", [y, c.arg(bias)])
        y = c.b.op("identity", [y], dtype=dtype_of(n))
        return view(c, "transpose", y, perm=[0, 3, 1, 2])
    y = c.b.op("conv2d", [c.arg(x), c.arg(w)], dict(attrs, layout="NCHW"))
    if bias is not None:
        y = c.b.op("add", [y, view(c, "reshape", c.arg(bias), shape=[shape_of(bias)[0], 1, 1])])
    return op(c, n, "identity", [y])


def _sdpa(c, n, q, k, v, mask, causal, scale, dropout):
    if dropout:
        raise Unsupported("attention with dropout")
    sq, skv = shape_of(q)[-2], shape_of(k)[-2]
    if causal and sq != skv:
        raise Unsupported("causal attention with Sq != Skv (PyTorch aligns the mask top-left, kiln bottom-right)")
    if len(shape_of(q)) != 4:
        raise Unsupported("attention on other than [B, H, S, D] tensors")
    inputs = [c.arg(q), c.arg(k), c.arg(v)] + ([c.arg(mask)] if mask is not None else [])
    out = c.b.op("sdpa", inputs, {"causal": bool(causal), "scale": None if scale is None else float(scale)},
                 dtype=dtype_of(q))
    return [out] + [None] * 8


@converts(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(c, n):
    a = list(n.args) + [None] * 8
    return _sdpa(c, n, a[0], a[1], a[2], n.kwargs.get("attn_mask", a[5]), n.kwargs.get("is_causal", a[4] or False),
                 n.kwargs.get("scale"), n.kwargs.get("dropout_p", a[3] or 0.0))


@converts(aten._scaled_dot_product_flash_attention.default)
def _sdpa_flash(c, n):
    a = list(n.args) + [None] * 8
    return _sdpa(c, n, a[0], a[1], a[2], None, n.kwargs.get("is_causal", a[4] or False), n.kwargs.get("scale"),
                 n.kwargs.get("dropout_p", a[3] or 0.0))


@converts(aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default)
def _sdpa_bias(c, n):
    a = list(n.args) + [None] * 8
    return _sdpa(c, n, a[0], a[1], a[2], a[3], n.kwargs.get("is_causal", a[6] or False), n.kwargs.get("scale"),
                 n.kwargs.get("dropout_p", a[5] or 0.0))


@converts(aten.scaled_dot_product_attention.default)
def _sdpa_composite(c, n):
    a = list(n.args) + [None] * 8
    if n.kwargs.get("enable_gqa"):
        raise Unsupported("enable_gqa (write GQA with expand or repeat_interleave)")
    out = _sdpa(c, n, a[0], a[1], a[2], n.kwargs.get("attn_mask", a[3]), n.kwargs.get("is_causal", a[5] or False),
                n.kwargs.get("scale"), n.kwargs.get("dropout_p", a[4] or 0.0))
    return out[0]


# ---- norms and reductions ----

@converts(aten._softmax.default, aten._log_softmax.default)
def _softmax(c, n):
    name = "softmax" if n.target == aten._softmax.default else "log_softmax"
    return op(c, n, name, [c.arg(n.args[0])], axis=int(n.args[1]))


# Below every finite f32: reduce_max(x) < this only where the whole line is -inf (and not NaN:
# kiln's max, like PyTorch's, propagates NaN).
_BELOW_EVERY_FINITE_F32 = -3.4028234663852886e38


@converts(aten._safe_softmax.default)
def _safe_softmax(c, n):
    """softmax, except that a line of -inf only (a query that sees no key) gives zeros, as
    PyTorch's math attention writes it: softmax written out, one pass of reductions over each
    row (max, then sum), the line's max also telling whether it is all -inf."""
    x, axis = c.arg(n.args[0]), int(n.args[1])
    line_max = c.b.op("reduce_max", [x], {"axes": [axis], "keepdims": True})
    e = c.b.op("exp", [c.b.op("sub", [x, line_max])])
    p = c.b.op("div", [e, c.b.op("reduce_sum", [e], {"axes": [axis], "keepdims": True})])
    all_minus_inf = c.b.op("lt", [line_max, _BELOW_EVERY_FINITE_F32])
    return op(c, n, "where", [all_minus_inf, 0.0, p])  # in the node's dtype (`dtype=` included)


@converts(aten.native_layer_norm.default)
def _layer_norm(c, n):
    x, normalized, w, b, eps = n.args
    inputs = [c.arg(x)] + ([c.arg(w)] if w is not None else [])
    if b is not None:
        if w is None:
            raise Unsupported("layer_norm with a bias and no weight")
        inputs.append(c.arg(b))
    axis = len(shape_of(x)) - len(normalized)
    y = c.b.op("layer_norm", inputs, {"axis": axis, "eps": float(eps)}, dtype=_KILN_DTYPE[val(x).dtype])
    read = {u.args[1]: u for u in n.users if u.target is operator.getitem and u.args[1] in (1, 2)}
    if not read:
        return [y, None, None]
    # mean and 1/sqrt(var + eps) over the normalised axes, as PyTorch saves them (in f32 for narrow inputs)
    axes = list(range(axis, len(shape_of(x))))
    xs = c.arg(x)
    mean = c.b.op("reduce_mean", [xs], {"axes": axes, "keepdims": True}, dtype="f32")
    var = c.b.op("reduce_mean", [c.b.op("square", [c.b.op("sub", [xs, mean], dtype="f32")], dtype="f32")],
                 {"axes": axes, "keepdims": True}, dtype="f32")
    rstd = c.b.op("rsqrt", [c.b.op("add", [var, float(eps)], dtype="f32")], dtype="f32")
    stats = [None, None]
    for index, value in ((1, mean), (2, rstd)):
        if index in read:
            stats[index - 1] = c.b.op("reshape", [c.b.op("identity", [value], dtype=dtype_of(read[index]))],
                                      {"shape": shape_of(read[index])})
    return [y] + stats


@converts(aten._native_batch_norm_legit_no_training.default)
def _batch_norm(c, n):
    x, w, b, mean, var, _momentum, eps = n.args
    inputs = [c.arg(x), c.arg(mean), c.arg(var)] + ([c.arg(w)] if w is not None else [])
    if b is not None:
        if w is None:
            raise Unsupported("batch_norm with a bias and no weight")
        inputs.append(c.arg(b))
    y = c.b.op("batch_norm", inputs, {"axis": 1, "eps": float(eps)}, dtype=_KILN_DTYPE[val(x).dtype])
    # What CUDA saves for the backward (the CPU saves nothing: empty outputs): the running mean and
    # 1/sqrt(running var + eps), in f32. An eval-mode backward reads the running statistics, not these.
    saved = [None, None]
    for u in n.users:
        if u.target is operator.getitem and u.args[1] in (1, 2) and not _is_empty(u):
            value = c.arg(mean) if u.args[1] == 1 else c.b.op("rsqrt", [c.b.op("add", [c.arg(var), float(eps)], dtype="f32")],
                                                              dtype="f32")
            saved[u.args[1] - 1] = c.b.op("reshape", [c.b.op("identity", [value], dtype=dtype_of(u))], {"shape": shape_of(u)})
    return [y] + saved


@converts(aten.native_group_norm.default)
def _group_norm(c, n):
    x, w, b, _n, _c, _hw, groups, eps = n.args
    inputs = [c.arg(x)] + ([c.arg(w)] if w is not None else [])
    if b is not None:
        if w is None:
            raise Unsupported("group_norm with a bias and no weight")
        inputs.append(c.arg(b))
    y = c.b.op("group_norm", inputs, {"groups": int(groups), "axis": 1, "eps": float(eps)}, dtype=_KILN_DTYPE[val(x).dtype])
    return [y, None, None]


@converts(aten.mean.dim, aten.sum.dim_IntList, aten.amax.default, aten.amin.default, aten.mean.default, aten.sum.default)
def _reduce(c, n):
    name = {aten.mean.dim: "reduce_mean", aten.mean.default: "reduce_mean", aten.sum.dim_IntList: "reduce_sum",
            aten.sum.default: "reduce_sum", aten.amax.default: "reduce_max", aten.amin.default: "reduce_min"}[n.target]
    rank = len(shape_of(n.args[0]))
    dims = n.args[1] if len(n.args) > 1 and n.target not in (aten.mean.default, aten.sum.default) else None
    keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
    axes = sorted({d % rank for d in dims}) if dims else list(range(rank))
    if rank == 0:
        return op(c, n, "identity", [c.arg(n.args[0])])
    return op(c, n, name, [c.arg(n.args[0])], axes=axes, keepdims=keepdim)


@converts(aten.max_pool2d_with_indices.default, aten.avg_pool2d.default)
def _pool(c, n):
    a = list(n.args) + [None] * 8
    pair = lambda v: (list(v) * 2)[:2]  # noqa: E731 (PyTorch allows one value for both)
    x, kernel = a[0], pair(a[1])
    stride = pair(a[2]) if a[2] else kernel
    padding = pair(a[3]) if a[3] is not None else [0, 0]
    maxpool = n.target == aten.max_pool2d_with_indices.default
    if maxpool:
        dilation, ceil = (list(a[4]) if a[4] else [1, 1]), bool(a[5])
        if any(d != 1 for d in dilation):
            raise Unsupported("dilated max pooling")
    else:
        ceil, include_pad, divisor = bool(a[4]), a[5] if a[5] is not None else True, a[6]
        if divisor is not None:
            raise Unsupported("avg_pool2d with divisor_override")
    if ceil:
        raise Unsupported("pooling with ceil_mode=True")
    attrs = {"layout": "NCHW", "kernel": kernel, "stride": stride, "padding": padding}
    if not maxpool:
        attrs["count_include_pad"] = bool(include_pad)
    y = op(c, n if not maxpool else n.args[0], "max_pool2d" if maxpool else "avg_pool2d", [c.arg(x)], **attrs)
    return [y, None] if maxpool else y


@converts(aten.adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d.default)
def _adaptive(c, n):
    """PyTorch's windows are [floor(i*H/out), ceil((i+1)*H/out)): where out divides H they are
    avg_pool2d's with kernel = stride = H/out; to 1x1 a mean over H and W. Elsewhere (VGG's 7x7
    from a 13x13 map; windows of two sizes, overlapping) the mean of each window is the mean
    over its rows, then over its columns: each row window sliced and averaged, the means
    concatenated along H, then the same along W, held in f32 and rounded once at the end."""
    out = sizes.sizes(n.args[1])
    if out == [1, 1]:
        return op(c, n, "reduce_mean", [c.arg(n.args[0])], axes=[2, 3], keepdims=True)
    h, w = shape_of(n.args[0])[-2:]
    if len(out) != 2 or not all(isinstance(v, int) for v in (h, w, *out)):
        raise Unsupported(f"adaptive_avg_pool2d from {h}x{w} to {out} (kiln: integer sizes)")
    if h % out[0] == 0 and w % out[1] == 0:
        kernel = [h // out[0], w // out[1]]
        if kernel == [1, 1]:
            return op(c, n, "identity", [c.arg(n.args[0])])
        return op(c, n, "avg_pool2d", [c.arg(n.args[0])], layout="NCHW", kernel=kernel, stride=kernel,
                  padding=[0, 0], count_include_pad=True)
    if max(out) > _MOST_PARTS:
        raise Unsupported(f"adaptive_avg_pool2d from {h}x{w} to {out} (kiln: at most {_MOST_PARTS} windows a side)")

    def windows(x, axis, size, count):  # the mean of each of `count` windows along `axis`, in f32
        means = [c.b.op("reduce_mean", [view(c, "slice", x, axis=axis, start=i * size // count,
                                             end=-(-(i + 1) * size // count))],
                        {"axes": [axis], "keepdims": True}, dtype="f32") for i in range(count)]
        return means[0] if count == 1 else concat(c, means, axis, "f32")

    pooled = windows(windows(c.arg(n.args[0]), 2, h, out[0]), 3, w, out[1])
    return c.b.op("cast", [pooled], dtype=dtype_of(n))


# ---- which nodes kiln takes ----------------------------------------------------

_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.unsqueeze.default, aten.permute.default, aten.t.default, aten.transpose.int,
          aten.expand.default, aten.slice.Tensor, aten.select.int, aten.split.Tensor, aten.split_with_sizes.default,
          aten.unbind.int, aten.clone.default, aten.alias.default, aten.detach.default, operator.getitem,
          aten.flatten.using_ints, aten.numpy_T.default}
# Operands whose values a converter reads when it converts (not kiln tensors): target -> (the
# operands, why the node stays in PyTorch where they are not constants).
_NO_GATHER = "an index tensor whose values are not known at conversion (kiln has no gather)"
_READ_AT_CONVERSION = {
    aten.index.Tensor: (lambda n: [i for i in n.args[1] if i is not None], _NO_GATHER),
    aten.index_select.default: (lambda n: [n.args[2]], _NO_GATHER),
}
# Multi-output ops: the outputs kiln computes (the others, such as saved statistics, stay unused or in PyTorch).
_FIRST_ONLY = {aten.native_layer_norm.default, aten._native_batch_norm_legit_no_training.default,
               aten.native_group_norm.default, aten.max_pool2d_with_indices.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default, aten._scaled_dot_product_flash_attention.default,
               aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default}


# Multi-output ops whose converters compute every output that is read (a layer norm's mean and
# reciprocal standard deviation, an eval batch norm's statistics on CUDA: what a forward with
# gradients on saves for the backward).
_EVERY_OUTPUT = {aten.native_layer_norm.default, aten._native_batch_norm_legit_no_training.default}


def _tensors(x) -> List[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def why_not(node: torch.fx.Node) -> Optional[str]:
    """None when kiln can take this node, else the reason it stays in PyTorch."""
    if node.op != "call_function":
        return None if node.op in ("placeholder", "output", "get_attr") else f"a {node.op} node"
    if _IN_PYTORCH in node.meta:
        return node.meta[_IN_PYTORCH]
    if node.target not in CONVERTERS:
        return "not in kiln's catalogue" if not isinstance(node.target, torch._ops.OpOverload) else \
            f"no kiln conversion for {node.target}"
    if _KNOWN in node.meta:
        return None  # a constant (_fold_constants): kiln builds it where a kiln op reads it
    read = _READ_AT_CONVERSION.get(node.target)
    if read is not None and any(_KNOWN not in a.meta for a in read[0](node)):
        return read[1]
    if node.target in _FIRST_ONLY:
        for user in node.users:
            if user.target is not operator.getitem:
                return "its outputs are read as a tuple"
            if user.args[1] != 0 and not _is_empty(user) and node.target not in _EVERY_OUTPUT:
                return f"output {user.args[1]} is used (kiln computes the first, and empty ones)"
    def checked_values(n: torch.fx.Node) -> List[torch.Tensor]:
        # a multi-output op kiln takes: its first output alone (the others are unused)
        if n.op == "call_function" and n.target in _FIRST_ONLY and n.target not in _EVERY_OUTPUT:
            return _tensors(n.meta.get("val"))[:1]
        if n.target is operator.getitem and n.args[0].target in _FIRST_ONLY and n.args[0].target not in _EVERY_OUTPUT:
            return _tensors(n.args[0].meta.get("val"))[:1]
        if n.op == "call_function" and n.target in _EVERY_OUTPUT:  # (its empty outputs are made by PyTorch)
            first, *others = _tensors(n.meta.get("val"))
            return [first] + [v for v in others if sizes.numel(v) > 0]
        return _tensors(n.meta.get("val"))

    values = checked_values(node)
    for a in node.all_input_nodes:
        # (cat drops empty inputs: a KV cache's empty past; a constant is kiln's on any device)
        if _KNOWN not in a.meta:
            values += [v for v in checked_values(a) if node.target != aten.cat.default or sizes.numel(v) > 0]
    if not values and node.target is not operator.getitem:
        return "no tensor metadata"
    on_device = any(v.device.type != "cpu" for v in values)
    tensors = [v for v in values if not _host_value(v, on_device)]  # (a host value is a constant of the graph)
    for v in tensors:
        if v.dtype not in _KILN_DTYPE:
            return f"a {v.dtype} tensor (kiln: float32, float16, bfloat16, bool)"
        if sizes.numel(v) == 0:
            return "an empty tensor"
        if v.dim() > 8:
            return f"a rank-{v.dim()} tensor (kiln: at most 8)"
        if v.device.type not in ("cuda", "cpu"):
            return f"a tensor on {v.device}"
    devices = {str(v.device) for v in tensors}
    if len(devices) > 1:  # (a kiln graph runs on one device)
        return f"tensors on several devices ({', '.join(sorted(devices))})"
    try:  # a dry conversion of the node alone catches what only its converter knows
        probe = Conversion("probe")
        for a in node.all_input_nodes:
            if a.op == "call_function" and a.target in _FIRST_ONLY:
                continue
            av = _tensors(a.meta.get("val"))
            if _KNOWN in a.meta:
                probe.env[a] = a.meta[_KNOWN]
            elif _host_value(a.meta.get("val"), on_device):
                probe.env[a] = 1.0
            elif isinstance(a.meta.get("val"), torch.Tensor) and sizes.numel(av[0]) > 0:
                probe.env[a] = probe.b.input(f"p{len(probe.env)}", sizes.sizes(av[0].shape), _KILN_DTYPE[av[0].dtype],
                                             sizes.sizes(av[0].stride()))
        empty = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor) and sizes.numel(a.meta["val"]) == 0]
        sized = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), (torch.SymInt, int))]  # (read as sizes)
        if node.target is operator.getitem or any(a not in probe.env and a not in empty and a not in sized
                                                  for a in node.all_input_nodes):
            return None  # decided with its producer
        CONVERTERS[node.target](probe, node)
    except Unsupported as e:
        return str(e)
    except KilnError as e:
        return f"kiln rejects it: {e}"
    except Exception as e:  # noqa: BLE001  (a converter that does not expect this operand: PyTorch runs it)
        return f"kiln's conversion fails: {type(e).__name__}: {e}"
    return None


class _Support(OperatorSupport):
    def __init__(self, reasons: Dict[torch.fx.Node, str]):
        super().__init__()
        self.reasons = reasons

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        reason = why_not(node)
        if reason is not None:
            self.reasons[node] = reason
        return reason is None


class _Partitioner(CapabilityBasedPartitioner):
    """PyTorch's partitioner, which merges every supported node it can without a cycle, in time
    quadratic in the graph (Swin-T's 1520 nodes: 1.2 s of a first call on this project's CI
    machine). Where no node outside kiln lies between two kiln nodes (a path kiln -> PyTorch ->
    kiln), nothing can form a cycle and its answer is known: every supported node in one
    partition. That is found here in linear time; any other graph goes to PyTorch's algorithm.

    Expects: the graph's nodes in topological order. Guarantees: the partitions PyTorch's
    propose_partitions returns, each node's support asked once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._supported: Dict[torch.fx.Node, bool] = {}

    def _is_node_supported(self, node: torch.fx.Node) -> bool:
        if node not in self._supported:
            self._supported[node] = super()._is_node_supported(node)
        return self._supported[node]

    def propose_partitions(self) -> List[Partition]:
        nodes = list(self.graph_module.graph.nodes)
        supported = {n for n in nodes if self._is_node_supported(n)}
        below_kiln: set = set()  # nodes with a supported node upstream
        for n in nodes:
            if any(a in supported or a in below_kiln for a in n.all_input_nodes):
                below_kiln.add(n)
        above_kiln: set = set()  # nodes with a supported node downstream
        for n in reversed(nodes):
            if any(u in supported or u in above_kiln for u in n.users):
                above_kiln.add(n)
        if any(n not in supported and n in below_kiln and n in above_kiln for n in nodes):
            return super().propose_partitions()
        # PyTorch's post-processing: a tuple's getitems join their producer's partition (none, for
        # a producer outside kiln)
        members = set(supported)
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if n.users and all(u.op == "call_function" and u.target is operator.getitem for u in n.users):
                    for u in n.users:
                        if (u in members) != (n in members):
                            (members.add if n in members else members.discard)(u)
                            changed = True
        ordered = [n for n in nodes if n in members]
        return [Partition(id=0, nodes=ordered, node_orders=range(len(ordered)))] if ordered else []


# ---- a kiln subgraph as a module --------------------------------------------

class KilnSubgraph(torch.nn.Module):
    """One partition: a kiln graph built on its first call from the
    partition's ATen nodes, compiled, and run on the tensors it is given.
    Outputs that are only views of its inputs are returned as PyTorch views
    (computed by PyTorch), never copied by a kiln kernel.

    A partition with symbolic sizes (dynamo's dynamic shapes) becomes one
    symbolic kiln graph, compiled once for every size (_torch_sizes.py),
    where kiln's one compile serves it; otherwise a graph per size, for at
    most MAX_SIZES sizes, after which a new size runs in PyTorch."""

    MAX_SIZES = 8
    MAX_VALUES = 8

    def __init__(self, gm: torch.fx.GraphModule, name: str, report: "Report", hints=None):
        super().__init__()
        self.gm = gm
        self.name = name
        self.report = report
        self.hints = hints  # the symbols' traced values (a partition of symbolic sizes)
        self._lock = threading.Lock()
        self._executables: Dict[Tuple, Any] = {}
        self.graphs: List[Any] = []  # the kiln graphs built: one per input layout, or the symbolic one
        self._last_layout = None  # the last call's argument layouts, and their entry with
        self._last_entry = None   # the non-empty arguments (kiln's inputs) and their layouts
        self._build()

    def _build(self):
        g = self.gm.graph
        self.placeholders = [n for n in g.nodes if n.op == "placeholder"]
        output = next(n for n in g.nodes if n.op == "output")
        self.output_nodes = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        # Outputs computed by PyTorch: placeholders and views of placeholders alone, and constants.
        self.torch_outputs = set()
        for i, n in enumerate(self.output_nodes):
            if all(a.op == "placeholder" or (a.target in _VIEWS) for a in _ancestors(n)) and (
                    n.op == "placeholder" or n.target in _VIEWS) or _KNOWN in n.meta:
                self.torch_outputs.add(i)
        # Empty outputs (the statistics an inference batch norm saves for a backward): PyTorch's.
        self.empty_outputs = {i: n.meta["val"] for i, n in enumerate(self.output_nodes) if _is_empty(n)}
        self.torch_outputs |= set(self.empty_outputs)
        # What PyTorch computes of them at each call: their own nodes and ancestors, not every view
        # and constant of the graph (Mistral's subgraph returns two constants, and evaluating the
        # whole graph's views and constants each call ran its sliding-window mask in PyTorch: 52
        # nodes, 0.9 ms a forward of Python on the CPU, about as much on the GPU).
        needed = {self.output_nodes[i] for i in self.torch_outputs - set(self.empty_outputs)}
        needed |= {a for n in needed for a in _ancestors(n)}
        self.view_nodes = [n for n in g.nodes if n in needed and _view_or_known(n)]
        traced = [n.meta.get("val") for n in self.placeholders]
        self.symbolic = any(sizes.is_symbolic(v) for v in traced)
        self.symbols = sorted({s for v in traced for s in _free_symbols(v)}, key=str)
        # Placeholders holding host values (_host_value): constants of the kiln graph, whose
        # graphs are keyed by their values (a model's eps: one value), at most MAX_VALUES of them.
        on_device = any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in traced)
        # Placeholders holding constants (_fold_constants): no kiln inputs, their values converted.
        self.known = {i: n.meta[_KNOWN] for i, n in enumerate(self.placeholders) if _KNOWN in n.meta}
        self.host_values = [i for i, v in enumerate(traced) if _host_value(v, on_device) and i not in self.known]
        # Tensors whose strides are symbolic and not dense (a view at a position counted from the end,
        # the prefill's last position x[:, -1:] of [B, S, H]: strides S*H, H, 1): kiln's dims spell
        # shapes, not strides, so PyTorch copies such an input dense before each call (here B*H
        # elements) and the graph is compiled once.
        with sizes.bound(self.hints):
            self.made_dense = [i for i, v in enumerate(traced) if isinstance(v, torch.Tensor) and i not in self.known
                               and sizes.is_symbolic(list(v.stride()))
                               and not sizes.contiguous(sizes.sizes(v.shape), sizes.sizes(v.stride()))]
        self._values_seen: set = set()
        self._one_compile: Dict[Tuple, Any] = {}  # the symbolic graph's entry, by host values
        self.per_size = None  # why this partition is compiled per size (symbolic sizes only)
        self._aliases = {}  # host values -> the symbols their one graph takes as one (_compile_once)
        self._sizes_compiled = 0

    def _graph_for(self, inputs):
        """The kiln graph of the partition for inputs [(shape, strides, dtype) or None per placeholder], and its
        builder's document; the converters read sizes under the binding of the caller (_torch_sizes.bound)."""
        c = Conversion(self.name)
        self.output_orders: Dict[str, List[int]] = {}  # output -> the permutation giving PyTorch's shape back
        for i, (n, t) in enumerate(zip(self.placeholders, inputs)):
            if i in self.known:
                c.env[n] = self.known[i]
            elif isinstance(t, float):  # a host value: a constant
                c.env[n] = t
            elif t is not None:  # an empty input (read only by a cat, which drops it) is no kiln input
                c.env[n] = c.b.input(f"in{i}", t[0], _KILN_DTYPE[t[2]], t[1])
        for n in self.gm.graph.nodes:
            if n.op == "call_function" and not _is_empty(n):
                c.env[n] = n.meta[_KNOWN] if _KNOWN in n.meta else CONVERTERS[n.target](c, n)
                _check_converted_shapes(c, n)
        names, seen, by_value = [], {}, {}
        for i, n in enumerate(self.output_nodes):
            if i in self.torch_outputs or n in seen:
                continue
            t = c.env[n]
            if isinstance(t, torch.Tensor):  # (a converter's result that is a constant: slice_scatter's whole source)
                t = c.constant(t)
            if isinstance(t, float):
                raise Unsupported(f"output {i} is a host value (a constant in kiln) PyTorch reads")
            if t.name in by_value:  # (the same value under two nodes: a detach of an output)
                seen[n] = by_value[t.name]
                continue
            value_name = t.name
            order = _dense_order(val(n))
            if order is not None:  # written in PyTorch's memory order (channels-last), given back as its view
                t = c.b.op("transpose", [t], {"perm": order})
            elif t.name in {c.env[x].name for x in self.placeholders if x in c.env and not isinstance(c.env[x], float)}:
                # an output that is an input through identities (bool values: only a cast reads them)
                t = c.b.op("cast", [t], dtype="bool") if val(n).dtype == torch.bool else c.b.op("identity", [t])
            out_name = f"out{len(names)}"
            c.b.output(t, name=out_name)
            if order is not None:
                self.output_orders[out_name] = [order.index(d) for d in range(len(order))]
            seen[n] = by_value[value_name] = out_name
            names.append((i, out_name))
        graph = c.b.build()
        for i, out_name in names:  # the conversion's shapes and dtypes are PyTorch's
            spec, want = graph.outputs[out_name], val(self.output_nodes[i])
            shape = list(spec.shape)
            if out_name in self.output_orders:
                shape = [shape[d] for d in self.output_orders[out_name]]
            if shape != sizes.sizes(want.shape) or spec.dtype != _KILN_DTYPE[want.dtype]:
                raise KilnError(f"internal: output {i} converted as {spec.dtype}{list(spec.shape)}, "
                                f"PyTorch has {want.dtype}{sizes.sizes(want.shape)}")
        return graph, seen, json.loads(c.b.to_json())

    def forward(self, *args):
        if any(isinstance(t, torch.Tensor) and (t.is_neg() or t.is_conj()) for t in args):
            # A negative or conjugate view: its storage holds the values without the sign (the
            # conjugation), and kiln reads the storage. Such an argument is given as a tensor of its own.
            args = tuple(t.resolve_neg().resolve_conj() if isinstance(t, torch.Tensor) else t for t in args)
        if self.made_dense:  # (views of symbolic strides: copied dense, see __init__)
            args = tuple(t.contiguous() if i in self.made_dense else t for i, t in enumerate(args))
        # One look at every argument's layout, compared with the last call's in one step: a
        # model's forward passes the same layouts every time (dynamo's guards see to its inputs).
        # (A size argument of a dynamic-shape partition is its value.)
        # (A host value's layout is its value: the graph holds it as a constant.)
        layout = [(t.shape, t.stride(), t.dtype, t.device) if isinstance(t, torch.Tensor) else t for t in args]
        for i in self.host_values:
            layout[i] = float(args[i])
        if layout != self._last_layout:
            live = [i for i, t in enumerate(args) if isinstance(t, torch.Tensor) and t.numel() > 0
                    and i not in self.host_values and i not in self.known]
            self._last_entry = self._entry_for(tuple(layout), args) + (live, [layout[i] for i in live])
            self._last_layout = layout
        exe, seen, live, live_layout = self._last_entry
        if exe is None:
            return self._in_pytorch(args)
        checked = exe._torch_inputs
        if checked is not None and checked[1] == live_layout:  # the executable's last checked call: these layouts
            results = exe._run_as_last_checked([args[i].data_ptr() for i in live])
        else:
            try:
                results = exe({f"in{i}": args[i] for i in live})
            except BindingError as e:  # arguments kiln cannot bind (checked before anything ran)
                key = tuple(layout)
                self._last_layout = None
                if any(self._executables.get(key) is once for once in self._one_compile.values()):
                    # outside what the symbolic graph takes (its range, its strides): a graph for these sizes
                    self._executables[key] = self._per_size_entry(key, args, f"the symbolic graph refused them: {e}")
                    return self.forward(*args)
                self._refuse(key, f"its arguments: {e}")
                return self._in_pytorch(args)
        env = None
        outs = []
        for i, n in enumerate(self.output_nodes):
            if i in self.empty_outputs:
                v = self.empty_outputs[i]
                with sizes.bound(sizes.call_binding(self.placeholders, args) if self.symbolic else None):
                    outs.append(torch.empty(sizes.sizes(v.shape), dtype=v.dtype, device=v.device))
            elif i in self.torch_outputs:
                if env is None:
                    env = _run_views(self.placeholders, args, self.view_nodes)
                outs.append(env[n])
            else:
                out_name = seen[n]
                order = self.output_orders.get(out_name)
                outs.append(results[out_name] if order is None else results[out_name].permute(order))
        return tuple(outs) if len(self.output_nodes) > 1 or isinstance(self._output_arg(), (list, tuple)) else outs[0]

    def _in_pytorch(self, args):
        return tuple(self.gm(*args)) if len(self.output_nodes) > 1 else self.gm(*args)

    def _entry_for(self, key, args):
        """(executable, output names) for arguments laid out as `key`; (None, reason) where
        kiln refused the partition, which then runs in PyTorch: whatever kiln cannot take is
        never an error of the user's forward."""
        entry = self._executables.get(key)
        if entry is None:
            with self._lock:
                entry = self._executables.get(key)
                if entry is None:
                    values = tuple(float(args[i]) for i in self.host_values)
                    if values not in self._values_seen and len(self._values_seen) >= self.MAX_VALUES:
                        return self._refuse(key, f"host values past the first {self.MAX_VALUES} (numbers PyTorch "
                                                 f"passes as CPU tensors: kiln compiles each value as a constant)")
                    self._values_seen.add(values)
                    why = None
                    if self.symbolic and self.per_size is None:
                        entry = self._one_compile.get(values) or self._compile_once(args, values)
                        differ = self._aliases_differ(values, args) if entry is not None else ""
                        if differ:  # (the one graph takes them as one symbol: these sizes, a graph of their own)
                            entry, why = None, f"the one graph's symbols traced equal differ here ({differ})"
                    if entry is None:
                        entry = self._per_size_entry(key, args, why or self.per_size)
                    self._executables[key] = entry
        return entry

    def _compiled(self, key, make_graph, sized_as: str):
        """(executable, output names) of the graph make_graph() builds; (None, reason) where kiln refuses it."""
        try:
            graph, seen, _doc = make_graph()
            exe = kiln_compile(graph)
            self.graphs.append(graph)
            with sizes.bound(self.hints):
                self.report.add_subgraph(self.name, self.gm, graph, exe, sized_as)
            return (exe, seen)
        except (Unsupported, KilnError) as e:
            return self._refuse(key, str(e))
        except Exception as e:  # noqa: BLE001  (a kiln bug: PyTorch still runs the user's forward)
            warnings.warn(f"kiln: subgraph {self.name} runs in PyTorch after an internal error: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
            return self._refuse(key, f"internal error {type(e).__name__}: {e}")

    def _per_size_entry(self, key, args, why: Optional[str]):
        """The partition compiled for the sizes of `args` (an integer kiln graph)."""
        tensors = [t for i, t in enumerate(args) if isinstance(t, torch.Tensor) and t.numel() > 0
                   and i not in self.host_values and i not in self.known]
        devices = sorted({str(t.device) for t in tensors})
        if not devices:
            return self._refuse(key, "no tensor inputs (a kiln graph runs on its inputs' device)")
        if len(devices) > 1:
            return self._refuse(key, f"its inputs are on several devices ({', '.join(devices)})")
        if self.symbolic and self._sizes_compiled >= self.MAX_SIZES:
            return self._refuse(key, f"a {self.MAX_SIZES + 1}th size (kiln compiles this partition per size, "
                                     f"at most {self.MAX_SIZES} sizes, because {why})")
        inputs = [(list(t.shape), list(t.stride()), t.dtype)
                  if isinstance(t, torch.Tensor) and t.numel() > 0 and i not in self.known else None
                  for i, t in enumerate(args)]
        for i in self.host_values:
            inputs[i] = float(args[i])

        def make_graph():
            with sizes.bound(sizes.call_binding(self.placeholders, args) if self.symbolic else None):
                return self._graph_for(inputs)
        self._sizes_compiled += self.symbolic
        return self._compiled(key, make_graph, f"per size: {why}" if self.symbolic else "")

    def _aliases_differ(self, values: Tuple, args) -> str:
        """Which of the symbols the one graph for `values` takes as one (equal_hints) differ at this
        call ("s69 = 110, s49 = 70"), or ""."""
        aliases = self._aliases.get(values)
        if not aliases:
            return ""
        binding = sizes.call_binding(self.placeholders, args)
        differ = [(a, r) for a, r in aliases.items() if binding.get(a) != binding.get(r)]
        return ", ".join(f"{a} = {binding.get(a)}, {r} = {binding.get(r)}" for a, r in differ)

    def _one_symbolic_graph(self, values: Tuple, aliases=None):
        """The graph one compile serves every size with (the widest range whose kernels meet no limit);
        NotAProduct, Unsupported or KilnError saying why there is none."""
        graph, why = None, ""
        for graph in self._symbolic_graphs(dict(zip(self.host_values, values)), aliases):
            # (a graph with no symbols left, the symbolic strides made dense, serves every size as it is)
            why, range_limit = per_size_reason(graph._native) if graph.dims else ("", False)
            if not why:
                break
            if not range_limit:  # (a limit at the largest sizes alone: the next, narrower range)
                raise sizes.NotAProduct(why)
        if why:
            raise sizes.NotAProduct(why)
        return graph

    def _compile_once(self, args, values: Tuple):
        """The symbolic graph's entry for these host values, or None with self.per_size saying why
        kiln compiles per size. Where the symbols taken apart make no graph, symbols traced at equal
        values are tried as one (a static cache's k and v lengths): _entry_for gives a call where
        they differ a graph of its own (_aliases_differ), since the one graph may rely on them being
        equal."""
        sized_as = "every size: one compile"
        try:
            try:
                graph = self._one_symbolic_graph(values)
            except (sizes.NotAProduct, Unsupported, KilnError) as apart:
                aliases = sizes.equal_hints(self.symbols, self.hints or {})
                if not aliases:
                    raise
                try:
                    graph = self._one_symbolic_graph(values, aliases)
                except (sizes.NotAProduct, Unsupported, KilnError) as together:
                    raise sizes.NotAProduct("{}; with {} as one: {}".format(
                        apart, ", ".join(f"{a} = {r}" for a, r in aliases.items()), together)) from None
                sized_as += " ({}: equal as traced; a call where they differ compiles per size)".format(
                    ", ".join(f"{a} = {r}" for a, r in aliases.items()))
                self._aliases[values] = aliases
            exe = kiln_compile(graph)
        except (sizes.NotAProduct, Unsupported, KilnError) as e:
            self.per_size = str(e)
            return None
        except Exception as e:  # noqa: BLE001  (a kiln bug: the partition is compiled per size)
            warnings.warn(f"kiln: subgraph {self.name} is compiled per size after an internal error: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=3)
            self.per_size = f"internal error {type(e).__name__}: {e}"
            return None
        self.graphs.append(graph)
        with sizes.bound(self.hints):
            self.report.add_subgraph(self.name, self.gm, graph, exe, sized_as)
        self._one_compile[values] = (exe, self._symbolic_seen)
        return self._one_compile[values]

    def _symbolic_graphs(self, host_values: Dict[int, float], aliases=None):
        """The partition as one symbolic kiln graph, converted at two probes, each generalised
        into dim expressions, which must agree (_torch_sizes.py): at the widest range of sizes
        first (sizes.CAPS), then narrower ones (a kernel's limits at the largest sizes). Symbols
        in `aliases` are the symbol they map to (sizes.equal_hints)."""
        docs = []
        for offset in (0, len(sizes._PRIMES) // 2):
            probe = sizes.Probe(self.symbols, offset, aliases)
            with sizes.bound(probe.binding):
                inputs = [host_values[i] if i in host_values else
                          (sizes.sizes(v.shape), _contiguous(tuple(sizes.sizes(v.shape))) if i in self.made_dense
                           else sizes.sizes(v.stride()), v.dtype)
                          if isinstance(v, torch.Tensor) and sizes.numel(v) > 0 and i not in self.known else None
                          for i, v in enumerate(n.meta.get("val") for n in self.placeholders)]
                _graph, seen, doc = self._graph_for(inputs)
            docs.append(sizes.generalize(doc, probe))
        if docs[0] != docs[1]:
            raise sizes.NotAProduct("the conversion depends on the sizes beyond products of them")
        self._symbolic_seen = seen
        doc = docs[0]
        used = sizes.used_symbols(doc, self.symbols)
        env = sizes.shape_env([n.meta.get("val") for n in self.placeholders])
        first = sizes.CAPS.index(sizes.largest_cap(doc))
        built = False
        for cap in sizes.CAPS[first:]:
            doc["dims"] = sizes.dims_table(env, used, cap, aliases)
            try:
                graph = Graph.from_json(doc)
            except GraphError as e:
                if "2^62" not in str(e):
                    raise sizes.NotAProduct(f"the symbolic graph: {e}") from None
                continue
            built = True
            yield graph
        if not built:
            raise sizes.NotAProduct("no range of sizes keeps its tensors below 2^62 elements")

    def _refuse(self, key, reason: str):
        entry = (None, reason)
        self._executables[key] = entry
        self.report.add_fallback(self.name, self.gm, reason)
        return entry

    def _output_arg(self):
        return next(n for n in self.gm.graph.nodes if n.op == "output").args[0]


def _free_symbols(v: Any):
    """dynamo's symbols in a traced value (a SymInt, a tensor's sizes and strides)."""
    values = [v] if isinstance(v, torch.SymInt) else list(v.shape) + list(v.stride()) if isinstance(v, torch.Tensor) else []
    return {s for x in values if isinstance(x, torch.SymInt) for s in x.node.expr.free_symbols}


def _dense_order(v: Any) -> Optional[List[int]]:
    """The dimensions of a dense tensor from its outermost to its innermost in memory where that
    is not their logical order (a channels-last activation: [0, 2, 3, 1]); None for a contiguous
    tensor or one with gaps or overlaps. kiln writes such an output in that order, so PyTorch gets
    the strides it traced (and its backward reads the activations it saved as eager's are laid out)."""
    if not isinstance(v, torch.Tensor) or v.dim() < 2:
        return None
    shape, strides = sizes.sizes(v.shape), sizes.sizes(v.stride())
    if sizes.contiguous(shape, strides):
        return None
    order = sorted(range(v.dim()), key=lambda d: (-strides[d] if shape[d] != 1 else 0, d))
    order = [d for d in order if shape[d] != 1]
    order = [d for d in range(v.dim()) if shape[d] == 1] + order  # size-1 dimensions: outermost, any stride
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return None if order == list(range(v.dim())) else order


def _host_value(v: Any, meets_device_tensors: bool) -> bool:
    """A number PyTorch holds as a 0-dim CPU tensor where it is one: a Python float dynamo passes
    as an f64 tensor instead of specialising it (dynamic shapes: an RMS norm's eps, a rotary
    scaling), or a 0-dim CPU tensor that meets tensors of a GPU, as PyTorch allows. kiln takes it
    as a constant of the graph (KilnSubgraph keys its graphs by the value)."""
    return (isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu" and v.dtype.is_floating_point
            and (v.dtype not in _KILN_DTYPE or meets_device_tensors))


def _on_host_alone(n: torch.fx.Node) -> bool:
    """A node of numbers: a 0-dim CPU value made of 0-dim CPU values alone."""
    def number(v):
        return isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu"
    return number(n.meta.get("val")) and all(number(a.meta.get("val")) for a in n.all_input_nodes)


def _rounded(value: float, dtype: torch.dtype) -> float:
    """A constant as a tensor of `dtype` holds it."""
    if not dtype.is_floating_point:
        raise Unsupported(f"a constant converted to {dtype}")
    return torch.tensor(value, dtype=torch.float64, device="cpu").to(dtype).item()


def _is_empty(n: torch.fx.Node) -> bool:
    v = n.meta.get("val")
    return n.op == "call_function" and isinstance(v, torch.Tensor) and sizes.numel(v) == 0


def _check_converted_shapes(c: "Conversion", n: torch.fx.Node) -> None:
    """Every tensor a converter gives has PyTorch's shape for its node (read under the sizes bound
    now). Unsupported where it does not: a kiln op that clamps where PyTorch's sizes would not (a
    slice of a static cache's 15 positions to a prompt's S, converted at a probe S past 15, ends at
    15), which one graph for every size would compute wrongly. The partition is then compiled
    per size (at a probe) or runs in PyTorch."""
    value, result = n.meta.get("val"), c.env[n]
    pairs = list(zip(value, result)) if isinstance(value, (tuple, list)) and isinstance(result, (tuple, list)) \
        else [(value, result)]
    for v, t in pairs:
        if isinstance(t, _KilnTensor) and isinstance(v, torch.Tensor):
            got, want = list(c.b.shape(t)), sizes.sizes(v.shape)
            if got != want:
                raise Unsupported(f"{n.target} ({n.name}) converted to shape {got} where PyTorch's is {want}")


def _ancestors(n: torch.fx.Node) -> List[torch.fx.Node]:
    """The nodes `n` depends on, each once, nearest first. (A dict as the ordered set: with a list,
    Swin-T's one output took 0.25 s here.)"""
    seen: Dict[torch.fx.Node, None] = {}
    stack = [n]
    while stack:
        x = stack.pop()
        for a in x.all_input_nodes:
            if a not in seen:
                seen[a] = None
                stack.append(a)
    return list(seen)


def _view_or_known(n: torch.fx.Node) -> bool:
    """A node PyTorch computes for a kiln subgraph's outputs: a view, or a constant."""
    return n.op == "call_function" and (n.target in _VIEWS or _KNOWN in n.meta)


def _run_views(placeholders: List[torch.fx.Node], args, nodes: List[torch.fx.Node]) -> Dict[torch.fx.Node, Any]:
    """PyTorch's own values of `nodes` (views and constants, _view_or_known, in the graph's order)
    from the placeholders' values `args`."""
    env: Dict[torch.fx.Node, Any] = dict(zip(placeholders, args))
    for n in nodes:
        if all(a in env for a in n.all_input_nodes):
            args_, kwargs_ = torch.fx.node.map_arg(n.args, lambda a: env[a]), torch.fx.node.map_arg(n.kwargs, lambda a: env[a])
            try:
                env[n] = n.target(*args_, **kwargs_)
            except RuntimeError:
                # An input laid out otherwise than traced (a kiln output is dense where PyTorch's
                # value had other strides): view cannot express it, reshape copies the same values.
                if n.target not in (aten.view.default, aten._unsafe_view.default):
                    raise
                env[n] = aten.reshape.default(*args_, **kwargs_)
    return env


# ---- the report ----------------------------------------------------------------

def node_flops(n: torch.fx.Node) -> int:
    """Multiply-add FLOPs of an anchor node (2 per multiply-add); 0 for the rest."""
    try:
        if n.target in (aten.mm.default, aten.bmm.default, aten.addmm.default, aten.matmul.default):
            a = val(n.args[1] if n.target == aten.addmm.default else n.args[0])
            return 2 * sizes.numel(val(n)) * sizes.size(a.shape[-1])
        if n.target == aten.convolution.default:
            w = val(n.args[1])
            return 2 * sizes.numel(val(n)) * sizes.numel(w) // sizes.size(w.shape[0])
        if "scaled_dot_product" in str(n.target):
            q, k = val(n.args[0]), val(n.args[1])
            return 4 * sizes.numel(q) * sizes.size(k.shape[-2])
    except (Unsupported, IndexError, AttributeError, sizes.NotAProduct):
        pass
    return 0


@dataclass
class Report:
    """What the backend did: kiln subgraphs and the ops left to PyTorch."""

    subgraphs: List[dict] = field(default_factory=list)
    left_to_pytorch: List[dict] = field(default_factory=list)
    graphs_in_pytorch: List[str] = field(default_factory=list)
    backward_in_pytorch: List[str] = field(default_factory=list)
    cuda_graphs: List[str] = field(default_factory=list)

    def add_subgraph(self, name, gm, graph, exe, sizes_served: str = ""):
        """One kiln graph compiled; sizes_served (dynamic shapes only): "every size: one compile", or
        "per size: <why>" with the sizes of this graph."""
        ops = [n for n in gm.graph.nodes if n.op == "call_function"]
        entry = {"name": name, "aten_ops": len(ops), "kiln_ops": graph._native.op_count,
                 "kernels": len(exe.kernels), "hash": graph.hash,
                 "kinds": [k["kind"] for k in exe.kernels], "flops": sum(map(node_flops, ops)),
                 "tactics": list(exe._tactics)}
        if sizes_served:
            entry["sizes"] = sizes_served
            if sizes_served.startswith("per size"):
                entry["inputs"] = {n: list(spec.shape) for n, spec in graph.inputs.items()}
        self.subgraphs.append(entry)

    def add_fallback(self, name, gm, reason):
        for n in gm.graph.nodes:
            if n.op == "call_function":
                self.left_to_pytorch.append({"op": str(n.target), "node": n.name, "reason": f"its subgraph failed in kiln: {reason}"})

    def note_gradients(self, forward: torch.fx.GraphModule):
        output = next(n for n in forward.graph.nodes if n.op == "output")
        count = len(output.args[0]) if isinstance(output.args[0], (list, tuple)) else 1
        self.backward_in_pytorch.append(f"autograd is on: kiln runs the forward ({count} outputs, the activations "
                                        f"saved for the backward among them); the backward runs in PyTorch")

    def to_dict(self) -> dict:
        return {"subgraphs": self.subgraphs, "left_to_pytorch": self.left_to_pytorch,
                "graphs_in_pytorch": self.graphs_in_pytorch, "backward_in_pytorch": self.backward_in_pytorch,
                "cuda_graphs": self.cuda_graphs}

    def __str__(self) -> str:
        lines = [f"kiln subgraphs: {len(self.subgraphs)}, "
                 f"{sum(s['kernels'] for s in self.subgraphs)} kernels, "
                 f"{sum(s['aten_ops'] for s in self.subgraphs)} ATen ops in kiln; "
                 f"{len(self.left_to_pytorch)} ATen ops in PyTorch"]
        for s in self.subgraphs:
            tactics = Counter(t for t in s["tactics"] if t)
            lines.append(f"  {s['name']}: {s['aten_ops']} ATen ops -> {s['kiln_ops']} kiln ops in {s['kernels']} "
                         f"kernel(s) ({', '.join(s['kinds'])}), graph {s['hash'][:12]}"
                         + (f"; anchors by tactic: {', '.join(f'{t} {n}' for t, n in sorted(tactics.items()))}"
                            if tactics else "")
                         + (f"; sizes served: {s['sizes']}" if "sizes" in s else ""))
        for why in self.graphs_in_pytorch:
            lines.append(f"  a whole graph ran in PyTorch: {why}")
        lines += [f"  {what}" for what in self.backward_in_pytorch + self.cuda_graphs]
        if self.left_to_pytorch:
            lines.append("left to PyTorch:")
            for e in self.left_to_pytorch:
                lines.append(f"  {e['op']} ({e['node']}): {e['reason']}")
        return "\n".join(lines)


_REPORTS = threading.local()


def _current_report() -> Report:
    report = getattr(_REPORTS, "report", None)
    return report if report is not None else _GLOBAL_REPORT


_GLOBAL_REPORT = Report()


# ---- the backend ---------------------------------------------------------------

# Values of the size arithmetic of a dynamic-shape graph (s0 * 128): host integers, no tensor ops.
_SIZE_VALUES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def _compile_aten(gm: torch.fx.GraphModule, example_inputs, report: Report, replayed: bool = False) -> Callable:
    """The ATen graph partitioned into kiln subgraphs and PyTorch's ops between them; with dynamic
    shapes, what PyTorch computes from the sizes alone is computed once per size (_torch_per_size),
    unless the forward is `replayed` from CUDA graphs."""
    env = sizes.shape_env(list(example_inputs))
    hints = sizes.hints(env) if env is not None else None  # (dynamic shapes: sizes read at the traced values)
    first = len(report.left_to_pytorch)
    with sizes.bound(hints):
        compiled = _partitioned(gm, report, hints)
    if hints is not None and not replayed:
        once = {n.name for n in per_size.memoize_size_only(compiled, _may_alias)}
        for e in report.left_to_pytorch[first:]:
            if e["node"] in once:
                e["reason"] += "; computed once per size (its inputs are sizes and constants)"
    return compiled


# A constant: a node whose value is known before the graph runs, in node.meta[_KNOWN] (a tensor).
_KNOWN = "kiln_value"
# The largest constant folded (elements); one of kiln's dtypes also in at most _MOST_PARTS runs of
# equal values, as kiln builds it (Conversion.constant).
_FOLDED_AT_MOST = 4096


def _fold_constants(gm: torch.fx.GraphModule) -> None:
    """Marks the constants of the graph (node.meta[_KNOWN]): the tensors the forward's code makes
    from numbers (torch.tensor(3), a list index, x[...] = 3: a get_attr read through
    lift_fresh_copy), the factories of no tensor (zeros, full) and the ops kiln converts applied to
    constants alone, computed here by PyTorch, on the device it would compute them on. kiln takes a
    constant on any device: a kiln op reading one reads it as kiln ops that make it
    (Conversion.constant) or, an index, its values; where PyTorch reads one, PyTorch computes it.

    Expects: gm's get_attr nodes are real tensors. Guarantees: a marked value is what PyTorch
    computes for the node (a tensor, not empty, at most _FOLDED_AT_MOST elements)."""
    from torch._subclasses.fake_tensor import FakeTensor
    with _real_tensors(), torch.no_grad():
        for n in gm.graph.nodes:
            value = _constant_value(gm, n)
            if (isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor) and not value.is_complex()
                    and 0 < value.numel() <= _FOLDED_AT_MOST and _buildable(value)):
                n.meta[_KNOWN] = value.detach()


def _constant_value(gm: torch.fx.GraphModule, n: torch.fx.Node) -> Any:
    """The node's value where it is a constant (_fold_constants), else None."""
    if n.op == "get_attr":
        if not n.users or any(u.target != aten.lift_fresh_copy.default for u in n.users):
            return None  # (a parameter or buffer kept as an attribute: an input like any other)
        value = gm
        for part in n.target.split("."):
            value = getattr(value, part, None)
        return value
    if n.op != "call_function" or n.target not in CONVERTERS or n.target is operator.getitem:
        return None
    if any(_KNOWN not in a.meta for a in n.all_input_nodes):
        return None
    if _of_symbolic_sizes(n):
        return None
    args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta[_KNOWN])
    try:
        return n.target(*args, **kwargs)
    except Exception:  # noqa: BLE001  (not computed here: the node is converted like any other)
        return None


def _of_symbolic_sizes(n: torch.fx.Node) -> bool:
    """Whether a node's arguments hold a size of dynamic shapes (a SymInt and the like)."""
    leaves: List[Any] = []
    torch.fx.node.map_aggregate((n.args, n.kwargs), leaves.append)
    return any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in leaves)


def _real_tensors():
    """Real tensors' ops (constants' values) while the backend compiles under PyTorch's fake mode."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    return unset_fake_temporarily()


def _buildable(value: torch.Tensor) -> bool:
    """Whether kiln builds a constant of `value` (Conversion.constant) where a tensor of one of its
    dtypes would otherwise be an input: finite, in at most _MOST_PARTS runs of equal values (a -inf
    for a mask stays what it was, a tensor PyTorch makes). Others (integers, float64) are no kiln
    input anyway: folded, they are read by an index or by the ops that fold them further."""
    if value.dtype not in _KILN_DTYPE:
        return True
    flat = value.flatten()
    if value.dtype.is_floating_point and not bool(flat.isfinite().all()):
        return False
    return int((flat[1:] != flat[:-1]).sum()) + 1 <= _MOST_PARTS


# The most bytes of constants one graph holds (_hold_constants); past it, PyTorch computes the
# rest on every forward as before.
_HELD_AT_MOST = 256 << 20
_HELD_PREFIX = "_kiln_held_"


def _hold_constants(gm: torch.fx.GraphModule, report: Report) -> None:
    """Computes once, while the backend compiles, what PyTorch would otherwise compute on every
    forward from constants alone, and holds the values the rest of the graph reads as buffers of
    gm (get_attr nodes). A decoder's masks are made this way: Mistral's sliding-window mask is
    arange, add, sub, compare and and on int64 positions (22 ops, a kernel each on the GPU), and
    the rotary embedding's float positions come from an arange too.

    Expects: _fold_constants has run (kiln's own constants are marked). Guarantees: only ops kiln
    does not take are held (what kiln takes, kiln computes in its kernels, where a large constant
    costs nothing to make); each held value is what PyTorch computes for its node, by the same op
    on the same device; nothing seeded-random or mutating, nothing of symbolic sizes; a value the
    graph returns is returned as a new copy of the held one on each call (the caller may write to
    it); at most _HELD_AT_MOST bytes in all. Each op computed once is in the report, with that
    reason."""
    from torch._subclasses.fake_tensor import FakeTensor
    values: Dict[torch.fx.Node, torch.Tensor] = {}
    on_the_way: set = set()  # ops kiln takes, computed for the ones after them (_leads_to_held)
    with _real_tensors(), torch.no_grad():
        for n in gm.graph.nodes:
            if _KNOWN in n.meta:
                values[n] = n.meta[_KNOWN]
            elif n.op == "get_attr":
                value = _constant_value(gm, n)  # (a tensor constant read through lift_fresh_copy)
                if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                    values[n] = value
            elif (once := _computed_once(n, values)) or _leads_to_held(n, values):
                if not once:
                    on_the_way.add(n)
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: values[a])
                try:
                    value = n.target(*args, **kwargs)
                except Exception:  # noqa: BLE001  (left to PyTorch's forward, as before)
                    continue
                if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                    values[n] = value.detach()
    # What an output returns, or a view of it (the caller may write to what it gets)
    returned = per_size.returned(gm, _may_alias)
    held_bytes = 0
    for n in list(gm.graph.nodes):
        if n not in values or n.op != "call_function":
            continue
        if n in on_the_way:
            continue  # (an op kiln takes, computed only on the way to one it does not: kiln's where read)
        output_reads = n in returned
        if output_reads:
            # A constant the graph returns: a device copy of the held value on each call. (Mistral's
            # forward returned two CPU constants moved to the GPU: each a copy from pageable memory,
            # which waits for every kernel before it, 0.45 ms a forward.)
            if _may_alias(n) or any(u.op != "output" and u in returned for u in n.users):
                continue  # (an output that may alias another: as traced)
        elif _KNOWN in n.meta or all(u in values for u in n.users):
            continue  # (kiln builds it where kiln reads it; or no forward reads it)
        value = values[n]
        size = value.numel() * value.element_size()
        if held_bytes + size > _HELD_AT_MOST:
            continue
        held_bytes += size
        name = next(f"{_HELD_PREFIX}{i}" for i in range(len(values) + 1) if not hasattr(gm, f"{_HELD_PREFIX}{i}"))
        gm.register_buffer(name, value, persistent=False)
        with gm.graph.inserting_before(n):
            attr = gm.graph.get_attr(name)
            copy = gm.graph.call_function(aten.clone.default, (attr,)) if output_reads else None
        attr.meta = dict(n.meta)
        # Constants to the converters that read values (_READ_AT_CONVERSION: a small held index) or
        # simplify by them (a bool and/or of a uniform mask: _bool_and_or).
        read_as_index = value.numel() <= _FOLDED_AT_MOST and any(
            u.target in _READ_AT_CONVERSION and n in _READ_AT_CONVERSION[u.target][0](u) for u in n.users)
        uniform_mask = value.dtype == torch.bool and any(CONVERTERS.get(u.target) is _bool_and_or for u in n.users)
        if read_as_index or (uniform_mask and _uniform(value)):
            attr.meta[_KNOWN] = value
        n.replace_all_uses_with(attr, delete_user_cb=lambda u: u.op != "output")
        if copy is not None:
            copy.meta = dict(n.meta)
            n.replace_all_uses_with(copy)
    computed = []
    for n in reversed(list(gm.graph.nodes)):  # the nodes no forward computes now (readers first)
        if n in values and n.op in ("call_function", "get_attr") and not n.users:
            if n.op == "call_function":
                computed.insert(0, (n.target, n.name))
            gm.graph.erase_node(n)
    for target, name in computed:
        report.left_to_pytorch.append({"op": str(target), "node": name, "flops": 0,
                                       "reason": "computed once while compiling: its inputs are constants"})
    if computed:
        gm.recompile()


# A vocabulary's projection (an LM head): at least this many columns, not a multiple of 8, of 16-bit
# values (codegen/gemm_tactics.cpp, kVocabularyColumns).
_VOCABULARY_COLUMNS = 16384
# The largest intermediate (elements) _causal_masks computes to learn a mask's value.
_MASK_EVALUATED_AT_MOST = 1 << 26
# An additive mask's blocked entries: at most this (finfo.min of bf16 and f32, -inf), so that
# exp(score + mask - row max) is 0 in f32 for every finite score, as under is_causal.
_BLOCKED_AT_MOST = -1e30


def _causal_masks(gm: torch.fx.GraphModule, report: Report) -> None:
    """An attention whose mask is computed from constants alone and is exactly the causal mask
    (True on and below the diagonal, False above; or 0 and at most _BLOCKED_AT_MOST) takes
    is_causal=True and no mask instead: the mask is never made, read or applied, and the attention
    kernel skips the tiles above the diagonal. (transformers' Mistral builds its sliding-window mask
    from aranges; where the sequence fits in the window the band is causal. Left a mask: a
    [B, 1, S, S] tensor every head reads, every tile computed.)

    Expects: _hold_constants has run (the mask's int64 and position ops are held buffers).
    Guarantees: the same results (a blocked entry's probability is 0 both ways: no query row of
    a causal mask is all blocked); masks of symbolic sizes, of other values, or larger than
    _MASK_EVALUATED_AT_MOST are left as they are."""
    values: Dict[torch.fx.Node, Optional[torch.Tensor]] = {}

    def value_of(n: Any) -> Optional[torch.Tensor]:
        if not isinstance(n, torch.fx.Node):
            return n
        if n not in values:
            values[n] = None
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor) and val.numel() > _MASK_EVALUATED_AT_MOST:
                return None
            if _KNOWN in n.meta:
                values[n] = n.meta[_KNOWN]
            elif n.op == "get_attr" and n.target.startswith(_HELD_PREFIX):
                values[n] = getattr(gm, n.target)
            elif _computable(n):
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), value_of)
                if all(value_of(a) is not None for a in n.all_input_nodes):
                    try:
                        value = n.target(*args, **kwargs)
                    except Exception:  # noqa: BLE001  (not a constant after all: left as it is)
                        value = None
                    values[n] = value if isinstance(value, torch.Tensor) else None
        return values[n]

    dropped: List[torch.fx.Node] = []  # masks no attention reads now
    with _real_tensors(), torch.no_grad():
        for n in list(gm.graph.nodes):
            if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
                continue
            names = [a.name for a in n.target._schema.arguments]
            where = {name: i for i, name in enumerate(names)}
            mask_name = next((m for m in ("attn_mask", "attn_bias") if m in where), None)
            if mask_name is None or "is_causal" not in where or "query" not in where:
                continue

            def argument(name):
                i = where[name]
                return n.args[i] if i < len(n.args) else n.kwargs.get(name)

            mask, q, k = argument(mask_name), argument("query"), argument("key")
            if not isinstance(mask, torch.fx.Node) or argument("is_causal"):
                continue
            qv, kv = q.meta.get("val"), k.meta.get("val")
            if not isinstance(qv, torch.Tensor) or not isinstance(kv, torch.Tensor):
                continue
            sq, skv = qv.shape[-2], kv.shape[-2]
            if not (isinstance(sq, int) and sq == skv):
                continue
            value = value_of(mask)
            if value is None or value.dim() < 2 or tuple(value.shape[-2:]) != (sq, skv):
                continue
            if value.dtype == torch.bool:
                allowed = value
            elif value.dtype.is_floating_point and bool(((value == 0) | (value <= _BLOCKED_AT_MOST)).all()):
                allowed = value == 0
            else:
                continue
            causal = torch.ones(sq, skv, dtype=torch.bool, device=value.device).tril()
            if not bool((allowed == causal).all()):
                continue
            args, kwargs = list(n.args), dict(n.kwargs)
            for name, new in ((mask_name, None), ("is_causal", True)):
                if where[name] < len(args):
                    args[where[name]] = new
                else:
                    kwargs[name] = new
            n.args, n.kwargs = tuple(args), kwargs
            dropped.append(mask)
    if not dropped:
        return
    made_of, todo = set(), list(dropped)  # the masks and what they are made of
    while todo:
        x = todo.pop()
        if x not in made_of:
            made_of.add(x)
            todo += x.all_input_nodes
    for n in reversed(list(gm.graph.nodes)):  # of those, the nodes no one reads now
        if n in made_of and n.op in ("call_function", "get_attr") and not n.users:
            if n.op == "call_function":
                report.left_to_pytorch.append({"op": str(n.target), "node": n.name, "flops": 0,
                                               "reason": "a causal mask made from constants: the attention is causal "
                                                         "instead (is_causal, no mask)"})
            target = n.target
            gm.graph.erase_node(n)
            if n.op == "get_attr" and target.startswith(_HELD_PREFIX) and not any(
                    m.op == "get_attr" and m.target == target for m in gm.graph.nodes):
                delattr(gm, target)  # (a held mask part: its memory too)
    gm.graph.lint()
    gm.recompile()


# node.meta[_IN_PYTORCH]: why the node is left to PyTorch, whatever kiln could do with it.
_IN_PYTORCH = "kiln_in_pytorch"
_ROW_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}


def _pad_vocabulary_products(gm: torch.fx.GraphModule) -> None:
    """Pads the columns of a vocabulary's projection to a multiple of 8 and returns the logits as
    a view of the padded product, as Inductor's pad_mm does: rows of 50257 bf16 (GPT-2) are no
    16-byte multiple, so no kernel can store them with the copy engine (H100: kiln's Hopper kernel
    4096 x 50257 x 768 in 0.776 ms against 0.454 at 50264; cuBLAS 3.30 against 0.51).

    Expects: an ATen graph with shapes in node.meta["val"]. Guarantees: only an `mm` of 16-bit
    operands with integer K and N (M may be symbolic), N >= _VOCABULARY_COLUMNS columns not a multiple of 8 and K a
    multiple of 8, whose product reaches the graph's outputs through views of its rows alone (a
    reshape of the leading dimension), is rewritten: B padded with zero columns (the rows of the
    weight it transposes, where it is one), the product of the padded B, and a slice of its first N
    columns, left to PyTorch (a view: no copy). Every value the graph returns equals the unpadded
    product's; the logits' rows are N + pad elements apart, as Inductor returns them."""
    changed = False
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.mm.default:
            continue
        a, b = n.args
        va, vb = a.meta.get("val"), b.meta.get("val")
        if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor) or va.dtype not in (torch.bfloat16, torch.float16):
            continue
        if vb.dtype != va.dtype or any(not isinstance(d, int) for d in vb.shape) or not isinstance(va.shape[1], int):
            continue  # (M may be symbolic: dynamic batch and sequence sizes)
        k, cols = vb.shape
        if cols < _VOCABULARY_COLUMNS or cols % 8 == 0 or k % 8 != 0 or not _reaches_outputs_as_rows(n, cols):
            continue
        pad = -cols % 8
        with gm.graph.inserting_before(n):
            if _transposed_matrix(b):  # B = wᵀ: w's rows padded, then transposed again
                w = b.args[0]
                padded_w = gm.graph.call_function(aten.constant_pad_nd.default, (w, [0, 0, 0, pad]))
                padded_w.meta["val"] = aten.constant_pad_nd.default(w.meta["val"], [0, 0, 0, pad])
                padded_b = gm.graph.call_function(aten.t.default, (padded_w,))
                padded_b.meta["val"] = aten.t.default(padded_w.meta["val"])
            else:
                padded_b = gm.graph.call_function(aten.constant_pad_nd.default, (b, [0, pad]))
                padded_b.meta["val"] = aten.constant_pad_nd.default(vb, [0, pad])
            product = gm.graph.call_function(aten.mm.default, (a, padded_b))
            product.meta["val"] = aten.mm.default(va, padded_b.meta["val"])
            logits = gm.graph.call_function(aten.slice.Tensor, (product, 1, 0, cols))
            logits.meta["val"] = aten.slice.Tensor(product.meta["val"], 1, 0, cols)
        logits.meta[_IN_PYTORCH] = (f"the first {cols} of {cols + pad} columns of a vocabulary's projection padded "
                                    "to a multiple of 8 (a view: no copy)")
        n.replace_all_uses_with(logits)
        gm.graph.erase_node(n)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()


def _transposed_matrix(n: torch.fx.Node) -> bool:
    """Whether n is the transpose of a 2-D tensor (t, permute [1, 0], transpose of dimensions 0 and 1)."""
    source = n.args[0] if n.op == "call_function" and n.args else None
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        return False
    if n.target is aten.t.default:
        return True
    if n.target is aten.permute.default:
        return list(n.args[1]) == [1, 0]
    return n.target is aten.transpose.int and {d % 2 for d in n.args[1:3]} == {0, 1}


def _reaches_outputs_as_rows(n: torch.fx.Node, cols: int) -> bool:
    """Whether every use of n is the graph's output or a view of its rows (last dimension `cols`)
    that is used alike."""
    for user in n.users:
        if user.op == "output":
            continue
        value = user.meta.get("val")
        if user.target not in _ROW_VIEWS or not isinstance(value, torch.Tensor) or value.shape[-1] != cols or \
                not _reaches_outputs_as_rows(user, cols):
            return False
    return bool(n.users)


def _computable(n: torch.fx.Node) -> bool:
    """Whether the node's value may be computed while compiling, given its inputs': an ATen op,
    neither random nor mutating, of integer sizes."""
    return (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded not in n.target.tags and not n.target._schema.is_mutable
            and not _of_symbolic_sizes(n))


def _computed_once(n: torch.fx.Node, values: Dict[torch.fx.Node, torch.Tensor]) -> bool:
    """Whether _hold_constants computes the node: an ATen op PyTorch runs (kiln does not take it),
    of constants alone, _computable."""
    return _computable(n) and all(a in values for a in n.all_input_nodes) and why_not(n) is not None


# The largest value (elements) of an op kiln takes that _hold_constants computes on the way to one
# it holds.
_EVALUATED_ON_THE_WAY_AT_MOST = 1 << 24


def _leads_to_held(n: torch.fx.Node, values: Dict[torch.fx.Node, torch.Tensor]) -> bool:
    """Whether _hold_constants computes an op kiln takes: of constants alone, as _computed_once's,
    at most _EVALUATED_ON_THE_WAY_AT_MOST elements, and leading (_reaches_pytorch) to an op kiln
    does not take, which may then be computed once too (T5's relative position buckets: a log and a
    multiply of float positions between int64 ops; kiln computed them each forward and PyTorch the
    rest). The op kiln takes is never held itself."""
    if not _computable(n) or any(a not in values for a in n.all_input_nodes):
        return False
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.numel() > _EVALUATED_ON_THE_WAY_AT_MOST:
        return False
    return _reaches_pytorch(n.users)


def _reaches_pytorch(users, most: int = 16) -> bool:
    """Whether one of `users` is an op kiln does not take, or leads to one through at most `most`
    ops kiln takes."""
    seen, todo = set(), list(users)
    while todo and len(seen) < most:
        x = todo.pop()
        if x in seen or x.op != "call_function" or not isinstance(x.target, torch._ops.OpOverload):
            continue
        seen.add(x)
        if why_not(x) is not None:
            return True
        todo += list(x.users)
    return False


def _may_alias(user: torch.fx.Node) -> bool:
    """Whether a node's value may be a view of its inputs'."""
    if user.target in _VIEWS:
        return True
    schema = getattr(user.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _sized_by_numbers_alone(gm: torch.fx.GraphModule) -> None:
    """Leaves to PyTorch each node whose size involves a symbol that neither a tensor the graph is
    given nor one of the node's operands has: a size passed as a number (a static cache's length,
    an int argument s98, in torch.zeros(1, 2, s98, 16)). A kiln graph reads its sizes from its
    inputs' shapes (graph-format.md), so such a node in kiln would name a symbol no launch binds;
    computed by PyTorch, its tensor is a kiln input that binds it."""
    given = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor):
            given |= _free_symbols(n.meta["val"])
    for n in gm.graph.nodes:
        value = n.meta.get("val")
        if n.op != "call_function" or _IN_PYTORCH in n.meta or not isinstance(value, torch.Tensor):
            continue
        have = given.union(*(_free_symbols(a.meta["val"]) for a in n.all_input_nodes
                             if isinstance(a.meta.get("val"), torch.Tensor)))
        missing = sorted(map(str, _free_symbols(value) - have))
        if missing:
            n.meta[_IN_PYTORCH] = (f"its size involves {', '.join(missing)}, a number the graph is given that no "
                                   "tensor kiln reads has (kiln reads its sizes from its inputs' shapes)")


def _partitioned(gm: torch.fx.GraphModule, report: Report, hints) -> torch.fx.GraphModule:
    _pad_vocabulary_products(gm)
    _fold_constants(gm)
    _hold_constants(gm, report)
    _causal_masks(gm, report)
    _sized_by_numbers_alone(gm)
    reasons: Dict[torch.fx.Node, str] = {}
    partitioner = _Partitioner(gm, _Support(reasons), allows_single_node_partition=True)
    partitions = partitioner.propose_partitions()
    # a partition of views alone, or of numbers on the host or constants alone, moves no data: PyTorch keeps it
    partitions = [p for p in partitions
                  if any(n.target not in _VIEWS and not _on_host_alone(n) and _KNOWN not in n.meta for n in p.nodes)]
    in_kiln = {n for p in partitions for n in p.nodes}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n not in in_kiln and not isinstance(n.meta.get("val"), _SIZE_VALUES):
            report.left_to_pytorch.append({"op": str(n.target), "node": n.name, "flops": node_flops(n),
                                           "reason": reasons.get(n, "views alone or constants alone, "
                                                                    "or outside every kiln subgraph")})
    if not partitions:
        return gm
    fused = partitioner.fuse_partitions(partitions)
    for node in list(fused.graph.nodes):
        if node.op == "call_module" and node.target.startswith("fused_"):
            sub = getattr(fused, node.target)
            setattr(fused, node.target, KilnSubgraph(sub, f"kiln_{node.target}", report, hints))
    fused.recompile()
    return fused


# torch.compile's `mode=` and `options=` settings the backend carries out (python.md, "PyTorch"):
# "reduce-overhead" (or options={"cudagraphs": True}) replays each inference forward from CUDA
# graphs; any other setting is named in one warning and ignored.
_MODES_TAKEN = {None, "default", "reduce-overhead"}
_OPTIONS_TAKEN = {"cudagraphs"}
_WARNED: set = set()


def _settings(mode, options) -> bool:
    """Whether CUDA graphs are wanted; warns once about each setting the backend ignores."""
    ignored = [] if mode in _MODES_TAKEN else [f"mode={mode!r}"]
    ignored += [f"options[{k!r}]" for k in (options or {}) if k not in _OPTIONS_TAKEN]
    new = [i for i in ignored if i not in _WARNED]
    if new:
        _WARNED.update(new)
        warnings.warn(f"kiln backend: {', '.join(new)} not supported; ignored (kiln compiles the graph as by default)",
                      UserWarning, stacklevel=3)
    return mode == "reduce-overhead" or bool((options or {}).get("cudagraphs", False))


def _replayed_from_cuda_graphs(compiled: Callable, aot_model: torch.fx.GraphModule, aot_inputs, dynamo_inputs: int,
                               report: "Report") -> Callable:
    """The inference forward (kiln's launches and the PyTorch ops between them) recorded and
    replayed by PyTorch's CUDA-graph trees, as Inductor's reduce-overhead mode does: parameters
    stay where they are, other inputs are copied into the graph's own, a new address or size
    records anew. A forward that cannot be captured (CPU tensors, input mutation) runs as is.

    Static inputs are Inductor's (`get_static_input_idxs`): with nn modules inlined (dynamo's
    default) the parameters are the graph's inputs too, and AOT autograd's metadata names them.
    Counted from the lifted arguments alone, every parameter was copied into the graph's buffers
    on every replay (H100, Qwen2 B4 S1024: 29 copies, 0.44 ms a forward, its embedding table
    among them)."""
    from torch._dynamo.backends.cudagraphs import check_for_skip, find_input_mutations, get_device_index, get_stack_traces
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._inductor.cudagraph_utils import get_placeholder_info
    from torch._inductor.utils import num_fw_fixed_arguments

    fixed = num_fw_fixed_arguments(dynamo_inputs, len(aot_inputs))
    static = _static_input_indices(fixed, len(aot_inputs))
    with _compiled_in_constants_hidden(compiled):
        skip = check_for_skip(aot_model, fixed)
    if skip:
        report.cuda_graphs.append(f"not replayed from CUDA graphs: {skip}")
        return compiled

    def run(args: list):
        outs = compiled(*args)
        args.clear()  # (boxed: the caller's list is ours to empty, as CUDA-graph trees expect)
        return outs
    run._boxed_call = True  # type: ignore[attr-defined]
    replayed = cudagraphify_impl(run, aot_inputs, static, device_index=get_device_index(aot_model),
                                 is_backward=False, is_inference=True, stack_traces=get_stack_traces(aot_model),
                                 placeholders=get_placeholder_info(aot_model.graph),
                                 mutated_input_idxs=find_input_mutations(aot_model.graph))
    replayed._boxed_call = True  # type: ignore[attr-defined]
    report.cuda_graphs.append(f"replayed from CUDA graphs (PyTorch's CUDA-graph trees; {len(static)} of "
                              f"{len(aot_inputs)} inputs static, the rest copied in at each replay)")
    return replayed


@contextlib.contextmanager
def _compiled_in_constants_hidden(compiled: Callable):
    """PyTorch's CUDA-graph check (check_for_skip) refuses a graph holding any CPU tensor. The
    constants a forward makes from numbers on the CPU (Swin's shifted-window mask: `mask[a:b] =
    count`) are such tensors, but where kiln subgraphs alone read them, kiln compiled their values
    into its graph (_fold_constants) and a replay never reads them. While this context lasts their
    traced values are hidden from the check; a CPU tensor PyTorch reads at run time still refuses.

    Expects: `compiled` is the partitioned graph (_partitioned), or any callable (nothing hidden)."""
    hidden = {}
    if isinstance(compiled, torch.fx.GraphModule):
        def read_by_kiln_alone(n: torch.fx.Node) -> bool:
            return bool(n.users) and all(
                u.op == "call_module" and isinstance(getattr(compiled, u.target, None), KilnSubgraph) for u in n.users)
        hidden = {n: n.meta.pop("val") for n in compiled.graph.nodes
                  if _KNOWN in n.meta and "val" in n.meta and read_by_kiln_alone(n)}
    try:
        yield
    finally:
        for n, value in hidden.items():
            n.meta["val"] = value


def _static_input_indices(fixed: int, inputs: int) -> List[int]:
    """The inputs a CUDA graph reads where they lie (parameters and buffers: a new address records
    anew) rather than copying them in: AOT autograd's, as Inductor asks for them while the
    compile's tracing context is live; the lifted arguments alone where it has none."""
    try:
        from torch._inductor.compile_fx import get_static_input_idxs
        static = get_static_input_idxs(fixed)
    except ImportError:  # (a PyTorch without it)
        static = range(fixed)
    return sorted({i for i in static if 0 <= i < inputs} | set(range(fixed)))  # (the lifted arguments always)


def backend(gm: torch.fx.GraphModule, example_inputs, mode: Optional[str] = None,
            options: Optional[Dict[str, Any]] = None) -> Callable:
    """The `torch.compile` backend "kiln". With autograd off, AOT autograd hands kiln the inference
    graph. With autograd on, it partitions the joint graph: the forward (its outputs and the
    activations the backward saves) is compiled with kiln like any inference graph, and the
    backward runs in PyTorch (eager ATen)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    cuda_graphs = _settings(mode, options)
    report = _current_report()

    def inference(g, ex):
        compiled = _compile_aten(g, ex, report, replayed=cuda_graphs)
        return _replayed_from_cuda_graphs(compiled, g, ex, len(example_inputs), report) if cuda_graphs else compiled

    def forward_with_gradients(g, ex):
        report.note_gradients(g)
        return _compile_aten(g, ex, report)

    def backward_in_pytorch(g, ex):  # (called with the saved activations and the outputs' gradients)
        from torch._functorch.aot_autograd import make_boxed_func
        return make_boxed_func(g)

    return aot_module_simplified(gm, example_inputs, fw_compiler=forward_with_gradients,
                                 bw_compiler=backward_in_pytorch, inference_compiler=inference)


def explain(model: Callable, *example_inputs, **kwargs) -> Report:
    """Runs `model` once through the kiln backend and reports the kiln
    subgraphs (ATen ops, kiln ops, kernels) and every ATen op left to
    PyTorch with the reason."""
    import torch._dynamo
    report = Report()
    _REPORTS.report = report
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=backend, dynamic=False)
        compiled(*example_inputs, **kwargs)
    finally:
        _REPORTS.report = None
        torch._dynamo.reset()
    return report


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "kiln" not in _BACKENDS:
        register_backend(name="kiln")(backend)


_register()
