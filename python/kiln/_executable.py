"""Compiling and running (python.md, "Compiling and running")."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _kiln
from ._arrays import Bound, allocate, bind, current_stream, strides_agree
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
        self.plan: dict = json.loads(native.plan_json)
        self.kernels: List[dict] = native.kernel_reports()
        self.workspace_bytes: int = native.workspace_bytes
        self._inputs: List[Tuple[str, Tuple[int, ...], str, Tuple[int, ...]]] = [
            (n, s.shape, s.dtype, s.strides) for n, s in graph.inputs.items()]
        self._outputs: List[Tuple[str, Tuple[int, ...], str]] = [
            (n, s.shape, dtype) for (n, s), dtype in zip(graph.outputs.items(), native.output_storage_dtypes())]
        self._input_names = [n for n, *_ in self._inputs]

    def __repr__(self) -> str:
        return f"kiln.Executable({self.graph.name!r}, {len(self.kernels)} kernels, {self.arch})"

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
            if b.shape != shape:
                raise BindingError(f"input '{name}': shape {list(b.shape)} given, {list(shape)} expected")
            if b.dtype != dtype:
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

    def _bind_outputs(self, outputs: Mapping[str, Any], device: Tuple[str, int]) -> List[Bound]:
        names = [n for n, *_ in self._outputs]
        for name in outputs:
            if name not in names:
                raise BindingError(f"'{name}' is not an output of graph '{self.graph.name}' (outputs: {', '.join(names)})")
        bound = []
        for name, shape, dtype in self._outputs:
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

    def __call__(self, inputs: Optional[Mapping[str, Any]] = None, /, *, stream: Any = None, **named: Any) -> Dict[str, Any]:
        """Runs the graph; returns its outputs by name, allocated by the inputs' library."""
        if inputs is not None and named:
            raise BindingError("pass the inputs either as a dict or as keywords, not both")
        ins = self._bind_inputs(inputs if inputs is not None else named)
        like = ins[0] if ins else None
        if like is None or like.device[0] == "cpu":
            return self._run_reference(ins)
        outs = {name: allocate(like, shape, dtype) for name, shape, dtype in self._outputs}
        self._launch(ins, self._bind_outputs(outs, like.device), like, stream, None)
        if like.library == "jax":
            return _to_jax(outs)
        return outs

    def run(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], *, stream: Any = None,
            workspace: Any = None) -> None:
        """Runs the graph into the caller's outputs. With `workspace` (an
        array of at least `workspace_bytes` bytes on the device) or a graph
        that needs none, nothing is allocated: a CUDA graph can capture it."""
        ins = self._bind_inputs(inputs)
        like = ins[0] if ins else None
        if like is None or like.device[0] == "cpu":
            results = self._run_reference(ins)
            outs = self._bind_outputs(outputs, like.device if like else ("cpu", 0))
            for b, (name, *_rest) in zip(outs, self._outputs):
                _copy_host(results[name], b.array)
            return None
        self._launch(ins, self._bind_outputs(outputs, like.device), like, stream, workspace)
        return None

    def _launch(self, ins: List[Bound], outs: List[Bound], like: Bound, stream: Any, workspace: Any) -> None:
        handle = current_stream(like, stream)
        scratch = 0
        if self.workspace_bytes:
            if workspace is None:
                # From the inputs' own pool, on the stream (PyTorch's caching allocator is stream-ordered).
                workspace = allocate(like, (self.workspace_bytes,), "bool")
            w = bind(workspace, "workspace")
            if w.device != like.device:
                raise BindingError(f"workspace is on {_where(w)}, the inputs on {_where(like)}")
            if _bytes(w) < self.workspace_bytes:
                raise BindingError(f"workspace: {_bytes(w)} bytes given, {self.workspace_bytes} needed")
            scratch = w.pointer
        self._native.launch([b.pointer for b in ins], [b.pointer for b in outs], scratch, handle, like.device[1])

    def _run_reference(self, ins: List[Bound]) -> Dict[str, Any]:
        import numpy as np
        arrays = [_host_view(b) for b in ins]
        results = self.graph._native.run_reference(arrays)
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


def _contiguous(shape):
    from ._arrays import _contiguous as c
    return c(shape)


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
        target.copy_(torch.from_numpy(value))
    else:
        target[...] = value


def _to_jax(outputs: Dict[str, Any]) -> Dict[str, Any]:
    import jax.dlpack
    import torch
    torch.cuda.synchronize()  # JAX's streams do not see kiln's; finish before handing the arrays over
    return {name: jax.dlpack.from_dlpack(t) for name, t in outputs.items()}
