"""Where a model's time goes under the kiln backend: one forward profiled
(CUDA kernels in launch order, with durations), next to the kiln plan's
kernels (kind and ops). kiln's kernels are all named kiln_kernel; their
order is the plan's.

    python3 bench/profile_kiln_model.py llama
"""
import gc
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import kiln.torch as kt
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_models import MODELS, on_device  # noqa: E402


def kiln_subgraphs():
    """Every live KilnSubgraph the backend made (their executables carry the plans)."""
    found = []
    for m in gc.get_objects():
        try:
            if isinstance(m, kt.KilnSubgraph):
                found.append(m)
        except ReferenceError:
            continue
    return found


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "llama"
    dump = sys.argv[2] if len(sys.argv) > 2 else None  # a folder: the kiln graphs as JSON, written before they run
    model, inputs = on_device(name, *MODELS[name]()[:2])
    with torch.no_grad():
        compiled = torch.compile(model, backend="kiln", dynamic=False)
        if dump:
            import os
            os.makedirs(dump, exist_ok=True)
            original = kt.kiln_compile

            def compile_and_dump(graph, **kw):
                with open(os.path.join(dump, f"{graph.name}-{graph.hash[:8]}.json"), "w") as f:
                    f.write(graph.to_json())
                return original(graph, **kw)
            kt.kiln_compile = compile_and_dump
        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            compiled(*inputs)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"{len(kernels)} GPU kernels, {sum(e.device_time for e in kernels) / 1e3:.3f} ms")
    plans = [exe.plan for m in kiln_subgraphs() for exe, _ in m._executables.values() if exe is not None]
    steps = iter([k for p in plans for k in p["kernels"]])
    for e in kernels:
        k = next(steps, None) if e.name == "kiln_kernel" else None
        what = f"{k['kind']:10s} {','.join(k['ops'])[:90]}" if k else ""
        print(f"{e.device_time:10.1f} us  {e.name[:40]:40s} {what}")


if __name__ == "__main__":
    main()
