"""Evaluate a kiln graph (graph-format.md) with PyTorch.

An implementation of the graph format independent of kiln's C++ code. It
serves two purposes:
  - cross-checking kiln's reference interpreter (float64, on CPU or GPU):
    tests/gpu/crosscheck_reference.py;
  - the PyTorch eager and torch.compile baselines of the benchmarks.

It follows the numerics of the spec: arithmetic in `compute` precision
(float32 for baselines, float64 for cross-checks), rounding to f16/bf16 only
where rule 2 says (explicit dtype, cast, graph outputs; views of rounded
values stay rounded), matmul/conv `precision` rounding of f32-valued operands,
sdpa probabilities rounded to v's value dtype.
"""
import json
import math

import torch
import torch.nn.functional as F

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "bool": torch.bool}
UNARY = {"identity", "neg", "abs", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "exp",
         "log", "sqrt", "rsqrt", "reciprocal", "square", "erf", "sin", "cos", "softplus", "clamp", "cast"}
BINARY = {"add", "sub", "mul", "div", "maximum", "minimum", "pow"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
VIEWS = {"transpose", "reshape", "expand", "slice"}


def load(path):
    with open(path) as f:
        return json.load(f)


class Tensor:
    """What the evaluator knows of a value: its dtype (rule 3) and whether its
    values are rounded to it (rule 2)."""

    def __init__(self, dtype, rounded, constant=False):
        self.dtype, self.rounded, self.constant = dtype, rounded, constant

    @property
    def value_dtype(self):
        return self.dtype if (self.rounded or self.dtype == "bool") else "f32"


def widest(types):
    floats = [t.dtype for t in types if not t.constant and t.dtype != "bool"]
    if not floats or "f32" in floats or ("f16" in floats and "bf16" in floats):
        return "f32"
    return floats[0]


def annotate(graph):
    """dtype and rounding of every tensor, by the spec's rules."""
    info = {name: Tensor(spec["dtype"], True) for name, spec in graph["inputs"].items()}
    outputs = set(graph["outputs"])
    for op in graph["ops"]:
        ins = [Tensor("f32", True, constant=True) if not isinstance(i, str) else info[i] for i in op["in"]]
        kind = op["op"]
        if "dtype" in op:
            dtype = op["dtype"]
        elif kind in COMPARE:
            dtype = "bool"
        elif kind in VIEWS:
            dtype = ins[0].dtype
        elif kind == "where":
            dtype = widest(ins[1:])
        else:
            dtype = widest(ins)
        rounded = ("dtype" in op or kind == "cast" or op["out"] in outputs
                   or (kind in VIEWS and ins[0].rounded and ins[0].dtype == dtype)
                   or (kind == "concat" and all(t.rounded and t.dtype == dtype for t in ins)))
        info[op["out"]] = Tensor(dtype, rounded)
    return info


def round_to(x, dtype, compute):
    if dtype in ("f16", "bf16"):
        return x.to(TORCH_DTYPES[dtype]).to(compute)
    if dtype == "f32" and compute != torch.float32:
        return x.to(torch.float32).to(compute)
    return x


def round_tf32(x, compute):
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    finite = torch.isfinite(x.to(torch.float32))
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) & ~0x1FFF).view(torch.float32)
    return torch.where(finite, rounded, x.to(torch.float32)).to(compute)


def at_precision(x, t, precision, compute):
    if precision == "f32" or t.value_dtype != "f32":
        return x
    if precision == "tf32":
        return round_tf32(x, compute)
    return round_to(x, precision, compute)


def norm_axis(axis, rank):
    return axis + rank if axis < 0 else axis


def sdpa(q, k, v, mask, mask_is_bool, causal, scale, p_dtype, compute):
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = torch.where(mask, s, torch.tensor(-math.inf, dtype=compute, device=s.device)) if mask_is_bool else s + mask
    sq, skv = s.shape[-2], s.shape[-1]
    if causal:
        i = torch.arange(sq, device=s.device).view(-1, 1)
        j = torch.arange(skv, device=s.device).view(1, -1)
        s = s.masked_fill(j > i + skv - sq, -math.inf)
    all_masked = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(all_masked, 0.0), dim=-1)
    p = round_to(p, p_dtype, compute) if p_dtype in ("f16", "bf16") else p
    return torch.matmul(p, v).masked_fill(all_masked, 0.0)


def native_type(ts, n):
    """The 16-bit torch dtype the first n operands share as values, or None."""
    kinds = {t.value_dtype for t in ts[:n]}
    return TORCH_DTYPES[kinds.pop()] if len(kinds) == 1 and kinds <= {"bf16", "f16"} else None


def evaluate(graph, inputs, compute=torch.float64, info=None, native_anchors=False):
    """inputs: name -> tensor (any float dtype; bool for bool inputs).
    Returns name -> tensor for every graph output, in `compute` precision
    (bool outputs as bool).

    native_anchors (benchmark baselines only): matmul, conv2d and sdpa whose
    operands are all bf16 or all f16 values run in that dtype, as a
    framework runs them (cuBLAS/cuDNN with f32 accumulation, flash
    attention), their result rounded to it; not the graph's numerics
    exactly, but the baseline users compare against."""
    info = info or annotate(graph)
    env = {}
    for name, spec in graph["inputs"].items():
        x = inputs[name]
        env[name] = x.bool() if spec["dtype"] == "bool" else round_to(x.to(compute), spec["dtype"], compute)
    for op in graph["ops"]:
        kind, a = op["op"], op
        xs = [env[i] if isinstance(i, str) else i for i in op["in"]]
        ts = [info[i] if isinstance(i, str) else Tensor("f32", True, True) for i in op["in"]]
        x = xs[0]
        out = info[op["out"]]
        if kind in UNARY:
            y = {"identity": lambda: x, "neg": lambda: -x, "abs": lambda: torch.abs(torch.as_tensor(x)),
                 "relu": lambda: torch.relu(x), "leaky_relu": lambda: F.leaky_relu(x, a.get("alpha", 0.01)),
                 "gelu": lambda: F.gelu(x), "gelu_tanh": lambda: F.gelu(x, approximate="tanh"),
                 "silu": lambda: F.silu(x), "sigmoid": lambda: torch.sigmoid(x), "tanh": lambda: torch.tanh(x),
                 "exp": lambda: torch.exp(x), "log": lambda: torch.log(x), "sqrt": lambda: torch.sqrt(x),
                 "rsqrt": lambda: torch.rsqrt(x), "reciprocal": lambda: torch.reciprocal(x),
                 "square": lambda: x * x, "erf": lambda: torch.erf(x), "sin": lambda: torch.sin(x),
                 "cos": lambda: torch.cos(x), "softplus": lambda: F.softplus(x),
                 "clamp": lambda: torch.clamp(x, a.get("min"), a.get("max")),
                 "cast": lambda: (x != 0) if a["dtype"] == "bool" else x.to(compute)}[kind]()
        elif kind in BINARY or kind in COMPARE:
            p, q = xs
            fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
                  "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow,
                  "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}[kind]
            dev = next((t.device for t in xs if torch.is_tensor(t)), "cpu")
            p = p if torch.is_tensor(p) else torch.tensor(float(p), dtype=compute, device=dev)
            q = q if torch.is_tensor(q) else torch.tensor(float(q), dtype=compute, device=dev)
            y = fn(p, q)
        elif kind == "where":
            c, p, q = xs
            dev = c.device
            p = p if torch.is_tensor(p) else torch.tensor(float(p), dtype=compute, device=dev)
            q = q if torch.is_tensor(q) else torch.tensor(float(q), dtype=compute, device=dev)
            y = torch.where(c, p, q)
        elif kind.startswith("reduce_"):
            axes = [norm_axis(d, x.dim()) for d in a.get("axes", list(range(x.dim())))]
            keep = a.get("keepdims", False)
            if not axes:
                y = x
            elif kind == "reduce_sum":
                y = torch.sum(x, dim=axes, keepdim=keep)
            elif kind == "reduce_mean":
                y = torch.mean(x, dim=axes, keepdim=keep)
            elif kind == "reduce_max":
                y = torch.amax(x, dim=axes, keepdim=keep)
            else:
                y = torch.amin(x, dim=axes, keepdim=keep)
        elif kind in ("softmax", "log_softmax"):
            axis = a.get("axis", -1)
            y = torch.softmax(x, dim=axis) if kind == "softmax" else torch.log_softmax(x, dim=axis)
        elif kind == "layer_norm":
            axis = norm_axis(a.get("axis", -1), x.dim())
            w = xs[1] if len(xs) > 1 else None
            b = xs[2] if len(xs) > 2 else None
            y = F.layer_norm(x, x.shape[axis:], w, b, a.get("eps", 1e-5))
        elif kind == "rms_norm":
            axis = norm_axis(a.get("axis", -1), x.dim())
            dims = list(range(axis, x.dim()))
            y = x * torch.rsqrt(torch.mean(x * x, dim=dims, keepdim=True) + a.get("eps", 1e-6))
            if len(xs) > 1:
                y = y * xs[1]
        elif kind == "batch_norm":
            axis = norm_axis(a.get("axis", -1), x.dim())
            shape = [1] * x.dim()
            shape[axis] = -1
            mean, var = xs[1].view(shape), xs[2].view(shape)
            y = (x - mean) * torch.rsqrt(var + a.get("eps", 1e-5))
            if len(xs) > 3:
                y = y * xs[3].view(shape)
            if len(xs) > 4:
                y = y + xs[4].view(shape)
        elif kind == "group_norm":
            axis = norm_axis(a.get("axis", -1), x.dim())
            moved = x.movedim(axis, 1)
            w = xs[1] if len(xs) > 1 else None
            b = xs[2] if len(xs) > 2 else None
            y = F.group_norm(moved, a["groups"], w, b, a.get("eps", 1e-5)).movedim(1, axis)
        elif kind == "matmul" and native_anchors and native_type(ts, 2):
            dt = native_type(ts, 2)
            y = torch.matmul(xs[0].to(dt), xs[1].to(dt)).to(compute)
        elif kind == "conv2d" and native_anchors and native_type(ts, 2):
            dt = native_type(ts, 2)
            nhwc = a.get("layout", "NHWC") == "NHWC"
            xx, w = x.to(dt), xs[1].to(dt)
            if nhwc:  # channels-last memory, as the NHWC graph stores it
                xx, w = xx.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
            y = F.conv2d(xx, w, stride=a.get("stride", [1, 1]), padding=a.get("padding", [0, 0]),
                         dilation=a.get("dilation", [1, 1]), groups=a.get("groups", 1))
            y = (y.permute(0, 2, 3, 1) if nhwc else y).to(compute)
        elif kind == "sdpa" and native_anchors and native_type(ts, 3):
            dt = native_type(ts, 3)
            mask = xs[3] if len(xs) > 3 else None
            if mask is not None and mask.dtype != torch.bool:
                mask = mask.to(dt)
            causal = a.get("causal", False)
            if causal and x.shape[2] != xs[1].shape[2]:
                raise ValueError("native sdpa baseline: causal needs Sq == Skv")
            y = F.scaled_dot_product_attention(x.to(dt), xs[1].to(dt), xs[2].to(dt), attn_mask=mask, is_causal=causal,
                                               scale=a.get("scale", 1.0 / math.sqrt(x.shape[-1])),
                                               enable_gqa=x.shape[1] != xs[1].shape[1]).to(compute)
        elif kind == "matmul":
            prec = a.get("precision", "f32")
            y = torch.matmul(at_precision(xs[0], ts[0], prec, compute), at_precision(xs[1], ts[1], prec, compute))
        elif kind == "conv2d":
            prec = a.get("precision", "f32")
            w = at_precision(xs[1], ts[1], prec, compute)
            xx = at_precision(x, ts[0], prec, compute)
            nhwc = a.get("layout", "NHWC") == "NHWC"
            if nhwc:
                xx, w = xx.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)
            y = F.conv2d(xx, w, stride=a.get("stride", [1, 1]), padding=a.get("padding", [0, 0]),
                         dilation=a.get("dilation", [1, 1]), groups=a.get("groups", 1))
            if nhwc:
                y = y.permute(0, 2, 3, 1)
        elif kind in ("max_pool2d", "avg_pool2d"):
            nhwc = a.get("layout", "NHWC") == "NHWC"
            xx = x.permute(0, 3, 1, 2) if nhwc else x
            k = a["kernel"]
            s = a.get("stride", k)
            pad = a.get("padding", [0, 0])
            if kind == "max_pool2d":
                y = F.max_pool2d(xx, k, s, pad)
            else:
                y = F.avg_pool2d(xx, k, s, pad, count_include_pad=a.get("count_include_pad", True))
            if nhwc:
                y = y.permute(0, 2, 3, 1)
        elif kind == "transpose":
            y = x.permute(*a.get("perm", list(reversed(range(x.dim())))))
        elif kind == "reshape":
            y = x.reshape(a["shape"])
        elif kind == "expand":
            y = x.expand(*a["shape"])
        elif kind == "slice":
            axis = norm_axis(a["axis"], x.dim())
            index = [slice(None)] * x.dim()
            index[axis] = slice(a.get("start", 0), a.get("end", None), a.get("step", 1))
            y = x[tuple(index)]
        elif kind == "concat":
            y = torch.cat([t.to(compute) for t in xs], dim=norm_axis(a["axis"], x.dim()))
        elif kind == "sdpa":
            mask = xs[3] if len(xs) > 3 else None
            d = x.shape[-1]
            y = sdpa(x, xs[1], xs[2], mask, len(ts) > 3 and ts[3].dtype == "bool", a.get("causal", False),
                     a.get("scale", 1.0 / math.sqrt(d)), ts[2].value_dtype, compute)
        else:
            raise ValueError(f"op {kind} is not in the catalogue")
        if out.dtype == "bool":
            y = y.bool()
        elif out.rounded:
            y = round_to(y.to(compute), out.dtype, compute)
        else:
            y = y.to(compute)
        env[op["out"]] = y
    return {name: env[name] for name in graph["outputs"]}
