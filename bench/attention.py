"""Attention against cuDNN and FlashAttention-2, same run, same shapes, one method.

    python3 bench/attention.py [--json OUT.json] [--only NAME,...] [--rounds N]

Each shape is a one-op kiln graph (sdpa), compiled through kiln's Python
package (`pip install .`; kiln.compile, fused, the kernel cache as the CLI
uses it). kiln and PyTorch's F.scaled_dot_product_attention with one backend
at a time (cuDNN, then FlashAttention-2) run on the same bf16 tensors, each
captured once in a CUDA graph and replayed back to back with CUDA events
around every replay (bench/run_bench.py's graph_ms): the kernels' time,
without host time per call, measured the same way for every side. The sides
alternate within a round (kiln, cuDNN, FlashAttention-2, then the next
round), so that a GPU clocking down under sustained load slows all alike;
the table has the median over rounds, and every round's time is in the
JSON. FLOPs: 4 * B * H * Sq * Skv * D, halved
under a causal mask (Sq = Skv). Decode shapes also report the GB/s of K and
V read (the bytes every kernel must move) against the device's copy ceiling
measured in the same run. The last column is the largest difference between
the output of kiln's last replay and cuDNN's (FlashAttention-2's where
cuDNN declines the shape): the timed kernel computed the attention.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import ceilings, graph_ms  # noqa: E402

# name: (B, H, Hkv, Sq, Skv, D, causal)
SHAPES = {
    "d128": (4, 32, 32, 4096, 4096, 128, False),
    "d128 causal": (4, 32, 32, 4096, 4096, 128, True),
    "d64": (4, 64, 64, 4096, 4096, 64, False),
    "d256": (4, 16, 16, 4096, 4096, 256, False),
    "s512": (128, 32, 32, 512, 512, 128, False),
    "s16384 causal": (1, 32, 32, 16384, 16384, 128, True),
    "gqa 32/8 causal": (4, 32, 8, 4096, 4096, 128, True),
    "vit-s": (32, 6, 6, 197, 197, 64, False),
    "decode": (8, 32, 8, 1, 8192, 128, False),
    "decode 32k": (1, 32, 8, 1, 32768, 128, False),
    "decode mha": (16, 32, 32, 1, 4096, 128, False),
}


def graph_for(name, shape):
    b, h, hkv, sq, skv, d, causal = shape
    return {"kiln": 1, "name": "attention " + name,
            "inputs": {"q": {"shape": [b, h, sq, d], "dtype": "bf16"}, "k": {"shape": [b, hkv, skv, d], "dtype": "bf16"},
                       "v": {"shape": [b, hkv, skv, d], "dtype": "bf16"}},
            "ops": [{"op": "sdpa", "in": ["q", "k", "v"], "out": "o", "causal": causal}], "outputs": ["o"]}


def tensors(shape):
    """q, k, v and an output buffer for `shape`, bf16 on the GPU."""
    b, h, hkv, sq, skv, d, _ = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
    return q, k, v, torch.empty_like(q)


def vendor_call(shape, backend, q, k, v):
    """PyTorch's SDPA on one backend, as a callable; None if the backend does not take the shape."""
    causal, gqa = shape[6], shape[2] != shape[1]

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    try:
        call()
    except RuntimeError as e:
        print(f"{backend.name} on {shape}: {str(e).splitlines()[0]}", file=sys.stderr)
        return None
    return call


def kiln_call(name, shape, q, k, v, o):
    """kiln's executable of the shape's graph, run into `o`, as a callable."""
    import kiln
    exe = kiln.compile(kiln.Graph.from_json(graph_for(name, shape)))
    if not exe.workspace_bytes:
        return lambda: exe.run({"q": q, "k": k, "v": v}, {"o": o})
    # Split keys (decode) combine partial results in a workspace: given, so that the replay allocates nothing.
    workspace = torch.empty(exe.workspace_bytes, dtype=torch.uint8, device=q.device)
    return lambda: exe.run({"q": q, "k": k, "v": v}, {"o": o}, workspace=workspace)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--only", help="shape names, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    shapes = {n: s for n, s in SHAPES.items() if only is None or n in only}
    if only and len(shapes) != len(only):
        sys.exit(f"unknown shape in --only: bench/attention.py has {', '.join(SHAPES)}")
    ceil = ceilings()
    rows = []
    print(f"copy ceiling {ceil['copy_gbps']:.0f} GB/s; {args.rounds} rounds, each side by CUDA-graph replay")
    print(f"{'shape':18} {'kiln ms':>8} {'TFLOP/s':>8} {'cuDNN ms':>9} {'TFLOP/s':>8} {'FA2 ms':>8} {'kiln/cuDNN':>10} {'kiln/FA2':>9}"
          f" {'K/V GB/s':>9} {'max|kiln-vendor|':>16}")
    for name, shape in shapes.items():
        b, h, hkv, sq, skv, d, causal = shape
        flops = 4 * b * h * sq * skv * d * (0.5 if causal and sq == skv else 1.0)
        kv_bytes = 2 * b * hkv * skv * d * 2
        q, k, v, o = tensors(shape)
        sides = {"kiln": kiln_call(name, shape, q, k, v, o),
                 "cudnn": vendor_call(shape, SDPBackend.CUDNN_ATTENTION, q, k, v),
                 "flash2": vendor_call(shape, SDPBackend.FLASH_ATTENTION, q, k, v)}
        times = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, call in sides.items():
                times[side].append(graph_ms(call) if call else float("nan"))
        ms = {side: statistics.median(t) for side, t in times.items()}
        # The output kiln's last replay left in `o` against cuDNN's (FlashAttention-2's where cuDNN declines).
        reference = next((sides[side]() for side in ("cudnn", "flash2") if sides[side]), None)
        torch.cuda.synchronize()
        difference = (o.float() - reference.float()).abs().max().item() if reference is not None else float("nan")
        k_ms, cudnn, flash = ms["kiln"], ms["cudnn"], ms["flash2"]
        row = {"shape": name, "B": b, "H": h, "Hkv": hkv, "Sq": sq, "Skv": skv, "D": d, "causal": causal,
               "kiln_ms": k_ms, "cudnn_ms": cudnn, "flash2_ms": flash, "kiln_tflops": flops / k_ms / 1e9,
               "cudnn_tflops": flops / cudnn / 1e9, "kv_gbps": kv_bytes / k_ms / 1e6, "copy_gbps": ceil["copy_gbps"],
               "rounds_ms": times, "max_abs_difference_from_vendor": difference}
        rows.append(row)
        print(f"{name:18} {k_ms:8.3f} {row['kiln_tflops']:8.0f} {cudnn:9.3f} {row['cudnn_tflops']:8.0f} {flash:8.3f}"
              f" {k_ms / cudnn:10.2f} {k_ms / flash:9.2f} {row['kv_gbps']:9.0f} {difference:16.2e}", flush=True)
        del q, k, v, o, sides, reference
        torch.cuda.empty_cache()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "method": "CUDA-graph replay, every side", "ceilings": ceil,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
