"""The backend under dynamo's dynamic shapes (python.md, "Shapes"): symbolic
kiln graphs compiled once where kiln's one compile serves them, a graph per
size (at most KilnSubgraph.MAX_SIZES) where it does not, PyTorch beyond;
results equal eager's at every size. CPU tensors: the executables run the
reference interpreter, the compiles are real NVRTC compiles for the default
arch."""
import pytest
import sympy

torch = pytest.importorskip("torch")
import kiln.torch  # noqa: E402
from kiln import _torch_sizes as sizes  # noqa: E402
from conftest import reporting  # noqa: E402


_LIVE: list = []  # the KilnSubgraph modules the test's compiles made


@pytest.fixture(autouse=True)
def _track_subgraphs(monkeypatch):
    original = kiln.torch.KilnSubgraph.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _LIVE.append(self)
    monkeypatch.setattr(kiln.torch.KilnSubgraph, "__init__", init)
    _LIVE.clear()
    yield
    _LIVE.clear()


def _subgraphs():
    return list(_LIVE)


class NormChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.nn.functional.gelu(self.norm(x) * 2 + 1)


class Attention(torch.nn.Module):
    """Projection, heads split by views, attention written out, residual."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.qkv = torch.nn.Linear(32, 96)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 4, 8).transpose(1, 2) for t in self.qkv(self.norm(x)).split(32, dim=-1))
        a = (q @ k.transpose(-1, -2) / 8 ** 0.5).softmax(-1) @ v
        return a.transpose(1, 2).reshape(b, s, 32) + x


SIZES = ((3, 7), (5, 11), (2, 13), (4, 9))


def run_sizes(model, compiled, shapes=SIZES, width=32):
    for b, s in shapes:
        x = torch.randn(b, s, width)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_a_chain_without_anchors_compiles_once_for_every_size():
    torch.manual_seed(0)
    m = NormChain()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True))
    assert len(report.subgraphs) == 1, report
    assert report.subgraphs[0]["sizes"] == "every size: one compile"
    assert not report.left_to_pytorch
    assert "sizes served: every size: one compile" in str(report)


def test_attention_written_out_compiles_once_for_every_size():
    # (f32: the SIMT matmuls over symbolic rows, the exact attention kernel over symbolic rows and keys)
    torch.manual_seed(0)
    m = Attention()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True))
    assert len(report.subgraphs) == 1, report
    assert report.subgraphs[0]["sizes"] == "every size: one compile", report
    # the size arithmetic between them (s0 * s1) is host integers, not an op left to PyTorch
    assert not report.left_to_pytorch, report


class CachedAttention(torch.nn.Module):
    """Causal attention of S queries over a cache's first S positions (a static cache's prefill)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.randn(16, 32))

    def forward(self, x):
        s = x.shape[0]
        kv = self.cache[:s].view(1, 1, s, 32)
        return torch.nn.functional.scaled_dot_product_attention(x.view(1, 1, s, 32), kv, kv, is_causal=True)


def test_a_slice_of_a_cache_to_a_symbolic_length_is_pytorchs_view_and_compiles_once():
    # The slice of the cache's 16 positions to S, converted at a probe S past 16, would clamp there
    # (one graph attending to all 16 positions at every S), and kiln's one graph takes no slice at a
    # symbolic position: PyTorch takes the view, which kiln reads through its (integer) strides, and
    # the attention compiles once for every S.
    torch.manual_seed(0)
    m = CachedAttention()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        for s in (3, 5, 7):
            x = torch.randn(s, 32)
            with torch.no_grad():
                torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert report.subgraphs and all(e["sizes"].startswith("every size") for e in report.subgraphs), report
    assert any(e["op"] == "aten.slice.Tensor" and "at a symbolic size" in e["reason"] for e in report.left_to_pytorch), report


class SequenceMean(torch.nn.Module):
    """A projection, then the mean over the sequence: a reduction over a symbolic extent."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.proj(x).mean(dim=1)


def test_a_graph_one_compile_does_not_cover_is_compiled_per_size_and_says_why():
    torch.manual_seed(0)
    m = SequenceMean()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True))
    assert len(report.subgraphs) == len(SIZES), report
    for entry in report.subgraphs:
        assert entry["sizes"].startswith("per size: ") and "a reduction over a symbolic extent" in entry["sizes"], entry
    shapes = sorted(tuple(shape[:2]) for e in report.subgraphs for shape in e["inputs"].values() if len(shape) == 3)
    assert shapes == sorted(SIZES)
    assert not report.left_to_pytorch, report


class Block(torch.nn.Module):
    """A transformer block in bf16: norm, fused QKV, attention (PyTorch's sdpa), output projection,
    residual, norm, MLP with GELU, residual."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = (t.view(b, s, self.heads, w // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).split(w, dim=-1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, w))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def test_a_bf16_transformer_block_compiles_once_for_every_size():
    """Matmuls and attention on the Hopper kernels (the default arch, sm_90) take symbolic rows,
    batches and sequences: one kiln compile serves every size."""
    torch.manual_seed(0)
    m = Block().to(torch.bfloat16)
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        for b, s in SIZES:
            x = torch.randn(b, s, 64, dtype=torch.bfloat16)
            with torch.no_grad():
                torch.testing.assert_close(c(x), m(x), rtol=3e-2, atol=3e-2)
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"], report
    assert sorted(set(report.subgraphs[0]["kinds"])) == ["attention", "matmul", "norm"]
    sub = next(s for s in _subgraphs() if s.graphs)
    assert [hi for _, hi, _ in sub.graphs[0].dims.values()] == [2**15, 2**15]  # (s0*s1 rows below 2^31)


def test_a_size_seen_again_compiles_nothing():
    torch.manual_seed(0)
    m = SequenceMean()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        run_sizes(m, c, SIZES + SIZES[:2])
    assert len(report.subgraphs) == len(SIZES)


def test_sizes_past_the_bound_run_in_pytorch(monkeypatch):
    torch.manual_seed(0)
    monkeypatch.setattr(kiln.torch.KilnSubgraph, "MAX_SIZES", 2)
    m = SequenceMean()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True))
    assert len(report.subgraphs) == 2
    reasons = {e["reason"] for e in report.left_to_pytorch}
    assert any("at most 2 sizes" in r for r in reasons), reasons


def test_mark_dynamic_makes_one_dimension_symbolic():
    torch.manual_seed(0)
    m = NormChain()
    with reporting() as report:
        c = torch.compile(m, backend="kiln")
        for b in (3, 6, 9):
            x = torch.randn(b, 5, 32)
            torch._dynamo.mark_dynamic(x, 0)
            with torch.no_grad():
                torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"]
    sub = next(s for s in _subgraphs() if s.symbolic)
    assert len(sub.graphs[0].dims) == 1


def test_a_second_size_without_dynamic_set_stays_in_kiln():
    """dynamo's automatic dynamic shapes: the first size compiles static, a second one recompiles
    with symbolic sizes; that graph runs in kiln too, not in PyTorch."""
    torch.manual_seed(0)
    m = NormChain()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln"), SIZES[:3])
    assert [e.get("sizes", "static") for e in report.subgraphs] == ["static", "every size: one compile"]
    assert not report.left_to_pytorch


def test_a_sum_of_sizes_is_compiled_per_size():
    """cat along a dynamic dimension gives s0 + s1: not a product, so no symbolic kiln graph."""
    def f(a, b):
        return torch.cat([a, b], dim=1).relu() * 2

    with reporting() as report:
        c = torch.compile(f, backend="kiln", dynamic=True)
        for s0, s1 in ((3, 4), (5, 2), (6, 7)):
            a, b = torch.randn(2, s0, 8), torch.randn(2, s1, 8)
            with torch.no_grad():
                torch.testing.assert_close(c(a, b), f(a, b))
    assert report.subgraphs and all(e["sizes"].startswith("per size") for e in report.subgraphs), report


def test_probe_factors_products_of_symbols_and_nothing_else():
    s0, s1 = sympy.Symbol("s0"), sympy.Symbol("s1")
    probe = sizes.Probe([s0, s1])
    p0, p1 = probe.primes
    assert probe.expression(p0 * p1 * 64, "x") == "s0*s1*64"
    assert probe.expression(p1 * p1, "x") == "s1*s1"
    assert probe.expression(768, "x") == 768
    doc = {"kiln": 1, "name": "g", "outputs": ["y"],
           "inputs": {"x": {"shape": [p0, 8], "dtype": "f32", "strides": [8, 1]}},
           "ops": [{"op": "reshape", "in": ["x"], "out": "y", "shape": [p0 * 8]}]}
    general = sizes.generalize(doc, probe)
    assert general["inputs"]["x"] == {"shape": ["s0", 8], "dtype": "f32"}  # (contiguous: no strides)
    assert general["ops"][0]["shape"] == ["s0*8"]
    strided = dict(doc, inputs={"x": {"shape": [p0, 8], "dtype": "f32", "strides": [16, 1]}})
    assert sizes.generalize(strided, probe)["inputs"]["x"]["strides"] == [16, 1]
    odd = dict(doc, inputs={"x": {"shape": [p0, 8], "dtype": "f32", "strides": [8 * p0, 1]}})
    with pytest.raises(sizes.NotAProduct, match="strides"):
        sizes.generalize(odd, probe)
    # A dimension of extent 1 reads index 0 alone: its stride, symbolic in PyTorch's view (a batch
    # of one sliced from a static cache), is the one its inner neighbour implies.
    batch_of_one = dict(doc, inputs={"x": {"shape": [1, p0, 8], "dtype": "f32", "strides": [8 * p1, 8, 1]}},
                        ops=[{"op": "reshape", "in": ["x"], "out": "y", "shape": [p0 * 8]}])
    assert sizes.generalize(batch_of_one, probe)["inputs"]["x"] == {"shape": [1, "s0", 8], "dtype": "f32"}
    sliced = dict(batch_of_one, inputs={"x": {"shape": [1, 4, p0], "dtype": "f32", "strides": [4 * p1, p1, 1]}})
    with pytest.raises(sizes.NotAProduct, match="strides"):  # (the inner strides are symbolic: refused as before)
        sizes.generalize(sliced, probe)
    narrow = dict(batch_of_one, inputs={"x": {"shape": [1, 4, 8], "dtype": "f32", "strides": [64 * p1, 16, 1]}})
    assert sizes.generalize(narrow, probe)["inputs"]["x"]["strides"] == [64, 16, 1]
    pooled = dict(doc, ops=[{"op": "avg_pool2d", "in": ["x"], "out": "y", "kernel": [p0, 1]}])
    with pytest.raises(sizes.NotAProduct, match="kernel"):
        sizes.generalize(pooled, probe)


def test_dims_take_dynamos_range_and_stay_below_the_element_limit():
    torch.manual_seed(0)
    m = NormChain()
    with reporting():
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True), SIZES[:2])
    sub = next(s for s in _subgraphs() if s.symbolic)
    dims = sub.graphs[0].dims
    assert len(dims) == 2
    for lo, hi, multiple in dims.values():
        # dynamo's [2, oo), capped where [s0, s1, 32] stays below 2^62 elements (2^31 - 1 would not);
        # a graph that writes s0*s1 as a dimension is capped where that stays below 2^31 (2^15)
        assert lo == 2 and hi == 2**24 and multiple == 1


class RMSNormWithFloats(torch.nn.Module):
    """Llama's RMS norm and a rotary-like scaling, with Python floats in tensor arithmetic:
    under dynamic shapes dynamo passes each as an f64 CPU tensor instead of specialising it."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(32))
        self.eps = 1e-6
        self.scaling = 0.75

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype) * self.scaling


def test_python_floats_passed_as_tensors_are_constants_of_one_compile():
    m = RMSNormWithFloats()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        run_sizes(m, c)
        graph = _subgraphs()[0].graphs[0]
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"], report
    assert not report.left_to_pytorch, report  # (the floats' conversions too)
    assert all(spec.dtype == "f32" and len(spec.shape) for spec in graph.inputs.values()), graph.inputs


def test_a_new_value_of_a_float_compiles_a_graph_of_its_own(monkeypatch):
    monkeypatch.setattr(kiln.torch.KilnSubgraph, "MAX_VALUES", 2)
    m = RMSNormWithFloats()
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        run_sizes(m, c, SIZES[:2])
        for eps in (1e-2, 0.5):  # (dynamo does not guard an unspecialised float: the same frame runs)
            m.eps = eps
            run_sizes(m, c, SIZES[:2])
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"] * 2, report
    reasons = {e["reason"] for e in report.left_to_pytorch}
    assert any("host values past the first 2" in r for r in reasons), reasons


class SmallCnn(torch.nn.Module):
    """A stem conv (3 channels, stride 2), batch norm and ReLU, a max pool, a depthwise conv with
    ReLU6, a grouped conv, a 1x1 conv with a residual, a 1x1 expansion, global average pooling (of 64
    channels: a column reduction) and a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.grouped = torch.nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.pointwise = torch.nn.Conv2d(16, 16, 1)
        self.expand = torch.nn.Conv2d(16, 64, 1)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, stride=2, padding=1)
        y = torch.nn.functional.relu6(self.depthwise(x))
        y = self.expand(self.pointwise(torch.relu(self.grouped(y))) + x)
        return self.head(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


def test_a_cnn_over_a_dynamic_batch_compiles_once():
    """Convolutions (dense, stem, depthwise, grouped, 1x1), pools and the classifier over a
    symbolic batch: one compile serves every batch size (spatial sizes stay integers)."""
    torch.manual_seed(0)
    m = SmallCnn().eval()
    with torch.no_grad():  # statistics a trained model would have
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    with reporting() as report:
        c = torch.compile(m, backend="kiln")
        for b in (3, 5, 8):  # (a batch of 1 dynamo specializes: a graph of its own)
            x = torch.randn(b, 3, 32, 32)
            torch._dynamo.mark_dynamic(x, 0)
            with torch.no_grad():
                torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    assert [e["sizes"] for e in report.subgraphs] == ["every size: one compile"], report
    sub = next(s for s in _subgraphs() if s.symbolic)
    assert len(sub.graphs) == 1 and len(sub.graphs[0].dims) == 1



@pytest.mark.parametrize("largest, once", [(2**24, False), (2**20, True)])
def test_a_kernels_block_limit_at_the_largest_sizes_is_met_by_a_narrower_range(largest, once):
    """Global average pooling of 64 channels over a symbolic batch: a column reduction, a block per
    image launched by a grid rule (at most 2^20 blocks). Over a range past that, the reason says so
    in words the backend takes for a range limit (it then declares a narrower range, as for the
    2^31-tile limits); within it, one compile."""
    from kiln import Graph
    from kiln._kiln import per_size_reason
    g = Graph.from_json({"kiln": 1, "dims": {"B": {"min": 1, "max": largest}},
                         "inputs": {"x": {"shape": ["B", 2, 2, 64], "dtype": "bf16"}},
                         "ops": [{"op": "reduce_mean", "in": ["x"], "out": "y", "axes": [1, 2]}], "outputs": ["y"]})
    why, range_limit = per_size_reason(g._native)
    if once:
        assert why == "" and not range_limit
    else:
        assert "more than 2^20 column blocks at the largest sizes" in why and range_limit, why


@pytest.mark.parametrize("largest, once", [(2**20, False), (2**16, True)])
def test_conv_rows_past_2_31_at_the_largest_sizes_are_met_by_a_narrower_range(largest, once):
    """A 3x3 conv over [B, 56, 56, 64]: its rows, B * 3136, pass 2^31 at B = 2^20, where the Hopper
    kernel (32-bit rows) cannot take it. That is a limit of the range the backend narrows (ResNet-50
    with its batch dynamic then keeps its convs on the Hopper kernel at every size), not a fall to
    mma.sync for every size (H200: 2.73 ms at B32 against 1.77 compiled for B32)."""
    from kiln import Graph
    from kiln._kiln import per_size_reason
    g = Graph.from_json({"kiln": 1, "dims": {"B": {"min": 1, "max": largest}},
                         "inputs": {"x": {"shape": ["B", 56, 56, 64], "dtype": "bf16"},
                                    "w": {"shape": [64, 3, 3, 64], "dtype": "bf16"}},
                         "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y", "padding": [1, 1]}], "outputs": ["y"]})
    why, range_limit = per_size_reason(g._native)
    if once:
        assert why == "" and not range_limit
    else:
        assert "conv rows reach 3288334336 (2^31 or more) at the largest sizes" in why and range_limit, why


@pytest.mark.parametrize("last", [lambda h: h[:, -1:], lambda h: h[:, -1], lambda h: h[:, -2:]],
                         ids=["slice from S - 1", "select S - 1", "slice from S - 2"])
def test_a_position_counted_from_the_end_of_a_symbolic_axis_is_pytorchs_view(last):
    """x[:, -1:] of [B, S, H] starts at S - 1, a sum kiln's dim expressions do not spell: PyTorch
    takes the view (no copy) and the subgraph reading it, given the view copied dense when its
    strides are symbolic, is compiled once for every S (a prefill's LM head). Values equal eager's."""
    torch.manual_seed(0)
    w = torch.randn(16, 8)

    def fn(x):
        return last(torch.relu(x * 2)) @ w
    with reporting() as report:
        c = torch.compile(fn, backend="kiln")
        for s in (5, 9, 13, 6):
            x = torch.randn(2, s, 16)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=1e-4)
    assert all(e["sizes"] == "every size: one compile" for e in report.subgraphs), report
    assert len(report.subgraphs) == 2, report
    assert any("counted from the end of a symbolic size" in e["reason"] for e in report.left_to_pytorch), report


def test_a_slice_to_a_position_counted_from_the_end_is_compiled_per_size():
    """x[:, :-1] of [B, S, H] has S - 1 rows, a sum: kiln compiles the subgraph taking it per size,
    and says why; values equal eager's at each size."""
    torch.manual_seed(0)
    w = torch.randn(16, 8)

    def fn(x):
        return torch.relu(x * 2)[:, :-1] @ w
    with reporting() as report:
        c = torch.compile(fn, backend="kiln")
        for s in (5, 9, 13):
            x = torch.randn(2, s, 16)
            torch._dynamo.mark_dynamic(x, 1)
            torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=1e-4)
    # (the subgraph reading the S - 1 rows finds S from them: before, "no value for s27", an internal error)
    assert report.subgraphs and all(e["sizes"].startswith("per size") for e in report.subgraphs), report
    assert any("a sum or difference of dimensions" in e["sizes"] for e in report.subgraphs), report


def test_a_reason_no_range_avoids_is_no_range_limit():
    """per_size_reason says whether a narrower range would serve the graph in one compile: a slice at
    a symbolic position needs a sum at every size, so the backend does not try narrower ranges."""
    from kiln import Graph
    from kiln._kiln import per_size_reason
    g = Graph.from_json({"kiln": 1, "dims": {"S": {"min": 2, "max": 4096}},
                         "inputs": {"x": {"shape": [2, "S", 64], "dtype": "f32"}},
                         "ops": [{"op": "slice", "in": ["x"], "out": "last", "axis": 1, "start": -1},
                                 {"op": "exp", "in": ["last"], "out": "y"}], "outputs": ["y"]})
    why, range_limit = per_size_reason(g._native)
    assert "slices at a symbolic position" in why and not range_limit, why


class Positions(torch.nn.Module):
    """A decoder's positions: arange over the sequence, offset and cast, read by kiln's ops; and,
    with `returned`, the positions themselves returned (a caller may write to them)."""

    def __init__(self, returned=False):
        super().__init__()
        self.returned = returned
        self.scale = torch.nn.Parameter(torch.randn(32))

    def forward(self, x):
        positions = (torch.arange(x.shape[1], device=x.device) + 3).float()[None, :, None]
        y = torch.sin(x * self.scale + positions)
        return (y, positions) if self.returned else y


def _memoized(monkeypatch):
    """The PerSizeValues modules of the graphs compiled from here on."""
    from kiln._torch_per_size import PerSizeValues
    made = []
    original = PerSizeValues.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(PerSizeValues, "__init__", init)
    return made


def test_values_of_the_sizes_alone_are_computed_once_per_size(monkeypatch):
    torch.manual_seed(0)
    made = _memoized(monkeypatch)
    m = Positions()
    with reporting() as report:
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True), SIZES + SIZES[:2])
    assert report.subgraphs[0]["sizes"] == "every size: one compile", report
    once = [e for e in report.left_to_pytorch if "computed once per size" in e["reason"]]
    assert {e["op"] for e in once} >= {"aten.arange.default"}, report
    # one kept value (the positions kiln reads), one entry for each sequence length seen
    assert len(made) == 1
    assert sorted(k for k, in made[0]._kept) == sorted(s for _, s in SIZES)
    # the same length gives the same tensor, computed by PyTorch's own ops
    a, b = made[0](11), made[0](11)
    assert a is b
    torch.testing.assert_close(a.flatten(), (torch.arange(11) + 3).float(), rtol=0, atol=0)


def test_a_value_of_the_sizes_alone_that_is_returned_is_computed_on_every_call(monkeypatch):
    # The caller owns what the forward returns and may write to it: never a kept tensor
    torch.manual_seed(0)
    made = _memoized(monkeypatch)
    m = Positions(returned=True)
    with reporting() as report:
        c = torch.compile(m, backend="kiln", dynamic=True)
        x = torch.randn(2, 7, 32)
        with torch.no_grad():
            y, positions = c(x)
            positions.fill_(-1)
            y2, positions2 = c(x)
    # the cast the positions are a view of is computed on each call; the int64 sum before it is kept
    reasons = {e["op"]: e["reason"] for e in report.left_to_pytorch}
    assert "computed once per size" not in reasons["aten._to_copy.default"], report
    assert "computed once per size" in reasons["aten.add.Tensor"], report
    kept = [v for module in made for v in module._kept.values()]
    assert kept and all(v.untyped_storage().data_ptr() != positions2.untyped_storage().data_ptr() for v in kept)
    torch.testing.assert_close(positions2, (torch.arange(7) + 3).float()[None, :, None], rtol=0, atol=0)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_kept_sizes_are_bounded_least_recently_used_first_out(monkeypatch):
    from kiln import _torch_per_size as per_size
    monkeypatch.setattr(per_size, "SIZES_KEPT", 2)
    made = _memoized(monkeypatch)
    m = Positions()
    with reporting():
        run_sizes(m, torch.compile(m, backend="kiln", dynamic=True), ((2, 7), (2, 9), (2, 7), (2, 11)))
    assert sorted(k for k, in made[0]._kept) == [7, 11]
    # and bytes: a value past VALUES_AT_MOST is computed on every call, never kept
    monkeypatch.setattr(per_size, "VALUES_AT_MOST", 16)
    assert made[0](13) is not made[0](13)
    assert 13 not in {k for k, in made[0]._kept}


def test_symbols_traced_equal_are_tried_as_one_where_apart_they_make_no_graph():
    # a static cache's keys and values: two tensors, two dynamo symbols for their one length, which
    # sdpa needs equal; apart, kiln's graph would refuse v's shape (bf16: the flash kernel, which
    # takes a symbolic key length)
    torch.manual_seed(0)
    def fn(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q * 2, k, v) + 1
    with reporting() as report:
        c = torch.compile(fn, backend="kiln")
        for s in (70, 110, 131):
            q, k, v = (torch.randn(1, 2, n, 64, dtype=torch.bfloat16) for n in (64, s, s))
            torch._dynamo.mark_dynamic(k, 2)
            torch._dynamo.mark_dynamic(v, 2)
            with torch.no_grad():
                torch.testing.assert_close(c(q, k, v), fn(q, k, v), rtol=3e-2, atol=3e-2)
    sized = [e["sizes"] for e in report.subgraphs]
    assert len(sized) == 1 and sized[0].startswith("every size: one compile (") and "equal as traced" in sized[0], report
    sub = next(s for s in _subgraphs() if s.symbolic)
    assert len(sub.graphs[0].dims) == 1


def test_symbols_taken_as_one_that_differ_at_a_call_compile_those_sizes_apart():
    # x and y concatenated: apart, s0 + s1 is a sum (no one graph); traced equal, the one graph takes
    # 2 * s0 rows, right only while they stay equal: a call where they differ compiles per size
    def fn(x, y):
        return torch.cat([x * 2, y + 1]).relu()
    with reporting() as report:
        c = torch.compile(fn, backend="kiln")
        for m, n in ((7, 7), (9, 9), (5, 8)):
            x, y = torch.randn(m, 16), torch.randn(n, 16)
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(y, 0)
            with torch.no_grad():
                torch.testing.assert_close(c(x, y), fn(x, y), rtol=0, atol=0)
    sized = [e["sizes"] for e in report.subgraphs]
    assert len(sized) == 2 and "equal as traced" in sized[0], report
    assert sized[1].startswith("per size: the one graph's symbols traced equal differ here"), report


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gpt2"])
def test_a_zoo_decoder_compiles_once_over_ten_sequence_lengths(name):
    """#49's serving case without a cache: a decoder of the zoo (tiny config, f32) with
    dynamic=True over ten prompt lengths: each graph dynamo makes is one kiln subgraph, compiled
    once (its one graph serves every length; Mistral's sliding window of 8 makes dynamo trace
    lengths up to 8 and past it apart, and once more where its guards ask), and each length's
    logits equal eager's."""
    pytest.importorskip("transformers")
    import os
    import sys
    from torch._dynamo.utils import counters
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    import zoo_models
    spec = zoo_models.BY_NAME[name]
    model, _ = zoo_models.instantiate(spec, tiny=True, device="cpu", dtype=torch.float32)
    torch._dynamo.reset()
    counters.clear()
    with reporting() as report:
        compiled = torch.compile(model, backend="kiln", dynamic=True)
        for s in (5, 9, 2, 17, 12, 30, 7, 23, 3, 16):
            ids, = spec.inputs(model, 2, s, "cpu", torch.float32).values()
            with torch.no_grad():
                torch.testing.assert_close(spec.output(compiled(input_ids=ids)), spec.output(model(input_ids=ids)),
                                           rtol=1e-4, atol=1e-4)
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert 0 < len(report.subgraphs) == graphs <= 3, (graphs, report.subgraphs)
    assert all(e["sizes"].startswith("every size: one compile") for e in report.subgraphs), report.subgraphs
