"""Where a zoo model's GPU time goes under kiln and under Inductor: one
forward of each profiled (torch.profiler), kernel counts and sums, kiln's
kernels by plan kind and tactic, Inductor's by kernel family, and the
largest kernels of each side.

    python3 bench/compare_profiles.py densenet121 efficientnet_b0:8
    KILN_PROFILE_KILN_ONLY=1 python3 bench/compare_profiles.py densenet121

A model is a zoo name (bench/zoo_models.py), optionally `:batch`; bf16,
eval, random weights, `cudnn.benchmark` on. kiln's kernels are all named
kiln_kernel and run in the plan's order, which is how each is matched to
its plan entry.
"""
import collections
import gc
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import kiln.torch  # noqa: F401  (registers the "kiln" backend)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402
from profile_kiln_model import kiln_subgraphs  # noqa: E402


def _one_forward(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _inductor_family(name):
    if name.startswith("triton_"):
        return "triton " + name.split("_")[1]  # poi, red, per
    lowered = name.lower()
    if "conv" in lowered or "xmma" in lowered or "implicit" in lowered:
        return "conv " + name[:32]
    if "gemm" in lowered or "cutlass" in lowered or "nvjet" in lowered:
        return "gemm " + name[:32]
    return name[:40]


def _print_classes(title, classes, limit=20):
    print(title)
    for c, (count, us) in sorted(classes.items(), key=lambda x: -x[1][1])[:limit]:
        print(f"  {count:4d} {us / 1e3:8.3f} ms  {c}")


def compare(name, batch):
    spec = zoo_models.BY_NAME[name]
    model, inputs = zoo_models.instantiate(spec, tiny=False, device="cuda", dtype=torch.bfloat16, batch=batch)
    torch.backends.cudnn.benchmark = True
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="kiln", dynamic=False)
        kiln_events = _one_forward(lambda: compiled(**inputs))
        plans = [exe.plan for m in kiln_subgraphs() for exe, _ in m._executables.values() if exe is not None]
        steps = iter([k for p in plans for k in p["kernels"]])
        kiln_classes = collections.defaultdict(lambda: [0, 0.0])
        rows = []
        for e in kiln_events:
            k = next(steps, None) if e.name == "kiln_kernel" else None
            c = f"{k['kind']} {(k.get('tactic') or {}).get('chosen', '')}".strip() if k else e.name[:30]
            kiln_classes[c][0] += 1
            kiln_classes[c][1] += e.device_time
            rows.append((e.device_time, c, ",".join(k["ops"])[:100] if k else ""))
        del compiled
        torch._dynamo.reset()
        gc.collect()
        inductor_events = []
        if not os.environ.get("KILN_PROFILE_KILN_ONLY"):
            inductor = torch.compile(model)
            inductor_events = _one_forward(lambda: inductor(**inputs))
    inductor_classes = collections.defaultdict(lambda: [0, 0.0])
    for e in inductor_events:
        c = _inductor_family(e.name)
        inductor_classes[c][0] += 1
        inductor_classes[c][1] += e.device_time
    print(f"=== {name} B{batch or spec.batch}: kiln {len(kiln_events)} kernels "
          f"{sum(e.device_time for e in kiln_events) / 1e3:.3f} ms | Inductor {len(inductor_events)} kernels "
          f"{sum(e.device_time for e in inductor_events) / 1e3:.3f} ms")
    _print_classes("kiln by kind and tactic:", kiln_classes)
    if inductor_events:
        _print_classes("Inductor by family:", inductor_classes)
    print("kiln's largest kernels:")
    for us, c, ops in sorted(rows, key=lambda r: -r[0])[:25]:
        print(f"  {us:8.1f} us {c:20s} {ops}")
    if inductor_events:
        print("Inductor's largest kernels:")
        for e in sorted(inductor_events, key=lambda e: -e.device_time)[:20]:
            print(f"  {e.device_time:8.1f} us {e.name[:90]}")
    sys.stdout.flush()


def main(argv):
    if not argv:
        sys.exit(__doc__)
    for arg in argv:
        name, _, batch = arg.partition(":")
        compare(name, int(batch) if batch else None)


if __name__ == "__main__":
    main(sys.argv[1:])
