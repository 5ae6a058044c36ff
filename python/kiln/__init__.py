"""kiln from Python: build or load an op graph, compile it into fused GPU
kernels, run it on PyTorch, CuPy or JAX arrays without copies (NumPy
arrays run the reference interpreter). The contract is python.md.

    import kiln, torch
    b = kiln.GraphBuilder("mlp")
    x = b.input("x", [64, 512], "bf16")
    w = b.input("w", [512, 256], "bf16")
    b.output(b.gelu(b.matmul(x, w), dtype="bf16"), name="y")
    exe = kiln.compile(b.build())
    y = exe(x=torch.randn(64, 512, dtype=torch.bfloat16, device="cuda"),
            w=torch.randn(512, 256, dtype=torch.bfloat16, device="cuda"))["y"]
"""
from ._errors import BindingError, CompileError, DeviceError, GraphError, KilnError, OutOfMemoryError
from ._graph import OP_TABLE, Dim, Graph, GraphBuilder, Tensor, TensorSpec
from ._executable import Executable, compile
from ._warm import warm
from . import _kiln

__all__ = ["Dim", "Graph", "GraphBuilder", "Tensor", "TensorSpec", "Executable", "compile", "warm", "set_log",
           "KilnError", "GraphError", "BindingError", "CompileError", "DeviceError", "OutOfMemoryError", "OP_TABLE"]
__version__ = "0.1.0"


import atexit as _atexit

_atexit.register(_kiln.set_log, None)


def set_log(callback) -> None:
    """Where the library's diagnostics go: callback(level, message), or None (nowhere, the default)."""
    _kiln.set_log(callback)
