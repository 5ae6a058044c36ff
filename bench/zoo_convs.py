"""The zoo's conv table: every distinct convolution of the zoo's CNNs, each
with the epilogue its model gives it, kiln against cuDNN's conv alone and
against Inductor on the same conv + epilogue, in one device run.

    python3 bench/zoo_convs.py [--models a,b] [--inductor sample|all|off] [--rounds N] [--json OUT]
    python3 bench/zoo_convs.py [KILN_BINARY] --dry-run [--graphs DIR] [--check N] [--warm]  # no GPU: list, write,
                                                                                       # plan, check (compile)
    python3 bench/zoo_convs.py [KILN_BINARY] --dry-run --tiny                        # the tiny configs (the test)

The device run uses kiln's Python package (`pip install .`) and the `kiln`
binary installed with it; the dry run the KILN_BINARY given (default: that
one too).

The conv list comes from the models (bench/zoo_models.py): each CNN is built
at its real size on the meta device at its serving batch, traced by torch.fx
and its shapes propagated; for every nn.Conv2d the nodes after it are
followed while each is the one reader of the last: BatchNorm2d (inference),
a residual add of a tensor of the same shape, an activation (ReLU, ReLU6,
SiLU, Hardswish, GELU, Sigmoid, Hardsigmoid; the chain ends after one), with
Dropout / Identity / StochasticDepth (identities in eval) passed through.
A conv's key is its input N, C, H, W, out channels, filter, stride, padding,
dilation, groups, bias and epilogue; the table has each distinct key once,
with how many times each model runs it (resnet50 NCHW and resnet50_cl
channels-last give the same keys: one row, both models counted; every side
here is channels-last). ViT-S/16's patch embedding (timm) is one more conv.
What the models put before a conv (DenseNet's batch norm + ReLU) or after it
that is not pointwise (ConvNeXt's layer norm, DenseNet's concat) is not in
the row: the row is the conv and its pointwise epilogue.

Families, in this order:
- depthwise: groups == C_in (channel multipliers included);
- grouped: 1 < groups < C_in;
- narrow: C_in < 8, or C_out < 64, or a filter >= 7 with C_in <= 4 (stems,
  patch embeddings, squeeze-excitation's narrow 1x1s);
- dense: the rest (1x1 and larger filters both; the table says which).

Each side, channels-last bf16:
- kiln: a graph per conv as the PyTorch backend (python/kiln/torch.py) gives
  it after layout sinking: conv2d NHWC (weights [K, R, S, C/groups]), + bias,
  batch_norm (the inference op, bf16 parameters as a bf16 model has them),
  + residual, activation, rounded to bf16 where each ATen op's output is;
  all compiled up front by `kiln warm --jobs N` (the package's kiln.warm),
  then each through kiln.compile (cache hits) and run on the NHWC views of
  the same channels-last tensors the other sides read;
- cuDNN: F.conv2d alone (no bias, no epilogue), torch.backends.cudnn.benchmark
  on;
- Inductor: torch.compile (default mode) of the conv + epilogue as a small
  function (compile_threads = the CPU count). An Inductor compile takes
  seconds and there are about 210 rows: --inductor=sample (the default)
  compiles 6 rows a family (the 4 the models spend most kiln time in, the 2
  slowest for kiln against cuDNN), all: every row (2-3 s more a row, some
  8 minutes: past the 6-minute budget), off: none.

Every side is timed by CUDA-graph replay (run_bench.graph_ms_sets: the
kernels' GPU time without host time per call), over as many input sets as
make one pass about three L2s (a small conv does not read its inputs warm
from L2, as `kiln bench` rotates its sets), kiln and cuDNN alternating in
--rounds rounds (median); Inductor's rounds follow, on the rows sampled.
kiln's output of the timed run is compared with PyTorch eager's (bf16):
a row off by more than 2e-2 (norm-relative) is listed as WRONG.

Per row also TFLOP/s and GB/s (kiln; bytes = inputs read once and the
output written once), and for depthwise rows the share of the binding
bound: the larger of bytes over the copy bandwidth measured in this run
(a 1 GiB device-to-device copy) and FLOPs over the FP32 FMA peak (SMs x
FP32 lanes x 2 x max SM clock), over kiln's time. Per family: the geomean
and max of kiln/cuDNN; --json OUT holds every figure.
"""
from __future__ import annotations

import argparse
import json
import math
import operator
import os
import subprocess
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402  (first: it makes torchvision importable on a CPU PyTorch)
from run_bench import ceilings, geomean, graph_ms_sets  # noqa: E402  (NaN-skipping geomean; CUDA-graph replay)

MODELS = ["resnet50", "resnet50_cl", "resnext50_32x4d", "convnext_t", "efficientnet_b0", "mobilenet_v3_s",
          "densenet121", "vit_s16"]
FAMILIES = ["dense", "depthwise", "grouped", "narrow"]

# ---- the conv list, from the models ---------------------------------------------

_ACTIVATION_MODULES = {torch.nn.ReLU: "relu", torch.nn.ReLU6: "relu6", torch.nn.SiLU: "silu",
                       torch.nn.Hardswish: "hardswish", torch.nn.GELU: "gelu", torch.nn.Sigmoid: "sigmoid",
                       torch.nn.Hardsigmoid: "hardsigmoid"}
_ACTIVATION_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", F.relu6: "relu6", F.silu: "silu", F.hardswish: "hardswish",
                         F.gelu: "gelu", torch.sigmoid: "sigmoid", F.hardsigmoid: "hardsigmoid"}
_ACTIVATION_METHODS = {"relu": "relu", "relu_": "relu", "sigmoid": "sigmoid"}
_ADDS = {operator.add, operator.iadd, torch.add}
_IDENTITY_MODULES = (torch.nn.Dropout, torch.nn.Identity)


@dataclass(frozen=True)
class Conv:
    """One distinct convolution and its epilogue (the key of a table row)."""
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: Tuple[int, int]
    padding: Tuple[int, int]
    dilation: Tuple[int, int]
    groups: int
    bias: bool
    epilogue: Tuple[str, ...]  # in order: "bn", "add" (residual), one activation
    bn_eps: float = 1e-5

    @property
    def p(self) -> int:
        return (self.h + 2 * self.padding[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        return (self.w + 2 * self.padding[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def family(self) -> str:
        if self.groups == self.c:
            return "depthwise"
        if self.groups > 1:
            return "grouped"
        if self.c < 8 or self.k < 64 or (max(self.r, self.s) >= 7 and self.c <= 4):
            return "narrow"
        return "dense"

    @property
    def flops(self) -> int:
        return 2 * self.n * self.p * self.q * self.k * (self.c // self.groups) * self.r * self.s

    @property
    def bytes(self) -> int:
        """bf16 bytes moved at least: input, weights, bias and batch-norm
        parameters and the residual read once, the output written once."""
        out = self.n * self.p * self.q * self.k
        params = self.k * (int(self.bias) + 4 * ("bn" in self.epilogue))
        return 2 * (self.n * self.h * self.w * self.c + self.k * self.r * self.s * (self.c // self.groups) + params
                    + out * (1 + ("add" in self.epilogue)))

    @property
    def activation(self) -> Optional[str]:
        acts = [e for e in self.epilogue if e not in ("bn", "add")]
        return acts[0] if acts else None

    def epilogue_text(self) -> str:
        return "+".join((["bias"] if self.bias else []) + list(self.epilogue)) or "-"

    def shape_text(self) -> str:
        txt = f"{self.r}x{self.s}/{self.stride[0]}"
        if self.padding[0] != (self.r - 1) // 2 * self.dilation[0]:
            txt += f" p{self.padding[0]}"
        if self.dilation[0] != 1:
            txt += f" d{self.dilation[0]}"
        if self.groups > 1 and self.family != "depthwise":
            txt += f" g{self.groups}"
        return f"{txt} {self.h}x{self.w} {self.c}->{self.k} N{self.n}"

    def name(self) -> str:
        g = f"_g{self.groups}" if self.groups > 1 else ""
        d = f"_d{self.dilation[0]}" if self.dilation[0] != 1 else ""
        return (f"conv{self.r}x{self.s}_s{self.stride[0]}_p{self.padding[0]}{d}{g}_n{self.n}_{self.h}x{self.w}_"
                f"c{self.c}_k{self.k}_{self.epilogue_text().replace('+', '_').replace('-', 'none')}")


def _activation_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Optional[str]:
    if node.op == "call_module":
        return _ACTIVATION_MODULES.get(type(gm.get_submodule(node.target)))
    if node.op == "call_function":
        if node.target in _ACTIVATION_FUNCTIONS:
            if node.target is F.gelu and node.kwargs.get("approximate", "none") != "none":
                return None
            return _ACTIVATION_FUNCTIONS[node.target]
    if node.op == "call_method":
        return _ACTIVATION_METHODS.get(node.target)
    return None


def _is_identity(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_module":
        mod = gm.get_submodule(node.target)
        return isinstance(mod, _IDENTITY_MODULES) or type(mod).__name__ == "StochasticDepth"
    if node.op == "call_function":
        return getattr(node.target, "__name__", "") == "stochastic_depth"  # torchvision's, an identity in eval
    return False


def _residual_of(node: torch.fx.Node, cur: torch.fx.Node, conv: torch.fx.Node, order: Dict[torch.fx.Node, int]) -> bool:
    """node adds to cur a tensor of cur's shape computed before the conv
    runs (a residual the conv's epilogue can read: of two conv branches
    meeting in an add, as ResNet's downsampling blocks have, the add is the
    epilogue of the conv that runs second)."""
    if not ((node.op == "call_function" and node.target in _ADDS) or (node.op == "call_method" and node.target in ("add", "add_"))):
        return False
    if len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
        return False
    other = node.args[1] if node.args[0] is cur else node.args[0]
    if not isinstance(other, torch.fx.Node) or other is cur or "tensor_meta" not in other.meta:
        return False
    return order[other] < order[conv] and tuple(other.meta["tensor_meta"].shape) == tuple(cur.meta["tensor_meta"].shape)


def epilogue_after(gm: torch.fx.GraphModule, conv: torch.fx.Node,
                   order: Dict[torch.fx.Node, int]) -> Tuple[Tuple[str, ...], float]:
    """The pointwise epilogue the model gives a conv node: the batch norm,
    residual add and activation that follow it, each the one reader of the
    value before it; and the batch norm's eps (1e-5 without one)."""
    steps: List[str] = []
    eps = 1e-5
    cur = conv
    while len(cur.users) == 1:
        nxt = next(iter(cur.users))
        if _is_identity(gm, nxt):
            pass
        elif nxt.op == "call_module" and isinstance(gm.get_submodule(nxt.target), torch.nn.BatchNorm2d) and not steps:
            bn = gm.get_submodule(nxt.target)
            if bn.training or not bn.track_running_stats or not bn.affine:
                break
            steps.append("bn")
            eps = float(bn.eps)
        elif "add" not in steps and _residual_of(nxt, cur, conv, order):
            steps.append("add")
        elif _activation_of(gm, nxt) is not None:
            steps.append(_activation_of(gm, nxt))
            break
        else:
            break
        cur = nxt
    return tuple(steps), eps


def trace_convs(spec: zoo_models.Spec, tiny: bool = False, batch: Optional[int] = None) -> List[Conv]:
    """Every conv the model runs in one forward, in order (a conv run twice is
    listed twice), at its serving batch (or `batch`), traced on the meta
    device: nothing is allocated or computed."""
    from torch.fx.passes.shape_prop import ShapeProp
    model, inputs = zoo_models.instantiate(spec, tiny=tiny, device="meta", dtype=torch.float32, batch=batch)
    gm = torch.fx.symbolic_trace(model)
    ShapeProp(gm).propagate(*inputs.values())
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    convs = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(gm.get_submodule(node.target), torch.nn.Conv2d):
            continue
        mod = gm.get_submodule(node.target)
        if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            raise ValueError(f"{spec.name}: conv {node.target} has padding {mod.padding!r} ({mod.padding_mode}); "
                             f"the table takes explicit zero padding")
        n, c, h, w = node.args[0].meta["tensor_meta"].shape
        epilogue, eps = epilogue_after(gm, node, order)
        convs.append(Conv(n=n, c=c, h=h, w=w, k=mod.out_channels, r=mod.kernel_size[0], s=mod.kernel_size[1],
                          stride=tuple(mod.stride), padding=tuple(mod.padding), dilation=tuple(mod.dilation),
                          groups=mod.groups, bias=mod.bias is not None, epilogue=epilogue,
                          bn_eps=eps if "bn" in epilogue else 1e-5))
    return convs


@dataclass
class Row:
    conv: Conv
    counts: Dict[str, int] = field(default_factory=dict)  # model -> times one forward runs it


def collect(models: List[str], tiny: bool = False) -> List[Row]:
    """The distinct convs of `models`, in first-seen order, with their counts."""
    rows: "OrderedDict[Conv, Row]" = OrderedDict()
    for name in models:
        for conv in trace_convs(zoo_models.BY_NAME[name], tiny=tiny):
            row = rows.setdefault(conv, Row(conv))
            row.counts[name] = row.counts.get(name, 0) + 1
    return list(rows.values())


# ---- the kiln graph of a row -----------------------------------------------------

def _activation_ops(act: str, x: str, out: str) -> List[dict]:
    """kiln ops for an activation, as python/kiln/torch.py converts it (the
    last op rounds to bf16, as the ATen op's output is)."""
    one = {"relu": ("relu", {}), "silu": ("silu", {}), "gelu": ("gelu", {}), "sigmoid": ("sigmoid", {}),
           "relu6": ("clamp", {"min": 0.0, "max": 6.0})}
    if act in one:
        name, attrs = one[act]
        return [dict({"op": name, "in": [x], "out": out, "dtype": "bf16"}, **attrs)]
    if act in ("hardswish", "hardsigmoid"):  # as the converter writes them: clamp(x + 3, 0, 6) [* x] * (1.0f / 6.0f)
        from kiln.torch import ONE_SIXTH_F32
        ops = [{"op": "add", "in": [x, 3.0], "out": f"{out}_x3"},
               {"op": "clamp", "in": [f"{out}_x3"], "out": f"{out}_c", "min": 0.0, "max": 6.0}]
        if act == "hardswish":
            ops.append({"op": "mul", "in": [x, f"{out}_c"], "out": f"{out}_xc"})
        last = f"{out}_xc" if act == "hardswish" else f"{out}_c"
        return ops + [{"op": "mul", "in": [last, ONE_SIXTH_F32], "out": out, "dtype": "bf16"}]
    raise ValueError(f"no kiln ops for activation {act!r}")


def kiln_graph(conv: Conv) -> dict:
    """The row as a kiln graph: what the PyTorch backend gives kiln for this
    conv and epilogue of a bf16 channels-last model, after layout sinking
    (NHWC throughout; bf16 parameters)."""
    cg = conv.c // conv.groups
    inputs = {"x": {"shape": [conv.n, conv.h, conv.w, conv.c], "dtype": "bf16"},
              "w": {"shape": [conv.k, conv.r, conv.s, cg], "dtype": "bf16"}}
    attrs = {"layout": "NHWC", "stride": list(conv.stride), "padding": list(conv.padding),
             "dilation": list(conv.dilation), "groups": conv.groups}
    ops = [dict({"op": "conv2d", "in": ["x", "w"], "out": "conv", "dtype": "bf16"}, **attrs)]
    last = "conv"
    if conv.bias:
        inputs["b"] = {"shape": [conv.k], "dtype": "bf16"}
        ops[0].pop("dtype")  # the converter adds the bias to the f32 sum, then rounds
        ops.append({"op": "add", "in": ["conv", "b"], "out": "biased", "dtype": "bf16"})
        last = "biased"
    for step in conv.epilogue:
        if step == "bn":
            for p in ("mean", "var", "gamma", "beta"):
                inputs[p] = {"shape": [conv.k], "dtype": "bf16"}
            ops.append({"op": "batch_norm", "in": [last, "mean", "var", "gamma", "beta"], "out": "bn", "axis": 3,
                        "eps": conv.bn_eps, "dtype": "bf16"})
            last = "bn"
        elif step == "add":
            inputs["r"] = {"shape": [conv.n, conv.p, conv.q, conv.k], "dtype": "bf16"}
            ops.append({"op": "add", "in": [last, "r"], "out": "res", "dtype": "bf16"})
            last = "res"
        else:
            ops += _activation_ops(step, last, "act")
            last = "act"
    ops[-1]["out"] = "y"  # (no op reads the last one's output)
    return {"kiln": 1, "name": conv.name(), "inputs": inputs, "ops": ops, "outputs": ["y"]}


# ---- the PyTorch side of a row ------------------------------------------------------

def input_names(conv: Conv) -> List[str]:
    """The row's inputs, in the order the PyTorch function takes them (the kiln graph's names)."""
    return (["x", "w"] + (["b"] if conv.bias else []) + (["mean", "var", "gamma", "beta"] if "bn" in conv.epilogue else [])
            + (["r"] if "add" in conv.epilogue else []))


def make_inputs(conv: Conv, device, seed: int, dtype=torch.bfloat16) -> Dict[str, torch.Tensor]:
    """Random inputs for the row, PyTorch's logical shapes (x and r NCHW, w
    OIHW) in channels-last memory; var drawn positive, as kiln run draws it."""
    g = torch.Generator(device=device).manual_seed(seed)
    shapes = {"x": (conv.n, conv.c, conv.h, conv.w), "w": (conv.k, conv.c // conv.groups, conv.r, conv.s),
              "r": (conv.n, conv.k, conv.p, conv.q)}
    out = {}
    for name in input_names(conv):
        t = torch.randn(shapes.get(name, (conv.k,)), generator=g, device=device)
        if name == "var":
            t = t.abs() + 0.5
        if name == "w":
            t = t / math.sqrt(conv.c // conv.groups * conv.r * conv.s)  # outputs of about unit size
        t = t.to(dtype)
        out[name] = t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
    return out


def nhwc(t: torch.Tensor) -> torch.Tensor:
    """A channels-last NCHW tensor (or OIHW weights) as the NHWC ([K, R, S, C]) tensor its memory holds."""
    return t.permute(0, 2, 3, 1)


def torch_function(conv: Conv, rounding=None):
    """The row's conv + epilogue as PyTorch runs it: f(*inputs in
    input_names order) -> NCHW output. `rounding`, if given, is applied
    where an ATen op's output is stored (for an f32 computation that rounds
    as a bf16 model does)."""
    rnd = rounding or (lambda t: t)
    acts = {"relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hardswish": F.hardswish, "gelu": F.gelu,
            "sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}
    names = input_names(conv)

    def f(*args):
        t = dict(zip(names, args))
        y = rnd(F.conv2d(t["x"], t["w"], t.get("b"), conv.stride, conv.padding, conv.dilation, conv.groups))
        for step in conv.epilogue:
            if step == "bn":
                y = rnd(F.batch_norm(y, t["mean"], t["var"], t["gamma"], t["beta"], training=False, eps=conv.bn_eps))
            elif step == "add":
                y = rnd(y + t["r"])
            else:
                y = rnd(acts[step](y))
        return y
    return f


# ---- device figures -------------------------------------------------------------------

def fp32_fma_peak_tflops() -> float:
    """The FP32 FMA peak: SMs x FP32 lanes per SM x 2 flops x the maximum SM
    clock (nvidia-smi); NaN where the clock is unknown."""
    props = torch.cuda.get_device_properties(0)
    lanes = 64 if (props.major, props.minor) in ((7, 0), (8, 0)) else 128
    mhz = float("nan")
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
        mhz = float(out.stdout.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as e:
        print(f"nvidia-smi gave no SM clock ({e}): no FMA bound", file=sys.stderr)
    return props.multi_processor_count * lanes * 2 * mhz * 1e6 / 1e12


def input_sets(conv: Conv, l2_bytes: int, cap: int = 16) -> int:
    """How many input sets to rotate so that one pass over them is about three L2s."""
    return max(1, min(cap, math.ceil(3 * l2_bytes / conv.bytes)))


# ---- the listing and the dry run ----------------------------------------------------

_SHORT = {"resnet50": "r50", "resnet50_cl": "r50cl", "resnext50_32x4d": "rx50", "convnext_t": "cnxt",
          "efficientnet_b0": "effb0", "mobilenet_v3_s": "mnv3s", "densenet121": "dn121", "vit_s16": "vit"}


def counts_text(row: Row) -> str:
    return " ".join(f"{_SHORT.get(m, m)}x{n}" for m, n in row.counts.items())


def summary(rows: List[Row], models: List[str]) -> List[str]:
    """Distinct convs per model and family, and convs run per forward."""
    lines = [f"{len(rows)} distinct convs over {len(models)} models "
             f"({', '.join(f'{f} {sum(r.conv.family == f for r in rows)}' for f in FAMILIES)})"]
    lines.append(f"{'model':<16} {'distinct':>8} {'runs':>5}  " + " ".join(f"{f:>9}" for f in FAMILIES))
    for m in models:
        mine = [r for r in rows if m in r.counts]
        lines.append(f"{m:<16} {len(mine):>8} {sum(r.counts[m] for r in mine):>5}  "
                     + " ".join(f"{sum(r.conv.family == f for r in mine):>9}" for f in FAMILIES))
    return lines


def write_graphs(rows: List[Row], folder: str) -> List[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for row in rows:
        paths.append(os.path.join(folder, f"{row.conv.name()}.json"))
        with open(paths[-1], "w") as f:
            json.dump(kiln_graph(row.conv), f, indent=1)
    return paths


def plan(kiln: str, path: str, arch: str = "sm_90") -> dict:
    """`kiln plan --json` of a graph: {"kernels": [...]} or {"error": message}."""
    done = subprocess.run([kiln, "plan", "--arch", arch, "--json", path], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")}
    return json.loads(done.stdout)


def check_on_cpu(kiln: str, conv: Conv, path: str, seed: int = 7) -> float:
    """kiln's reference interpreter (`kiln run --device cpu`) against the
    PyTorch function in f32 with bf16 rounding where the model rounds, on
    the inputs kiln drew: ||kiln - torch|| / ||torch||."""
    import numpy as np
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([kiln, "run", path, "--device", "cpu", "--random", str(seed), "--outputs", out], check=True,
                       capture_output=True, text=True)
        got = torch.from_numpy(np.load(os.path.join(out, "y.npy"))).float()
        ins = {n: torch.from_numpy(np.load(os.path.join(out, f"{n}.npy"))).float() for n in input_names(conv)}
    for n in ("x", "w", "r"):
        if n in ins:
            ins[n] = ins[n].permute(0, 3, 1, 2)  # NHWC files -> PyTorch's NCHW / OIHW
    bf16 = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    want = torch_function(conv, bf16)(*(bf16(ins[n]) for n in input_names(conv))).permute(0, 2, 3, 1)
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def check_rows(rows: List[Row], count: int) -> List[Row]:
    """The rows to check on the CPU, up to `count`: the cheapest of each
    family, then of each epilogue, then the cheapest stem (channels padded
    to 8 by kiln's rewrite)."""
    by_cost = sorted(rows, key=lambda r: r.conv.flops + r.conv.bytes)
    picked: List[Row] = []
    for key in (lambda r: r.conv.family, lambda r: r.conv.epilogue_text(), lambda r: r.conv.c < 8):
        seen = set()
        for r in by_cost:
            if key(r) not in seen:
                seen.add(key(r))
                if r not in picked and key(r) is not False:
                    picked.append(r)
    return picked[:count]


def dry_run(args, rows: List[Row], models: List[str]) -> int:
    """No GPU: list the convs, write their graphs, plan each for sm_90, check
    the cheapest few against PyTorch on the CPU. Returns the exit status."""
    for line in summary(rows, models):
        print(line)
    folder = args.graphs or tempfile.mkdtemp(prefix="zoo_convs_")
    paths = write_graphs(rows, folder)
    print(f"graphs written to {folder}")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        plans = list(pool.map(lambda p: plan(args.kiln, p), paths))
    failed = 0
    for family in FAMILIES:
        mine = [(r, p, pl) for r, p, pl in zip(rows, paths, plans) if r.conv.family == family]
        if not mine:
            continue
        print(f"\n{family} ({len(mine)})")
        print(f"  {'shape':<34} {'epilogue':<18} {'runs':<28} {'GFLOP':>7} {'MB':>7}  plan (sm_90)")
        for r, _, pl in mine:
            if "error" in pl:
                failed += 1
                text = f"FAILED: {pl['error']}"
            else:
                kinds = [k.get("kernel_kind", k["kind"]) for k in pl["kernels"]]
                text = f"{len(kinds)} kernel{'s' if len(kinds) != 1 else ''}: {', '.join(kinds)}"
            print(f"  {r.conv.shape_text():<34} {r.conv.epilogue_text():<18} {counts_text(r):<28} "
                  f"{r.conv.flops / 1e9:>7.3f} {r.conv.bytes / 1e6:>7.2f}  {text}")
    print(f"\nplanned {len(paths) - failed} of {len(paths)} graphs for sm_90" + (f", {failed} FAILED" if failed else ""))
    if args.warm:  # codegen and NVRTC for every kernel (no GPU needed), into the kernel cache
        done = subprocess.run([args.kiln, "warm", "--arch", "sm_90", "--jobs", str(args.jobs), folder],
                              capture_output=True, text=True)
        summary_line = [l for l in done.stdout.splitlines() if l.startswith("warmed:")]
        print(f"kiln warm --arch sm_90: {summary_line[-1] if summary_line else done.stderr.strip()[-2000:]}")
        failed += done.returncode != 0
    bad = 0
    if args.check:
        print(f"checked against PyTorch on the CPU (kiln run --device cpu; f32, bf16 rounding as the model's):")
        for r in check_rows(rows, args.check):
            try:
                err = check_on_cpu(args.kiln, r.conv, paths[rows.index(r)])
            except subprocess.CalledProcessError as e:
                err = float("nan")
                print(f"  kiln run failed on {paths[rows.index(r)]}: {e.stderr.strip()}")
            ok = err <= 1e-2  # cli.md's bf16 tolerance
            bad += not ok
            print(f"  {r.conv.shape_text():<34} {r.conv.epilogue_text():<18} rel. error {err:.2e}  {'ok' if ok else 'FAILED'}")
    return 1 if failed or bad else 0


# ---- the device run -----------------------------------------------------------------

def _median(values: List[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def time_row(conv: Conv, path: str, l2_bytes: int, rounds: int) -> dict:
    """kiln's and cuDNN's times for one row, alternating in `rounds`, on the
    same input sets; and kiln's output against PyTorch eager's (bf16)."""
    import kiln
    names = input_names(conv)
    sets = [make_inputs(conv, "cuda", seed) for seed in range(input_sets(conv, l2_bytes))]
    outs = [torch.empty(conv.n, conv.p, conv.q, conv.k, device="cuda", dtype=torch.bfloat16) for _ in sets]
    result = {"input_sets": len(sets), "kiln_rounds_ms": [], "cudnn_rounds_ms": []}
    try:
        exe = kiln.compile(kiln.Graph.load(path))
    except Exception as e:  # noqa: BLE001 - a row kiln cannot compile is a row of the table, not the end
        print(f"kiln failed on {path}: {e}", file=sys.stderr)
        result["error"] = str(e)
        exe = None
    if exe is not None:
        result["kernels"] = [k["kind"] for k in exe.kernels]
        extra = {"workspace": torch.empty(exe.workspace_bytes, dtype=torch.uint8, device="cuda")} if exe.workspace_bytes else {}

        def kiln_call(t, y):
            bound = {n: (nhwc(v) if v.dim() == 4 else v) for n, v in t.items()}
            return lambda: exe.run(bound, {"y": y}, **extra)
        kiln_calls = [kiln_call(t, y) for t, y in zip(sets, outs)]
    cudnn_calls = [lambda t=t: F.conv2d(t["x"], t["w"], None, conv.stride, conv.padding, conv.dilation, conv.groups)
                   for t in sets]
    for _ in range(rounds):
        if exe is not None:
            try:
                result["kiln_rounds_ms"].append(graph_ms_sets(kiln_calls))
            except Exception as e:  # noqa: BLE001 - a launch that fails is the row's result
                print(f"kiln's run failed on {path}: {e}", file=sys.stderr)
                result["error"] = str(e)
                exe = None
        result["cudnn_rounds_ms"].append(graph_ms_sets(cudnn_calls))
    result["kiln_ms"] = _median(result["kiln_rounds_ms"])
    result["cudnn_ms"] = _median(result["cudnn_rounds_ms"])
    if exe is not None:  # the timed kernels computed the row: kiln's last output of set 0 against eager's
        want = nhwc(torch_function(conv)(*(sets[0][n] for n in names))).float()
        got = outs[0].float()
        result["rel_error_vs_eager"] = ((got - want).norm() / want.norm().clamp_min(1e-30)).item()
    del sets, outs, cudnn_calls
    torch.cuda.empty_cache()
    return result


def time_inductor(conv: Conv, l2_bytes: int, rounds: int) -> dict:
    """torch.compile (default mode) of the row's conv + epilogue, timed by
    CUDA-graph replay over rotating input sets (median of `rounds`)."""
    names = input_names(conv)
    torch._dynamo.reset()
    fn = torch.compile(torch_function(conv), dynamic=False)
    sets = [make_inputs(conv, "cuda", seed) for seed in range(input_sets(conv, l2_bytes))]
    calls = [lambda t=t: fn(*(t[n] for n in names)) for t in sets]
    out = {"inductor_rounds_ms": []}
    try:
        start = time.monotonic()
        calls[0]()
        torch.cuda.synchronize()
        out["inductor_compile_s"] = time.monotonic() - start
        for _ in range(rounds):
            out["inductor_rounds_ms"].append(graph_ms_sets(calls))
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"torch.compile failed on {conv.name()}: {e}", file=sys.stderr)
        out["inductor_error"] = str(e)
    out["inductor_ms"] = _median(out["inductor_rounds_ms"])
    del sets, calls
    torch.cuda.empty_cache()
    return out


def inductor_sample(rows: List[Row], results: List[dict], mode: str, per_family: int = 6) -> List[int]:
    """Row indices for Inductor: none, all, or per family the 4 rows the
    models spend most kiln time in and the 2 slowest against cuDNN."""
    if mode == "off":
        return []
    if mode == "all":
        return list(range(len(rows)))
    picked = []
    for family in FAMILIES:
        mine = [i for i, r in enumerate(rows) if r.conv.family == family and results[i]["kiln_ms"] == results[i]["kiln_ms"]]
        weight = sorted(mine, key=lambda i: -sum(rows[i].counts.values()) * results[i]["kiln_ms"])
        ratio = sorted(mine, key=lambda i: -results[i]["kiln_ms"] / results[i]["cudnn_ms"])
        chosen = weight[:per_family - 2]
        chosen += [i for i in ratio if i not in chosen][:per_family - len(chosen)]
        picked += chosen
    return sorted(picked)


def _fmt(v: float, spec: str) -> str:
    return "-" if v != v else format(v, spec)


def figures(rows: List[Row], results: List[dict], ceil: dict, fma_tflops: float) -> List[dict]:
    """One dict per row with every figure of the table."""
    out = []
    for row, res in zip(rows, results):
        c = row.conv
        f = dict(asdict(c), family=c.family, shape=c.shape_text(), epilogue_text=c.epilogue_text(), p=c.p, q=c.q,
                 counts=row.counts, flops=c.flops, bytes=c.bytes, **res)
        k = f["kiln_ms"]
        f["kiln_vs_cudnn"] = k / f["cudnn_ms"]
        f["inductor_ms"] = f.get("inductor_ms", float("nan"))
        f["kiln_vs_inductor"] = k / f["inductor_ms"]
        f["tflops"] = c.flops / (k * 1e-3) / 1e12
        f["gbps"] = c.bytes / (k * 1e-3) / 1e9
        memory_ms = c.bytes / (ceil["copy_gbps"] * 1e9) * 1e3
        fma_ms = c.flops / (fma_tflops * 1e12) * 1e3 if fma_tflops == fma_tflops else float("nan")
        f["bound"] = "fma" if fma_ms > memory_ms else "copy"
        f["bound_ms"] = max(memory_ms, fma_ms) if fma_ms == fma_ms else memory_ms
        f["bound_share"] = f["bound_ms"] / k
        out.append(f)
    return out


def report(figs: List[dict], models: List[str]) -> Tuple[List[str], dict]:
    """The markdown tables per family, the per-family lines and the goals; and those figures."""
    lines, families = [], {}
    for family in FAMILIES:
        mine = [f for f in figs if f["family"] == family]
        if not mine:
            continue
        depthwise = family == "depthwise"
        lines += ["", f"### {family} ({len(mine)} convs)", "",
                  "| shape | epilogue | runs | kiln ms | cuDNN ms | kiln/cuDNN | Inductor ms | kiln/Ind | TFLOP/s | GB/s |"
                  + (" bound | share |" if depthwise else "") + " kiln kernels |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---|---:|" if depthwise else "") + "---|"]
        for f in mine:
            kernels = ", ".join(f.get("kernels", [])) or f.get("error", "-")[:60]
            lines.append(f"| {f['shape']} | {f['epilogue_text']} | {' '.join(f'{_SHORT.get(m, m)}x{n}' for m, n in f['counts'].items())} "
                         f"| {_fmt(f['kiln_ms'], '.4f')} | {_fmt(f['cudnn_ms'], '.4f')} | {_fmt(f['kiln_vs_cudnn'], '.2f')} "
                         f"| {_fmt(f['inductor_ms'], '.4f')} | {_fmt(f['kiln_vs_inductor'], '.2f')} "
                         f"| {_fmt(f['tflops'], '.1f')} | {_fmt(f['gbps'], '.0f')} |"
                         + (f" {f['bound']} | {_fmt(100 * f['bound_share'], '.0f')}% |" if depthwise else "")
                         + f" {kernels} |")
        ratios = [f["kiln_vs_cudnn"] for f in mine if f["kiln_vs_cudnn"] == f["kiln_vs_cudnn"]]
        fam = {"convs": len(mine), "timed": len(ratios), "geomean_kiln_vs_cudnn": geomean(ratios),
               "max_kiln_vs_cudnn": max(ratios, default=float("nan")),
               "over_1_25x_cudnn": sum(r > 1.25 for r in ratios),
               "geomean_kiln_vs_inductor": geomean([f["kiln_vs_inductor"] for f in mine]),
               "inductor_rows": sum(f["inductor_ms"] == f["inductor_ms"] for f in mine)}
        if depthwise:
            shares = [f["bound_share"] for f in mine if f["bound_share"] == f["bound_share"]]
            fam["at_80pct_of_bound"] = sum(s >= 0.8 for s in shares)
            fam["min_bound_share"] = min(shares, default=float("nan"))
        families[family] = fam
        lines += ["", f"{family}: kiln/cuDNN conv alone geomean {fam['geomean_kiln_vs_cudnn']:.2f}, max "
                      f"{fam['max_kiln_vs_cudnn']:.2f}, {fam['over_1_25x_cudnn']} of {fam['timed']} above 1.25x; "
                      f"kiln/Inductor geomean {fam['geomean_kiln_vs_inductor']:.2f} over {fam['inductor_rows']} rows"
                  + (f"; {fam['at_80pct_of_bound']} of {len(mine)} at >= 80% of their binding bound (lowest "
                     f"{100 * fam['min_bound_share']:.0f}%)" if depthwise else "")]
        if family == "dense":  # 1x1 (GEMMs over pixels) and larger filters apart
            for label, part in (("1x1", [f for f in mine if f["r"] == f["s"] == 1]),
                                ("larger", [f for f in mine if f["r"] * f["s"] > 1])):
                fam[f"geomean_kiln_vs_cudnn_{label}"] = geomean([f["kiln_vs_cudnn"] for f in part])
                if part:
                    lines.append(f"  {label} filters: kiln/cuDNN geomean {fam[f'geomean_kiln_vs_cudnn_{label}']:.2f} "
                                 f"over {len(part)} convs")
    per_model = {}
    lines += ["", "per model, each conv as often as one forward runs it (kiln: conv + epilogue; cuDNN: conv alone):"]
    for m in models:
        mine = [f for f in figs if m in f["counts"]]
        kiln_total = sum(f["kiln_ms"] * f["counts"][m] for f in mine)
        cudnn_total = sum(f["cudnn_ms"] * f["counts"][m] for f in mine)
        per_model[m] = {"convs": sum(f["counts"][m] for f in mine), "kiln_ms": kiln_total, "cudnn_ms": cudnn_total}
        lines.append(f"  {m:<16} {per_model[m]['convs']:>4} convs: kiln {kiln_total:8.3f} ms, cuDNN {cudnn_total:8.3f} ms "
                     f"({kiln_total / cudnn_total:.2f}x)")
    goals = {f: {"geomean_le_1": v["geomean_kiln_vs_cudnn"] <= 1.0, "none_above_1_25": v["over_1_25x_cudnn"] == 0}
             for f, v in families.items()}
    if "depthwise" in families:
        goals["depthwise"]["all_at_80pct_of_bound"] = families["depthwise"]["at_80pct_of_bound"] == families["depthwise"]["convs"]
    lines += ["", "goals: " + "; ".join(f"{f}: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in g.items())
                                        for f, g in goals.items())]
    return lines, {"families": families, "models": per_model, "goals": goals}


def run_on_gpu(args, rows: List[Row], models: List[str]) -> int:
    import kiln
    import torch._inductor.config
    start = time.monotonic()
    torch.backends.cudnn.benchmark = True  # cuDNN at its best, as users who care about speed run it
    torch._inductor.config.compile_threads = os.cpu_count() or 1
    ceil = ceilings()
    fma_tflops = fp32_fma_peak_tflops()
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    folder = args.graphs or tempfile.mkdtemp(prefix="zoo_convs_")
    paths = write_graphs(rows, folder)
    warm_start = time.monotonic()
    try:  # the package's own binary: the build and the cache kiln.compile reads
        warmed = kiln.warm(folder, jobs=args.jobs)
    except (kiln.GraphError, kiln.CompileError) as e:  # the rows that fail say so below
        warmed = f"FAILED: {str(e)[-2000:]}"
    print(f"{torch.cuda.get_device_name()}: copy {ceil['copy_gbps']:.0f} GB/s, cuBLAS bf16 {ceil['cublas_tflops']:.0f} "
          f"TFLOP/s, FP32 FMA peak {fma_tflops:.1f} TFLOP/s, L2 {l2 >> 20} MiB")
    print(f"{len(rows)} distinct convs; kiln warm ({time.monotonic() - warm_start:.0f} s, {args.jobs} jobs): {warmed}",
          flush=True)
    results = []
    for i, (row, path) in enumerate(zip(rows, paths)):
        results.append(time_row(row.conv, path, l2, args.rounds))
        r = results[-1]
        print(f"[{i + 1}/{len(rows)}] {row.conv.family:<9} {row.conv.shape_text():<34} {row.conv.epilogue_text():<18} "
              f"kiln {r['kiln_ms']:.4f} ms, cuDNN {r['cudnn_ms']:.4f} ms ({r['kiln_ms'] / r['cudnn_ms']:.2f}x)"
              + (f", rel. error {r['rel_error_vs_eager']:.1e}" if "rel_error_vs_eager" in r else ""), flush=True)
    timed_s = time.monotonic() - start
    chosen = inductor_sample(rows, results, args.inductor)
    print(f"Inductor (torch.compile, default mode) on {len(chosen)} rows ({args.inductor})", flush=True)
    for i in chosen:
        results[i].update(time_inductor(rows[i].conv, l2, args.rounds))
        print(f"  {rows[i].conv.shape_text():<34} {rows[i].conv.epilogue_text():<18} Inductor {results[i]['inductor_ms']:.4f} ms "
              f"(compiled in {results[i].get('inductor_compile_s', float('nan')):.1f} s)", flush=True)
    figs = figures(rows, results, ceil, fma_tflops)
    lines, totals = report(figs, models)
    seconds = time.monotonic() - start
    print(f"\n## The zoo's convs ({torch.cuda.get_device_name()}, channels-last bf16, every side by CUDA-graph replay "
          f"over rotating input sets; {args.rounds} rounds, kiln and cuDNN alternating)")
    print("\n".join(lines))
    print(f"\n{seconds:.0f} s in all ({timed_s:.0f} s to the end of kiln and cuDNN, then Inductor)")
    bad = [f for f in figs if f.get("rel_error_vs_eager", 0) > 2e-2 or "error" in f]
    for f in bad:
        print(f"WRONG or FAILED: {f['shape']} {f['epilogue_text']}: {f.get('error') or f['rel_error_vs_eager']}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "ceilings": ceil, "fma_tflops": fma_tflops, "l2_bytes": l2,
                       "method": "CUDA-graph replay over rotating input sets, every side", "rounds": args.rounds,
                       "inductor": args.inductor, "seconds": seconds, "rows": figs, **totals}, fh, indent=1)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kiln", nargs="?", help="the kiln binary (default: the one installed with the kiln package)")
    ap.add_argument("--models", help=f"comma-separated (default: {','.join(MODELS)})")
    ap.add_argument("--inductor", choices=["sample", "all", "off"], default="sample")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds, kiln and cuDNN alternating")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: list, write the graphs, plan them, check a few on the CPU")
    ap.add_argument("--tiny", action="store_true", help="the models' tiny configurations (the test)")
    ap.add_argument("--graphs", help="folder for the kiln graphs (default: a new temporary folder)")
    ap.add_argument("--warm", action="store_true", help="dry run: also compile every kernel for sm_90 (kiln warm)")
    ap.add_argument("--check", type=int, default=16, help="dry run: rows checked on the CPU (0: none)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="parallel kiln processes")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",")] if args.models else list(MODELS)
    unknown = [m for m in models if m not in zoo_models.BY_NAME]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(zoo_models.BY_NAME)}")
    if args.kiln is None:
        from kiln._warm import binary
        args.kiln = binary()
    start = time.monotonic()
    rows = collect(models, tiny=args.tiny)
    print(f"traced {len(models)} models in {time.monotonic() - start:.1f} s")
    if args.dry_run:
        return dry_run(args, rows, models)
    return run_on_gpu(args, rows, models)


if __name__ == "__main__":
    sys.exit(main())
