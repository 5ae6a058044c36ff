"""Attention against cuDNN and FlashAttention-2, same run, same shapes.

    python3 bench/attention.py KILN_BINARY [--json OUT.json] [--only NAME,...]

Each shape is written as a one-op kiln graph (sdpa) and timed with `kiln
bench --json` (kernels launched back to back, CUDA-event median). PyTorch's
F.scaled_dot_product_attention runs on the same shapes with one backend at
a time (cuDNN, then FlashAttention-2), bf16 tensors as users hold them,
timed by CUDA-graph replay (the kernel's time without PyTorch's host time
per call; bench/run_bench.py's graph_ms). FLOPs: 4 * B * H * Sq * Skv * D,
halved under a causal mask (Sq = Skv). Decode shapes also report the GB/s
of K and V read (the bytes every kernel must move) against the device's
copy ceiling measured in the same run.
"""
import json
import os
import subprocess
import sys
import tempfile

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


def vendor_ms(shape, backend):
    b, h, hkv, sq, skv, d, causal = shape
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel([backend]):
            return graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h))
    except RuntimeError as e:  # the backend does not take the shape
        print(f"{backend.name} on {shape}: {str(e).splitlines()[0]}", file=sys.stderr)
        return float("nan")


def main():
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i:i + 2]
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = set(args[i + 1].split(","))
        del args[i:i + 2]
    kiln = args[0]
    shapes = {n: s for n, s in SHAPES.items() if only is None or n in only}
    ceil = ceilings()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for name, shape in shapes.items():
            paths[name] = os.path.join(tmp, name.replace(" ", "_").replace("/", "-") + ".json")
            with open(paths[name], "w") as f:
                json.dump(graph_for(name, shape), f)
        out = subprocess.run([kiln, "bench", "--json", *paths.values()], check=True, capture_output=True, text=True).stdout
        kiln_ms = {r["path"]: r["fused_ms"] for r in json.loads(out)}
    rows = []
    print(f"copy ceiling {ceil['copy_gbps']:.0f} GB/s")
    print(f"{'shape':18} {'kiln ms':>8} {'TFLOP/s':>8} {'cuDNN ms':>9} {'TFLOP/s':>8} {'FA2 ms':>8} {'kiln/cuDNN':>10} {'kiln/FA2':>9}"
          f" {'K/V GB/s':>9}")
    for name, shape in shapes.items():
        b, h, hkv, sq, skv, d, causal = shape
        flops = 4 * b * h * sq * skv * d * (0.5 if causal and sq == skv else 1.0)
        kv_bytes = 2 * b * hkv * skv * d * 2
        k_ms = kiln_ms[paths[name]]
        cudnn = vendor_ms(shape, SDPBackend.CUDNN_ATTENTION)
        flash = vendor_ms(shape, SDPBackend.FLASH_ATTENTION)
        row = {"shape": name, "B": b, "H": h, "Hkv": hkv, "Sq": sq, "Skv": skv, "D": d, "causal": causal,
               "kiln_ms": k_ms, "cudnn_ms": cudnn, "flash2_ms": flash, "kiln_tflops": flops / k_ms / 1e9,
               "cudnn_tflops": flops / cudnn / 1e9, "kv_gbps": kv_bytes / k_ms / 1e6, "copy_gbps": ceil["copy_gbps"]}
        rows.append(row)
        print(f"{name:18} {k_ms:8.3f} {row['kiln_tflops']:8.0f} {cudnn:9.3f} {row['cudnn_tflops']:8.0f} {flash:8.3f}"
              f" {k_ms / cudnn:10.2f} {k_ms / flash:9.2f} {row['kv_gbps']:9.0f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
