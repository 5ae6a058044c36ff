"""Where a model's host time goes under the kiln backend: the Python
functions of 50 forwards (cProfile, by own time and by cumulative time),
next to the GPU time of one forward, so that host time per kernel can be
counted.

    python3 bench/host_profile_model.py bert [--dynamic]

With --dynamic the model is compiled with dynamic=True and run once at
another size first (its batch doubled), so the forward profiled is the
symbolic graph's: its host time against the integer graph's.
"""
import cProfile
import pstats
import sys
import time

import torch

import kiln.torch  # noqa: F401  (registers the backend)
sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_models import MODELS, on_device  # noqa: E402


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dynamic = "--dynamic" in sys.argv
    name = args[0] if args else "bert"
    model, inputs = on_device(name, *MODELS[name]()[:2])
    with torch.no_grad():
        compiled = torch.compile(model, backend="kiln", dynamic=dynamic)
        if dynamic:  # (another batch first: the forward below is the symbolic graph's)
            compiled(*[torch.cat([t, t]) if isinstance(t, torch.Tensor) else t for t in inputs])
        for _ in range(5):
            compiled(*inputs)
        torch.cuda.synchronize()
        walls = []
        for _ in range(50):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            compiled(*inputs)
            walls.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        walls.sort()
        print(f"{name}{' (dynamic=True)' if dynamic else ''}: host time per forward, median {walls[25] * 1e3:.3f} ms, min {walls[0] * 1e3:.3f} ms")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(50):
            compiled(*inputs)
        profiler.disable()
        torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(35)
    stats.sort_stats("cumulative").print_stats(45)


if __name__ == "__main__":
    main()
