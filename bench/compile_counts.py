"""What a zoo model's first call compiles: per model, the kiln graphs the
backend builds, their kernels, how many distinct kernel texts (each compiled
once), NVRTC's time per kind of kernel, and `kiln.compile`'s wall time, with
a cold kiln cache in a fresh process.

    python3 bench/compile_counts.py --models resnet50,bert [--device cpu] [--batch 1] [--seq 32]

On CPU tensors kiln compiles for sm_90 with NVRTC as on the GPU machine and
runs the graph on the reference interpreter (so the first call's total time
there is not the GPU's); `kiln.compile`'s time is the same work as there, on
this machine's cores. bench/NOTES.md v0.37 has the figures.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time


def child(args):
    """In a fresh process: the model's first call through the backend, every kiln.compile timed."""
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kiln.torch as backend
    import zoo_models
    spec = zoo_models.BY_NAME[args.child]
    compiles = []
    real = backend.kiln_compile

    def timed(graph, *a, **k):
        start = time.perf_counter()
        exe = real(graph, *a, **k)
        compiles.append(dict(s=time.perf_counter() - start, kernels=[(x["kind"], x["key"], x["ms"]) for x in exe.kernels]))
        return exe
    backend.kiln_compile = timed
    seq = args.seq if spec.package == "transformers" else spec.seq
    model = spec.build(False).eval().to(device=args.device, dtype=torch.bfloat16)
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    inputs = spec.inputs(model, args.batch, seq, args.device, torch.bfloat16)
    start = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend="kiln", dynamic=False)(**inputs)
    print(json.dumps(dict(first_call_s=time.perf_counter() - start, compiles=compiles)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert,llama,resnet50,efficientnet_b0")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence (transformers)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    print(f"| model | first call s | kiln.compile s | kernels | distinct texts | NVRTC s by kind (count, total, longest) |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        command = [sys.executable, __file__, "--child", name, "--device", args.device, "--batch", str(args.batch),
                   "--seq", str(args.seq)]
        out = subprocess.run(command, capture_output=True, text=True, timeout=3600,
                             env=dict(os.environ, KILN_CACHE_DIR=tempfile.mkdtemp(prefix="kiln-cold-")))
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        if out.returncode != 0 or not lines:
            print(f"| {name} | FAILED: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode} |")
            continue
        r = json.loads(lines[0])
        kernels = [k for c in r["compiles"] for k in c["kernels"]]
        first_ms = {}  # a text's compile: its first kernel's (the rest are found compiled)
        for kind, key, ms in kernels:
            first_ms.setdefault(key, (kind, ms))
        by_kind = collections.defaultdict(list)
        for kind, ms in first_ms.values():
            by_kind[kind].append(ms / 1e3)
        kinds = ", ".join(f"{kind} {len(v)}, {sum(v):.1f}, {max(v):.2f}"
                          for kind, v in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])))
        print(f"| {name} | {r['first_call_s']:.1f} | {sum(c['s'] for c in r['compiles']):.1f} | {len(kernels)} | "
              f"{len(first_ms)} | {kinds} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
