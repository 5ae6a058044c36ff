"""Graphs: loaded from JSON or built op by op (python.md, "Graphs").

GraphBuilder's op methods are generated from the op table of the C++
library (compiler/ops.def, attrs.def) when this module is imported: an op
added to the table appears here with its attributes, and its type stub is
generated from the same table at build time (tools/gen_stubs.py).
"""
from __future__ import annotations

import json
import numbers
import operator
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _kiln
from ._errors import GraphError


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as a caller binds it."""

    shape: Tuple[int, ...]
    dtype: str  # "f32", "f16", "bf16", "bool"
    strides: Tuple[int, ...]  # in elements; outputs are contiguous


class Graph:
    """An immutable, validated graph."""

    def __init__(self, native: "_kiln.Graph"):
        self._native = native
        self.inputs: Dict[str, TensorSpec] = {n: TensorSpec(s, d, st) for n, s, d, st in native.input_specs()}
        self.outputs: Dict[str, TensorSpec] = {n: TensorSpec(s, d, st) for n, s, d, st in native.output_specs()}

    @staticmethod
    def load(path: Union[str, "os.PathLike[str]"]) -> "Graph":
        return Graph(_kiln.Graph.load(os.fspath(path)))

    @staticmethod
    def from_json(document: Union[str, dict]) -> "Graph":
        text = document if isinstance(document, str) else json.dumps(document)
        return Graph(_kiln.Graph.from_json(text))

    def to_json(self) -> str:
        return self._native.to_json()

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def hash(self) -> str:
        return self._native.hash

    @property
    def dims(self) -> Dict[str, Tuple[int, int, int]]:
        """The `dims` table of a graph with symbolic dimensions: symbol ->
        (min, max, multiple_of); empty for an integer graph. (A symbolic
        graph's `inputs` and `outputs` show the shapes at every symbol's
        smallest size.)"""
        return {name: (lo, hi, multiple) for name, lo, hi, multiple in self._native.dims()}

    def specialize(self, **sizes: int) -> "Graph":
        """The integer graph at these sizes (every symbol given, each in its
        range: a GraphError otherwise): what compile() takes."""
        return Graph(self._native.specialize({k: _integer(f"size of '{k}'", v) for k, v in sizes.items()}))

    def dims_from_shapes(self, shapes: Sequence[Sequence[int]]) -> Dict[str, int]:
        """The symbols' values read from the inputs' shapes (binding order),
        checked to agree and lie in range: a BindingError otherwise."""
        return self._native.dims_from_shapes([_integers("an input shape", s) for s in shapes])

    def __repr__(self) -> str:
        return f"kiln.Graph({self.name!r}, {self._native.op_count} ops, hash {self.hash})"


# Input parameter names by op family; ops taking optional parameters
# (norms) and sdpa's mask take them positionally after the first.
_PARAMETERS = {
    "unary": ["x"], "binary": ["a", "b"], "compare": ["a", "b"], "select": ["cond", "a", "b"],
    "reduce": ["x"], "norm": ["x"], "matmul": ["a", "b"], "conv": ["x", "w"], "pool": ["x"],
    "view": ["x"], "attention": ["q", "k", "v"], "concat": [],
}
_VARIADIC = 8  # max_inputs above this: the op takes a list (concat)


@dataclass(frozen=True)
class Tensor:
    """A tensor of a GraphBuilder: an input or an op's result."""

    builder: "GraphBuilder"
    id: int
    name: str


Operand = Union[Tensor, float, int]


class Dim:
    """A symbol that GraphBuilder.dim declared, or a product of symbols and
    positive integers (`b.dim("B") * 128`): shapes and size attributes take
    it where the JSON writes a dim expression ("B*128"). Sums and quotients
    are not dimensions (graph-format.md, "Symbolic dimensions")."""

    def __init__(self, expression: str):
        self.expression = expression

    def __mul__(self, other: Any) -> "Dim":
        if isinstance(other, Dim):
            return Dim(f"{self.expression}*{other.expression}")
        if isinstance(other, numbers.Integral) and not isinstance(other, bool):
            return Dim(f"{self.expression}*{operator.index(other)}")
        return NotImplemented

    __rmul__ = __mul__

    def _not_a_product(self, *_: Any) -> "Dim":
        raise GraphError(f"dimension {self.expression}: a sum, difference or quotient of dimensions is not a "
                         "dimension (only products of symbols and positive integers are)")

    __add__ = __radd__ = __sub__ = __rsub__ = __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _not_a_product

    def __str__(self) -> str:
        return self.expression

    def __repr__(self) -> str:
        return f"kiln.Dim({self.expression!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Dim) and other.expression == self.expression

    def __hash__(self) -> int:
        return hash(self.expression)


def _dimensions(what: str, values: Sequence[Any]) -> List[Union[int, str]]:
    """A shape as the JSON writes it: integers, and dim expressions (Dim or str) as strings."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise GraphError(f"{what}: a {type(values).__name__}, not a sequence of dimensions")
    return [str(v) if isinstance(v, (Dim, str)) else _integer(what, v) for v in values]


def _integers(what: str, values: Sequence[Any]) -> List[int]:
    """Sizes, strides or an integer attribute as the JSON writes them: Python
    ints (NumPy's and other integers through operator.index); a bool or
    anything else that is not an integer is a GraphError."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise GraphError(f"{what}: a {type(values).__name__}, not a sequence of integers")
    return [_integer(what, v) for v in values]


def _integer(what: str, value: Any) -> int:
    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):  # (NumPy's bool: "bool_" before 2.0)
        raise GraphError(f"{what}: {value!r} is a bool, not an integer")
    try:
        return operator.index(value)
    except TypeError:
        raise GraphError(f"{what}: {value!r} is a {type(value).__name__}, not an integer") from None


def _attribute(op: str, key: str, value: Any) -> Any:
    """An attribute value as the JSON writes it (NumPy integers as ints)."""
    if isinstance(value, (bool, float, str)):
        return value
    if isinstance(value, Dim):  # slice's start/end
        return str(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, (Dim, str)) for v in value):
        return _dimensions(f"{op}: attribute '{key}'", value)
    if isinstance(value, (list, tuple)):
        return _integers(f"{op}: attribute '{key}'", value)
    if isinstance(value, numbers.Integral):  # NumPy's integers (not its bool)
        return _integer(f"{op}: attribute '{key}'", value)
    return value  # (anything else is refused natively, naming its type)


class GraphBuilder:
    """Builds a graph op by op; each call is checked at once (GraphError).

    The native builder checks each call; the JSON document kept beside it is
    what build() loads. Both read an operand by the handle's id, which must be
    one this builder returned with the name it returned it with, so that the
    graph built is the graph checked."""

    def __init__(self, name: str = ""):
        self._native = _kiln.GraphBuilder(name)
        self._doc: Dict[str, Any] = {"kiln": 1, "name": name, "inputs": {}, "ops": [], "outputs": []}
        self._names: set = set()
        self._next = 0
        self._handed: Dict[int, str] = {}  # id -> the name its handle was returned with
        self._doc_name: Dict[int, str] = {}  # id -> its name in the document (output() may rename it)
        self._renamed: set = set()  # the names output() gave

    def _hand_out(self, tid: int, name: str) -> Tensor:
        self._handed[tid] = name
        self._doc_name[tid] = name
        self._names.add(name)
        return Tensor(self, tid, name)

    def _name_in_doc(self, t: Any, what: str) -> str:
        """The document's name of the tensor handle `t`; a GraphError when this builder did not return it."""
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: not a tensor of this builder (a {type(t).__name__})")
        if t.builder is not self:
            raise GraphError(f"{what}: not a tensor of this builder (a tensor of another builder)")
        handed = self._handed.get(t.id) if type(t.id) is int else None
        if handed is None:
            raise GraphError(f"{what}: not a tensor of this builder (id {t.id!r} is none of the tensors it returned)")
        current = self._doc_name[t.id]
        if t.name not in (handed, current):
            raise GraphError(f"{what}: the handle names '{t.name}' but its id {t.id} is '{current}'; "
                             "use the handle the builder returned")
        return current

    def dim(self, name: str, min: int = 1, max: int = 2**31 - 1, multiple_of: int = 1) -> Dim:
        """Declares a symbol of the graph's `dims` table (before any input)."""
        lo, hi, multiple = (_integer(f"dim '{name}': {k}", v) for k, v in
                            (("min", min), ("max", max), ("multiple_of", multiple_of)))
        self._native.dim(name, lo, hi, multiple)
        self._doc.setdefault("dims", {})[name] = {"min": lo, "max": hi, "multiple_of": multiple}
        return Dim(name)

    def input(self, name: str, shape: Sequence[Union[int, Dim, str]], dtype: str,
              strides: Optional[Sequence[int]] = None) -> Tensor:
        shape = _dimensions(f"input '{name}': shape", shape)
        strides = None if strides is None else _integers(f"input '{name}': strides", strides)
        tid = self._native.input(name, shape, dtype, strides)
        entry: Dict[str, Any] = {"shape": shape, "dtype": dtype}
        if strides is not None:
            entry["strides"] = strides
        self._doc["inputs"][name] = entry
        return self._hand_out(tid, name)

    def op(self, op: str, inputs: Sequence[Operand], attrs: Optional[Dict[str, Any]] = None,
           dtype: Optional[str] = None, name: Optional[str] = None) -> Tensor:
        """Any op of the catalogue by its graph-format.md name."""
        attrs = {k: _attribute(op, k, v) for k, v in (attrs or {}).items() if v is not None}
        native_in: List[Union[int, float]] = []
        doc_in: List[Union[str, float]] = []
        for i, x in enumerate(inputs):
            if isinstance(x, Tensor):
                doc_in.append(self._name_in_doc(x, f"{op}: operand {i}"))
                native_in.append(x.id)
            elif isinstance(x, (int, float)) and not isinstance(x, bool):
                native_in.append(float(x))
                doc_in.append(float(x))
            else:
                raise GraphError(f"{op}: an operand is a {type(x).__name__}, not a kiln tensor or a number")
        if name is None:
            while f"t{self._next}" in self._names:
                self._next += 1
            name = f"t{self._next}"
            self._next += 1
        elif name in self._renamed:  # (a name output() gave, which the native builder does not know)
            raise GraphError(f"{op}: the name '{name}' is taken (an output's)")
        tid = self._native.op(op, native_in, attrs, dtype, name)
        entry: Dict[str, Any] = {"op": op, "in": doc_in, "out": name}
        if dtype is not None:
            entry["dtype"] = dtype
        entry.update(attrs)
        self._doc["ops"].append(entry)
        return self._hand_out(tid, name)

    def shape(self, t: Tensor) -> Tuple[int, ...]:
        """The shape shape inference gave `t` (in a graph with dims: at its symbols' smallest
        sizes)."""
        self._name_in_doc(t, "shape")
        return tuple(self._native.shape(t.id))

    def output(self, t: Tensor, name: Optional[str] = None) -> None:
        """Marks `t` as a graph output, renamed to `name` when given."""
        current = self._name_in_doc(t, "output")
        if name is not None and name != current:
            self._rename(current, name)
            self._doc_name[t.id] = name
            self._renamed.add(name)
            current = name
        if current in self._doc["outputs"]:
            raise GraphError(f"output: '{current}' is an output already")
        self._doc["outputs"].append(current)

    def _rename(self, old: str, new: str) -> None:
        if new in self._names:
            raise GraphError(f"output: the name '{new}' is taken")
        if old in self._doc["inputs"]:
            raise GraphError(f"output: '{old}' is a graph input; an input keeps its name")
        for entry in self._doc["ops"]:
            entry["in"] = [new if x == old else x for x in entry["in"]]
            if entry["out"] == old:
                entry["out"] = new
        self._doc["outputs"] = [new if x == old else x for x in self._doc["outputs"]]
        self._names.discard(old)
        self._names.add(new)

    def to_json(self) -> str:
        return json.dumps(self._doc)

    def build(self) -> Graph:
        return Graph.from_json(self.to_json())


def _make_op_method(op: str, family: str, min_inputs: int, max_inputs: int, attrs: List[Tuple[str, str]]):
    attr_names = [a for a, _ in attrs]
    if max_inputs > _VARIADIC:
        def method(self, inputs, **kwargs):
            return self.op(op, list(inputs), *_split(op, attr_names, kwargs))
        signature = f"(inputs: list, *, {', '.join(f'{a}=None' for a in attr_names)}{', ' if attr_names else ''}dtype=None, name=None)"
    else:
        def method(self, *inputs, **kwargs):
            if not min_inputs <= len(inputs) <= max_inputs:
                expected = str(min_inputs) if min_inputs == max_inputs else f"{min_inputs} to {max_inputs}"
                raise GraphError(f"{op}: {len(inputs)} inputs given, {expected} expected")
            return self.op(op, list(inputs), *_split(op, attr_names, kwargs))
        params = _PARAMETERS[family]
        extra = max_inputs - len(params)
        names = params + [f"p{i}=None" for i in range(extra)] if family != "attention" else params + ["mask=None"]
        signature = f"({', '.join(names)}, *, {''.join(f'{a}=None, ' for a in attr_names)}dtype=None, name=None)"
    method.__name__ = op
    method.__qualname__ = f"GraphBuilder.{op}"
    method.__doc__ = (f"`{op}` of graph-format.md{signature}: {family} op, {min_inputs}"
                      f"{'' if min_inputs == max_inputs else f'-{max_inputs}'} inputs; attributes "
                      f"{', '.join(f'{a} ({k})' for a, k in attrs) or 'none'} (None: the catalogue's default).")
    return method


def _split(op: str, attr_names: List[str], kwargs: Dict[str, Any]):
    dtype = kwargs.pop("dtype", None)
    name = kwargs.pop("name", None)
    unknown = [k for k in kwargs if k not in attr_names]
    if unknown:
        accepted = ", ".join(attr_names) or "none"
        raise GraphError(f"{op}: unknown attribute '{unknown[0]}' (accepted: {accepted}, dtype, name)")
    return kwargs, dtype, name


OP_TABLE = _kiln.op_table()
for _op, _family, _lo, _hi, _attrs in OP_TABLE:
    if _op in ("input", "output", "op", "build", "to_json", "dim"):
        raise RuntimeError(f"op '{_op}' collides with a GraphBuilder method")
    setattr(GraphBuilder, _op, _make_op_method(_op, _family, _lo, _hi, list(_attrs)))
