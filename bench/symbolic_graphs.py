"""#49's table: the symbolic graphs the PyTorch backend builds for zoo models,
each timed by `kiln bench --dim` at many sizes against the same graph
written at those sizes (the symbolic graph's one compile and the integer
graph's kernels, on the same inputs, in one process).

    python3 bench/symbolic_graphs.py [--models llama,bert,resnet50] [--sizes 32x64,8x128] [--json OUT]

Per model: one forward through `torch.compile(model, backend="kiln")` with
its sequence dynamic (`dynamic=True`; the vision models: the batch marked
dynamic) at the traced sizes below; every kiln graph the backend compiles
with symbolic dimensions is saved; then, per size, each dimension whose
traced value was the traced batch or sequence takes the new one (the rest
keep their traced values) and `kiln bench --dim` runs the graph. Printed:
per model and size, each graph's integer and symbolic ms and their ratio,
and the model's total (its graphs' times summed). bf16, eval, random
weights (bench/zoo_models.py).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

import kiln  # noqa: E402
import kiln.torch  # noqa: E402
from kiln import _torch_sizes  # noqa: E402

# model: (traced batch, traced sequence or image size, [(batch, sequence), ...] timed)
SIZES = {
    "llama": (4, 300, [(4, 64), (4, 300), (4, 1000), (4, 4000), (1, 128), (16, 300), (64, 64)]),
    "bert": (32, 200, [(32, 64), (32, 128), (32, 300), (32, 512), (1, 128), (8, 128), (64, 64)]),
    "resnet50": (32, 224, [(1, 224), (4, 224), (16, 224), (32, 224), (64, 224)]),
}
KILN = os.environ.get("KILN", "kiln")


def capture(spec, batch, seq):
    """The symbolic kiln graphs (JSON documents) of one forward, each with the hint of every dimension."""
    graphs, hints = [], {}
    real_compile = kiln.torch.kiln_compile

    def recording(graph, *a, **kw):
        doc = json.loads(graph.to_json())
        if doc.get("dims"):
            graphs.append((doc, dict(hints)))
        return real_compile(graph, *a, **kw)

    def backend(gm, example_inputs, **kw):
        env = _torch_sizes.shape_env([n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes
                                      if n.op == "placeholder"])
        hints.clear()
        if env is not None:
            values = getattr(env, "backed_var_to_val", None) or env.var_to_val
            hints.update({str(k): int(v) for k, v in values.items()})
        return kiln.torch.backend(gm, example_inputs, **kw)

    torch._dynamo.reset()
    model, _ = zoo_models.instantiate(spec, tiny=False, device="cuda", dtype=torch.bfloat16, batch=batch, seq=seq)
    inputs = spec.inputs(model, batch, seq, "cuda", torch.bfloat16)
    vision = spec.package == "torchvision"
    if vision:
        for v in inputs.values():
            if isinstance(v, torch.Tensor):
                torch._dynamo.mark_dynamic(v, 0)
    kiln.torch.kiln_compile = recording
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend, dynamic=None if vision else True)(**inputs)
    finally:
        kiln.torch.kiln_compile = real_compile
    return graphs


def bench(path, dims):
    args = [KILN, "bench", "--json", path] + [a for n, v in dims.items() for a in ("--dim", f"{n}={v}")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    row = json.loads(done.stdout)[0]
    return row["fused_ms"], row["one_compile_ms"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,bert,resnet50")
    p.add_argument("--sizes", help="BxS,... to time instead of each model's list (a vision model's S: its image size)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    chosen = [tuple(int(x) for x in bs.split("x")) for bs in args.sizes.split(",")] if args.sizes else None
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, bf16\n")
    rows = []
    for spec in zoo_models.select(args.models):
        batch0, seq0, sizes = SIZES[spec.name]
        sizes = chosen or sizes
        try:
            graphs = capture(spec, batch0, seq0)
        except Exception as e:  # noqa: BLE001  (one model's failure is its row)
            print(f"### {spec.name}: FAILED to capture: {type(e).__name__}: {e}")
            continue
        print(f"### {spec.name}: {len(graphs)} symbolic graph(s), traced at B{batch0} "
              f"{'image' if spec.package == 'torchvision' else 'S'}{seq0}")
        print("| B | S | graph | integer ms | symbolic ms | sym / int |\n|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for i, (doc, hints) in enumerate(graphs):
                paths.append((os.path.join(tmp, f"{spec.name}_{i}.json"), doc, hints))
                with open(paths[-1][0], "w") as f:
                    json.dump(doc, f)
            for b, s in sizes:
                total_int = total_sym = 0.0
                for path, doc, hints in paths:
                    dims = {}
                    for name, r in doc["dims"].items():
                        traced = hints.get(name)
                        value = b if traced == batch0 else s if traced == seq0 else traced
                        dims[name] = min(max(value if value is not None else r["min"], r["min"]), r["max"])
                    try:
                        integer, symbolic = bench(path, dims)
                    except Exception as e:  # noqa: BLE001
                        print(f"| {b} | {s} | {os.path.basename(path)} | FAILED: {str(e)[:200]} | | |")
                        continue
                    total_int += integer
                    total_sym += symbolic
                    rows.append(dict(model=spec.name, batch=b, seq=s, graph=os.path.basename(path), dims=dims,
                                     integer_ms=integer, symbolic_ms=symbolic))
                    print(f"| {b} | {s} | {os.path.basename(path)} {dims} | {integer:.4f} | {symbolic:.4f} | "
                          f"{symbolic / integer:.3f} |", flush=True)
                if len(paths) > 1 and total_int > 0:
                    print(f"| {b} | {s} | all | {total_int:.4f} | {total_sym:.4f} | {total_sym / total_int:.3f} |")
        ratios = [r["symbolic_ms"] / r["integer_ms"] for r in rows if r["model"] == spec.name]
        if ratios:
            print(f"\n{spec.name}: sym / int geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}, "
                  f"max {max(ratios):.3f} over {len(ratios)} graph-sizes\n", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
