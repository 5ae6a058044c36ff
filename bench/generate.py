"""The serving loop people run (#49): a decoder's `generate` with a static KV
cache (transformers' StaticCache, `cache_implementation="static"`, as
gpt-fast runs it), its forward compiled once by `torch.compile` and called
for the prefill and every decode step.

    python3 bench/generate.py [--models llama,qwen2] [--batches 1,8] [--prompts 100,37,250] [--new 64]

Per model and batch, sides in turn on the same prompts (greedy decoding, so
every side must produce eager's tokens): eager, kiln (`backend="kiln"`),
kiln with `mode="reduce-overhead"`, Inductor's default mode and Inductor
with `mode="reduce-overhead"`. For each: the first `generate` (its compiles
included), then tokens per second over the prompts (each prompt a
`generate` of --new tokens, timed after one untimed run of the same
prompt), whether its tokens equal eager's (each compiled side in a process
of its own: one that crashes is its row), and, for the kiln sides, the
kiln compiles (explain's report: one entry a compile; how each served its
sizes) and the ops left to PyTorch (the cache update, `index_copy_` into
the cache, among them). bf16, eval, random weights (bench/zoo_models.py,
the zoo's configs). Where a side's tokens differ, the rows that differ and
eager's top-2 logit margin at each first difference (a near tie flips under
bf16 rounding; a wide margin is a wrong answer). Inductor's reduce-overhead
side begins a CUDA-graph step at each forward (torch.compiler.
cudagraph_mark_step_begin, as PyTorch asks of a loop that keeps a forward's
outputs; without it, it fails on generate's kept outputs). --device cpu runs the tiny configs in f32 (a check of
the loop, not a timing).
"""
import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

import kiln.torch  # noqa: E402


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


def generate(model, prompt, new_tokens):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, cache_implementation="static")


def run_side(model, forward, prompts, new_tokens, device, want):
    """The side's first generate (s), tokens per second over the prompts, and whether every prompt's
    tokens equal `want`'s (None for the eager side itself)."""
    model.forward = forward
    synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        first = generate(model, prompts[0], new_tokens)
    synchronize(device)
    first_s = time.perf_counter() - start
    tokens, seconds, outputs = 0, 0.0, []
    with torch.no_grad():
        for p in prompts:
            generate(model, p, new_tokens)  # (its compiles, if this prompt's length is new)
            synchronize(device)
            start = time.perf_counter()
            out = generate(model, p, new_tokens)
            synchronize(device)
            seconds += time.perf_counter() - start
            tokens += new_tokens * p.shape[0]
            outputs.append(out)
    same = None if want is None else all(torch.equal(a, b) for a, b in zip(outputs, want)) and torch.equal(first, want[0])
    return first_s, tokens / seconds, same, outputs


def step_marked(compiled):
    """A reduce-overhead forward as PyTorch asks it to be called from a loop that keeps its outputs
    (generate keeps the logits and the cache across steps): a new CUDA-graph step begins at each
    call (torch.compiler.cudagraph_mark_step_begin), so a replay never overwrites outputs the
    loop still reads."""
    def forward(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)
    return forward


def divergences(model, prompts, want, outputs, new_tokens):
    """Where a side's tokens leave eager's: per prompt and row, the first generated position that
    differs, and eager's own margin there (its top logit less its second, from eager's scores).
    Greedy decoding in bf16 flips where eager's top two logits lie within rounding of each other;
    a flip at a wide margin is a wrong answer. (count, largest margin, the margin's top logit)"""
    count, widest = 0, (0.0, 0.0)
    for p, w, o in zip(prompts, want, outputs):
        differs = (w != o)[:, p.shape[1]:]
        rows = [r for r in range(differs.shape[0]) if differs[r].any()]
        if not rows:
            continue
        with torch.no_grad():
            scores = model.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, cache_implementation="static",
                                    output_logits=True, return_dict_in_generate=True).logits
        for r in rows:
            step = int(differs[r].nonzero()[0])
            top = scores[step][r].float().topk(2).values
            count += 1
            widest = max(widest, (float(top[0] - top[1]), float(top[0])))
    return count, widest[0], widest[1]


def report_lines(report):
    served = collections.Counter(e.get("sizes", "static (integer sizes)") for e in report.subgraphs)
    lines = [f"{len(report.subgraphs)} kiln compiles: " + "; ".join(f"{n} x {why}" for why, n in served.items())]
    left = collections.Counter((e["op"], e["reason"]) for e in report.left_to_pytorch)
    lines += [f"  left to PyTorch: {n} x {op} ({why[:120]})" for (op, why), n in left.most_common(8)]
    return lines


SIDES = {"kiln": dict(backend="kiln"), "kiln r-o": dict(backend="kiln", mode="reduce-overhead"),
         "Inductor": dict(), "Inductor r-o": dict(mode="reduce-overhead")}


def model_and_prompts(spec, batch, prompt_lengths, device):
    tiny = device == "cpu"
    dtype = torch.float32 if tiny else torch.bfloat16
    model, _ = zoo_models.instantiate(spec, tiny=tiny, device=device, dtype=dtype, batch=batch, seq=max(prompt_lengths))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (batch, s), generator=generator).to(device) for s in prompt_lengths]
    return model, prompts


def run_compiled_side(spec, batch, prompt_lengths, new_tokens, device, name, want):
    """One compiled side's row: (first generate s, tokens/s, tokens equal eager's, report lines)."""
    model, prompts = model_and_prompts(spec, batch, prompt_lengths, device)
    eager_forward = model.forward
    how = SIDES[name]
    report = kiln.torch.Report()
    kiln.torch._REPORTS.report = report if "kiln" in name else None
    try:
        compiled = torch.compile(eager_forward, **how)
        if name == "Inductor r-o":  # (kiln's reduce-overhead gives generate outputs it may keep)
            compiled = step_marked(compiled)
        first_s, tps, same, outputs = run_side(model, compiled, prompts, new_tokens, device, want)
        lines = report_lines(report) if "kiln" in name else []
        if not same:
            model.forward = eager_forward
            count, margin, top = divergences(model, prompts, want, outputs, new_tokens)
            lines.append(f"tokens leave eager's in {count} of {len(prompts) * batch} rows; eager's widest "
                         f"top-2 margin at a first difference: {margin:.4f} (its top logit {top:.3f})")
        return first_s, tps, same, lines
    except Exception as e:  # noqa: BLE001  (a side's failure is its row)
        return float("nan"), float("nan"), False, [f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}"]
    finally:
        kiln.torch._REPORTS.report = None


def run_model(spec, batch, prompt_lengths, new_tokens, device, argv):
    """Eager's row here, then each compiled side in a process of its own (a side that kills its
    process, as PyTorch 2.11's reduce-overhead did inside a Triton launch while recording a CUDA
    graph of Llama's generate on H100 and H200, is its row, not the run's end)."""
    model, prompts = model_and_prompts(spec, batch, prompt_lengths, device)
    _, eager_tps, _, want = run_side(model, model.forward, prompts, new_tokens, device, None)
    rows = {"eager": (float("nan"), eager_tps, True, [])}  # (its first generate compiles nothing)
    del model
    with tempfile.TemporaryDirectory() as tmp:
        torch.save([w.cpu() for w in want], os.path.join(tmp, "want.pt"))
        for name in SIDES:
            if name.startswith("Inductor") and device != "cuda":
                continue
            row_path = os.path.join(tmp, "row.json")
            done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--models", spec.name,
                                   "--batches", str(batch), "--side", name, "--want", os.path.join(tmp, "want.pt"),
                                   "--row", row_path])
            if done.returncode == 0 and os.path.exists(row_path):
                with open(row_path) as f:
                    rows[name] = tuple(json.load(f))
                os.remove(row_path)
            else:
                why = (f"signal {-done.returncode} ({signal.Signals(-done.returncode).name})" if done.returncode < 0
                       else f"exit status {done.returncode}")
                rows[name] = (float("nan"), float("nan"), False, [f"FAILED: its process ended by {why}"])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,qwen2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompts", default="100,37,250", help="prompt lengths, each a generate (the first also the first call)")
    p.add_argument("--new", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # (a compiled side's own process:)
    p.add_argument("--want", help=argparse.SUPPRESS)  # eager's tokens, saved by the parent
    p.add_argument("--row", help=argparse.SUPPRESS)  # where its row goes (JSON)
    args = p.parse_args(argv)
    lengths = [int(s) for s in args.prompts.split(",")]
    for limit in ("recompile_limit", "cache_size_limit"):  # (every side's prompt lengths and decode steps)
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    if args.side:
        want = [w.to(args.device) for w in torch.load(args.want)]
        row = run_compiled_side(zoo_models.select(args.models)[0], int(args.batches), lengths, args.new, args.device,
                                args.side, want)
        with open(args.row, "w") as f:
            json.dump(row, f)
        return 0
    shared = ["--prompts", args.prompts, "--new", str(args.new), "--device", args.device]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (tiny configs, f32)"
    print(f"{device_name}, PyTorch {torch.__version__}, prompts {lengths}, {args.new} new tokens each, greedy\n")
    for spec in zoo_models.select(args.models):
        if spec.long_context or spec.package != "transformers":
            continue
        for batch in (int(b) for b in args.batches.split(",")):
            print(f"### {spec.name}, batch {batch}", flush=True)
            rows = run_model(spec, batch, lengths, args.new, args.device, shared)
            eager_tps = rows["eager"][1]
            print("| side | tokens/s | x eager | first generate s | tokens equal eager's |")
            print("|---|---|---|---|---|")
            for name, (first_s, tps, same, _) in rows.items():
                first = "-" if first_s != first_s else f"{first_s:.2f}"
                print(f"| {name} | {tps:.1f} | {tps / eager_tps:.2f} | {first} | {same} |")
            for name, (_, _, _, lines) in rows.items():
                for line in lines:
                    print(f"{name}: {line}")
            print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
