"""Graphs from Python: the builder against the JSON format, every op of the
catalogue, and the errors."""
import json

import numpy as np
import pytest

import kiln
from conftest import EXAMPLES, example_id


def rebuild(document):
    """The graph of a JSON document, built again through GraphBuilder's generated op methods."""
    b = kiln.GraphBuilder(document.get("name", ""))
    tensors = {}
    for name, spec in document["inputs"].items():
        tensors[name] = b.input(name, spec["shape"], spec["dtype"], spec.get("strides"))
    for op in document["ops"]:
        attrs = {k: v for k, v in op.items() if k not in ("op", "in", "out", "dtype")}
        operands = [tensors[x] if isinstance(x, str) else x for x in op["in"]]
        method = getattr(b, op["op"])
        hi = {o: h for o, _f, _l, h, _a in kiln.OP_TABLE}[op["op"]]
        args = (operands,) if hi > 8 else operands
        tensors[op["out"]] = method(*args, dtype=op.get("dtype"), name=op["out"], **attrs)
    for name in document["outputs"]:
        b.output(tensors[name])
    return b.build()


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_builder_and_json_give_the_same_hash(path):
    loaded = kiln.Graph.load(path)
    built = rebuild(json.loads(path.read_text()))
    assert built.hash == loaded.hash
    assert kiln.Graph.from_json(loaded.to_json()).hash == loaded.hash
    assert kiln.Graph.from_json(json.loads(path.read_text())).hash == loaded.hash


def test_hash_ignores_names():
    b = kiln.GraphBuilder("a")
    x = b.input("x", [4, 4], "f32")
    b.output(b.relu(x))
    c = kiln.GraphBuilder("b")
    y = c.input("other", [4, 4], "f32")
    c.output(c.relu(y), name="renamed")
    assert b.build().hash == c.build().hash


# One valid call of every op family, on a [2, 4, 6, 8] f32 tensor (x), so
# that every op of the table is reached through its generated method.
def call_every_op(b, op, family, lo, hi, attrs):
    x = b.input(f"x_{op}", [2, 4, 6, 8], "f32")
    method = getattr(b, op)
    if family in ("unary",):
        return method(x, dtype="bf16") if op == "cast" else method(x)
    if family in ("binary", "compare"):
        return method(x, 2.0)
    if family == "select":
        return method(b.gt(x, 0.0), x, 1.0)
    if family == "reduce":
        return method(x, axes=[1, 3], keepdims=True)
    if family == "norm":
        if op == "batch_norm":
            m = b.input(f"m_{op}", [8], "f32")
            v = b.input(f"v_{op}", [8], "f32")
            return method(x, m, v, eps=1e-3)
        if op == "group_norm":
            return method(x, groups=2)
        return method(x, axis=-1)
    if family == "matmul":
        w = b.input(f"w_{op}", [8, 3], "f32")
        return method(x, w, precision="tf32")
    if family == "conv":
        w = b.input(f"w_{op}", [5, 3, 3, 8], "f32")
        return method(x, w, padding=[1, 1])
    if family == "pool":
        return method(x, kernel=[2, 2])
    if family == "view":
        if op == "transpose":
            return method(x, perm=[0, 2, 1, 3])
        if op == "reshape":
            return method(x, shape=[2, -1])
        if op == "expand":
            return method(x, shape=[3, 2, 4, 6, 8])
        if op == "slice":
            return method(x, axis=1, start=1, end=3)
    if family == "attention":
        return method(x, x, x, causal=True)
    if family == "concat" or hi > 8:
        return method([x, x], axis=2)
    raise AssertionError(f"no test call for op '{op}' ({family}): add one")


def test_every_catalogue_op_is_reachable_from_the_builder():
    b = kiln.GraphBuilder("every_op")
    reached = []
    for op, family, lo, hi, attrs in kiln.OP_TABLE:
        assert callable(getattr(kiln.GraphBuilder, op)), op
        b.output(call_every_op(b, op, family, lo, hi, attrs))
        reached.append(op)
    g = b.build()
    assert len(reached) == len(kiln.OP_TABLE) and g.hash


def test_type_stub_lists_every_op():
    import pathlib
    stub = pathlib.Path(kiln.__file__).with_name("_graph.pyi").read_text()
    for op, *_ in kiln.OP_TABLE:
        assert f"    def {op}(self," in stub, op


def test_graph_properties():
    g = kiln.Graph.load(EXAMPLES[0])
    assert g.name and len(g.hash) == 32
    for spec in list(g.inputs.values()) + list(g.outputs.values()):
        assert isinstance(spec, kiln.TensorSpec) and len(spec.shape) == len(spec.strides)
        assert spec.dtype in ("f32", "f16", "bf16", "bool")


@pytest.mark.parametrize("build, says", [
    (lambda b: b.add(b.input("x", [4, 3], "f32"), b.input("y", [5], "f32")), "do not broadcast"),
    (lambda b: b.input("x", [4], "f8e4m3"), "dtype"),
    (lambda b: b.reduce_sum(b.input("x", [4], "f32"), axes=[3]), "axis"),
    (lambda b: b.relu(b.input("x", [4], "f32"), b.input("y", [4], "f32")), "2 inputs given, 1 expected"),
    (lambda b: b.relu(b.input("x", [4], "f32"), alpha=0.1), "unknown attribute 'alpha'"),
    (lambda b: b.op("addd", [b.input("x", [4], "f32")]), "unknown op 'addd'"),
    (lambda b: b.input("bad name", [4], "f32"), "name"),
    (lambda b: b.relu("x"), "not a kiln tensor or a number"),
])
def test_invalid_graphs_raise_graph_error_with_the_cli_message(build, says):
    with pytest.raises(kiln.GraphError) as error:
        build(kiln.GraphBuilder("bad"))
    assert says in str(error.value)
    assert isinstance(error.value, ValueError)


def test_loading_a_malformed_graph_raises_graph_error(tmp_path):
    path = tmp_path / "g.json"
    path.write_text('{"kiln": 1, "inputs": {"x": {"shape": [4], "dtype": "f32"}}, "ops": [{"op": "addd", "in": ["x"], "out": "y"}], "outputs": ["y"]}')
    with pytest.raises(kiln.GraphError, match="op 0 'y': unknown op 'addd'"):
        kiln.Graph.load(path)
    with pytest.raises(kiln.GraphError, match="cannot"):
        kiln.Graph.load(tmp_path / "missing.json")
    with pytest.raises(kiln.GraphError):
        kiln.Graph.from_json("{not json")


def test_outputs_are_named_and_checked():
    b = kiln.GraphBuilder("names")
    x = b.input("x", [4], "f32")
    y = b.relu(x)
    b.output(y, name="y")
    with pytest.raises(kiln.GraphError, match="output already"):
        b.output(kiln.Tensor(b, y.id, "y"))
    with pytest.raises(kiln.GraphError, match="graph input"):
        b.output(x, name="z")
    with pytest.raises(kiln.GraphError, match="taken"):
        b.output(b.exp(x), name="x")
    other = kiln.GraphBuilder("other")
    with pytest.raises(kiln.GraphError, match="not a tensor of this builder"):
        other.output(y)
    assert list(b.build().outputs) == ["y"]


# A handle the builder did not return (a made-up id, a name that disagrees
# with its id) is a GraphError: a made-up id crashed the process or read
# garbage natively, and a name that disagreed built another graph than the
# one checked.
@pytest.mark.parametrize("tid", [1048576, 1, 3, 1000, 2**40, -1, True, "0", None])  # (0 is x, 2 is y)
def test_a_handle_the_builder_did_not_return_is_a_graph_error(tid):
    b = kiln.GraphBuilder("g")
    x = b.input("x", [3], "f32")
    y = b.add(x, 1.0)  # natively, the constant 1.0 is a tensor no handle names
    forged = kiln.Tensor(b, tid, "x")
    with pytest.raises(kiln.GraphError, match=r"exp: operand 0: not a tensor of this builder \(id .* is none of"):
        b.exp(forged)
    with pytest.raises(kiln.GraphError, match="output: not a tensor of this builder"):
        b.output(forged)
    b.output(b.exp(y), name="z")  # the builder is unharmed
    assert b.build().outputs["z"].shape == (3,)


def test_the_builder_gives_each_tensors_inferred_shape():
    b = kiln.GraphBuilder("g")
    x = b.input("x", [4, 8], "f32")
    assert b.shape(b.op("slice", [x], {"axis": 1, "start": 2, "end": 100})) == (4, 6)  # (clamped to 8)
    assert b.shape(b.matmul(x, b.op("transpose", [x], {"perm": [1, 0]}))) == (4, 4)
    with pytest.raises(kiln.GraphError, match="shape: not a tensor of this builder"):
        b.shape(kiln.Tensor(b, 1000, "x"))


def test_a_handle_whose_name_disagrees_with_its_id_is_a_graph_error():
    b = kiln.GraphBuilder("g")
    x = b.input("x", [3], "f32")
    y = b.input("y", [3], "f32")
    with pytest.raises(kiln.GraphError, match=r"sub: operand 1: the handle names 'y' but its id 0 is 'x'"):
        b.sub(y, kiln.Tensor(b, x.id, "y"))
    with pytest.raises(kiln.GraphError, match="the handle names 'nope'"):
        b.output(kiln.Tensor(b, x.id, "nope"))
    other = kiln.GraphBuilder("other")
    theirs = other.input("x", [3], "f32")
    with pytest.raises(kiln.GraphError, match=r"add: operand 1: not a tensor of this builder \(a tensor of another builder\)"):
        b.add(x, theirs)
    # What is checked is what is built: y - x.
    b.output(b.sub(y, x), name="d")
    assert json.loads(b.to_json())["ops"] == [{"op": "sub", "in": ["y", "x"], "out": "d"}]


@pytest.mark.parametrize("operand", [0, 1, 2**40, -1, True, "x", 1.5j])
def test_the_native_builder_refuses_ids_it_did_not_return(operand):
    native = kiln._kiln.GraphBuilder("g")
    with pytest.raises(kiln.GraphError, match="exp: operand 0"):
        native.op("exp", [operand], {}, None, "y")
    x = native.input("x", [3], "f32", None)
    with pytest.raises(kiln.GraphError, match="operand 1"):
        native.op("add", [x, operand if operand != 0 else 5], {}, None, "y")


def test_shapes_take_numpy_integers_and_refuse_bools():
    np = pytest.importorskip("numpy")
    b = kiln.GraphBuilder("g")
    x = b.input("x", [np.int64(3), np.int32(4)], "f32", strides=(np.int64(4), np.uint8(1)))
    b.output(b.reshape(b.reduce_sum(x, axes=[np.int64(1)]), shape=[np.int64(3), 1]), name="y")
    g = b.build()
    assert g.inputs["x"].shape == (3, 4) and g.outputs["y"].shape == (3, 1)
    for bad in ([True, 4], [np.True_, 4], [3.0, 4], "34", 3):
        with pytest.raises(kiln.GraphError, match=r"input 'z': shape: .*(bool|float|str|int), not"):
            b.input("z", bad, "f32")
    with pytest.raises(kiln.GraphError, match=r"input 'z': strides: False is a bool"):
        b.input("z", [3], "f32", strides=[False])


@pytest.mark.parametrize("attrs, says", [
    (dict(axis=2**70), r"softmax: attribute 'axis': 1180591620717411303424 does not fit a 64-bit integer"),
    (dict(axis=-2**63 - 1), "does not fit a 64-bit integer"),
])
def test_an_attribute_too_large_for_int64_is_a_graph_error(attrs, says):
    b = kiln.GraphBuilder("g")
    x = b.input("x", [3], "f32")
    with pytest.raises(kiln.GraphError, match=says):
        b.softmax(x, **attrs)
    with pytest.raises(kiln.GraphError, match="reshape: attribute 'shape': .* does not fit a 64-bit integer"):
        b.reshape(x, shape=[2**64])
    with pytest.raises(kiln.GraphError, match="attribute name is a int"):
        b._native.op("softmax", [x.id], {1: 2}, None, "w")


# Symbolic dimensions (graph-format.md, "Symbolic dimensions"; python.md, b.dim).
def _symbolic_layer(b):
    B = b.dim("B", min=1, max=64)
    S = b.dim("S", multiple_of=8)
    x = b.input("x", [B, S, 64], "f32")
    w = b.input("w", [64, 256], "f32")
    h = b.matmul(x, w)
    r = b.reshape(h, shape=[B, S * 4, 64])
    b.output(b.softmax(r), name="y")
    b.output(b.slice(r, axis=1, start=-1), name="last")
    return b.build()


def test_builder_dims_give_the_json_graph():
    g = _symbolic_layer(kiln.GraphBuilder("layer"))
    doc = {"kiln": 1, "name": "layer",
           "dims": {"B": {"min": 1, "max": 64}, "S": {"min": 1, "max": 2**31 - 1, "multiple_of": 8}},
           "inputs": {"x": {"shape": ["B", "S", 64], "dtype": "f32"}, "w": {"shape": [64, 256], "dtype": "f32"}},
           "ops": [{"op": "matmul", "in": ["x", "w"], "out": "h"},
                   {"op": "reshape", "in": ["h"], "out": "r", "shape": ["B", "4*S", 64]},
                   {"op": "softmax", "in": ["r"], "out": "y"},
                   {"op": "slice", "in": ["r"], "out": "last", "axis": 1, "start": -1}],
           "outputs": ["y", "last"]}
    assert g.hash == kiln.Graph.from_json(doc).hash
    assert g.dims == {"B": (1, 64, 1), "S": (1, 2**31 - 1, 8)}
    assert '"shape":["B","S*4",64]' in g.to_json()
    assert kiln.Graph.from_json(g.to_json()).hash == g.hash


def test_specialize_and_sizes_from_shapes():
    g = _symbolic_layer(kiln.GraphBuilder("layer"))
    sized = g.specialize(B=2, S=16)
    assert sized.dims == {}
    assert sized.inputs["x"].shape == (2, 16, 64)
    assert sized.outputs["y"].shape == (2, 64, 64)
    assert g.dims_from_shapes([(3, 24, 64), (64, 256)]) == {"B": 3, "S": 24}
    with pytest.raises(kiln.BindingError, match=r"S = 12 is outside its range \(S in \[1, 2147483647\], a multiple of 8\)"):
        g.dims_from_shapes([(3, 12, 64), (64, 256)])
    with pytest.raises(kiln.GraphError, match=r"B = 65 is outside its range \(B in \[1, 64\]\)"):
        g.specialize(B=65, S=8)
    with pytest.raises(kiln.GraphError, match="symbol 'S' has no size"):
        g.specialize(B=2)


def test_dim_sums_and_unknown_symbols_are_graph_errors():
    b = kiln.GraphBuilder()
    B = b.dim("B", max=8)
    with pytest.raises(kiln.GraphError, match="a sum, difference or quotient of dimensions is not a dimension"):
        B + 1
    with pytest.raises(kiln.GraphError, match="dimension 'T' uses unknown symbol 'T' \\(declared: B\\)"):
        b.input("x", [B, "T"], "f32")
    b2 = kiln.GraphBuilder()
    b2.input("x", [4], "f32")
    with pytest.raises(kiln.GraphError, match="symbols are declared before the inputs"):
        b2.dim("B")


def test_compiling_a_symbolic_graph_one_compile_does_not_cover_asks_for_its_sizes():
    # A slice at a symbolic position (start=-1 of S*4 rows) is not one compile for every size yet:
    # the error says why and how to bind the sizes.
    g = _symbolic_layer(kiln.GraphBuilder("layer"))
    with pytest.raises(kiln.GraphError, match="one compile for every size does not cover it yet: 'last' slices at a "
                                              "symbolic position; bind its sizes first"):
        kiln.compile(g)


def _symbolic_norm(b):
    B = b.dim("B", min=1, max=64)
    S = b.dim("S", max=4096, multiple_of=8)
    x = b.input("x", [B, S, 768], "bf16")
    w = b.input("w", [768], "bf16")
    b.output(b.gelu(b.rms_norm(x, w)), name="y")
    return b.build()


def test_a_symbolic_norm_graph_compiles_once_and_sizes_its_outputs_from_the_inputs():
    g = _symbolic_norm(kiln.GraphBuilder("norm"))
    exe = kiln.compile(g, arch="sm_90")
    assert exe._native.output_shapes([[3, 24, 768], [768]]) == [(3, 24, 768)]
    assert exe._native.output_shapes([[64, 4096, 768], [768]]) == [(64, 4096, 768)]
    with pytest.raises(kiln.BindingError, match=r"B = 65 is outside its range \(B in \[1, 64\]\)"):
        exe._native.output_shapes([[65, 8, 768], [768]])
    with pytest.raises(kiln.BindingError, match=r"S = 12 is outside its range \(S in \[1, 4096\], a multiple of 8\)"):
        exe._native.output_shapes([[2, 12, 768], [768]])
    # On the CPU, the reference at the inputs' sizes, outputs shaped by them.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 768), dtype=np.float32)
    w = rng.standard_normal(768, dtype=np.float32)
    got = exe(x=x, w=w)
    assert got["y"].shape == (2, 16, 768)
    want = g.specialize(B=2, S=16)
    assert got["y"].tobytes() == kiln.compile(want, arch="sm_90")(x=x, w=w)["y"].tobytes()
    with pytest.raises(kiln.BindingError, match="S = 12 is outside its range"):
        exe(x=np.zeros((2, 12, 768), np.float32), w=w)
