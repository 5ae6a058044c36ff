"""Dynamic shapes through the backend (python.md, "Shapes"; #49): one
torch.compile(model, backend="kiln", dynamic=True) of a zoo model run at many
sequence lengths, against the same model compiled for each size
(dynamic=False: a new compile per size) and Inductor with dynamic=True, in
one process.

    python3 bench/dynamic_shapes.py [--models gpt2,llama,bert] [--seqs 64,100,...] [--batch N]
    python3 bench/dynamic_shapes.py --models resnet50,efficientnet_b0 --batches 1,3,8,...

With --batches the batch varies instead (the vision models: their image
size stays, so the dynamic sides mark the inputs' batch dimension dynamic,
torch._dynamo.mark_dynamic, rather than dynamic=True, which would make the
image's height and width symbolic too).

Per model and size: the first call's wall time through each side (its
compiles included), then each side's forward in ms (run_bench.median_ms,
after warm-up), its GPU time (the forward captured in a CUDA graph and
replayed: run_bench.graph_ms; at small sizes the host's time per call
decides the first), and kiln dynamic / kiln static of each. At the bottom of each model:
how many kiln graphs each kiln side compiled (explain's report: one entry a
kiln compile) and how each kiln subgraph of the dynamic side served its sizes
(one symbolic compile, or per size and why), and dynamo's frame compiles.
bf16, eval, no_grad, random weights (bench/zoo_models.py).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402
from run_bench import graph_ms, median_ms  # noqa: E402

import kiln.torch  # noqa: E402


def first_call_s(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def gpu_ms(call):
    """The forward's GPU time: captured once in a CUDA graph and replayed (run_bench.graph_ms),
    without the host's time per call, which at small sizes is most of what median_ms sees. NaN
    where the side's forward cannot be captured."""
    try:
        return graph_ms(call, runs=20)
    except Exception:  # noqa: BLE001  (a forward that cannot be captured has no such time)
        torch.cuda.synchronize()
        return float("nan")


def frame_compiles():
    from torch._dynamo.utils import counters
    return sum(counters["stats"].values()) if "stats" in counters else 0


def run_model(spec, seqs, batch, iters, batches=None):
    torch._dynamo.reset()
    # Three compiled sides of one forward share dynamo's cache of its code, and the static side
    # compiles once per size: past the default limit (8) dynamo would run the rest eagerly.
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 1024)
    if batches:  # the sizes are batches at the model's own sequence or image size
        model, _ = zoo_models.instantiate(spec, tiny=False, device="cuda", dtype=torch.bfloat16, batch=batches[0], seq=spec.seq)
        inputs = {b: spec.inputs(model, b, spec.seq, "cuda", torch.bfloat16) for b in batches}
        seqs = batches
    else:
        model, _ = zoo_models.instantiate(spec, tiny=False, device="cuda", dtype=torch.bfloat16, batch=batch, seq=seqs[0])
        longest = getattr(model.config, "max_position_embeddings", None) or max(seqs)
        if any(s > longest for s in seqs):  # (BERT's 512 positions: a longer sequence fails in PyTorch itself)
            print(f"  {spec.name}: sequences past its {longest} positions left out: {[s for s in seqs if s > longest]}")
            seqs = [s for s in seqs if s <= longest]
        inputs = {s: spec.inputs(model, batch, s, "cuda", torch.bfloat16) for s in seqs}
    # The dynamic sides' own copies of the inputs, their batch dimension marked dynamic (--batches).
    marked = {s: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in x.items()} for s, x in inputs.items()}
    if batches:
        for x in marked.values():
            for v in x.values():
                if isinstance(v, torch.Tensor):
                    torch._dynamo.mark_dynamic(v, 0)
    dynamic = None if batches else True
    reports = {"kiln dynamic": kiln.torch.Report(), "kiln static": kiln.torch.Report()}
    sides = {}
    for name, how in (("kiln dynamic", dynamic), ("kiln static", False)):
        kiln.torch._REPORTS.report = reports[name]
        sides[name] = torch.compile(model, backend="kiln", dynamic=how)
    sides["inductor dynamic"] = torch.compile(model, dynamic=dynamic)
    rows = []
    with torch.no_grad():
        for s in seqs:
            row = {"size": s}  # (a sequence length, or with --batches a batch)
            for name, fn in sides.items():
                if name in reports:
                    kiln.torch._REPORTS.report = reports[name]
                given = inputs[s] if name == "kiln static" else marked[s]
                call = lambda: fn(**given)  # noqa: E731
                row[f"{name} first s"] = first_call_s(call)
                row[f"{name} ms"] = median_ms(call, warmup=2, runs=iters)
                row[f"{name} gpu ms"] = gpu_ms(call)
            kiln.torch._REPORTS.report = None
            rows.append(row)
            print(f"  {spec.name} " + (f"B{s}" if batches else f"B{batch} S{s}") + ": " + ", ".join(
                f"{n} {row[n + ' ms']:.3f} ms (first {row[n + ' first s']:.2f} s)" for n in sides), flush=True)
    return rows, reports


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama,bert")
    p.add_argument("--seqs", default="64,100,128,200,256,300,384,500,512,1000")
    p.add_argument("--batch", type=int, default=0, help="the batch (default: each model's serving batch)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--batches", help="batch sizes to run instead of sequence lengths (the batch marked dynamic)")
    args = p.parse_args(argv)
    seqs = [int(s) for s in args.seqs.split(",")]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else None
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, bf16, no_grad, sizes {seqs}\n")
    for spec in zoo_models.select(args.models):
        if spec.long_context:
            continue
        batch = args.batch or spec.batch
        print(f"### {spec.name}, " + (f"batches {batches}" if batches else f"batch {batch}"), flush=True)
        try:
            rows, reports = run_model(spec, seqs, batch, args.iters, batches)
        except Exception as e:  # noqa: BLE001  (one model's failure is its row, not the run's end)
            print(f"FAILED: {type(e).__name__}: {e}", flush=True)
            continue
        print("\n| " + ("batch" if batches else "seq") + " | kiln dynamic ms | kiln static ms | dynamic / static | Inductor dynamic ms "
              "| kiln dyn / Ind dyn | GPU ms kiln dyn / kiln static / Ind dyn | GPU dynamic / static "
              "| first call kiln dyn / kiln static / Ind dyn s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['size']} | {r['kiln dynamic ms']:.3f} | {r['kiln static ms']:.3f} | "
                  f"{r['kiln dynamic ms'] / r['kiln static ms']:.2f} | {r['inductor dynamic ms']:.3f} | "
                  f"{r['kiln dynamic ms'] / r['inductor dynamic ms']:.2f} | {r['kiln dynamic gpu ms']:.3f} / "
                  f"{r['kiln static gpu ms']:.3f} / {r['inductor dynamic gpu ms']:.3f} | "
                  f"{r['kiln dynamic gpu ms'] / r['kiln static gpu ms']:.2f} | {r['kiln dynamic first s']:.2f} / "
                  f"{r['kiln static first s']:.2f} / {r['inductor dynamic first s']:.2f} |")
        for name, report in reports.items():
            served = {}
            for e in report.subgraphs:
                served.setdefault(e.get("sizes", "static (integer sizes)"), 0)
                served[e.get("sizes", "static (integer sizes)")] += 1
            print(f"\n{name}: {len(report.subgraphs)} kiln compiles over {len(rows)} sizes; "
                  + "; ".join(f"{n} x {why}" for why, n in served.items()))
            left = {e["reason"] for e in report.left_to_pytorch}
            if left:
                print(f"  left to PyTorch for: {sorted(left)[:5]}")
        print(f"dynamo frame compiles (all sides, this model): {frame_compiles()}\n", flush=True)


if __name__ == "__main__":
    main()
