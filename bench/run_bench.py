"""The benchmark table: kiln against PyTorch eager and torch.compile, in the
same run on the same graph files, with the device's measured ceilings.

    python3 bench/run_bench.py KILN_BINARY GRAPH... [--json OUT.json] [--exact] [--quick]

Ceilings (measured here, now): device-to-device copy bandwidth (bytes read +
written over time) and the cuBLAS bf16 GEMM rate (torch.matmul 8192^3).

The PyTorch baselines are each graph as its users write it
(bench/native_torch.py: storage dtypes, torch's own ops, channels-last
convolutions with torch.backends.cudnn.benchmark on), eager and under
torch.compile (Inductor's default mode; graphs with a matmul also
mode="max-autotune-no-cudagraphs", Inductor's GEMM autotuning, the better of
the two counts). With --exact, a column more: torch.compile of the graph
with the graph format's exact numerics (bench/torch_graph.py: f32 compute,
rounding where the graph says), labelled as such; no user runs that.

Per graph also: the anchor alone (a graph's one matmul or conv2d, its
operands already in memory) through cuBLAS or cuDNN, the vendor's rate for
that shape, timed by CUDA-graph replay (graph_ms: the kernel's time, not
PyTorch's host time per call); where the vendor has one fused call for the whole graph
(cuBLASLt bias+GELU/ReLU epilogues, cuDNN conv+bias(+residual)+ReLU), that
too; kiln's fused and unfused plan (`kiln bench --json`). Times are medians
of CUDA-event timings after warm-up, PyTorch's recorded back to back as
kiln's are (median_ms). Memory-bound graphs are compared with
the copy ceiling (bytes = each input read once + each output written once),
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
import native_torch  # noqa: E402
import torch_graph  # noqa: E402


def median_ms(fn, warmup=3, runs=20):
    """The median of `runs` calls, each between two CUDA events, recorded back
    to back with no synchronisation between calls: the queue stays full, so
    the host's time per call (Python, dynamo's guards) overlaps the previous
    call's kernels, as in `kiln bench` (runtime/bench.h) and in a model that
    calls one op after another."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(runs)]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in events)
    return times[len(times) // 2]


def graph_ms(fn, runs=50):
    """The median GPU time of fn: captured once in a CUDA graph (after
    warm-up, so cuDNN's autotuner has chosen), then replayed back to back.
    For vendor kernels: their time without PyTorch's host time per call,
    which on a 20-us convolution is most of what median_ms would see."""
    return graph_ms_sets([fn], runs=runs)


def graph_ms_sets(calls, runs=50):
    """graph_ms of several calls captured in turn in one CUDA graph, per
    call: the same work on as many input sets (one call each), so that a
    small kernel does not find its inputs in L2 from the call before, as
    `kiln bench` rotates its input sets (runtime/bench.h)."""
    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return median_ms(graph.replay, runs=runs) / len(calls)


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
    memory in their storage type: cuBLAS (torch.matmul; f32 operands in full
    f32, cuBLAS's SGEMM) for a matmul, cuDNN (F.conv2d, channels-last for
    NHWC) for a conv2d. Returns (name, ms) or None (no single matmul/conv2d
    anchor, or operands of two types)."""
    anchors = [op for op in graph["ops"] if op["op"] in ("matmul", "conv2d")]
    if len(anchors) != 1:
        return None
    op = anchors[0]
    names = [x for x in op["in"][:2] if isinstance(x, str)]
    if len(names) != 2:
        return None
    dtypes = {graph["inputs"][n]["dtype"] for n in names if n in graph["inputs"]} or {"bf16"}
    if len(dtypes) != 1 or not dtypes <= {"bf16", "f16", "f32"}:
        return None
    dt = torch_graph.TORCH_DTYPES[dtypes.pop()]
    if dt == torch.float32 and (op["op"] != "matmul" or op.get("precision", "f32") != "f32"):
        return None
    vals = torch_graph.evaluate(dict(graph, outputs=names), ins, torch.float32, info, native_anchors=True)
    a, b = (vals[n].to(dt).contiguous() for n in names)
    if op["op"] == "matmul":
        return "cuBLAS", graph_ms(lambda: torch.matmul(a, b))
    x, w = a, b
    if op.get("layout", "NHWC") == "NHWC":  # channels-last memory, as the graph stores it
        x, w = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
    return "cuDNN", graph_ms(lambda: F.conv2d(x, w, stride=op.get("stride", [1, 1]), padding=op.get("padding", [0, 0]),
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
                    graph_ms(lambda: torch._addmm_activation(ins[b], ins[a], ins[w], use_gelu=gelu)))
        if kinds[:2] == ["conv2d", "add"] and kinds[-1] == "relu" and len(kinds) in (3, 4) and \
                ops[0].get("layout", "NHWC") == "NHWC" and ops[0].get("groups", 1) == 1:
            conv = ops[0]
            b = bias_of(ops[1], conv["out"])
            if b is None:
                return None
            x, w = (ins[n].permute(0, 3, 1, 2) for n in conv["in"][:2])  # channels-last memory
            args = (conv.get("stride", [1, 1]), conv.get("padding", [0, 0]), conv.get("dilation", [1, 1]), 1)
            if len(kinds) == 3:
                return ("cuDNN conv+bias+relu", graph_ms(lambda: torch.cudnn_convolution_relu(x, w, ins[b], *args)))
            if kinds[2] != "add":
                return None
            r = [n for n in ops[2]["in"] if n != ops[1]["out"]][0]
            z = ins[r].permute(0, 3, 1, 2)
            return ("cuDNN conv+bias+res+relu", graph_ms(lambda: torch.cudnn_convolution_add_relu(x, w, z, 1.0, ins[b], *args)))
    except Exception as e:  # noqa: BLE001 - a baseline the library lacks here
        print(f"vendor fused baseline failed on {graph['name']}: {e}", file=sys.stderr)
    return None


def compiled_ms(fn, ins, modes):
    """The best median over torch.compile `modes` of fn(ins), NaN if none compiles."""
    best = float("nan")
    for mode in modes:
        try:
            torch._dynamo.reset()  # one graph after another: without a reset dynamo's recompile limit falls back to eager
            compiled = torch.compile(fn, dynamic=False, mode=mode)
            ms = median_ms(lambda: compiled(ins))
            best = ms if best != best or ms < best else best
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"torch.compile (mode={mode}) failed: {e}", file=sys.stderr)
    return best


def geomean(values):
    values = [v for v in values if v == v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main():
    args = sys.argv[1:]
    json_out = None
    if "--json" in args:
        i = args.index("--json")
        json_out = args[i + 1]
        del args[i:i + 2]
    exact = "--exact" in args
    quick = "--quick" in args  # Inductor's default mode alone (its GEMM autotuning takes minutes on f32)
    args = [a for a in args if a not in ("--exact", "--quick")]
    kiln, graphs = args[0], args[1:]
    torch.backends.cudnn.benchmark = True  # cuDNN at its best, as users who care about speed run it
    torch.backends.cuda.matmul.allow_tf32 = False  # (PyTorch's default: f32 matmuls in full f32, as the graphs ask)
    ceil = ceilings()
    kiln_results = {r["path"]: r for r in json.loads(
        subprocess.run([kiln, "bench", "--json", *graphs], check=True, capture_output=True, text=True).stdout)}
    rows = []
    for path in graphs:
        graph = torch_graph.load(path)
        info = torch_graph.annotate(graph)
        ins = inputs_for(graph, 1)
        native = native_torch.NATIVE[graph["name"]]
        anchored = any(op["op"] == "matmul" for op in graph["ops"])
        eager_ms = median_ms(lambda: native(ins))
        compile_ms = compiled_ms(native, ins, [None, "max-autotune-no-cudagraphs"] if anchored and not quick else [None])
        exact_ms = float("nan")
        if exact:
            exact_ms = compiled_ms(lambda i: torch_graph.evaluate(graph, i, torch.float32, info, native_anchors=True), ins,
                                   ["max-autotune-no-cudagraphs" if anchored else None])
        vendor = anchor_alone(graph, ins, info)
        fused = vendor_fused(graph, ins)
        k = kiln_results[path]
        row = {"graph": graph["name"], "kiln_ms": k["fused_ms"], "unfused_ms": k["unfused_ms"], "eager_ms": eager_ms,
               "compile_ms": compile_ms, "exact_compile_ms": exact_ms, "bytes": k["bytes"], "flops": k["flops"],
               "gbps": k["gbps"], "tflops": k["tflops"]}
        row["ratio_vs_compile"] = row["kiln_ms"] / compile_ms if compile_ms == compile_ms else float("nan")
        row["ratio_vs_eager"] = row["kiln_ms"] / eager_ms
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
    print("baselines: PyTorch as users write it (bench/native_torch.py), eager and torch.compile"
          + ("; 'exact cmp': torch.compile of the graph format's exact numerics" if exact else ""))
    head = (f"{'graph':<26} {'kiln ms':>8} {'unfused':>8} {'eager':>8} {'compile':>8} {'kiln/cmp':>8} {'kiln/eag':>8}"
            + (f" {'exact cmp':>9}" if exact else "")
            + f" {'GB/s':>6} {'TFLOP/s':>7}  {'share':<11} {'anchor alone (vendor) ms':>24} {'kiln/anchor':>11}")
    print(head)
    for r in rows:
        vendor = f"{r['vendor_ms']:.3f} ({r['vendor']})" if r["vendor"] else "-"
        print(f"{r['graph']:<26} {r['kiln_ms']:>8.3f} {r['unfused_ms']:>8.3f} {r['eager_ms']:>8.3f} {r['compile_ms']:>8.3f} "
              f"{r['ratio_vs_compile']:>8.2f} {r['ratio_vs_eager']:>8.2f}"
              + (f" {r['exact_compile_ms']:>9.3f}" if exact else "")
              + f" {r['gbps']:>6.0f} {r['tflops']:>7.1f}  {r['share']:<11} {vendor:>24} {r['kiln_vs_vendor']:>11.2f}")
    fused_rows = [r for r in rows if r["vendor_fused"]]
    if fused_rows:
        print("vendor fused kernels (the whole graph in one vendor call, same run):")
        for r in fused_rows:
            print(f"  {r['graph']:<26} {r['vendor_fused']:<26} {r['vendor_fused_ms']:>8.3f} ms   kiln {r['kiln_ms']:.3f} ms"
                  f"   kiln/vendor {r['kiln_ms'] / r['vendor_fused_ms']:.2f}")
    memory = [r for r in rows if r["flops"] == 0]
    anchors = [r for r in rows if r["flops"] > 0]
    for label, group in (("memory-bound", memory), ("anchor", anchors), ("all", rows)):
        if group:
            print(f"geometric mean kiln/torch.compile ({label}, {len(group)} graphs): "
                  f"{geomean([r['ratio_vs_compile'] for r in group]):.2f}; kiln/eager {geomean([r['ratio_vs_eager'] for r in group]):.2f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
