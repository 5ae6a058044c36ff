"""The benchmark table: kiln against PyTorch eager and torch.compile, in the
same run on the same graph files, with the device's measured ceilings.

    python3 bench/run_bench.py KILN_BINARY GRAPH... [--json OUT.json]

Ceilings (measured here, now): device-to-device copy bandwidth (bytes read +
written over time) and the cuBLAS bf16 GEMM rate (torch.matmul 8192^3).
Per graph: the anchor alone (a graph's one matmul or conv2d, its operands
already in memory) through cuBLAS or cuDNN, the vendor's rate for that
shape; where the vendor has one fused call for the whole graph (cuBLASLt
bias+GELU/ReLU epilogues, cuDNN conv+bias(+residual)+ReLU), that too;
kiln's fused and unfused plan (`kiln bench --json`), eager and
torch.compile of the same graph through bench/torch_graph.py (the spec's
numerics: f32 compute, rounding where the graph says; matmul, conv2d and
sdpa on 16-bit operands run natively in that dtype, as frameworks run them:
cuBLAS, cuDNN, flash attention). Graphs with a matmul are compiled with
mode="max-autotune-no-cudagraphs" (Inductor's GEMM autotuning). Times are medians of
CUDA-event timings after warm-up. Memory-bound graphs are compared with the
copy ceiling (bytes = each input read once + each output written once),
anchor graphs with the cuBLAS rate.
"""
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_graph  # noqa: E402


def median_ms(fn, warmup=3, runs=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def ceilings():
    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy_ms = median_ms(lambda: b.copy_(a))
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: torch.matmul(x, y), runs=10)
    return {"copy_gbps": 2 * n / (copy_ms * 1e-3) / 1e9, "cublas_tflops": 2 * 8192 ** 3 / (gemm_ms * 1e-3) / 1e12}


def inputs_for(graph, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    var_inputs = {op["in"][2] for op in graph["ops"] if op["op"] == "batch_norm"}
    for name, spec in graph["inputs"].items():
        shape = spec["shape"]
        if spec["dtype"] == "bool":
            out[name] = torch.rand(shape, generator=g, device="cuda") < 0.5
            continue
        x = torch.randn(shape, generator=g, device="cuda")
        if name in var_inputs:
            x = x.abs() + 0.5
        out[name] = x.to(torch_graph.TORCH_DTYPES[spec["dtype"]])
    return out


def anchor_alone(graph, ins, info):
    """The vendor library on the graph's anchor alone, operands already in
    memory in their 16-bit type: cuBLAS (torch.matmul) for a matmul, cuDNN
    (F.conv2d, channels-last for NHWC) for a conv2d. Returns (name, ms) or
    None (no single matmul/conv2d anchor, or f32 operands)."""
    anchors = [op for op in graph["ops"] if op["op"] in ("matmul", "conv2d")]
    if len(anchors) != 1:
        return None
    op = anchors[0]
    names = [x for x in op["in"][:2] if isinstance(x, str)]
    if len(names) != 2:
        return None
    dtypes = {graph["inputs"][n]["dtype"] for n in names if n in graph["inputs"]} or {"bf16"}
    if len(dtypes) != 1 or not dtypes <= {"bf16", "f16"}:
        return None
    dt = torch_graph.TORCH_DTYPES[dtypes.pop()]
    vals = torch_graph.evaluate(dict(graph, outputs=names), ins, torch.float32, info, native_anchors=True)
    a, b = (vals[n].to(dt).contiguous() for n in names)
    if op["op"] == "matmul":
        return "cuBLAS", median_ms(lambda: torch.matmul(a, b))
    x, w = a, b
    if op.get("layout", "NHWC") == "NHWC":  # channels-last memory, as the graph stores it
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    return "cuDNN", median_ms(lambda: F.conv2d(x, w, stride=op.get("stride", [1, 1]), padding=op.get("padding", [0, 0]),
                                               dilation=op.get("dilation", [1, 1]), groups=op.get("groups", 1)))


def vendor_fused(graph, ins):
    """The vendor library's own fused kernel for the graph, where it has one
    for exactly this graph: cuBLASLt's bias+GELU / bias+ReLU epilogues
    (torch._addmm_activation; its GELU is the tanh form, a timing baseline
    only) for matmul -> add bias -> gelu/relu, and cuDNN's fused
    conv+bias(+residual)+ReLU (torch.cudnn_convolution_relu / _add_relu)
    for an NHWC conv2d -> add bias [-> add residual] -> relu, all 16-bit.
    Returns (name, ms) or None."""
    ops = graph["ops"]
    kinds = [op["op"] for op in ops]
    inputs = graph["inputs"]
    def bias_of(op, out_prev):
        other = [x for x in op["in"] if x != out_prev]
        return other[0] if len(other) == 1 and isinstance(other[0], str) and len(inputs.get(other[0], {}).get("shape", [])) == 1 else None
    try:
        if kinds in (["matmul", "add", "gelu"], ["matmul", "add", "relu"]) and not any(op.get("dtype") == "f32" for op in ops):
            a, w = ops[0]["in"]
            b = bias_of(ops[1], ops[0]["out"])
            if b is None or len(inputs[a]["shape"]) != 2:
                return None
            gelu = kinds[2] == "gelu"
            return ("cuBLASLt bias+" + ("gelu" if gelu else "relu"),
                    median_ms(lambda: torch._addmm_activation(ins[b], ins[a], ins[w], use_gelu=gelu)))
        if kinds[:2] == ["conv2d", "add"] and kinds[-1] == "relu" and len(kinds) in (3, 4) and \
                ops[0].get("layout", "NHWC") == "NHWC" and ops[0].get("groups", 1) == 1:
            conv = ops[0]
            b = bias_of(ops[1], conv["out"])
            if b is None:
                return None
            x, w = (ins[n].permute(0, 3, 1, 2) for n in conv["in"][:2])  # channels-last memory
            args = (conv.get("stride", [1, 1]), conv.get("padding", [0, 0]), conv.get("dilation", [1, 1]), 1)
            if len(kinds) == 3:
                return ("cuDNN conv+bias+relu", median_ms(lambda: torch.cudnn_convolution_relu(x, w, ins[b], *args)))
            if kinds[2] != "add":
                return None
            r = [n for n in ops[2]["in"] if n != ops[1]["out"]][0]
            z = ins[r].permute(0, 3, 1, 2)
            return ("cuDNN conv+bias+res+relu", median_ms(lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, ins[b], *args)))
    except Exception as e:  # noqa: BLE001 - a baseline the library lacks here
        print(f"vendor fused baseline failed on {graph['name']}: {e}", file=sys.stderr)
    return None


def main():
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i:i + 2]
    kiln, graphs = args[0], args[1:]
    ceil = ceilings()
    kiln_results = {r["path"]: r for r in json.loads(
        subprocess.run([kiln, "bench", "--json", *graphs], check=True, capture_output=True, text=True).stdout)}
    rows = []
    for path in graphs:
        graph = torch_graph.load(path)
        info = torch_graph.annotate(graph)
        ins = inputs_for(graph, 1)
        eager = lambda: torch_graph.evaluate(graph, ins, torch.float32, info, native_anchors=True)
        eager_ms = median_ms(eager)
        try:
            # Every graph runs through the same evaluate(): without a reset,
            # dynamo's recompile limit would quietly fall back to eager.
            torch._dynamo.reset()
            anchored = any(op["op"] == "matmul" for op in graph["ops"])
            compiled = torch.compile(lambda i: torch_graph.evaluate(graph, i, torch.float32, info, native_anchors=True),
                                     dynamic=False, mode="max-autotune-no-cudagraphs" if anchored else None)
            compile_ms = median_ms(lambda: compiled(ins))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"torch.compile failed on {path}: {e}", file=sys.stderr)
            compile_ms = float("nan")
        vendor = anchor_alone(graph, ins, info)
        fused = vendor_fused(graph, ins)
        k = kiln_results[path]
        row = {"graph": graph["name"], "kiln_ms": k["fused_ms"], "unfused_ms": k["unfused_ms"], "eager_ms": eager_ms,
               "compile_ms": compile_ms, "bytes": k["bytes"], "flops": k["flops"], "gbps": k["gbps"], "tflops": k["tflops"]}
        row["ratio_vs_compile"] = row["kiln_ms"] / compile_ms if compile_ms == compile_ms else float("nan")
        row["share"] = (f"{100 * k['tflops'] / ceil['cublas_tflops']:.0f}% cuBLAS" if k["flops"] > 0
                        else f"{100 * k['gbps'] / ceil['copy_gbps']:.0f}% copy")
        # The anchor alone through the vendor library, same shapes: kiln's
        # fused graph against it (1.00 = the epilogue and prologue are free).
        row["vendor"], row["vendor_ms"] = vendor if vendor else ("", float("nan"))
        row["kiln_vs_vendor"] = row["kiln_ms"] / row["vendor_ms"] if vendor else float("nan")
        # The vendor's own fused kernel for the whole graph, where it has one.
        row["vendor_fused"], row["vendor_fused_ms"] = fused if fused else ("", float("nan"))
        rows.append(row)
        torch.cuda.empty_cache()
    print(f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, cuBLAS bf16 {ceil['cublas_tflops']:.0f} TFLOP/s ({torch.cuda.get_device_name()})")
    head = (f"{'graph':<22} {'kiln ms':>9} {'unfused':>9} {'eager ms':>9} {'compile':>9} {'kiln/cmp':>8} {'GB/s':>7} "
            f"{'TFLOP/s':>8}  {'share':<12} {'anchor alone (vendor) ms':>24} {'kiln/anchor':>11}")
    print(head)
    for r in rows:
        vendor = f"{r['vendor_ms']:.3f} ({r['vendor']})" if r["vendor"] else "-"
        print(f"{r['graph']:<22} {r['kiln_ms']:>9.3f} {r['unfused_ms']:>9.3f} {r['eager_ms']:>9.3f} {r['compile_ms']:>9.3f} "
              f"{r['ratio_vs_compile']:>8.2f} {r['gbps']:>7.0f} {r['tflops']:>8.1f}  {r['share']:<12} {vendor:>24} "
              f"{r['kiln_vs_vendor']:>11.2f}")
    fused_rows = [r for r in rows if r["vendor_fused"]]
    if fused_rows:
        print("vendor fused kernels (the whole graph in one vendor call, same run):")
        for r in fused_rows:
            print(f"  {r['graph']:<26} {r['vendor_fused']:<26} {r['vendor_fused_ms']:>8.3f} ms   kiln {r['kiln_ms']:.3f} ms"
                  f"   kiln/vendor {r['kiln_ms'] / r['vendor_fused_ms']:.2f}")
    ratios = [r["ratio_vs_compile"] for r in rows if r["ratio_vs_compile"] == r["ratio_vs_compile"]]
    if ratios:
        print(f"geometric mean kiln/torch.compile: {math.exp(sum(math.log(x) for x in ratios) / len(ratios)):.2f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
