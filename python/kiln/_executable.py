"""Compiling and running (python.md, "Compiling and running")."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _kiln
from ._arrays import Bound, _contiguous, allocate, bind, current_stream, strides_agree
from ._errors import BindingError
from ._graph import Graph


def compile(graph: Graph, *, arch: Optional[str] = None, fuse: bool = True, autotune: bool = False,
            cache_dir: Optional[str] = None) -> "Executable":
    """Plans, generates and compiles every kernel (or finds it in the cache).

    Needs a GPU only for `autotune`. The GIL is released while NVRTC runs.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"kiln.compile takes a kiln.Graph, not a {type(graph).__name__}")
    native = _kiln.compile(graph._native, arch=arch, fuse=fuse, autotune=autotune,
                           cache_dir=None if cache_dir is None else str(cache_dir))
    return Executable(graph, native)


class Executable:
    """A compiled graph. Calling it runs it on the inputs' device, on the
    caller's current stream, without synchronising."""

    def __init__(self, graph: Graph, native: "_kiln.Executable"):
        self.graph = graph
        self._native = native
        self.arch: str = native.arch
        self._plan: Optional[dict] = None
        self.kernels: List[dict] = native.kernel_reports()
        self._tactics: List[str] = native.kernel_tactics()  # (for kiln.torch.explain)
        self.workspace_bytes: int = native.workspace_bytes
        self._inputs: List[Tuple[str, Tuple[int, ...], str, Tuple[int, ...]]] = [
            (n, s.shape, s.dtype, s.strides) for n, s in graph.inputs.items()]
        self._outputs: List[Tuple[str, Tuple[int, ...], str]] = [
            (n, s.shape, dtype) for (n, s), dtype in zip(graph.outputs.items(), native.output_storage_dtypes())]
        # A symbolic graph (python.md, b.dim): compiled once for every size; each
        # call reads the sizes from the inputs' shapes and sizes the outputs by them.
        self._symbolic = bool(graph.dims)
        self._input_names = [n for n, *_ in self._inputs]
        self._output_names = [n for n, *_ in self._outputs]
        # The fast path for PyTorch tensors: (shape, strides, dtype, device) of
        # every input (output) as last bound, compared in one step; any
        # difference takes the checked path, which may accept it and update these.
        self._torch_inputs = None
        self._torch_outputs = None
        self._torch_empty = None  # per output: (shape, dtype, device) for torch.empty
        self._torch_scratch = 0  # the workspace bytes of the last checked call's sizes
        self._torch_shapes: List[List[int]] = []  # the inputs' shapes of that call (a symbolic graph binds them)
        self._raw_stream = None

    def __repr__(self) -> str:
        return f"kiln.Executable({self.graph.name!r}, {len(self.kernels)} kernels, {self.arch})"

    @property
    def plan(self) -> dict:
        """The plan its kernels were made from, as `kiln plan --json` prints it
        for this arch: planned when first read (a program found in the cache
        needed none)."""
        if self._plan is None:
            self._plan = json.loads(self._native.plan_json)
        return self._plan

    # ---- binding ----

    def _bind_inputs(self, inputs: Mapping[str, Any]) -> List[Bound]:
        if len(inputs) != len(self._inputs) or any(n not in inputs for n in self._input_names):
            for name in inputs:
                if name not in self._input_names:
                    raise BindingError(f"'{name}' is not an input of graph '{self.graph.name}' "
                                       f"(inputs: {', '.join(self._input_names)})")
            missing = [n for n in self._input_names if n not in inputs]
            raise BindingError(f"input '{missing[0]}' is not given (graph '{self.graph.name}' has inputs "
                               f"{', '.join(self._input_names)})")
        bound = []
        for name, shape, dtype, strides in self._inputs:
            b = bind(inputs[name], f"input '{name}'")
            if self._symbolic:  # (the sizes are checked against `dims` by the launch; contiguous unless declared)
                strides = _contiguous(b.shape) if tuple(strides) == tuple(_contiguous(shape)) else strides
                shape = b.shape
            if b.shape != shape:
                raise BindingError(f"input '{name}': shape {list(b.shape)} given, {list(shape)} expected")
            if b.dtype != dtype and not (b.library == "numpy" and dtype == "bf16" and b.dtype == "f32"):
                # (NumPy has no bfloat16: float32 arrays bind to bf16 inputs, rounded as `kiln run` rounds them.)
                raise BindingError(f"input '{name}': dtype {b.dtype_text} given, {dtype} expected")
            if not strides_agree(shape, b.strides, strides):
                raise BindingError(f"input '{name}': strides {list(b.strides)} given; the graph declares {list(strides)} "
                                   "(pass an array laid out so, or declare its strides in the graph)")
            bound.append(b)
        first = bound[0] if bound else None
        for b, (name, *_) in zip(bound, self._inputs):
            if b.device != first.device:
                raise BindingError(f"input '{name}' is on {_where(b)} while input '{self._inputs[0][0]}' is on "
                                   f"{_where(first)}: bind arrays of one device")
        return bound

    def _output_specs(self, ins: List[Bound]) -> List[Tuple[str, Tuple[int, ...], str]]:
        """(name, shape, dtype) of each output for these inputs: a symbolic
        graph's at the sizes they bind (a BindingError where they break `dims`)."""
        if not self._symbolic:
            return self._outputs
        shapes = self._native.output_shapes([list(b.shape) for b in ins])
        return [(name, tuple(shape), dtype) for (name, _, dtype), shape in zip(self._outputs, shapes)]

    def _shapes(self, ins: List[Bound]) -> List[List[int]]:
        return [list(b.shape) for b in ins] if self._symbolic else []

    def _bind_outputs(self, outputs: Mapping[str, Any], device: Tuple[str, int],
                      specs: Optional[List[Tuple[str, Tuple[int, ...], str]]] = None) -> List[Bound]:
        names = [n for n, *_ in self._outputs]
        for name in outputs:
            if name not in names:
                raise BindingError(f"'{name}' is not an output of graph '{self.graph.name}' (outputs: {', '.join(names)})")
        bound = []
        for name, shape, dtype in (specs if specs is not None else self._outputs):
            if name not in outputs:
                raise BindingError(f"output '{name}' is not given")
            b = bind(outputs[name], f"output '{name}'")
            if b.shape != shape:
                raise BindingError(f"output '{name}': shape {list(b.shape)} given, {list(shape)} expected")
            if b.dtype != dtype:
                raise BindingError(f"output '{name}': dtype {b.dtype_text} given, {dtype} expected")
            if not strides_agree(shape, b.strides, _contiguous(shape)):
                raise BindingError(f"output '{name}': outputs are contiguous; strides {list(b.strides)} given")
            if b.device != device:
                raise BindingError(f"output '{name}' is on {_where(b)}, the inputs on {_where_device(device)}")
            bound.append(b)
        return bound

    # ---- running ----

    def _fast_torch(self, inputs: Mapping[str, Any], expected) -> Optional[List[int]]:
        """Pointers of PyTorch CUDA tensors laid out exactly as last time, else None."""
        if expected is None or len(inputs) != len(expected[0]):
            return None
        try:
            tensors = [inputs[n] for n in expected[0]]
            if [(t.shape, t.stride(), t.dtype, t.device) for t in tensors] != expected[1]:
                return None
            return [t.data_ptr() for t in tensors]
        except (KeyError, AttributeError, TypeError):
            return None

    @staticmethod
    def _torch_signature(names: List[str], bound: List[Bound]):
        if not bound or any(b.library != "torch" or b.device[0] != "cuda" for b in bound):
            return None
        return (names, [(b.array.shape, b.array.stride(), b.array.dtype, b.array.device) for b in bound])

    def __call__(self, inputs: Optional[Mapping[str, Any]] = None, /, *, stream: Any = None, **named: Any) -> Dict[str, Any]:
        """Runs the graph; returns its outputs by name, allocated by the inputs' library."""
        if inputs is not None and named:
            raise BindingError("pass the inputs either as a dict or as keywords, not both")
        given = inputs if inputs is not None else named
        pointers = self._fast_torch(given, self._torch_inputs)
        if pointers is not None and stream is None:
            return self._run_as_last_checked(pointers)
        ins = self._bind_inputs(given)
        like = ins[0] if ins else None
        if like is None or like.device[0] == "cpu":
            return self._run_reference(ins)
        specs = self._output_specs(ins)
        outs = {name: allocate(like, shape, dtype) for name, shape, dtype in specs}
        bound_outs = self._bind_outputs(outs, like.device, specs)
        self._launch(ins, bound_outs, like, stream, None)
        self._remember_torch(ins, bound_outs)
        if like.library == "jax":
            return _to_jax(outs)
        return outs

    def _run_as_last_checked(self, pointers: List[int]) -> Dict[str, Any]:
        """The fast path's launch: PyTorch CUDA inputs (their data pointers, in
        input order) laid out exactly as in the last checked call, which the
        caller has established; outputs allocated as then."""
        import torch
        outs = {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, dtype, device) in self._torch_empty}
        where = self._torch_inputs[1][0][3]
        # the workspace from PyTorch's pool, stream-ordered like the outputs (a symbolic graph's at these sizes)
        need = self._torch_scratch
        scratch = torch.empty(need, dtype=torch.uint8, device=where).data_ptr() if need else 0
        device = where.index or 0
        self._native.launch(pointers, [t.data_ptr() for t in outs.values()], scratch, self._raw_stream(device), device,
                            self._torch_shapes)
        return outs

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], *, stream: Any = None,
            workspace: Any = None) -> None:
        """Runs the graph into the caller's outputs. With `workspace` (an
        array of at least `workspace_bytes` bytes on the device) or a graph
        that needs none, nothing is allocated: a CUDA graph can capture it."""
        if stream is None:
            pointers = self._fast_torch(inputs, self._torch_inputs)
            out_pointers = self._fast_torch(outputs, self._torch_outputs) if pointers is not None else None
            scratch = self._fast_workspace(workspace) if out_pointers is not None else None
            if scratch is not None:
                device = self._torch_inputs[1][0][3].index or 0
                self._native.launch(pointers, out_pointers, scratch, self._raw_stream(device), device, self._torch_shapes)
                return None
        ins = self._bind_inputs(inputs)
        like = ins[0] if ins else None
        if like is None or like.device[0] == "cpu":
            results = self._run_reference(ins)
            outs = self._bind_outputs(outputs, like.device if like else ("cpu", 0), self._output_specs(ins))
            for b, (name, *_rest) in zip(outs, self._outputs):
                _copy_host(results[name], b.array)
            return None
        bound_outs = self._bind_outputs(outputs, like.device, self._output_specs(ins))
        self._launch(ins, bound_outs, like, stream, workspace)
        self._remember_torch(ins, bound_outs)
        return None

    def _fast_workspace(self, workspace: Any) -> Optional[int]:
        """The fast path's workspace pointer: 0 where the last checked call's sizes need none, a given
        PyTorch tensor on the inputs' device holding enough bytes; else None (the checked path binds,
        checks or allocates it)."""
        need = self._torch_scratch
        if not need:
            return 0
        try:
            if (workspace is not None and workspace.device == self._torch_inputs[1][0][3] and workspace.is_contiguous()
                    and workspace.numel() * workspace.element_size() >= need):
                return workspace.data_ptr()
        except AttributeError:  # (not a PyTorch tensor)
            pass
        return None

    def _remember_torch(self, ins: List[Bound], outs: List[Bound]) -> None:
        """After a checked launch of PyTorch CUDA tensors: what the fast path compares with."""
        signature = self._torch_signature(self._input_names, ins)
        if signature is None:
            return
        self._torch_inputs = signature
        self._torch_outputs = self._torch_signature(self._output_names, outs)
        self._torch_empty = [(name, (tuple(b.shape), b.array.dtype, b.array.device))
                             for name, b in zip(self._output_names, outs)]
        self._torch_scratch = self._workspace_bytes_for(ins)
        self._torch_shapes = self._shapes(ins)  # (a symbolic graph's sizes: the launch binds them)
        if self._raw_stream is None:
            import torch
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            self._raw_stream = raw or (lambda index: torch.cuda.current_stream(index).cuda_stream)

    def _workspace_bytes_for(self, ins: List[Bound]) -> int:
        """The scratch a launch of these inputs needs: workspace_bytes, or a symbolic graph's at their sizes."""
        if not self._symbolic or not self.workspace_bytes:
            return self.workspace_bytes
        return self._native.workspace_bytes_at(self._shapes(ins))

    def _launch(self, ins: List[Bound], outs: List[Bound], like: Bound, stream: Any, workspace: Any) -> None:
        handle = current_stream(like, stream)
        scratch = 0
        need = self._workspace_bytes_for(ins)
        if need:
            if workspace is None:
                # From the inputs' own pool, on the stream (PyTorch's caching allocator is stream-ordered).
                workspace = allocate(like, (need,), "bool")
            w = bind(workspace, "workspace")
            if w.device != like.device:
                raise BindingError(f"workspace is on {_where(w)}, the inputs on {_where(like)}")
            if _bytes(w) < need:
                raise BindingError(f"workspace: {_bytes(w)} bytes given, {need} needed")
            scratch = w.pointer
        self._native.launch([b.pointer for b in ins], [b.pointer for b in outs], scratch, handle, like.device[1],
                            self._shapes(ins))

    def _run_reference(self, ins: List[Bound]) -> Dict[str, Any]:
        import numpy as np
        arrays = [_host_view(b) for b in ins]
        try:
            results = self.graph._native.run_reference(arrays)
        except TypeError as e:  # (nanobind could not take an array: bind() refuses those it knows of)
            raise BindingError(f"graph '{self.graph.name}': an input kiln cannot read on the CPU: {e}") from None
        library = ins[0].library if ins else "numpy"
        out = {}
        for (name, shape, dtype), value in zip(self._outputs, results):
            if library == "torch":
                from ._arrays import _TORCH_BY_KILN, _torch
                _torch()
                out[name] = __import__("torch").from_numpy(value).to(_TORCH_BY_KILN[dtype])
            elif dtype == "f16":
                out[name] = value.astype(np.float16)
            else:
                out[name] = value  # f32, bool; bf16 as float32 (NumPy has no bfloat16), as `kiln run` writes it
        return out


def _where(b: Bound) -> str:
    return _where_device(b.device)


def _where_device(device: Tuple[str, int]) -> str:
    return "the CPU" if device[0] == "cpu" else f"cuda:{device[1]}"


def _bytes(b: Bound) -> int:
    n = 1
    for d in b.shape:
        n *= d
    return n * getattr(getattr(b.array, "dtype", None), "itemsize", 1)


def _host_view(b: Bound):
    """A host array the extension reads through DLPack (bf16 torch tensors as they are)."""
    return b.array.detach() if b.library == "torch" else b.array


def _copy_host(value, target) -> None:
    if type(target).__module__.split(".")[0] == "torch":
        import torch
        target.copy_(value if isinstance(value, torch.Tensor) else torch.from_numpy(value))
    else:
        target[...] = value


def _to_jax(outputs: Dict[str, Any]) -> Dict[str, Any]:
    import jax.dlpack
    import torch
    torch.cuda.synchronize()  # JAX's streams do not see kiln's; finish before handing the arrays over
    return {name: jax.dlpack.from_dlpack(t) for name, t in outputs.items()}
