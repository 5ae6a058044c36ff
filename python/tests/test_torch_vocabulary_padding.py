"""A vocabulary's projection whose width is no multiple of 8 (GPT-2's 50257)
through torch.compile(backend="kiln") on CPU tensors: the backend pads the
weight's rows to a multiple of 8, kiln computes the padded product, and the
logits come back as a view of its first N columns (kiln.torch,
_pad_vocabulary_products), as Inductor's pad_mm returns them. The values
equal those of the same graph unpadded exactly (the same products summed in
the same order) and eager's within bf16's tolerance; the rows are N + pad
elements apart, also where batch and sequence sizes are symbolic (dynamic=True).
Products it must not touch: widths that are multiples of 8, narrow ones, f32,
and logits that another op reads."""
import pytest

torch = pytest.importorskip("torch")

import kiln.torch  # noqa: E402  (registers the backend)

WIDTH = 16391  # at least kiln.torch._VOCABULARY_COLUMNS, 7 short of a multiple of 8


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


class Head(torch.nn.Module):
    """A final norm and an LM head tied to the embedding (GPT-2's), then `after` of the logits."""

    def __init__(self, width=WIDTH, depth=64, after=None):
        super().__init__()
        self.embedding = torch.nn.Embedding(width, depth)
        self.norm = torch.nn.LayerNorm(depth)
        self.head = torch.nn.Linear(depth, width, bias=False)
        self.head.weight = self.embedding.weight
        self.after = after

    def forward(self, ids):
        logits = self.head(self.norm(self.embedding(ids)))
        return self.after(logits) if self.after else logits


def compiled(model, ids, padding=True, monkeypatch=None):
    torch._dynamo.reset()
    if not padding:
        monkeypatch.setattr(kiln.torch, "_pad_vocabulary_products", lambda gm: None)
    with torch.no_grad():
        return torch.compile(model, backend="kiln", dynamic=False)(ids)


def padded_slices(report):
    return [e for e in report.left_to_pytorch if "vocabulary's projection padded" in e["reason"]]


def test_logits_are_a_view_of_the_padded_product_with_the_unpadded_values(monkeypatch):
    model = Head().to(torch.bfloat16).eval()
    ids = torch.randint(0, WIDTH, (2, 12))
    got = compiled(model, ids)
    assert got.shape == (2, 12, WIDTH) and got.dtype == torch.bfloat16
    assert got.stride() == (12 * (WIDTH + 1), WIDTH + 1, 1)  # rows of WIDTH + 1 elements: a view
    with torch.no_grad():
        torch.testing.assert_close(got, model(ids), rtol=2e-2, atol=2e-2)
        report = kiln.torch.explain(model, ids)
    (entry,) = padded_slices(report)
    assert entry["op"] == "aten.slice.Tensor" and f"the first {WIDTH} of {WIDTH + 1} columns" in entry["reason"]
    unpadded = compiled(model, ids, padding=False, monkeypatch=monkeypatch)
    assert unpadded.is_contiguous()
    assert torch.equal(got, unpadded)


def test_f16_weight_not_transposed_is_padded_along_its_columns(monkeypatch):
    # B stored [K, N] (no transpose to undo): its columns padded
    weight = torch.randn(64, WIDTH, dtype=torch.float16)

    def project(h):
        return torch.mm(h, weight)

    h = torch.randn(10, 64, dtype=torch.float16)
    got = compiled(project, h)
    assert got.stride() == (WIDTH + 1, 1)
    unpadded = compiled(project, h, padding=False, monkeypatch=monkeypatch)
    assert torch.equal(got, unpadded)


@pytest.mark.parametrize("case", ["multiple of 8", "narrow", "f32", "logits read by softmax"])
def test_products_left_as_they_are(case):
    width, dtype, after = WIDTH, torch.bfloat16, None
    if case == "multiple of 8":
        width = WIDTH + 1
    elif case == "narrow":
        width = 4001
    elif case == "f32":
        dtype = torch.float32
    else:
        after = lambda logits: torch.softmax(logits.float(), dim=-1)  # noqa: E731  (a kiln op reads the logits)
    model = Head(width=width, after=after).to(dtype).eval()
    ids = torch.randint(0, width, (2, 6))
    got = compiled(model, ids)
    assert got.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(got, model(ids), rtol=2e-2, atol=2e-2)
        assert not padded_slices(kiln.torch.explain(model, ids))


def test_dynamic_batch_and_sequence_sizes_are_padded_too(monkeypatch):
    # dynamic=True: M (batch x sequence) is symbolic, K and N are not
    model = Head().to(torch.bfloat16).eval()
    torch._dynamo.reset()
    compiled_model = torch.compile(model, backend="kiln", dynamic=True)
    with torch.no_grad():
        for batch, seq in ((2, 12), (3, 5)):
            ids = torch.randint(0, WIDTH, (batch, seq))
            got = compiled_model(ids)
            assert got.shape == (batch, seq, WIDTH) and got.stride() == (seq * (WIDTH + 1), WIDTH + 1, 1)
            torch.testing.assert_close(got, model(ids), rtol=2e-2, atol=2e-2)
