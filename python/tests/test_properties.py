"""Property-based tests of the Python boundary (hypothesis): random graphs
built through GraphBuilder against an independent NumPy evaluation, and
random arrays given to an executable, each either rejected with a
BindingError or run right."""
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kiln

# An independent evaluation of some of the catalogue's ops, in float64 and,
# op by op, in float32: kiln must be as near the float64 value as float32
# arithmetic itself gets (a row sum multiplied back in can grow a value to
# 1e3, and cos of it loses 1e-4 to f32 rounding alone: hypothesis found one).
UNARY = {
    "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "sin": np.sin, "cos": np.cos,
}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4)


@st.composite
def programs(draw):
    shape = draw(shapes)
    steps = draw(st.lists(st.tuples(st.sampled_from(sorted(UNARY) + sorted(BINARY)), st.integers(0, 10 ** 6),
                                    st.booleans()), min_size=1, max_size=8))
    return shape, steps


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2 ** 31 - 1))
@example(([1, 3], [("abs", 0, False), ("abs", 0, False), ("cos", 0, True), ("abs", 3, True), ("abs", 0, False),
                   ("abs", 0, False), ("abs", 704, True), ("cos", 7, False)]), 0)  # cos(1290): f32 is 3.7e-4 off
def test_random_graphs_match_an_independent_evaluation(program, seed):
    shape, steps = program
    rng = np.random.default_rng(seed)
    b = kiln.GraphBuilder("random")
    x = b.input("x", shape, "f32")
    values = {x.name: rng.standard_normal(shape).astype(np.float32)}
    handles = [x]
    reference = {x.name: values[x.name].astype(np.float64)}
    in_f32 = {x.name: values[x.name]}

    def both(name, f, *operands):  # the float64 and the float32 evaluation of one op
        reference[name] = f(*(reference[o] for o in operands))
        in_f32[name] = np.asarray(f(*(in_f32[o] for o in operands)), dtype=np.float32)

    for op, pick, use_reduce in steps:
        a = handles[pick % len(handles)]
        if op in UNARY:
            t = getattr(b, op)(a)
            both(t.name, UNARY[op], a.name)
        else:
            c = handles[(pick // 7) % len(handles)]
            t = getattr(b, op)(a, c)
            both(t.name, BINARY[op], a.name, c.name)
        if use_reduce and len(shape) > 1:  # a row sum read back by every element of its row
            r = b.reduce_sum(t, axes=[len(shape) - 1], keepdims=True)
            both(r.name, lambda v: v.sum(axis=-1, keepdims=True), t.name)
            scaled = b.mul(t, r)
            both(scaled.name, np.multiply, t.name, r.name)
            t = scaled
        handles.append(t)
    out = handles[-1]
    b.output(out, name="y")
    exe = kiln.compile(b.build(), arch="sm_90")
    got = exe(x=values["x"])["y"]
    want = reference[out.name]
    assert got.shape == want.shape
    scale = max(np.abs(want).max(), 1.0)
    f32_error = np.abs(in_f32[out.name] - want)
    with np.errstate(invalid="ignore"):
        far = ~(np.abs(got - want) <= 1e-4 * scale + 1e-4 * np.abs(want) + 4 * f32_error)
    far &= ~(np.isnan(got) & np.isnan(want))
    assert not far.any(), f"kiln {got[far][:4]}, float64 {want[far][:4]}, float32 {in_f32[out.name][far][:4]}"

DTYPES = [np.float32, np.float16, np.float64, np.int32, np.bool_]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=0, max_size=3), st.sampled_from(DTYPES), st.booleans(), st.booleans())
def test_random_arrays_are_rejected_or_run_right(shape, dtype, transpose, extra_input):
    b = kiln.GraphBuilder("bind")
    x = b.input("x", [3, 4], "f32")
    b.output(b.add(b.exp(x), 1.0), name="y")
    exe = kiln.compile(b.build(), arch="sm_90")
    a = np.ones(shape, dtype)
    if transpose and a.ndim >= 2:
        a = a.T
    inputs = {"x": a}
    if extra_input:
        inputs["z"] = a
    try:
        y = exe(**inputs)["y"]
    except kiln.BindingError as e:
        assert "'x'" in str(e) or "'z'" in str(e)
        return
    assert not extra_input and a.shape == (3, 4) and a.dtype == np.float32  # only a right binding runs
    np.testing.assert_allclose(y, np.exp(a.astype(np.float64)) + 1, rtol=1e-6)
