"""cuBLASLt against kiln's own GEMM kernels on the matmul shapes of the zoo's
models, in one run: the evidence for the cuBLASLt tactic's rule
(codegen/gemm_tactics.cpp).

    python3 bench/vendor_gemm.py [--kiln build-gpu/bin/kiln] [--rounds 3] [--json OUT]

Each shape is a graph of the matmul alone (B stored [n][k] where a model's
nn.Linear stores it so). `kiln bench` times it three ways, in alternating
rounds: KILN_VENDOR=off (kiln's own kernel), always (cuBLASLt) and auto (the
rule's choice); the table has each side's median over rounds, TFLOP/s, the
ratio own/cuBLASLt and which side the rule took.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# name, operand dtype, precision, batch, M, N, K, B stored [n][k]
SHAPES = [
    ("gpt2 lm head", "bf16", "f32", 1, 4096, 50257, 768, True),
    ("llama lm head", "bf16", "f32", 1, 4096, 32000, 1024, True),
    ("qwen2 lm head", "bf16", "f32", 1, 4096, 151936, 896, True),
    ("llama-7b lm head", "bf16", "f32", 1, 4096, 32000, 4096, True),
    ("gpt2 lm head b1", "bf16", "f32", 1, 512, 50257, 768, True),
    ("llama qkv", "bf16", "f32", 1, 4096, 2048, 1024, True),
    ("llama gate+up", "bf16", "f32", 1, 4096, 5632, 1024, True),
    ("llama down", "bf16", "f32", 1, 4096, 1024, 2816, True),
    ("bert ffn in", "bf16", "f32", 1, 4096, 3072, 768, True),
    ("bert projection", "bf16", "f32", 1, 4096, 768, 768, True),
    ("square 4096", "bf16", "f32", 1, 4096, 4096, 4096, True),
    ("decode projection", "bf16", "f32", 1, 8, 4096, 4096, True),
    ("decode lm head", "bf16", "f32", 1, 1, 32000, 1024, True),
    ("t5 scores f32", "f32", "f32", 192, 256, 256, 64, True),
    ("t5 probs.v f32", "f32", "f32", 192, 256, 64, 256, False),
    ("bert ffn in f32", "f32", "f32", 1, 4096, 3072, 768, True),
    ("decode projection f32", "f32", "f32", 1, 8, 4096, 4096, True),
    ("bert ffn in tf32", "f32", "tf32", 1, 4096, 3072, 768, True),
]

SIDES = ("off", "always", "auto")


def graph(dtype, precision, batch, m, n, k, b_nk):
    lead = [batch] if batch > 1 else []
    b_shape = [n, k] if b_nk else [k, n]
    ops = [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}] if b_nk else []
    ops.append({"op": "matmul", "in": ["x", "wt" if b_nk else "w"], "out": "y", "precision": precision})
    return {"kiln": 1, "inputs": {"x": {"shape": lead + [m, k], "dtype": dtype}, "w": {"shape": b_shape, "dtype": dtype}},
            "ops": ops, "outputs": ["y"]}


def bench(kiln, paths, side):
    env = dict(os.environ, KILN_VENDOR=side)
    out = subprocess.run([kiln, "bench", "--json", *paths], check=True, capture_output=True, text=True, env=env,
                         timeout=900).stdout
    return {r["path"]: r["fused_ms"] for r in json.loads(out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="build-gpu/bin/kiln")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--only", help="comma-separated words: the shapes whose names hold one of them")
    args = ap.parse_args()
    if args.only:
        words = args.only.split(",")
        SHAPES[:] = [s for s in SHAPES if any(w in s[0] for w in words)]
    folder = tempfile.mkdtemp(prefix="kiln-vendor-gemm-")
    paths = []
    for i, (name, *shape) in enumerate(SHAPES):
        path = os.path.join(folder, f"gemm{i}.json")
        with open(path, "w") as f:
            json.dump(dict(graph(*shape), name=name.replace(" ", "_").replace(".", "_")), f)
        paths.append(path)
    times = {side: {p: [] for p in paths} for side in SIDES}
    for r in range(args.rounds):
        for side in SIDES[r % 3:] + SIDES[:r % 3]:  # each round starts one side later
            for p, ms in bench(args.kiln, paths, side).items():
                times[side][p].append(ms)
            print(f"round {r + 1}, KILN_VENDOR={side}: " + " ".join(f"{times[side][p][-1]:.3f}" for p in paths), flush=True)
    print(f"{'shape':24} {'batch x M x N x K':>24} {'own ms':>8} {'cuBLASLt':>8} {'own/cuBLASLt':>12} "
          f"{'TFLOP/s own':>11} {'cuBLASLt':>8}  rule takes")
    rows = []
    for (name, dtype, precision, batch, m, n, k, _), p in zip(SHAPES, paths):
        own, lt, auto = (statistics.median(times[s][p]) for s in SIDES)
        flops = 2.0 * batch * m * n * k
        rule = "cuBLASLt" if abs(auto - lt) < abs(auto - own) else "own"
        rows.append(dict(name=name, dtype=dtype, precision=precision, shape=[batch, m, n, k], own_ms=own, cublaslt_ms=lt,
                         auto_ms=auto, rule=rule, rounds={s: times[s][p] for s in SIDES}))
        print(f"{name:24} {f'{batch}x{m}x{n}x{k}':>24} {own:8.3f} {lt:8.3f} {own / lt:12.2f} "
              f"{flops / own / 1e9:11.1f} {flops / lt / 1e9:8.1f}  {rule}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
