"""A decoder's `generate` with a static KV cache through the backend (the
serving loop of bench/generate.py): greedy tokens equal eager's, the decode
step is compiled once and a prompt of a length seen before compiles nothing.
Tiny Llama on CPU tensors (the executables run the reference interpreter; the
compiles are real NVRTC compiles for the default arch)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import kiln.torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import generate as bench_generate  # noqa: E402
import zoo_models  # noqa: E402


def test_a_static_cache_generate_gives_eagers_tokens_and_compiles_the_decode_step_once():
    model, _ = zoo_models.instantiate(zoo_models.BY_NAME["llama"], tiny=True, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.config.vocab_size, (2, s), generator=g) for s in (11, 7, 9)]
    with torch.no_grad():
        want = [bench_generate.generate(model, p, 4) for p in prompts]
    eager_forward = model.forward
    torch._dynamo.reset()
    report = kiln.torch.Report()
    kiln.torch._REPORTS.report = report
    try:
        model.forward = torch.compile(eager_forward, backend="kiln")
        with torch.no_grad():
            assert torch.equal(bench_generate.generate(model, prompts[0], 4), want[0])
            compiles = len(report.subgraphs)
            assert compiles > 0
            # the same prompt length again: the prefill and every decode step are compiled already
            assert torch.equal(bench_generate.generate(model, prompts[0], 4), want[0])
            assert len(report.subgraphs) == compiles, report
            # a new prompt length recompiles the prefill only (dynamo's second size: symbolic)
            assert torch.equal(bench_generate.generate(model, prompts[1], 4), want[1])
            assert any(e.get("sizes", "").startswith("every size") for e in report.subgraphs[compiles:]), report
            # a third length compiles the layers alone: their attention reads the cache's first S
            # positions, a slice kiln converts at a probe S past the cache's 14 and clamps there,
            # which one graph would compute wrongly (the check of every converted shape says so).
            # The LM head reads the last position, x[:, -1:], a view PyTorch takes (a slice from
            # S - 1) and copies dense, so its subgraph has no symbol left and serves every length
            compiles = len(report.subgraphs)
            assert torch.equal(bench_generate.generate(model, prompts[2], 4), want[2])
            again = report.subgraphs[compiles:]
            assert len(again) == 2 and all("aten.slice.Tensor" in e.get("sizes", "") and "converted to shape"
                                           in e.get("sizes", "") for e in again), report
    finally:
        kiln.torch._REPORTS.report = None
        model.forward = eager_forward
        torch._dynamo.reset()
    # the cache update into the static cache (index_copy_) stays PyTorch's, and says so
    assert any(e["op"] == "aten.index_copy.default" for e in report.left_to_pytorch)
    assert any(e["op"] == "aten.slice.Tensor" and "counted from the end of a symbolic size" in e["reason"]
               for e in report.left_to_pytorch), report
