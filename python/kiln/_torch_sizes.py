"""Sizes under dynamo's dynamic shapes, for the PyTorch backend (torch.py).

A partition traced with `dynamic=True`, `mark_dynamic` or dynamo's automatic
dynamic shapes (a second size seen) carries SymInt sizes: sympy expressions
over dynamo's symbols. The converters compute with integers; while one
conversion runs, a binding gives every symbol a value (`bound`), and
`size()` reads any size (an int, a SymInt, the fx node of one) under it:
- the hints dynamo traced with, while the partitioner asks what kiln takes;
- the sizes a call's arguments bind (`call_binding`), for a kiln graph of
  integer sizes compiled for them;
- a probe (`Probe`): a distinct prime per symbol, so that every value the
  conversion computed from sizes by products factors back into symbols and
  the graph becomes a symbolic kiln graph (`generalize`, graph-format.md,
  "Symbolic dimensions"), compiled once for every size. kiln's own size
  probe works the same way (compiler/size_probe.h).

Expects: SymInts over the symbols of one ShapeEnv.
Guarantees: no SymInt is ever made an int by PyTorch (after dynamo has
finished that would add a guard or specialise); a value the probe cannot
factor, or a conversion that differs between two probes, raises NotAProduct
and never yields a wrong dimension.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Dict, Iterator, List, Optional, Sequence

import sympy
import torch

from ._arrays import _contiguous

_BINDING: contextvars.ContextVar = contextvars.ContextVar("kiln_torch_sizes", default=None)


class NotAProduct(Exception):
    """The partition's graph is not a symbolic kiln graph; the message says why (it is compiled per size)."""


@contextlib.contextmanager
def bound(binding: Optional[Dict[sympy.Symbol, int]]) -> Iterator[None]:
    token = _BINDING.set(binding)
    try:
        yield
    finally:
        _BINDING.reset(token)


def is_symbolic(x: Any) -> bool:
    """Whether x (a SymInt, a tensor, a sequence of sizes) has a size that is not a constant."""
    if isinstance(x, torch.SymInt):
        return not x.node.expr.is_number
    if isinstance(x, torch.Tensor):
        return any(is_symbolic(s) for s in x.shape) or any(is_symbolic(s) for s in x.stride())
    if isinstance(x, (list, tuple)):
        return any(is_symbolic(s) for s in x)
    return False


def is_product(x: torch.SymInt) -> bool:
    """Whether a size is a product of symbols and positive integers (a dim expression, graph-format.md)."""
    expr = x.node.expr
    factors = expr.args if expr.is_Mul else (expr,)
    return all(f.is_Symbol or (f.is_Integer and f > 0) for f in factors)


def size(x: Any) -> int:
    """A size as an int under the current binding: an int, a SymInt, or the fx node of one."""
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, bool) or not isinstance(x, (int, torch.SymInt)):
        raise TypeError(f"not a size: {x!r}")
    if isinstance(x, int):
        return x
    expr = x.node.expr
    if expr.is_number:
        return int(expr)
    binding = _BINDING.get()
    if binding is None:
        raise NotAProduct(f"the size {expr} with no values bound to its symbols")
    value = expr.subs(binding)
    if not value.is_number:
        raise NotAProduct(f"the size {expr}: no value for {sorted(map(str, value.free_symbols))}")
    return int(value)


def sizes(xs: Sequence[Any]) -> List[int]:
    return [size(x) for x in xs]


def numel(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape:
        n *= size(s)
    return n


def contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a tensor of these sizes and strides is dense in row-major order (size-1 dims: any stride)."""
    step = 1
    for n, st in zip(reversed(shape), reversed(strides)):
        if n != 1 and st != step:
            return False
        step *= n
    return True


def shape_env(values: Sequence[Any]):
    """The ShapeEnv of the first SymInt among values (tensors' sizes and strides, SymInts); None if none."""
    for v in values:
        for s in ([v] if isinstance(v, torch.SymInt) else list(v.shape) + list(v.stride()) if isinstance(v, torch.Tensor)
                  else []):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def hints(env) -> Dict[sympy.Symbol, int]:
    """The values dynamo traced with, per symbol."""
    table = getattr(env, "backed_var_to_val", None) or env.var_to_val
    return {s: int(v) for s, v in table.items() if getattr(v, "is_integer", False) or isinstance(v, int)}


def call_binding(placeholders: Sequence[torch.fx.Node], args: Sequence[Any]) -> Dict[sympy.Symbol, int]:
    """The symbols' values at a call: each symbol read where it stands alone (a SymInt argument, a size of a tensor)."""
    binding: Dict[sympy.Symbol, int] = {}
    for node, arg in zip(placeholders, args):
        v = node.meta.get("val")
        if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
            binding[v.node.expr] = int(arg)
        elif isinstance(v, torch.Tensor) and isinstance(arg, torch.Tensor):
            for traced, actual in zip(list(v.shape) + list(v.stride()), list(arg.shape) + list(arg.stride())):
                if isinstance(traced, torch.SymInt) and traced.node.expr.is_Symbol:
                    binding.setdefault(traced.node.expr, int(actual))
    # A symbol standing in no size alone but in a linear one (an input of S - 1 rows, made by PyTorch
    # from x[:, :-1]): its value solved from that size.
    for node, arg in zip(placeholders, args):
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor) and isinstance(arg, torch.Tensor):
            for traced, actual in zip(v.shape, arg.shape):
                expr = traced.node.expr if isinstance(traced, torch.SymInt) else None
                if expr is not None and not expr.is_Symbol and len(expr.free_symbols) == 1:
                    (symbol,) = expr.free_symbols
                    slope, offset = expr.diff(symbol), expr.subs(symbol, 0)
                    if (symbol not in binding and slope.is_Integer and slope != 0 and offset.is_Integer
                            and (int(actual) - int(offset)) % int(slope) == 0):
                        binding[symbol] = (int(actual) - int(offset)) // int(slope)
    return binding


# Primes above 2^16: no size a model writes is a multiple of one by chance (vocabularies, widths
# and head counts lie below or factor into small primes), and a product of three still leaves an
# element count far below kiln's 2^62 with a few thousand elements of integers beside it.
_PRIMES = (65537, 65539, 65543, 65551, 65557, 65563, 65579, 65581, 65587, 65599, 65609, 65617, 65629, 65633,
           65647, 65651, 65657, 65677, 65687, 65699, 65701, 65707, 65713, 65717)


class Probe:
    """Symbol i at a prime of its own; `offset` picks a disjoint set for a second probe. A symbol in
    `aliases` (symbol -> the symbol it stands for: equal_hints) takes that symbol's prime, and the
    graph names that symbol alone."""

    def __init__(self, symbols: Sequence[sympy.Symbol], offset: int = 0,
                 aliases: Optional[Dict[sympy.Symbol, sympy.Symbol]] = None):
        aliases = aliases or {}
        own = [s for s in symbols if aliases.get(s, s) == s]
        if offset + len(own) > len(_PRIMES):
            raise NotAProduct(f"{len(own)} symbols (kiln's backend probes at most {len(_PRIMES) // 2})")
        self.symbols = own
        self.primes = list(_PRIMES[offset:offset + len(own)])
        prime_of = dict(zip(own, self.primes))
        self.binding = {s: prime_of[aliases.get(s, s)] for s in symbols}

    def involves(self, value: int) -> bool:
        return any(value % p == 0 for p in self.primes)

    def expression(self, value: int, what: str) -> Any:
        """The value as a dim expression ("s0*s1*64"), or the int where no symbol's prime divides it."""
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or not self.involves(value):
            return value
        factors, rest = [], value
        for symbol, p in zip(self.symbols, self.primes):
            while rest % p == 0:
                factors.append(str(symbol))
                rest //= p
        return "*".join(factors + ([str(rest)] if rest != 1 else []))


# The attributes whose integers may be dimensions (graph-format.md: "a shape or a size attribute").
_SIZE_ATTRIBUTES = {"shape", "start", "end"}


def _extent_one_strides_implied(shape: Sequence[int], strides: Sequence[int]) -> List[int]:
    """The strides with each dimension of extent 1 given the stride its inner neighbour implies
    (that stride times that extent; 1 innermost): an index there is always 0, so its stride is
    any number, and PyTorch's may be a symbolic one (a batch of one sliced from a static cache,
    [1, H, S, D] of [1, H, max, D]: its first stride H*max*D) where the other strides are not."""
    out = list(strides)
    for d in reversed(range(len(shape))):
        if shape[d] == 1:
            out[d] = out[d + 1] * shape[d + 1] if d + 1 < len(shape) else 1
    return out


def generalize(doc: Dict[str, Any], probe: Probe) -> Dict[str, Any]:
    """The JSON document of a graph converted at the probe's sizes, with every size that involves a
    symbol written as its expression; NotAProduct where an integer involves one elsewhere."""
    out = {k: v for k, v in doc.items() if k not in ("inputs", "ops")}

    def sized(value: Any, what: str) -> Any:
        if isinstance(value, list):
            return [sized(v, what) for v in value]
        return probe.expression(value, what)

    def refuse_symbols(value: Any, what: str) -> None:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and v > 0 and probe.involves(v):
                raise NotAProduct(f"{what} depends on a symbolic size ({v} at the probe)")

    inputs = {}
    for name, entry in doc["inputs"].items():
        e = dict(entry)
        if "strides" in e:
            e["strides"] = _extent_one_strides_implied(e["shape"], e["strides"])
            if tuple(e["strides"]) == _contiguous(tuple(e["shape"])):
                del e["strides"]
            else:
                refuse_symbols(e["strides"], f"input {name}'s strides")
        e["shape"] = sized(e["shape"], f"input {name}'s shape")
        inputs[name] = e
    ops = []
    for entry in doc["ops"]:
        e = {}
        for key, value in entry.items():
            if key in _SIZE_ATTRIBUTES:
                e[key] = sized(value, f"{entry['op']}'s {key}")
            elif key in ("op", "out", "dtype", "in"):
                if key == "in":
                    refuse_symbols([v for v in value if isinstance(v, int)], f"{entry['op']}'s operands")
                e[key] = value
            else:
                refuse_symbols(value, f"{entry['op']}'s attribute {key}")
                e[key] = value
        ops.append(e)
    out["inputs"], out["ops"] = inputs, ops
    return out


def used_symbols(doc: Dict[str, Any], symbols: Sequence[sympy.Symbol]) -> List[sympy.Symbol]:
    names = set()
    for entry in doc["inputs"].values():
        names |= {part for d in entry["shape"] if isinstance(d, str) for part in d.split("*")}
    return [s for s in symbols if str(s) in names]


# The largest sizes a symbolic graph declares: dynamo's ranges are usually unbounded above. The
# largest of these that keeps every dimension the graph writes (B*S*64) below 2^31, which kiln's
# kernels index with 32-bit tile and row counts, and then every tensor below kiln's 2^62 elements.
CAPS = (2**31 - 1, 2**24, 2**20, 2**16, 2**15, 2**12, 2**10)


def largest_cap(doc: Dict[str, Any]) -> int:
    """The largest of CAPS at which every dim expression of the document stays below 2^31."""
    dims = [d for e in doc["inputs"].values() for d in e["shape"]]
    dims += [d for e in doc["ops"] for d in (e.get("shape") or []) if isinstance(e.get("shape"), list)]
    cap = CAPS[0]
    for d in dims:
        if not isinstance(d, str):
            continue
        factors = d.split("*")
        constant = 1
        for f in factors:
            constant *= int(f) if f.isdigit() else 1
        symbols = sum(not f.isdigit() for f in factors)
        while cap > CAPS[-1] and constant * cap ** symbols >= 2**31:
            cap = CAPS[CAPS.index(cap) + 1]
    return cap


def _finite(bound: Any, otherwise: int) -> int:
    """A range's bound as an int; `otherwise` for an infinite one (dynamo's int_oo)."""
    try:
        value = int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return otherwise
    return value if abs(value) < 2**62 else otherwise


def dims_table(env, symbols: Sequence[sympy.Symbol], cap: int,
               aliases: Optional[Dict[sympy.Symbol, sympy.Symbol]] = None) -> Dict[str, Dict[str, int]]:
    """Each symbol's range: dynamo's, at most `cap`; a symbol others stand for (aliases) takes the
    range all of them share."""
    table = {}
    for s in symbols:
        lo, hi = 1, cap
        for t in [s] + [a for a, r in (aliases or {}).items() if r == s]:
            r = env.var_to_range.get(t) if env is not None else None
            if r is not None:
                lo, hi = max(lo, _finite(r.lower, 1)), min(hi, _finite(r.upper, cap))
        table[str(s)] = {"min": min(lo, hi), "max": hi, "multiple_of": 1}
    return table


def equal_hints(symbols: Sequence[sympy.Symbol], hints: Dict[sympy.Symbol, int]) -> Dict[sympy.Symbol, sympy.Symbol]:
    """Symbols dynamo traced at equal values, each to the first of its value (symbols order): the
    aliases a partition's one graph may try where its symbols taken apart do not make one (a static
    cache's k and v lengths: two symbols, one length). Empty where no two are equal."""
    first: Dict[int, sympy.Symbol] = {}
    aliases = {}
    for s in symbols:
        if s not in hints:
            continue
        rep = first.setdefault(hints[s], s)
        if rep != s:
            aliases[s] = rep
    return aliases
