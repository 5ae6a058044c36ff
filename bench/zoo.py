"""The model zoo: real models through torch.compile(backend="kiln") against
eager PyTorch and Inductor, one table (models: bench/zoo_models.py).

    python3 bench/zoo.py [--models llama,bert,...] [--batch N | --batch-scale F] [--rounds N]
                         [--json OUT] [--no-cold] [--quick] [--grad [--step]]
    python3 bench/zoo.py --gpus 0,1,2,3 [...]            # the rows spread over four GPUs, one table
    python3 bench/zoo.py --device cpu --quick --tiny     # the harness itself, checked without a GPU
                                                         # (with --gpus 0,1: two rows at once)

Every model is built from its config or constructor with random weights
(nothing is downloaded), in bf16 (f32 on the CPU), eval(), under
torch.no_grad() (--grad: autograd on, the forward alone timed; --step: and
whole training steps, forward, loss and backward). Per model,
in this one process:

- correctness: each compiled forward's output against eager's: the largest
  absolute difference, and that over the largest |eager| ("max rel err");
- time: kiln, kiln mode="reduce-overhead" (its forward replayed from CUDA
  graphs; on the GPU), Inductor (default mode), Inductor mode="reduce-overhead"
  and eager, each warmed up, then timed in alternating rounds
  (kiln, its reduce-overhead, Inductor, reduce-overhead, eager, then the next round), so that a
  GPU clocking down under sustained load slows every side alike. A side's
  time in a round is run_bench.median_ms over --iters calls: CUDA events
  around each call, recorded back to back (the host's time per call
  overlaps the previous call's kernels, as a serving loop's does); the
  table has the median over rounds, the JSON every round;
- what kiln took (kiln.torch.explain): kernels, kiln subgraphs, the share of
  ATen ops and of anchor FLOPs (matmul, conv, attention) in kiln, and the
  ops left to PyTorch grouped by reason;
- where the time goes: one kiln-compiled forward under the torch profiler,
  its GPU kernels by time (kiln's kernels labelled with their kind from the
  kiln plans, in launch order), and the same forward's under Inductor
  (default mode) beside them; the table's "GPU ms kiln / Ind" sums each
  profile's kernels, a comparison of the two sides' GPU work that a slow
  host, which can hold both reduce-overhead sides above it, does not move;
- first calls (unless --no-cold), each in a fresh process per model and
  backend: cold (new empty KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and
  TRITON_CACHE_DIR, no remote kiln cache) and warm (a second process with
  those caches kept): the wall time of the first call, tracing, compiling
  and running included (the backends' modules imported before it).

--gpus runs the rows in child processes, one at a time per GPU (each child
sees its GPU alone and an equal share of the host's cores, so that compile
times are those of a machine of that share), and prints their rows as one
table: the zoo in one device run on a machine of several GPUs (--deadline:
no row starts after that many seconds; the rest are listed as not run).
--batch-scale 1,0.25 gives a table for each scale.

A model that raises anything through the kiln backend is a FAILURE row (the
message printed, the traceback on stderr), never the harness's end; a kiln
subgraph that ran in PyTorch after an internal error is a FAILURE line under
the model's row (kiln's warning: its outputs are right, its times PyTorch's). At the
bottom: the geometric mean of kiln/Inductor over the models that ran, and
the failures.
"""
import argparse
import copy
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402  (first: it makes torchvision importable on a CPU PyTorch)
from run_bench import geomean, median_ms  # noqa: E402  (CUDA events around each call, the median)

FIRST_CALL_PREFIX = "first-call: "


# ---- timing --------------------------------------------------------------------

def cpu_median_ms(fn, warmup=3, runs=20):
    """median_ms's CPU counterpart (the smoke check without a GPU): the median
    wall time of `runs` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_first_call(fn, device):
    """(result, seconds) of one call, the device's work included."""
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - t0


def alternating_rounds(sides, device, rounds, iters, warmup):
    """{side: [ms per round]}: every side warmed up, then timed round after
    round in turn (see the module's docstring)."""
    timer = median_ms if device == "cuda" else cpu_median_ms
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    times = {side: [] for side in sides}
    for _ in range(rounds):
        for side, fn in sides.items():
            times[side].append(timer(fn, warmup=1, runs=iters))
    return times


# ---- correctness ---------------------------------------------------------------

def errors(got, want):
    """The largest |got - want|, that over the largest |want|, and the norm-wise relative error."""
    got, want = got.detach().float(), want.detach().float()
    if got.shape != want.shape:
        raise ValueError(f"output shape {list(got.shape)}, eager's {list(want.shape)}")
    diff = (got - want).abs()
    max_abs = diff.max().item()
    scale = want.abs().max().item()
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale else float("nan"),
            "norm_rel": ((got - want).norm() / want.norm()).item() if want.norm().item() else float("nan")}


# ---- what kiln took (explain) --------------------------------------------------

def explain_summary(report):
    """The table's figures from kiln.torch.explain's report (as a dict)."""
    subgraphs, left = report["subgraphs"], report["left_to_pytorch"]
    in_kiln = sum(s["aten_ops"] for s in subgraphs)
    flops_kiln = sum(s.get("flops", 0) for s in subgraphs)
    flops_all = flops_kiln + sum(e.get("flops", 0) for e in left)
    reasons = Counter(f"{e['op']}: {e['reason']}" for e in left)
    return {"kernels": sum(s["kernels"] for s in subgraphs), "subgraphs": len(subgraphs),
            "aten_ops_in_kiln": in_kiln, "aten_ops": in_kiln + len(left),
            "aten_share": in_kiln / (in_kiln + len(left)) if in_kiln + len(left) else float("nan"),
            "flops_share": flops_kiln / flops_all if flops_all else float("nan"),
            "left_to_pytorch": [{"count": n, "what": what} for what, n in reasons.most_common()],
            "graphs_in_pytorch": report.get("graphs_in_pytorch", []),
            "anchor_tactics": dict(Counter(t for s in subgraphs for t in s.get("tactics", []) if t))}


# ---- where the time goes (the profiler) ----------------------------------------

def top_kernels(fn, report, device, top=10):
    """One forward under the torch profiler: its kernels (on the CPU, its ops)
    by time, largest first, as [{kernel, calls, ms, share}]. kiln's kernels
    are all named kiln_kernel: they are labelled in launch order with the
    kinds of explain's subgraphs, in the order kiln compiled them (the order
    a forward runs them), where the counts agree; kernels a vendor library
    runs (the cublasLt tactic) keep the library's kernel names."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    synchronize(device)
    activities = [ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    totals, calls = Counter(), Counter()
    if device == "cuda":
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kinds = [f"kiln subgraph {j} ({s['name']}) kernel {i}: {kind}"
                 for j, s in enumerate(report["subgraphs"])
                 for i, (kind, tactic) in enumerate(zip(s["kinds"], s.get("tactics", [""] * len(s["kinds"]))))
                 if tactic != "cublasLt"]
        kiln_launches = sum(e.name == "kiln_kernel" for e in events)
        labels = iter(kinds if kiln_launches == len(kinds) else [])
        for e in events:
            name = next(labels, "kiln_kernel") if e.name == "kiln_kernel" else e.name
            totals[name] += e.device_time
            calls[name] += 1
    else:
        for e in prof.key_averages():
            totals[e.key] += e.self_cpu_time_total
            calls[e.key] += e.count
    whole = sum(totals.values()) or float("nan")
    return {"total_ms": whole / 1e3,
            "kernels": [{"kernel": name, "calls": calls[name], "ms": us / 1e3, "share": us / whole}
                        for name, us in totals.most_common(top)]}


# ---- first calls, each in a fresh process --------------------------------------

def compiled(model, backend, mode=None):
    if backend == "kiln":
        return torch.compile(model, backend="kiln", dynamic=False, mode=mode)
    return torch.compile(model, dynamic=False, mode=mode)


def first_call_child(args):
    """The child's job (--first-call NAME --backend B): build the model, time
    the first call through B, print the seconds on one line."""
    spec = zoo_models.BY_NAME[args.first_call]
    batch, seq = (int(x) for x in args.shape.split(","))
    device, dtype = args.device, dtype_of(args)
    model, inputs = zoo_models.instantiate(spec, tiny=args.tiny, device=device, dtype=dtype, batch=batch, seq=seq)
    if device == "cuda":
        torch.backends.cudnn.benchmark = True  # as in the parent
    # The backends' modules imported before the clock starts, for both alike.
    # (aliased: a plain `import torch.x` here would make `torch` a local of this function)
    import torch._dynamo as _dynamo  # noqa: F401
    if args.backend == "kiln":
        import kiln.torch  # noqa: F401  (registers the backend)
    else:
        import torch._inductor.compile_fx as _compile_fx  # noqa: F401
    with torch.set_grad_enabled(args.grad):
        fn = compiled(model, args.backend)
        _, seconds = timed_first_call(lambda: fn(**inputs), device)
    print(FIRST_CALL_PREFIX + json.dumps({"seconds": seconds}), flush=True)


def first_calls(spec, batch, seq, backend, args):
    """{cold_s, warm_s}: the first call through `backend` in a process with
    empty caches, then in a second process with the caches the first left."""
    cache = tempfile.mkdtemp(prefix=f"zoo-{backend}-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_REMOTE_CACHE")}
    env.update(KILN_CACHE_DIR=os.path.join(cache, "kiln"), TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
               TRITON_CACHE_DIR=os.path.join(cache, "triton"))
    command = [sys.executable, os.path.abspath(__file__), "--first-call", spec.name, "--backend", backend,
               "--shape", f"{batch},{seq}", "--device", args.device, "--dtype", args.dtype or ""]
    command += ["--tiny"] * args.tiny + ["--grad"] * args.grad
    result = {}
    try:
        for phase in ("cold", "warm"):
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.child_timeout)
            except subprocess.TimeoutExpired:
                result[f"{phase}_error"] = f"timed out after {args.child_timeout} s"
                break
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith(FIRST_CALL_PREFIX)]
            if done.returncode != 0 or not lines:
                tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                result[f"{phase}_error"] = f"exit {done.returncode}: {tail}"
                break
            result[f"{phase}_s"] = json.loads(lines[-1][len(FIRST_CALL_PREFIX):])["seconds"]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return result


def describe(e):
    """An exception in one line: the innermost cause (dynamo wraps a backend's
    error in BackendCompilerFailed), its message's first line, and where it
    was raised."""
    while (e.__cause__ or getattr(e, "inner_exception", None)) is not None:
        e = e.__cause__ or e.inner_exception
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {os.path.basename(where.filename)}:{where.lineno} in {where.name})" if where else ""
    return f"{type(e).__name__}: {lines[0] if lines else ''}{at}"


# ---- one model -----------------------------------------------------------------

def dtype_of(args):
    if args.dtype:
        return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    return torch.bfloat16 if args.device == "cuda" else torch.float32


def shape_for(spec, args):
    batch = spec.tiny_batch if args.tiny else spec.batch
    if args.batch:
        batch = args.batch
    elif args.batch_scale:
        batch = max(1, round(batch * args.batch_scale))
    return batch, (spec.tiny_seq if args.tiny else spec.seq)


def measure(spec, args):
    """One row: every figure of one model (see the module's docstring). An
    exception through the kiln backend becomes the row's `failure`."""
    import kiln.torch
    batch, seq = shape_for(spec, args)
    row = {"model": spec.name, "batch": batch, "seq": seq, "device": args.device}
    if args.first_calls_only:
        return first_calls_row(spec, batch, seq, args, row)
    device, stage = args.device, "building the model"
    # kiln's warnings: a subgraph that ran in PyTorch after an internal error is a failure of the
    # row, though its outputs are right (BERT's under reduce-overhead once, timed as PyTorch's).
    caught = warnings.catch_warnings(record=True)
    log = caught.__enter__()
    warnings.simplefilter("always")
    try:
        model, inputs = zoo_models.instantiate(spec, tiny=args.tiny, device=device, dtype=dtype_of(args),
                                               batch=batch, seq=seq)
        with torch.set_grad_enabled(args.grad):
            stage = "eager"
            eager = lambda: model(**inputs)  # noqa: E731
            want = spec.output(eager()).detach()

            stage = "kiln.torch.explain"
            explained = kiln.torch.explain(model, **inputs).to_dict()
            row.update(explain_summary(explained))

            stage = "kiln (first call in this process)"
            torch._dynamo.reset()
            kiln_fn = compiled(model, "kiln")
            got, row["kiln_first_call_in_process_s"] = timed_first_call(lambda: kiln_fn(**inputs), device)
            row["kiln_error"] = errors(spec.output(got), want)
            del got
            sides = {"kiln": lambda: kiln_fn(**inputs)}

            def add_side(side, backend, mode):
                """Compiles the model through `backend` in `mode`, times its first call, checks it, and times it below."""
                fn = compiled(model, backend, mode)
                if mode == "reduce-overhead":  # a new step each call, as torch's benchmarks run it
                    call = lambda: (torch.compiler.cudagraph_mark_step_begin(), fn(**inputs))[1]  # noqa: E731
                else:
                    call = lambda: fn(**inputs)  # noqa: E731
                notes = kiln.torch._current_report().cuda_graphs  # (kiln's: replayed, or why not)
                seen = len(notes)
                got, row[f"{side}_first_call_in_process_s"] = timed_first_call(call, device)
                if backend == "kiln" and mode == "reduce-overhead":
                    row["kiln_cuda_graphs"] = notes[seen:]
                del got
                row[f"{side}_error"] = errors(spec.output(call()), want)
                sides[side] = call

            if device == "cuda":  # kiln's forward replayed from CUDA graphs, beside Inductor's reduce-overhead
                stage = "kiln mode=\"reduce-overhead\""
                add_side("kiln_reduce_overhead", "kiln", "reduce-overhead")
            if args.inductor:
                for side, mode in (("inductor", None), ("reduce_overhead", "reduce-overhead")):
                    try:
                        add_side(side, "inductor", mode)
                    except Exception as e:  # noqa: BLE001 (Inductor's failure is a missing column, not a FAILURE)
                        row[f"{side}_failure"] = describe(e)
            sides["eager"] = eager
            del want

            stage = "timing"
            times = alternating_rounds(sides, device, args.rounds, args.iters, args.warmup)
            row["rounds_ms"] = times
            for side, t in times.items():
                row[f"{side}_ms"] = statistics.median(t)

            if args.step:  # the training step's time too: forward, a loss, the backward (kiln's in PyTorch)
                stage = "timing training steps"
                def step(fn):
                    spec.output(fn()).float().square().mean().backward()
                steps = {side: (lambda fn=fn: step(fn)) for side, fn in sides.items()}
                times = alternating_rounds(steps, device, args.rounds, args.iters, args.warmup)
                row["step_rounds_ms"] = times
                for side, t in times.items():
                    row[f"{side}_step_ms"] = statistics.median(t)
                model.zero_grad(set_to_none=True)

            stage = "profiling the kiln forward"
            row["top_kernels"] = top_kernels(sides["kiln"], explained, device)
            if "inductor" in sides:  # the same forward's kernels under Inductor, beside kiln's
                stage = "profiling the Inductor forward"
                row["inductor_top_kernels"] = top_kernels(sides["inductor"], {"subgraphs": []}, device)
        del sides, kiln_fn, model, inputs
    except Exception as e:  # noqa: BLE001 (a model that fails is a row, the others run)
        print(f"{spec.name}: FAILURE while {stage}:", file=sys.stderr)
        traceback.print_exc()
        row["failure"] = {"stage": stage, "error": describe(e)}
    finally:
        caught.__exit__(None, None, None)
        row["kiln_internal_errors"] = sorted({str(w.message) for w in log if "internal error" in str(w.message)})
        torch._dynamo.reset()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    if not args.no_cold and "failure" not in row:
        first_calls_row(spec, batch, seq, args, row)
    return row


def first_calls_row(spec, batch, seq, args, row):
    """The row's cold and warm first calls (fresh processes), through kiln and through Inductor."""
    for backend in ("kiln", "inductor") if args.inductor else ("kiln",):
        for key, value in first_calls(spec, batch, seq, backend, args).items():
            row[f"{backend}_{key}"] = value
    return row


# ---- the table -----------------------------------------------------------------

def number(x, digits=3):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def ratio(a, b):
    return a / b if a is not None and b and not math.isnan(a) and not math.isnan(b) else float("nan")


def shape_text(spec, row):
    if spec.package == "transformers":
        return f"B{row['batch']} S{row['seq']}"
    return f"B{row['batch']} {row['seq']}x{row['seq']}" + (" NHWC" if spec.channels_last else "")


COLUMNS = ["model", "batch/seq", "kiln ms", "Inductor ms", "kiln/Ind", "kiln r-o ms", "Ind r-o ms", "kiln r-o / Ind r-o",
           "GPU ms kiln / Ind", "eager ms",
           "max rel err kiln / Ind", "cold 1st call kiln / Ind s", "warm 1st call kiln / Ind s", "kernels", "subgraphs",
           "ATen ops in kiln", "FLOPs in kiln"]


def gpu_ms(row, key):
    """One forward's kernels summed (top_kernels), or None: a side's GPU time whatever its host's."""
    top = row.get(key)
    if row.get("device") != "cuda" or not top or math.isnan(top.get("total_ms", math.nan)):
        return None  # (on the CPU the profile sums ops' CPU time)
    return top["total_ms"]


def gpu_time_cell(row):
    """kiln's and Inductor's GPU time of one forward and their ratio: where both reduce-overhead
    sides wait on the host (a slow one), the ratio of their GPU work still compares the kernels."""
    kiln, inductor = gpu_ms(row, "top_kernels"), gpu_ms(row, "inductor_top_kernels")
    if kiln is None or inductor is None:
        return "-"
    return f"{number(kiln)} / {number(inductor)} = {number(ratio(kiln, inductor), 2)}"


def table_line(spec, row):
    if "failure" in row:
        f = row["failure"]
        cells = [spec.name, shape_text(spec, row), f"**FAILURE** ({f['stage']}): {f['error'][:160]}"]
        return "| " + " | ".join(cells + [""] * (len(COLUMNS) - len(cells))) + " |"
    g = row.get
    err = lambda side: f"{g(f'{side}_error')['max_rel']:.1e}" if g(f"{side}_error") else "-"  # noqa: E731
    cells = [spec.name, shape_text(spec, row), number(g("kiln_ms")), number(g("inductor_ms")),
             number(ratio(g("kiln_ms"), g("inductor_ms")), 2), number(g("kiln_reduce_overhead_ms")),
             number(g("reduce_overhead_ms")), number(ratio(g("kiln_reduce_overhead_ms"), g("reduce_overhead_ms")), 2),
             gpu_time_cell(row), number(g("eager_ms")),
             f"{err('kiln')} / {err('inductor')}", f"{number(g('kiln_cold_s'), 1)} / {number(g('inductor_cold_s'), 1)}",
             f"{number(g('kiln_warm_s'), 1)} / {number(g('inductor_warm_s'), 1)}", str(g("kernels", "-")),
             str(g("subgraphs", "-")),
             f"{100 * row['aten_share']:.0f}% ({row['aten_ops_in_kiln']}/{row['aten_ops']})" if g("aten_ops") else "-",
             f"{100 * row['flops_share']:.0f}%" if not math.isnan(g("flops_share", math.nan)) else "-"]
    return "| " + " | ".join(cells) + " |"


def details(spec, row):
    """The per-model lists below the table: ops left to PyTorch, top kernels, what did not run."""
    lines = [f"### {spec.name} ({shape_text(spec, row)})"]
    if "failure" in row:
        return lines + [f"FAILURE while {row['failure']['stage']}: {row['failure']['error']}", ""]
    if "left_to_pytorch" not in row:  # (--first-calls-only)
        return lines + [f"- {key.replace('_', ' ')}: {row[key]}" for key in sorted(row) if "cold" in key or "warm" in key] + [""]
    for key in ("inductor_failure", "reduce_overhead_failure", "kiln_cold_error", "kiln_warm_error",
                "inductor_cold_error", "inductor_warm_error"):
        if key in row:
            lines.append(f"- {key.replace('_', ' ')}: {row[key]}")
    for why in row.get("kiln_internal_errors", []):
        lines.append(f"- FAILURE: {why}")
    for why in row["graphs_in_pytorch"]:
        lines.append(f"- a whole graph ran in PyTorch: {why}")
    for note in row.get("kiln_cuda_graphs", []):  # (a forward not replayed times its launches from the host)
        if not note.startswith("replayed"):
            lines.append(f"- kiln reduce-overhead: {note.splitlines()[0]}")
    left = row["left_to_pytorch"]
    lines.append(f"ops left to PyTorch ({row['aten_ops'] - row['aten_ops_in_kiln']} of {row['aten_ops']} ATen ops):"
                 + ("" if left else " none"))
    lines += [f"- {e['count']} x {e['what']}" for e in left]
    if row.get("anchor_tactics"):  # (vendor tactics: cuBLASLt's kernels appear under their own names below)
        lines.append("anchor kernels by tactic: " + ", ".join(f"{t} {n}" for t, n in sorted(row["anchor_tactics"].items())))
    if "kiln_step_ms" in row:
        sides = [side for side in ("kiln", "inductor", "eager") if f"{side}_step_ms" in row]
        lines.append("training step (forward, loss, backward) ms: " + ", ".join(
            f"{side} {number(row[f'{side}_step_ms'])}" for side in sides))
        lines.append("its backward (step - forward) ms: " + ", ".join(
            f"{side} {number(row[f'{side}_step_ms'] - row[f'{side}_ms'])}" for side in sides)
            + " (kiln's backward is eager ATen's)")
    top = row["top_kernels"]
    where = "GPU kernels" if row.get("device") == "cuda" else "ops (CPU time)"
    lines.append(f"top {where} of one kiln forward ({number(top['total_ms'])} ms in all):")
    lines += [f"- {100 * k['share']:5.1f}%  {k['ms']:8.3f} ms  x{k['calls']:<4d} {k['kernel'][:100]}"
              for k in top["kernels"]]
    if "inductor_top_kernels" in row:
        top = row["inductor_top_kernels"]
        lines.append(f"top {where} of one Inductor forward ({number(top['total_ms'])} ms in all):")
        lines += [f"- {100 * k['share']:5.1f}%  {k['ms']:8.3f} ms  x{k['calls']:<4d} {k['kernel'][:100]}"
                  for k in top["kernels"]]
    return lines + [""]


def summary(rows):
    ran = [r for r in rows if "failure" not in r]

    def mean(pairs):
        ratios = [x for x in (ratio(a, b) for a, b in pairs) if not math.isnan(x)]
        return {"geomean": geomean(ratios), "models": len(ratios)}
    means = {side: mean((r.get("kiln_ms"), r.get(f"{side}_ms")) for r in ran)
             for side in ("inductor", "reduce_overhead", "eager")}
    means["reduce_overhead_both"] = mean((r.get("kiln_reduce_overhead_ms"), r.get("reduce_overhead_ms"))
                                         for r in ran)  # both from CUDA graphs
    means["gpu_time"] = mean((gpu_ms(r, "top_kernels"), gpu_ms(r, "inductor_top_kernels")) for r in ran)
    return means, [r["model"] for r in rows if "failure" in r]


def report(rows, args):
    specs = [zoo_models.BY_NAME[r["model"]] for r in rows]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join(["---"] * len(COLUMNS)) + "|")
    for spec, row in zip(specs, rows):
        print(table_line(spec, row))
    means, failures = summary(rows)
    print()
    names = {"inductor": "kiln/Inductor (default)", "reduce_overhead": "kiln/Inductor reduce-overhead", "eager": "kiln/eager",
             "reduce_overhead_both": "kiln reduce-overhead/Inductor reduce-overhead",
             "gpu_time": "kiln/Inductor by one forward's GPU time"}
    for side, m in means.items():
        print(f"geomean {names[side]} over {m['models']} models: {number(m['geomean'], 3)}")
    print(f"failures: {len(failures)}" + (f" ({', '.join(failures)})" if failures else ""))
    print()
    for spec, row in zip(specs, rows):
        print("\n".join(details(spec, row)))
    return means, failures


# ---- several GPUs ---------------------------------------------------------------

# Rough minutes of one row (compiles of both backends and the timing), so that
# the longest rows start first and the GPUs finish together.
ROW_MINUTES = {"densenet121": 5, "swin_t": 5, "efficientnet_b0": 4, "convnext_t": 3, "resnext50_32x4d": 3,
               "resnet50": 3, "resnet50_cl": 3, "mobilenet_v3_s": 3, "vit_s16": 3}


def row_minutes(spec):
    return 4 if spec.long_context else ROW_MINUTES.get(spec.name, 2)


def child_command(spec, scale, args, json_path):
    """This script's command line for one row (at `scale` of its serving batch), with the parent's options."""
    command = [sys.executable, os.path.abspath(__file__), "--models", spec.name, "--json", json_path,
               "--rounds", str(args.rounds), "--iters", str(args.iters), "--warmup", str(args.warmup),
               "--inductor", "on" if args.inductor else "off", "--child-timeout", str(args.child_timeout),
               "--device", args.device]
    command += ["--no-long"] * (not spec.long_context)  # (a decoder's name alone selects its long row too)
    command += ["--batch", str(args.batch)] if args.batch else []
    command += ["--batch-scale", str(scale)] if scale else []
    command += ["--dtype", args.dtype] if args.dtype else []
    command += ["--first-calls-only"] * args.first_calls_only
    command += ["--no-cold"] * args.no_cold + ["--tiny"] * args.tiny + ["--grad"] * args.grad + ["--step"] * args.step
    return command


def spread_over_gpus(jobs, args):
    """Every row (a spec at a batch scale) in a child process of its own, as
    many at once as there are GPUs in --gpus; the rows (in the jobs' order) as
    the children wrote them, a FAILURE row for a child that wrote none."""
    import threading
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // len(args.gpus))
    queue = sorted(jobs, key=lambda job: row_minutes(job[0]), reverse=True)
    lock = threading.Lock()
    rows = {}
    work = tempfile.mkdtemp(prefix="zoo-gpus-")

    deadline = time.monotonic() + args.deadline if args.deadline else None

    def worker(slot, gpu):
        own_cores = set(cores[slot * share:(slot + 1) * share]) or set(cores)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
        while True:
            with lock:
                if not queue or (deadline and time.monotonic() > deadline):
                    return
                spec, scale = job = queue.pop(0)
            json_path = os.path.join(work, f"{spec.name.replace('@', '_')}-{scale or 1}.json")
            log_path = json_path[:-len(".json")] + ".log"
            start = time.monotonic()
            error = None
            with open(log_path, "w") as log:
                try:
                    done = subprocess.run(child_command(spec, scale, args, json_path), env=env, stdout=log, stderr=subprocess.STDOUT,
                                          timeout=args.row_timeout, preexec_fn=lambda: os.sched_setaffinity(0, own_cores))
                    if done.returncode != 0:
                        error = f"its process exited {done.returncode}"
                except subprocess.TimeoutExpired:
                    error = f"its process timed out after {args.row_timeout} s"
            try:
                with open(json_path) as f:
                    row = json.load(f)["rows"][0]
            except (OSError, ValueError, KeyError, IndexError) as e:
                with open(log_path) as f:
                    tail = [ln for ln in f.read().strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
                batch, seq = shape_for(spec, with_scale(args, scale))
                row = {"model": spec.name, "batch": batch, "seq": seq, "device": args.device,
                       "failure": {"stage": "its process", "error": f"{error or type(e).__name__}: {tail[0]}"}}
            row["batch_scale"] = scale
            with lock:
                rows[job] = row
                print(f"{spec.name}: {row_status(row)} (GPU {gpu}, {time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=worker, args=(slot, gpu)) for slot, gpu in enumerate(args.gpus)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shutil.rmtree(work, ignore_errors=True)
    if queue:
        print(f"not run (--deadline {args.deadline} s): {', '.join(f'{spec.name} x{scale or 1}' for spec, scale in queue)}",
              flush=True)
    return [rows[job] for job in jobs if job in rows]


# ---- main ----------------------------------------------------------------------

def arguments(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated names (a decoder's name selects its long-context row too)")
    ap.add_argument("--no-long", action="store_true", help="without the decoders' long-context rows")
    ap.add_argument("--batch", type=int, help="every model at this batch")
    ap.add_argument("--batch-scale", help="every model's serving batch times this (comma-separated: a table for each)")
    ap.add_argument("--rounds", type=int, help="timing rounds (default 5; --quick 2)")
    ap.add_argument("--iters", type=int, help="calls per side per round (default 20; --quick 3)")
    ap.add_argument("--warmup", type=int, help="calls per side before the rounds (default 3; --quick 1)")
    ap.add_argument("--json", dest="json_out", help="every figure, and every round's time, to this file")
    ap.add_argument("--no-cold", action="store_true", help="skip the first-call measurements (fresh processes)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds and calls")
    ap.add_argument("--first-calls-only", action="store_true",
                    help="only the cold and warm first calls (fresh processes), nothing timed in this one")
    ap.add_argument("--grad", action="store_true", help="autograd on (model.eval() alone); the forward timed")
    ap.add_argument("--step", action="store_true", help="with --grad: training steps (forward, loss, backward) timed too")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="the tiny configs of python/tests/test_zoo_tiny.py")
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32", ""), default=None,
                    help="default bf16 on the GPU, f32 on the CPU")
    ap.add_argument("--inductor", choices=("auto", "on", "off"), default="auto",
                    help="the Inductor sides (auto: on the GPU only; on the CPU its compiles take minutes)")
    ap.add_argument("--child-timeout", type=int, default=1800, help="seconds for one first-call process")
    ap.add_argument("--gpus", help="comma-separated CUDA device indices: the rows spread over them (child processes)")
    ap.add_argument("--row-timeout", type=int, default=1500, help="with --gpus: seconds for one row's process")
    ap.add_argument("--deadline", type=int, help="with --gpus: no row starts after this many seconds (the rest: not run)")
    # the first-call child's own arguments
    ap.add_argument("--first-call", help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=("kiln", "inductor"), help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch and args.batch_scale:
        ap.error("--batch and --batch-scale: give one")
    try:
        args.batch_scales = [float(x) for x in args.batch_scale.split(",")] if args.batch_scale else [None]
    except ValueError:
        ap.error(f"--batch-scale {args.batch_scale}: numbers, comma-separated")
    args.batch_scale = args.batch_scales[0]
    if args.step and not args.grad:
        ap.error("--step times training steps: it needs --grad")
    args.rounds = args.rounds or (2 if args.quick else 5)
    args.iters = args.iters or (3 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.inductor = args.inductor == "on" or (args.inductor == "auto" and args.device == "cuda")
    if args.gpus is not None:
        try:
            args.gpus = [int(x) for x in args.gpus.split(",") if x.strip()]
        except ValueError:
            ap.error(f"--gpus {args.gpus}: comma-separated device indices, as 0,1,2,3")
        if not args.gpus:
            ap.error("--gpus takes one or more CUDA device indices")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device here: --device cpu (with --tiny --quick) checks the harness")
    return args


def with_scale(args, scale):
    """The options of one row: `args` at batch scale `scale`."""
    one = copy.copy(args)
    one.batch_scale = scale
    return one


def row_status(row):
    return "FAILURE" if "failure" in row else f"kiln {number(row.get('kiln_ms'))} ms"


def measured_row(spec, args):
    row = measure(spec, args)
    row["device"] = args.device
    print(f"{spec.name}: {row_status(row)}", file=sys.stderr, flush=True)
    return row


def main(argv=None):
    args = arguments(argv)
    if args.first_call:
        return first_call_child(args)
    try:
        specs = zoo_models.select(args.models)
        if args.no_long:
            specs = [s for s in specs if not s.long_context]
    except ValueError as e:
        sys.exit(str(e))
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True  # cuDNN at its best, as in run_bench.py
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{device_name}, PyTorch {torch.__version__}, {dtype_of(args)}, "
          f"{'gradients on' if args.grad else 'no_grad'}, {args.rounds} rounds x {args.iters} calls"
          + ("" if args.inductor else "; Inductor skipped") + ("" if not args.tiny else "; tiny configs"), flush=True)
    jobs = [(spec, scale) for scale in args.batch_scales for spec in specs]
    if args.gpus:
        print(f"rows spread over GPUs {','.join(map(str, args.gpus))}, one process per row", flush=True)
        rows = spread_over_gpus(jobs, args)
    else:
        rows = [dict(measured_row(spec, with_scale(args, scale)), batch_scale=scale) for spec, scale in jobs]
    tables = []
    for scale in args.batch_scales:  # a table for each batch scale
        print()
        if len(args.batch_scales) > 1:
            print(f"## batch scale {scale or 1}\n")
        means, failures = report([r for r in rows if r["batch_scale"] == scale], args)
        tables.append({"batch_scale": scale, "geomean_kiln_over": means, "failures": failures})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__, "options": vars(args), "rows": rows,
                       "tables": tables, **({k: tables[0][k] for k in ("geomean_kiln_over", "failures")} if len(tables) == 1 else {})},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
