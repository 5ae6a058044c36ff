"""Cross-check kiln's CPU reference interpreter against an independent
evaluation of the same graph in PyTorch (bench/torch_graph.py, float64).

For every example graph: `kiln run --device cpu --random SEED --outputs DIR`
writes the inputs it drew and its outputs; PyTorch evaluates the graph on
those inputs; the two must agree to ||kiln - torch|| / ||torch|| below the
output's rounding level. Needs PyTorch and numpy (the GPU machine has both).
Prints one line per output and a closing 'N passed, N failed' line.
"""
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import torch_graph  # noqa: E402

TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1e-2, "bool": 0.0}


def main():
    kiln, root = sys.argv[1], sys.argv[2]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    passed = failed = 0
    for path in sorted(glob.glob(os.path.join(root, "examples", "**", "*.json"), recursive=True)):
        graph = torch_graph.load(path)
        info = torch_graph.annotate(graph)
        for seed in (1, 2):
            with tempfile.TemporaryDirectory() as out:
                subprocess.run([kiln, "run", path, "--device", "cpu", "--random", str(seed), "--outputs", out],
                               check=True, capture_output=True)
                inputs = {n: torch.from_numpy(np.load(os.path.join(out, n + ".npy"))).to(device)
                          for n in graph["inputs"]}
                want = torch_graph.evaluate(graph, inputs, torch.float64, info)
                for name, ref in want.items():
                    got = torch.from_numpy(np.load(os.path.join(out, name + ".npy"))).to(device)
                    ref = ref.to(got.dtype) if info[name].dtype == "bool" else ref
                    if info[name].dtype == "bool":
                        err = float((got != ref).float().mean())
                    else:
                        got64, ref64 = got.double(), ref.double()
                        same_nonfinite = bool(torch.equal(torch.isfinite(got64), torch.isfinite(ref64)))
                        fin = torch.isfinite(ref64)
                        num = torch.linalg.norm((got64 - ref64)[fin])
                        den = torch.linalg.norm(ref64[fin]).clamp_min(1e-30)
                        err = float(num / den) if same_nonfinite else float("inf")
                    ok = err <= TOLERANCE[info[name].dtype]
                    passed += ok
                    failed += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {os.path.relpath(path, root)} seed {seed} {name} "
                          f"({info[name].dtype}): rel err {err:.2e}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
