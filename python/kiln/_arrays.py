"""Arrays of every library as kiln binds them: where they live, their
layout, and how to allocate outputs with the same library.

PyTorch tensors are read through their own attributes (the fast path);
CuPy arrays through __cuda_array_interface__; anything else with
__dlpack__ (JAX, NumPy, ...) through DLPack, by the extension.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from ._errors import BindingError

_TORCH_DTYPES: dict = {}
_TORCH_BY_KILN: dict = {}


def _torch():
    torch = sys.modules.get("torch")
    if torch is not None and not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.bool: "bool"})
        _TORCH_BY_KILN.update({v: k for k, v in _TORCH_DTYPES.items()})
    return torch


_NUMPY_KILN = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "bool": "bool"}
_DLPACK_CPU, _DLPACK_CUDA = 1, 2  # DLDeviceType


@dataclass
class Bound:
    """One array as a binding: its library, device, pointer and layout."""

    library: str              # "torch", "cupy", "jax", "numpy", "dlpack"
    device: Tuple[str, int]   # ("cpu", 0) or ("cuda", index)
    pointer: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    dtype: Optional[str]      # kiln's name, None for dtypes kiln does not store
    dtype_text: str           # the library's name, for messages
    array: Any


def bind(x: Any, what: str) -> Bound:
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type not in ("cpu", "cuda"):
            raise BindingError(f"{what}: a tensor on {x.device}; kiln binds CPU and CUDA tensors")
        if x.is_neg() or x.is_conj():
            # (a lazy negation or conjugation: the storage holds the values without it)
            raise BindingError(f"{what}: a {'negative' if x.is_neg() else 'conjugate'} view, whose storage does not "
                               "hold its values; pass x.resolve_neg() / x.resolve_conj()")
        device = ("cuda", x.device.index or 0) if x.is_cuda else ("cpu", 0)
        return Bound("torch", device, x.data_ptr(), tuple(x.shape), tuple(x.stride()), _TORCH_DTYPES.get(x.dtype),
                     str(x.dtype), x)
    module = type(x).__module__.split(".")[0]
    if module == "cupy":
        cai = x.__cuda_array_interface__
        itemsize = x.dtype.itemsize
        strides = cai.get("strides")
        shape = tuple(cai["shape"])
        elem = tuple(s // itemsize for s in strides) if strides else _contiguous(shape)
        return Bound("cupy", ("cuda", x.device.id), cai["data"][0], shape, elem, _NUMPY_KILN.get(x.dtype.name),
                     x.dtype.name, x)
    if module == "numpy":
        import numpy as np
        if isinstance(x, np.ndarray):
            if not x.dtype.isnative:
                raise BindingError(f"{what}: big-endian {x.dtype.name} (not this machine's byte order); "
                                   "pass x.astype(x.dtype.newbyteorder('='))")
            if x.itemsize and any(s % x.itemsize for s in x.strides):
                raise BindingError(f"{what}: byte strides {list(x.strides)} are not multiples of the {x.itemsize}-byte "
                                   "item size (a view of a record array?); pass np.ascontiguousarray(x)")
            elem = tuple(s // x.itemsize for s in x.strides) if x.itemsize else ()
            return Bound("numpy", ("cpu", 0), x.__array_interface__["data"][0], x.shape, elem,
                         _NUMPY_KILN.get(x.dtype.name), x.dtype.name, x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        from . import _kiln
        try:
            pointer, shape, strides, dtype, device_type, device_id = _kiln.dlpack_info(x)
        except TypeError as e:  # (nanobind could not take the array through DLPack)
            raise BindingError(f"{what}: a {type(x).__module__}.{type(x).__name__} kiln cannot read through DLPack: {e}") from None
        library = "jax" if module in ("jax", "jaxlib") else "dlpack"
        if device_type not in (_DLPACK_CPU, _DLPACK_CUDA):
            raise BindingError(f"{what}: an array on DLPack device type {device_type}; kiln binds CPU and CUDA arrays")
        device = ("cuda", device_id) if device_type == _DLPACK_CUDA else ("cpu", 0)
        return Bound(library, device, pointer, tuple(shape), tuple(strides), dtype or None, dtype or "an unsupported dtype", x)
    raise BindingError(f"{what}: a {type(x).__module__}.{type(x).__name__} is not an array kiln can bind "
                       "(PyTorch, CuPy, JAX, NumPy or any object with __dlpack__)")


def _contiguous(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def strides_agree(shape: Tuple[int, ...], given: Tuple[int, ...], declared: Tuple[int, ...]) -> bool:
    """Strides bind when they agree wherever a dimension has more than one element."""
    return all(n == 1 or g == d for n, g, d in zip(shape, given, declared))


def allocate(like: Bound, shape: Tuple[int, ...], dtype: str):
    """An output array of the inputs' library on their device."""
    if like.library == "torch":
        torch = _torch()
        device = torch.device("cuda", like.device[1]) if like.device[0] == "cuda" else torch.device("cpu")
        return torch.empty(shape, dtype=_TORCH_BY_KILN[dtype], device=device)
    if like.library == "cupy":
        import cupy
        if dtype == "bf16":
            raise BindingError("CuPy has no bfloat16 arrays: bind a bf16 output through PyTorch or JAX")
        with cupy.cuda.Device(like.device[1]):
            return cupy.empty(shape, dtype={"f32": "float32", "f16": "float16", "bool": "bool"}[dtype])
    if like.library in ("jax", "dlpack") and like.device[0] == "cuda":
        # JAX arrays are immutable: the output is allocated by PyTorch and handed over by DLPack.
        import torch  # noqa: F401  (so that _torch() finds it)
        torch = _torch()
        return torch.empty(shape, dtype=_TORCH_BY_KILN[dtype], device=torch.device("cuda", like.device[1]))
    raise BindingError(f"cannot allocate outputs for {like.library} arrays; pass outputs to run()")


def current_stream(like: Bound, stream: Any) -> int:
    """The stream handle to launch on: the caller's `stream=`, else the library's current one."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        if hasattr(stream, "__cuda_stream__"):
            return int(stream.__cuda_stream__()[1])
        for attribute in ("cuda_stream", "ptr", "handle"):
            if hasattr(stream, attribute):
                return int(getattr(stream, attribute))
        raise BindingError(f"stream: a {type(stream).__name__} is not a CUDA stream (an int or an object with __cuda_stream__)")
    if like.library == "torch":
        torch = _torch()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(like.device[1]) if raw else torch.cuda.current_stream(like.device[1]).cuda_stream
    if like.library == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0
