"""Random small programs through torch.compile(backend="kiln") against
eager PyTorch: ops kiln converts mixed with ops it does not (which split the
graph), on shapes and (on a GPU) storage dtypes drawn from the seed. CI runs
40 seeds on CPU tensors; on the GPU machine KILN_RANDOM_PROGRAMS=N
KILN_RANDOM_DEVICE=cuda runs N seeds on the device, starting at
KILN_RANDOM_FIRST (so several processes can share the seeds out).
A failing seed is printed, to be kept as a test of its own.

kiln and eager are both compared with the program evaluated in f64 on the
same (rounded) inputs: kiln's relative error may not exceed twice eager's
plus a slack of 1e-5 in f32, one rounding step of the storage dtype in
f16/bf16 (where kiln keeps f32 between fused ops and eager rounds after
each). Measuring against eager alone failed well-conditioned-looking seeds
whose result is a near-cancellation (GPU seeds 2798 and 2799: x - mean over
rows after two softmaxes and sigmoids), where eager is no closer to the
exact value than kiln."""
import os
import random

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import kiln.torch  # noqa: E402,F401

D = 8
STEPS = [  # (name, function of (x, params), converted by kiln)
    ("linear", lambda x, p: F.linear(x, p["w"], p["b"]), True),
    ("gelu", lambda x, p: F.gelu(x), True),
    ("gelu_tanh", lambda x, p: F.gelu(x, approximate="tanh"), True),
    ("silu_mul", lambda x, p: F.silu(x) * x, True),
    ("layer_norm", lambda x, p: F.layer_norm(x, (D,), p["g"], p["b"]), True),
    ("rms_by_hand", lambda x, p: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * p["g"], True),
    ("softmax", lambda x, p: torch.softmax(x, -1), True),
    ("residual", lambda x, p: x + torch.tanh(x), True),
    ("rope_like", lambda x, p: torch.cat((-x[..., D // 2:], x[..., : D // 2]), -1) * 0.5 + x, True),
    ("transpose_back", lambda x, p: x.transpose(0, 1).contiguous().transpose(0, 1), True),
    ("reshape_heads", lambda x, p: x.reshape(x.shape[0], x.shape[1], 2, D // 2).sigmoid().reshape(x.shape), True),
    ("mean_keep", lambda x, p: x - x.mean(1, keepdim=True), True),
    ("clamp", lambda x, p: x.clamp(-1.5, 1.5), True),
    ("where", lambda x, p: torch.where(x > 0, x, x * 0.1), True),
    ("cumsum", lambda x, p: torch.cumsum(x, dim=-1) * 0.1, False),
    ("sort", lambda x, p: torch.sort(x, dim=-1).values, False),
    # A step threshold away from 0: programs make exact zeros in exact arithmetic
    # (softmax -> x - mean over rows -> cumsum ends each row at 1 - 1), whose
    # computed sign is rounding noise; `> 0` there failed seed 101 on the GPU.
    # The one discontinuous step: left out of f16/bf16 programs, where values
    # within a rounding step of 0.3 land on either side (seed 613 on the GPU:
    # one element of 48 flipped, and cumsum carried it along the row).
    ("int_roundtrip", lambda x, p: x + (x > 0.3).to(torch.int64).to(x.dtype), True),
]


DISCONTINUOUS = {"int_roundtrip"}


def program(seed, dtype=torch.float32):
    rng = random.Random(seed)
    choices = STEPS if dtype == torch.float32 else [s for s in STEPS if s[0] not in DISCONTINUOUS]
    steps = [rng.choice(choices) for _ in range(rng.randint(2, 7))]

    def fn(x, w, b, g):
        p = {"w": w, "b": b, "g": g}
        for _, step, _ in steps:
            x = step(x, p)
        return x
    return fn, [s[0] for s in steps]


COUNT = int(os.environ.get("KILN_RANDOM_PROGRAMS", "40"))
FIRST = int(os.environ.get("KILN_RANDOM_FIRST", "0"))
DEVICE = os.environ.get("KILN_RANDOM_DEVICE", "cpu")
SLACK = {torch.float32: 1e-5, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def inputs(seed):
    """The seed's inputs: (x, w, b, g) with x of a drawn [batch, rows, D], and
    the storage dtype (f32 on the CPU; on a GPU one seed in four is f16 or bf16)."""
    rng = random.Random(seed * 7919 + 1)
    dtype = torch.float32
    if DEVICE == "cuda" and rng.random() < 0.25:
        dtype = rng.choice([torch.float16, torch.bfloat16])
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rng.randint(1, 3), rng.randint(1, 33), D, generator=gen)
    params = (torch.randn(D, D, generator=gen) / 3, torch.randn(D, generator=gen), torch.randn(D, generator=gen))
    return tuple(t.to(DEVICE, dtype) for t in (x, *params)), dtype


def relative_error(got, want):
    return ((got.double().cpu() - want.double().cpu()).norm() / max(want.double().norm().item(), 1e-30)).item()


# Seeds that once failed, run every time: 101 and 613 (on the GPU) were the
# generator's ill-conditioned programs (see int_roundtrip), 2798 and 2799 the
# old comparison with eager alone (see above); none was kiln's error.
REGRESSIONS = [101, 613, 2798, 2799]


@pytest.mark.parametrize("seed", sorted(set(range(FIRST, FIRST + COUNT)) | set(REGRESSIONS)))
def test_random_programs_match_eager(seed):
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("KILN_RANDOM_DEVICE=cuda without a GPU")
    args, dtype = inputs(seed)
    fn, names = program(seed, dtype)
    with torch.no_grad():
        eager = fn(*args)
        torch._dynamo.reset()
        got = torch.compile(fn, backend="kiln", dynamic=False)(*args)
        exact = fn(*(a.double().cpu() for a in args))
    assert got.dtype == eager.dtype and got.shape == eager.shape, f"seed {seed}: {got.dtype}{tuple(got.shape)}"
    what = f"seed {seed} ({' -> '.join(names)}, {dtype}, x {tuple(args[0].shape)})"
    err, eager_err = relative_error(got, exact), relative_error(eager, exact)
    assert err <= 2 * eager_err + SLACK[dtype], f"{what}: error {err} against f64, eager's {eager_err}"


GRADIENT_SEEDS = sorted(set(range(FIRST, FIRST + max(COUNT // 2, 1))) | set(REGRESSIONS))


@pytest.mark.parametrize("seed", GRADIENT_SEEDS)
def test_random_programs_with_gradients_on_match_eager(seed):
    """The same programs with autograd on (half the seeds): the kiln forward's output and the
    gradients of x and the parameters (the backward in PyTorch, from the activations kiln saved),
    each against f64 no farther than twice eager's error plus a slack."""
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("KILN_RANDOM_DEVICE=cuda without a GPU")
    args, dtype = inputs(seed)
    fn, names = program(seed, dtype)
    weights = torch.randn(fn(*args).shape, generator=torch.Generator().manual_seed(seed))

    def forward_backward(f, values):
        leaves = [a.detach().clone().requires_grad_() for a in values]
        out = f(*leaves)
        if out.requires_grad:
            (out.double() * weights.to(out.device, torch.float64)).sum().backward()
        return out.detach(), [t.grad for t in leaves]

    eager, eager_grads = forward_backward(fn, args)
    torch._dynamo.reset()
    got, got_grads = forward_backward(torch.compile(fn, backend="kiln", dynamic=False), args)
    exact, exact_grads = forward_backward(fn, [a.double().cpu() for a in args])
    what = f"seed {seed} ({' -> '.join(names)}, {dtype}, x {tuple(args[0].shape)})"
    err, eager_err = relative_error(got, exact), relative_error(eager, exact)
    assert err <= 2 * eager_err + SLACK[dtype], f"{what}: output's error {err} against f64, eager's {eager_err}"
    for name, g, e, x in zip("xwbg", got_grads, eager_grads, exact_grads):
        if x is None or not x.any():  # (no path from this input to the output, or a zero gradient)
            assert g is None or not g.any(), f"{what}: a gradient of {name} where f64 has none"
            continue
        assert g is not None, f"{what}: no gradient of {name}"
        err, eager_err = relative_error(g, x), relative_error(e, x)
        assert err <= 2 * eager_err + 10 * SLACK[dtype], f"{what}: gradient of {name}: {err} against f64, eager's {eager_err}"
