"""The special cases PyTorch documents for the ATen ops kiln converts,
against eager on CPU tensors (the reference interpreter runs kiln's graphs):
beta or alpha of 0 (PyTorch then leaves that term out, NaN and inf in it
included), softplus's threshold, NaN and infinity through every converter,
bounds out of order, and negative views as subgraph inputs.

Each case is compiled once; its property (kiln's result is eager's, NaN at
the same places) is then checked on several draws of values, each mixing
normal values with NaN, infinities, zeros of both signs and large values.
"""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import kiln.torch  # noqa: E402  (registers the backend)

nan, inf = float("nan"), float("inf")
SPECIAL = [nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 0.5, 3.0, 25.0, -25.0, 1e30, -1e30]
# Without the values whose f32 products overflow: where eager's f32 sums and
# variances overflow to inf (or inf - inf), kiln's reference, exact in f64, does not.
NOT_HUGE = [v for v in SPECIAL if abs(v) != 1e30]
# Without infinities: eager's CPU gelu gives NaN at inf and -inf (kiln: inf and 0), and its
# pow(-inf, 0.3) NaN (C's pow: inf), quirks no document states.
FINITE = [v for v in SPECIAL if abs(v) != inf]
# Finite and not huge: eager's CPU convolution (oneDNN) spreads a NaN or inf to outputs
# that do not read it (its transforms mix neighbouring inputs).
ORDINARY = [v for v in NOT_HUGE if abs(v) != inf and v == v]


def draw(shape, seed, special=True, values=SPECIAL, share=0.25):
    """Normal values with, where `special`, a `share` of them replaced by some of `values`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if special:
        mask = torch.rand(shape, generator=g) < share
        x = torch.where(mask, torch.tensor(values)[torch.randint(len(values), shape, generator=g)], x)
    return x


def holds_for_draws(fn, *shapes, seeds=range(4), special=None, values=SPECIAL, share=0.25, rtol=1e-5, atol=1e-6,
                    in_kiln=True):
    """fn through the kiln backend equals eager on every draw; `special`
    (default: all) names the inputs that get special values."""
    special = range(len(shapes)) if special is None else special
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kiln", dynamic=False)
    with torch.no_grad():
        for seed in seeds:
            inputs = [draw(s, seed * 31 + i, i in special, values, share) for i, s in enumerate(shapes)]
            want = fn(*inputs)
            got = compiled(*inputs)
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"seed {seed}: {m}\ninputs: {inputs}")
        report = kiln.torch.explain(fn, *inputs)
    if in_kiln is not None:
        assert bool(report.subgraphs) == in_kiln, str(report)
    return report


# ---- addmm: beta * input + alpha * (mat1 @ mat2) ----

NON_FINITE = [nan, inf, -inf]


@pytest.mark.parametrize("bias_shape", [(6,), (4, 6), (1, 6), (4, 1)])
def test_addmm_with_beta_0_ignores_the_input_nan_and_inf_included(bias_shape):
    # (the input was multiplied by 0: NaN and inf in it gave NaN)
    for alpha in (1, -1.5):
        holds_for_draws(lambda c, x, y: torch.addmm(c, x, y, beta=0, alpha=alpha), bias_shape, (4, 8), (8, 6),
                        special=[0], values=NON_FINITE, share=0.5)


@pytest.mark.parametrize("bias_shape", [(6,), (4, 6), (4, 1)])
def test_addmm_with_alpha_0_ignores_the_product_nan_and_inf_included(bias_shape):
    for beta in (1, 2.5):
        holds_for_draws(lambda c, x, y: torch.addmm(c, x, y, alpha=0, beta=beta), bias_shape, (4, 8), (8, 6),
                        special=[1, 2], values=NON_FINITE, share=0.25)


def test_addmm_with_beta_and_alpha_0_gives_zeros():
    holds_for_draws(lambda c, x, y: torch.addmm(c, x, y, alpha=0, beta=0), (6,), (4, 8), (8, 6), in_kiln=False)


@pytest.mark.parametrize("beta, alpha", [(1, 1), (0.5, 2.0), (-1, 0.25)])
def test_addmm_propagates_nan_and_inf_as_eager_does(beta, alpha):
    holds_for_draws(lambda c, x, y: torch.addmm(c, x, y, beta=beta, alpha=alpha), (6,), (4, 8), (8, 6), rtol=1e-4)


# ---- add, sub, rsub with alpha: a + alpha * b (PyTorch multiplies even by 0) ----

@pytest.mark.parametrize("alpha", [0, -1.5, 2])
def test_add_sub_rsub_with_alpha(alpha):
    holds_for_draws(lambda a, b: torch.add(a, b, alpha=alpha), (4, 8), (4, 8))
    holds_for_draws(lambda a, b: torch.sub(a, b, alpha=alpha), (4, 8), (8,))
    holds_for_draws(lambda a, b: torch.rsub(a, b, alpha=alpha), (4, 8), (4, 8))
    # (the .Scalar overloads take alpha as their third argument, which was ignored: rsub(a, 2, alpha=2) gave 2 - a)
    holds_for_draws(lambda a: torch.rsub(a, 2.0, alpha=alpha), (4, 8))
    holds_for_draws(lambda a: torch.add(a, 3.0, alpha=alpha) - torch.sub(a, 3.0, alpha=alpha), (4, 8))


# ---- the pointwise ops generated from the op table ----

POINTWISE = [
    ("unary", lambda x: torch.stack([torch.relu(x), torch.neg(x), torch.abs(x), torch.sigmoid(x), torch.tanh(x),
                                     torch.exp(x), torch.erf(x), torch.sin(x), torch.cos(x), F.silu(x)])),
    ("unary_domains", lambda x: torch.stack([torch.sqrt(x), torch.log(x), torch.rsqrt(x), torch.reciprocal(x)])),
    ("binary", lambda a, b: torch.stack([a * b, a / b, torch.maximum(a, b), torch.minimum(a, b), a * 2.5, a / 0.0])),
    ("pow", lambda a, b: torch.stack([torch.pow(a, b), torch.pow(a, 0.0), torch.pow(a, 2), torch.pow(a, 0.5),
                                      torch.pow(a, -1), torch.pow(2.0, b), a.square()])),
    ("compare", lambda a, b: torch.stack([a == b, a != b, a < b, a <= b, a > b, a >= b, a > 0.5])),
]


@pytest.mark.parametrize("name, fn", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_ops_on_nan_inf_and_signed_zeros(name, fn):
    shapes = [(4, 8)] * fn.__code__.co_argcount
    if name == "pow":  # (exponents: normal values; eager's CPU pow(0, -1e30) is NaN, not C's inf)
        holds_for_draws(fn, *shapes, special=[0], values=FINITE, rtol=1e-5, atol=1e-6)
    else:
        holds_for_draws(fn, *shapes, rtol=1e-5, atol=1e-6)


def test_pointwise_compositions_on_nan_inf_and_signed_zeros():
    holds_for_draws(lambda x: torch.stack([F.hardswish(x), F.hardsigmoid(x), F.hardtanh(x), F.hardtanh(x, -2.0, 0.5)]),
                    (4, 8), rtol=1e-4, atol=1e-5)
    holds_for_draws(lambda x: torch.stack([F.gelu(x), F.gelu(x, approximate="tanh")]), (4, 8), values=FINITE,
                    rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("slope", [0.01, 0.0, -0.5, 2.0])
def test_leaky_relu(slope):
    holds_for_draws(lambda x: F.leaky_relu(x, slope), (4, 8))
    holds_for_draws(lambda x: F.leaky_relu(x, negative_slope=slope), (4, 8))


@pytest.mark.parametrize("beta, threshold", [(1.0, 20.0), (2.0, 20.0), (1.0, 1.0), (2.0, 1.0), (0.5, 5.0), (-1.0, 2.0)])
def test_softplus_returns_x_past_its_threshold(beta, threshold):
    # (the threshold was ignored: softplus(2, threshold=1) gave 2.127, not 2)
    holds_for_draws(lambda x: F.softplus(x, beta=beta, threshold=threshold), (4, 8), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lo, hi", [(-0.5, 0.5), (2.0, 1.0), (None, 0.0), (0.0, None), (-0.0, 0.0)])
def test_clamp_bounds_in_and_out_of_order(lo, hi):
    holds_for_draws(lambda x: torch.clamp(x, lo, hi), (4, 8))


def test_where_masked_fill_and_casts_carry_nan_and_inf():
    holds_for_draws(lambda c, a, b: torch.where(c > 0, a, b) + a.masked_fill(c < 0, -1.0), (4, 8), (4, 8), (4, 8))
    holds_for_draws(lambda x: torch.stack([(x.to(torch.bool)).float(), x.half().float(), x.bfloat16().float()]), (4, 8))


# ---- anchors, reductions, norms, pools ----

def test_matmul_linear_and_conv_carry_nan_and_inf():
    holds_for_draws(lambda a, b: a @ b, (4, 8), (8, 6), values=NOT_HUGE, rtol=1e-4)
    holds_for_draws(lambda x, w, b: F.linear(x, w, b), (2, 4, 8), (6, 8), (6,), values=NOT_HUGE, rtol=1e-4)
    holds_for_draws(lambda x, w: F.conv2d(x, w, padding=1), (1, 2, 5, 5), (3, 2, 3, 3), values=ORDINARY, rtol=1e-4)


def test_reductions_carry_nan_and_inf():
    holds_for_draws(lambda x: torch.stack([x.sum(-1), x.mean(-1), x.amax(-1), x.amin(-1)]), (4, 8), rtol=1e-4)
    holds_for_draws(lambda x: x.sum(dim=[]) + x.mean(), (4, 8), rtol=1e-4)


def test_softmax_log_softmax_and_layer_norm_carry_nan_and_inf():
    holds_for_draws(lambda x: torch.softmax(x, -1), (4, 8), rtol=1e-4, atol=1e-6)
    holds_for_draws(lambda x: torch.log_softmax(x, -1), (4, 8), rtol=1e-4, atol=1e-5)
    holds_for_draws(lambda x: F.layer_norm(x, (8,)), (4, 8), values=NOT_HUGE, rtol=1e-4, atol=1e-5)
    # a row of -inf alone
    holds_for_draws(lambda x: torch.softmax(x.masked_fill(x > -10, -inf), -1), (4, 8), special=[])


def test_pools_carry_nan_and_inf():
    holds_for_draws(lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), (1, 2, 6, 6), rtol=1e-4)
    holds_for_draws(lambda x: F.max_pool2d(x, 3, stride=2, padding=1), (1, 2, 6, 6))


def test_division_with_a_rounding_mode_stays_in_pytorch():
    report = holds_for_draws(lambda a, b: torch.div(a, b, rounding_mode="floor") + torch.div(a, b, rounding_mode="trunc"),
                             (4, 8), (4, 8), in_kiln=None)
    assert sorted(e["reason"] for e in report.left_to_pytorch) == ["division with rounding_mode='floor'",
                                                                   "division with rounding_mode='trunc'"]


def test_attention_with_a_query_that_sees_no_key():
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[1] = False
    holds_for_draws(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), (1, 2, 4, 8), (1, 2, 4, 8),
                    (1, 2, 4, 8), special=[], rtol=1e-4, atol=1e-5)


# ---- indices as PyTorch reads them: negative, out of range, empty ----

def test_negative_and_out_of_range_indices_and_empty_parts():
    holds_for_draws(lambda x: torch.cat([x[-3:, -100:100].exp(), x[1:, ::3].exp(), x[1:, :0]], dim=-1), (4, 8))
    holds_for_draws(lambda x: x.select(1, -1).exp().sum() + x.select(0, -4) + x.sum(-2), (4, 8))
    holds_for_draws(lambda x: x.expand(3, -1, -1).exp() * x.unsqueeze(-3), (4, 8))


# ---- subgraph inputs that are negative views ----

def test_a_negative_view_input_is_read_with_its_sign():
    # (kiln read the storage of x._neg_view(), which holds x: the sign was lost)
    torch._dynamo.reset()
    fn = lambda x, y: torch.exp(x) * y  # noqa: E731
    compiled = torch.compile(fn, backend="kiln", dynamic=False)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        for a in (x._neg_view(), x, x._neg_view()):
            torch.testing.assert_close(compiled(a, y), fn(a, y))


def _compiled_with_report(fn):
    torch._dynamo.reset()
    report = kiln.torch.Report()
    kiln.torch._REPORTS.report = report
    return torch.compile(fn, backend="kiln", dynamic=False), report


def test_a_zero_dim_tensor_that_changes_every_call_is_an_input_not_a_constant():
    """A 0-dim f32 tensor of a CPU graph is a kiln input: a new value compiles nothing."""
    def fn(x, s):
        return torch.relu(x * s) + s
    c, report = _compiled_with_report(fn)
    try:
        x = draw((16, 32), 5, special=False)
        for v in range(10):
            s = torch.tensor(0.5 + v)
            torch.testing.assert_close(c(x, s), fn(x, s))
    finally:
        kiln.torch._REPORTS.report = None
        torch._dynamo.reset()
    assert len(report.subgraphs) == 1 and not report.left_to_pytorch, str(report)


def test_an_f64_number_is_a_constant_compiled_per_value_then_left_to_pytorch(monkeypatch):
    """A 0-dim f64 tensor (how dynamo passes a Python float under dynamic shapes) is a constant of
    the kiln graph, keyed by its value: MAX_VALUES values compiled, later ones run in PyTorch."""
    monkeypatch.setattr(kiln.torch.KilnSubgraph, "MAX_VALUES", 2)

    def fn(x, s):
        return torch.relu(x * s) + 1.0
    c, report = _compiled_with_report(fn)
    try:
        x = draw((16, 32), 6, special=False)
        for v in (0.5, 2.0, 0.5, 3.0, 4.0):
            s = torch.tensor(v, dtype=torch.float64)
            torch.testing.assert_close(c(x, s), fn(x, s))
    finally:
        kiln.torch._REPORTS.report = None
        torch._dynamo.reset()
    assert len(report.subgraphs) == 2, str(report)
    assert any("host values past the first 2" in e["reason"] for e in report.left_to_pytorch), str(report)
