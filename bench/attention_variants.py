"""kiln's attention kernel against variants of itself and cuDNN, on the GPU
machine, in one run.

    python3 bench/attention_variants.py [--rounds N] [--shapes NAME,...] [--json OUT] [VARIANT ...]

A VARIANT is a patch in bench/variants/ named without its .patch, or several
joined by '+'; 'tree' is the working tree as it is (always first). Each
variant is built (the kiln target, into build-variants/: its patches are
applied to the working tree, built and reverted), checked against the
reference interpreter on small shapes of every case the attention kernel
takes (`kiln run --device cuda --check`: partial tiles, causal, GQA, masks,
head dims 64 to 256, f16), then every variant that passed and cuDNN
(PyTorch's SDPA backend, bf16, CUDA-graph replay) are timed on
bench/attention.py's shapes in interleaved rounds (the tree, each variant,
cuDNN, then again), so that a GPU clocking down as it heats slows all
alike. The SM clock and board power are sampled through NVML while each
runs. Printed last: per shape, the median over rounds, each variant's time
over the tree's and over cuDNN's, and the mean SM clock of each column.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch
from torch.nn.attention import SDPBackend

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from attention import SHAPES, graph_for, tensors, vendor_call  # noqa: E402
from run_bench import graph_ms  # noqa: E402

DEFAULT_SHAPES = ["d128", "d128 causal", "d64", "d256", "s512", "gqa 32/8 causal", "vit-s"]

# (name, B, H, Hkv, Sq, Skv, D, causal, dtype, mask): small, odd, every case.
CHECKS = [
    ("d128 partial tiles", 1, 2, 2, 1000, 1000, 128, False, "bf16", None),
    ("d128 176-key tiles", 1, 1, 1, 2100, 2100, 128, False, "bf16", None),
    ("d128 causal skv>sq", 1, 2, 2, 129, 4097, 128, True, "bf16", None),
    ("d128 causal f16", 2, 2, 2, 300, 300, 128, True, "f16", None),
    ("gqa 4 causal", 1, 8, 2, 300, 300, 128, True, "bf16", None),
    ("bool mask", 1, 2, 2, 200, 200, 128, False, "bf16", "bool"),
    ("additive mask f16", 1, 2, 2, 200, 333, 128, False, "f16", "add"),
    ("d64", 2, 3, 3, 197, 197, 64, False, "bf16", None),
    ("d96 causal", 1, 2, 2, 177, 177, 96, True, "bf16", None),
    ("d256", 1, 2, 2, 300, 300, 256, False, "bf16", None),
    ("sq 63 skv 1000", 1, 2, 2, 63, 1000, 128, False, "bf16", None),
    # More query tiles than blocks: the persistent kernel's loop carries its
    # barriers' phases from one tile to the next (about 7 and 4 a block).
    ("d64 persistent", 8, 40, 40, 257, 257, 64, False, "bf16", None),
    ("d128 persistent", 4, 40, 40, 300, 300, 128, False, "bf16", None),
]


def check_graph(name, b, h, hkv, sq, skv, d, causal, dtype, mask):
    g = graph_for(name, (b, h, hkv, sq, skv, d, causal))
    for spec in g["inputs"].values():
        spec["dtype"] = dtype
    if mask:  # a bool mask of every row and key; an additive one broadcast over heads and rows
        g["inputs"]["m"] = {"shape": [1, 1, sq, skv], "dtype": "bool"} if mask == "bool" else {"shape": [b, 1, 1, skv], "dtype": dtype}
        g["ops"][-1]["in"].append("m")
    return g


def patch_tool():
    if shutil.which("git"):
        return lambda patch, reverse: ["git", "apply", *(["-R"] if reverse else []), patch]
    if shutil.which("patch"):
        return lambda patch, reverse: ["patch", "-p1", "-s", *(["-R"] if reverse else []), "-i", patch]
    sys.exit("neither git nor patch is installed: cannot apply the variants")


def build(variant, build_dir, out_dir, log):
    """The kiln binary of `variant`, copied to out_dir; None if a patch does not apply or the build fails."""
    patches = [] if variant == "tree" else [os.path.join(HERE, "variants", p + ".patch") for p in variant.split("+")]
    tool, applied = patch_tool(), []
    try:
        for p in patches:
            if subprocess.run(tool(p, False), cwd=ROOT, stdout=log, stderr=log).returncode != 0:
                print(f"{variant}: {os.path.basename(p)} does not apply", flush=True)
                return None
            applied.append(p)
        if subprocess.run(["cmake", "--build", build_dir, "--target", "kiln", "-j", str(os.cpu_count())], stdout=log,
                          stderr=log).returncode != 0:
            print(f"{variant}: build failed (log in {log.name})", flush=True)
            return None
        binary = os.path.join(out_dir, "kiln-" + variant)
        shutil.copy(os.path.join(build_dir, "bin", "kiln"), binary)
        return binary
    finally:
        for p in reversed(applied):
            subprocess.run(tool(p, True), cwd=ROOT, stdout=log, stderr=log, check=True)


def passes_checks(variant, binary, work, env):
    ok = True
    for case in CHECKS:
        path = os.path.join(work, "check.json")
        with open(path, "w") as f:
            json.dump(check_graph(*case), f)
        start = time.time()
        try:
            r = subprocess.run([binary, "run", "--device", "cuda", "--check", "--random", "7", path], capture_output=True,
                               text=True, env=env, timeout=60)
        except subprocess.TimeoutExpired:  # a hang (a barrier's phase gone wrong): killed
            ok = False
            print(f"{variant}: HANGS on {case[0]} (killed after 60 s)", flush=True)
            continue
        if r.returncode != 0:
            ok = False
            print(f"{variant}: FAILS {case[0]} (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-300:]}", flush=True)
        else:
            print(f"{variant}: {case[0]} passed in {time.time() - start:.1f} s", flush=True)
    print(f"{variant}: {'every check passed' if ok else 'left out of the timings'} ({len(CHECKS)} shapes)", flush=True)
    return ok


class Clock:
    """SM clock (MHz) and board power (W) sampled every 20 ms through NVML while `with` runs."""

    def __init__(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception:  # noqa: BLE001 (no NVML: no clock column)
            self.nvml = None
        self.samples = []

    def __enter__(self):
        self.samples, self.running = [], True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while self.running and self.nvml:
            self.samples.append((self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM),
                                 self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0))
            time.sleep(0.02)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()

    def means(self):
        if not self.samples:
            return float("nan"), float("nan")
        return statistics.mean(s[0] for s in self.samples), statistics.mean(s[1] for s in self.samples)


def time_kiln(binary, paths, env):
    out = subprocess.run([binary, "bench", "--json", "--no-fusion", *paths], check=True, capture_output=True, text=True,
                         env=env, timeout=300).stdout
    return {r["path"]: r["unfused_ms"] for r in json.loads(out)}


def cudnn_calls(shapes):
    """PyTorch's SDPA on cuDNN for each shape, on tensors made once for every round."""
    calls = {}
    for name in shapes:
        q, k, v, _ = tensors(SHAPES[name])
        calls[name] = vendor_call(SHAPES[name], SDPBackend.CUDNN_ATTENTION, q, k, v)
    return calls


def time_cudnn(calls):
    return {name: graph_ms(call) if call else float("nan") for name, call in calls.items()}


def report(columns, shapes, times, clocks, rounds, json_out=None):
    """The table: per shape the median over rounds of each column (the tree
    first, cuDNN last), each variant over the tree (x) and over cuDNN (c),
    and each column's mean SM clock and power while it ran."""
    med = {c: {s: statistics.median(times[c][s]) for s in shapes} for c in columns}
    label = {c: c if c in ("tree", "cuDNN") else chr(ord("A") + i - 1) for i, c in enumerate(columns)}
    for c in columns:
        if label[c] != c:
            print(f"{label[c]}: {c}")
    width = 19
    print("\nms, median of the rounds (x: over the tree; c: over cuDNN)")
    print(f"{'shape':18}" + "".join(f" {label[c]:>{width}}" for c in columns))
    for s in shapes:
        cells = []
        for c in columns:
            cell = f"{med[c][s]:.3f}"
            if c not in ("tree", "cuDNN"):
                cell += f" x{med[c][s] / med['tree'][s]:.3f}"
            if c != "cuDNN":
                cell += f" c{med[c][s] / med['cuDNN'][s]:.2f}"
            cells.append(cell)
        print(f"{s:18}" + "".join(f" {x:>{width}}" for x in cells))
    print(f"{'SM MHz, W':18}" + "".join(
        f" {statistics.mean(m for m, _ in clocks[c]):>{width - 6}.0f} {statistics.mean(w for _, w in clocks[c]):>5.0f}"
        for c in columns))
    print(f"{'spread (max/min)':18}" + "".join(
        f" {max(max(times[c][s]) / min(times[c][s]) - 1 for s in shapes):>{width}.1%}" for c in columns))
    spread = {c: {s: (min(times[c][s]), max(times[c][s])) for s in shapes} for c in columns}
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rounds": rounds, "times": times, "median": med,
                       "spread": spread, "clocks_mhz_w": clocks}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", help="patch names in bench/variants/ (without .patch), '+' to combine")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    for s in shapes:
        if s not in SHAPES:
            sys.exit(f"unknown shape '{s}': bench/attention.py has {', '.join(SHAPES)}")
    variants = ["tree"] + [v for v in args.variants if v != "tree"]
    for v in variants[1:]:
        for name in v.split("+"):
            if not os.path.exists(os.path.join(HERE, "variants", name + ".patch")):
                known = sorted(f[:-len(".patch")] for f in os.listdir(os.path.join(HERE, "variants")) if f.endswith(".patch"))
                sys.exit(f"no patch '{name}' in bench/variants/ (there: {', '.join(known)})")
    out_dir = os.environ.get("OUT") or tempfile.mkdtemp(prefix="kiln-variants-")
    build_dir = os.path.join(ROOT, "build-variants")
    work = tempfile.mkdtemp(prefix="kiln-variants-work-")
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo"], check=True,
                       stdout=subprocess.DEVNULL)
    binaries, envs = {}, {}
    with open(os.path.join(out_dir, "variants-build.log"), "w") as log:
        for v in variants:
            start = time.time()
            binary = build(v, build_dir, work, log)
            if binary is None:
                continue
            print(f"{v}: built in {time.time() - start:.0f} s", flush=True)
            envs[v] = dict(os.environ, KILN_CACHE_DIR=os.path.join(work, "cache-" + v))
            if passes_checks(v, binary, work, envs[v]):
                binaries[v] = binary
    if "tree" not in binaries:
        sys.exit("the tree itself failed: no timings")

    paths = {}
    for name in shapes:
        paths[name] = os.path.join(work, name.replace(" ", "_").replace("/", "-") + ".json")
        with open(paths[name], "w") as f:
            json.dump(graph_for(name, SHAPES[name]), f)
    for v, binary in binaries.items():  # compile every kernel and time once, outside the rounds
        time_kiln(binary, list(paths.values()), envs[v])
    cudnn = cudnn_calls(shapes)
    columns = list(binaries) + ["cuDNN"]
    times = {c: {s: [] for s in shapes} for c in columns}
    clocks = {c: [] for c in columns}
    for r in range(args.rounds):
        for c in list(columns):
            try:
                with Clock() as clock:
                    if c == "cuDNN":
                        ms = time_cudnn(cudnn)
                    else:
                        by_path = time_kiln(binaries[c], [paths[s] for s in shapes], envs[c])
                        ms = {s: by_path[paths[s]] for s in shapes}
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                print(f"{c}: timing failed in round {r + 1} ({type(e).__name__}): left out from here on", flush=True)
                columns.remove(c)
                continue
            clocks[c].append(clock.means())
            for s in shapes:
                times[c][s].append(ms[s])
        # Each round's figures as they come: a call that runs out of time still leaves them in its log.
        print(f"round {r + 1} of {args.rounds}: " + "; ".join(
            f"{c} " + " ".join(f"{times[c][s][-1]:.3f}" for s in shapes) for c in columns),
              flush=True)
    if "tree" not in columns:
        sys.exit("the tree's own timing failed")
    report(columns, shapes, times, clocks, args.rounds, args.json)


if __name__ == "__main__":
    main()
