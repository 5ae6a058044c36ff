"""A decoder's `generate` with a static KV cache through the backend (the
serving loop of bench/generate.py): greedy tokens equal eager's, the decode
step is compiled once and a prompt of a length seen before compiles nothing;
a cache that grows is served by one compile of each phase.
Tiny Llama on CPU tensors (the executables run the reference interpreter; the
compiles are real NVRTC compiles for the default arch)."""
import contextlib
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import kiln.torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import generate as bench_generate  # noqa: E402
import zoo_models  # noqa: E402


@contextlib.contextmanager
def forward_through_kiln(model):
    """The model's forward compiled with the kiln backend for the block (dynamo reset before and
    after), and the block's Report."""
    eager_forward = model.forward
    torch._dynamo.reset()
    report = kiln.torch.Report()
    kiln.torch._REPORTS.report = report
    try:
        model.forward = torch.compile(eager_forward, backend="kiln")
        yield report
    finally:
        kiln.torch._REPORTS.report = None
        model.forward = eager_forward
        torch._dynamo.reset()


def test_a_static_cache_generate_gives_eagers_tokens_and_compiles_the_decode_step_once():
    model, _ = zoo_models.instantiate(zoo_models.BY_NAME["llama"], tiny=True, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (2, s), generator=g) for s in (11, 7, 9)]
    with torch.no_grad():
        want = [bench_generate.generate(model, p, 4) for p in prompts]
    with forward_through_kiln(model) as report, torch.no_grad():
        assert torch.equal(bench_generate.generate(model, prompts[0], 4), want[0])
        compiles = len(report.subgraphs)
        assert compiles > 0
        # the same prompt length again: the prefill and every decode step are compiled already
        assert torch.equal(bench_generate.generate(model, prompts[0], 4), want[0])
        assert len(report.subgraphs) == compiles, report
        # a new prompt length recompiles the prefill only (dynamo's second size: symbolic)
        assert torch.equal(bench_generate.generate(model, prompts[1], 4), want[1])
        assert any(e.get("sizes", "").startswith("every size") for e in report.subgraphs[compiles:]), report
        # a third length within the cache compiles nothing: the prefill's attention reads the
        # cache's first S positions, a slice PyTorch takes as a view (kiln's one graph takes no
        # slice at a symbolic position) and kiln reads through its strides; the LM head reads the
        # last position, x[:, -1:], a view PyTorch copies dense
        compiles = len(report.subgraphs)
        assert torch.equal(bench_generate.generate(model, prompts[2], 4), want[2])
        assert len(report.subgraphs) == compiles, report.subgraphs[compiles:]
    # the cache update into the static cache (index_copy_) stays PyTorch's, and says so
    assert any(e["op"] == "aten.index_copy.default" for e in report.left_to_pytorch)
    assert any(e["op"] == "aten.slice.Tensor" and "counted from the end of a symbolic size" in e["reason"]
               for e in report.left_to_pytorch), report
    assert any(e["op"] == "aten.slice.Tensor" and "at a symbolic size (s" in e["reason"] for e in report.left_to_pytorch)


def test_a_cache_that_grows_is_served_by_one_compile_per_phase():
    """bf16 (the decode step's attention on flash decoding): a prompt too long for the cache makes a
    new cache, whose length becomes a symbol in dynamo's next graphs: the prefill's (the cache made
    in the forward, torch.zeros(..., s98, ...): PyTorch's, its size a number no tensor kiln reads
    has; its first S positions a view) and the decode step's (k's and v's lengths two symbols, one
    length: tried as one). Each compiles once and serves every later length."""
    model, _ = zoo_models.instantiate(zoo_models.BY_NAME["llama"], tiny=True, device="cpu", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.config.vocab_size, (1, s), generator=g) for s in (11, 7, 20, 9, 23)]
    with forward_through_kiln(model) as report, torch.no_grad():
        for p in prompts[:3]:  # (a static prefill and decode step, then symbolic ones)
            assert bench_generate.generate(model, p, 3).shape == (1, p.shape[1] + 3)
        grown = [e for e in report.subgraphs if e.get("sizes", "static") != "static"]
        assert grown and all(e["sizes"].startswith("every size: one compile") for e in grown), grown
        assert any("attention" in e["kinds"] and "equal as traced" in e["sizes"] for e in grown), grown
        compiles = len(report.subgraphs)
        for p in prompts[3:]:  # a shorter prompt, and a longer one that grows the cache again
            assert bench_generate.generate(model, p, 3).shape == (1, p.shape[1] + 3)
        assert len(report.subgraphs) == compiles, report.subgraphs[compiles:]
    assert any("a number the graph is given that no tensor kiln reads has" in e["reason"] for e in report.left_to_pytorch)
