"""Values of the sizes alone, computed once per size (the PyTorch backend under dynamic shapes).

A decoder's forward makes tensors from its sizes: positions `arange(S)`, offset, cast to float,
unsqueezed for the rotary embedding. In an integer graph those are constants, computed once while
the backend compiles (_hold_constants in torch.py). In a symbolic graph they depend on S, so
PyTorch computed them on every forward: on the GPU a kernel launch each and ATen's dispatch from
Python (the tiny Llama: arange, add, two unsqueezes and a cast, every call).

memoize_size_only(gm) replaces each such value that the rest of the graph reads with a
PerSizeValues module: it computes the value from the sizes (and the graph's constants) the first
time it sees them, and hands the same tensor back for the same sizes afterwards.

Expects: gm is the partitioned inference or forward graph (torch.py, _partitioned); its size
placeholders and size arithmetic carry a SymInt (or number) as meta["val"]; its get_attr nodes
are constants (the backend's held values), which no forward writes.
Guarantees: only deterministic, non-mutating ATen ops of sizes and constants alone are kept;
no kept value is returned by the graph, aliased by what it returns, or read by a mutating op (a
caller may write to what it is returned); a value is the one PyTorch computes for the same sizes;
at most SIZES_KEPT sizes and VALUES_AT_MOST bytes are kept per value, least recently used first
out; a value larger than that is computed on each call, as before. Not used where the forward is
replayed from CUDA graphs (a replay launches nothing from Python anyway).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Set

import torch

# The most sizes one PerSizeValues keeps, and the most bytes of values it holds.
SIZES_KEPT = 16
VALUES_AT_MOST = 64 << 20

# What a size of a dynamic-shape graph is (a placeholder s0, the arithmetic s0 * 128): a host number.
_SIZES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


class PerSizeValues(torch.nn.Module):
    """One value of the sizes alone: `graph` computes it from its placeholders (sizes, then
    constants); calls with the same sizes return the same tensor."""

    def __init__(self, graph: torch.fx.GraphModule, sizes: int):
        super().__init__()
        self.graph = graph
        self.sizes = sizes  # how many leading arguments are sizes (the rest are constants)
        self._kept: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def forward(self, *args):
        key = tuple(args[:self.sizes])
        with self._lock:
            value = self._kept.get(key)
            if value is not None:
                self._kept.move_to_end(key)
                return value
        value = self.graph(*args)
        size = value.numel() * value.element_size()
        if size > VALUES_AT_MOST:
            return value
        with self._lock:
            if key not in self._kept:
                self._kept[key] = value
                self._bytes += size
                while len(self._kept) > SIZES_KEPT or self._bytes > VALUES_AT_MOST:
                    _, dropped = self._kept.popitem(last=False)
                    self._bytes -= dropped.numel() * dropped.element_size()
        return value


def memoize_size_only(gm: torch.fx.GraphModule, may_alias: Callable[[torch.fx.Node], bool]) -> List[torch.fx.Node]:
    """Replaces the values of sizes alone that the rest of gm reads with PerSizeValues modules.
    `may_alias`: whether an ATen node's value may be a view of its inputs' (torch.py's rule).
    Returns the ATen nodes no forward computes per call now (for the report)."""
    kept = _size_only_nodes(gm, may_alias)
    read = [n for n in gm.graph.nodes if n in kept and any(u not in kept for u in n.users)]
    if not read:
        return []
    for index, n in enumerate(read):
        name = f"_kiln_per_size_{index}"
        while hasattr(gm, name):
            name += "_"
        sub, leaves, sizes = _extracted(gm, n, kept)
        gm.add_submodule(name, PerSizeValues(sub, sizes))
        with gm.graph.inserting_before(n):
            call = gm.graph.call_module(name, tuple(leaves))
        call.meta = dict(n.meta)
        n.replace_all_uses_with(call, delete_user_cb=lambda u: u is not call and u not in kept)
    gone = []
    for n in reversed(list(gm.graph.nodes)):  # (readers first)
        if n in kept and not n.users:
            gone.insert(0, n)
            gm.graph.erase_node(n)
    gm.recompile()
    return gone


def _size_only_nodes(gm: torch.fx.GraphModule, may_alias: Callable[[torch.fx.Node], bool]) -> Set[torch.fx.Node]:
    """ATen tensor ops whose inputs are sizes, constants and such ops, at least one size among
    what they read; none returned, aliased by what is returned, or read by a mutating op."""
    excluded = returned(gm, may_alias) | {n for n in gm.graph.nodes if any(_mutates(u) for u in n.users)}
    kept: Set[torch.fx.Node] = set()
    of_sizes: Set[torch.fx.Node] = set()  # kept nodes that read a size, directly or through others
    for n in gm.graph.nodes:
        if n in excluded or not _computable(n):
            continue
        inputs = n.all_input_nodes
        if not all(a in kept or _is_size(a) or a.op == "get_attr" for a in inputs):
            continue
        if any(_is_symbolic_size(a) or a in of_sizes for a in inputs):
            kept.add(n)
            of_sizes.add(n)
    return kept


def _computable(n: torch.fx.Node) -> bool:
    if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in n.target.tags or n.target._schema.is_mutable:
        return False
    return isinstance(n.meta.get("val"), torch.Tensor)


def _is_size(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), _SIZES)


def _is_symbolic_size(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _mutates(n: torch.fx.Node) -> bool:
    """Whether a node may write to what it reads: a mutating ATen op, or a callable of unknown effect
    (the size arithmetic of Python's operator module writes nothing)."""
    if n.op != "call_function":
        return False
    if isinstance(n.target, torch._ops.OpOverload):
        return n.target._schema.is_mutable
    return getattr(n.target, "__module__", None) not in ("_operator", "operator")


def returned(gm: torch.fx.GraphModule, may_alias: Callable[[torch.fx.Node], bool]) -> Set[torch.fx.Node]:
    """What the graph returns, and what that may be a view of: through ATen nodes as `may_alias`
    says, through a module by what its graph returns (a kiln subgraph returns its inputs' views as
    PyTorch's views, KilnSubgraph.gm)."""
    out: Set[torch.fx.Node] = set()
    for n in reversed(gm.graph.nodes):
        if any(u.op == "output" or (u in out and _user_may_alias(gm, u, n, may_alias)) for u in n.users):
            out.add(n)
    return out


def _user_may_alias(gm: torch.fx.GraphModule, user: torch.fx.Node, n: torch.fx.Node,
                    may_alias: Callable[[torch.fx.Node], bool]) -> bool:
    if user.op != "call_module":
        return may_alias(user)
    inner = gm.get_submodule(user.target)
    inner = getattr(inner, "gm", inner)
    if not isinstance(inner, torch.fx.GraphModule) or user.kwargs:
        return True
    placeholders = [p for p in inner.graph.nodes if p.op == "placeholder"]
    inner_returned = returned(inner, may_alias)
    return any(a is n and (i >= len(placeholders) or placeholders[i] in inner_returned) for i, a in enumerate(user.args))


def _extracted(gm: torch.fx.GraphModule, value: torch.fx.Node, kept: Set[torch.fx.Node]):
    """The graph computing `value` from its leaves (sizes first, then constants), the leaves in
    that order, and how many are sizes."""
    needed: Set[torch.fx.Node] = set()
    stack = [value]
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(a for a in n.all_input_nodes if a in kept)
    leaves = _ordered({a for n in needed for a in n.all_input_nodes if a not in kept}, gm.graph.nodes)
    sizes = [a for a in leaves if _is_size(a)]
    constants = [a for a in leaves if not _is_size(a)]
    graph = torch.fx.Graph()
    env: Dict[torch.fx.Node, torch.fx.Node] = {}
    for a in sizes + constants:
        env[a] = graph.placeholder(f"leaf_{len(env)}")
    for n in _ordered(needed, gm.graph.nodes):
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[value])
    return torch.fx.GraphModule(torch.nn.Module(), graph), sizes + constants, len(sizes)


def _ordered(nodes: Set[torch.fx.Node], order: Iterable[torch.fx.Node]) -> List[torch.fx.Node]:
    return [n for n in order if n in nodes]
