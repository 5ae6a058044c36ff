"""Attention as model code writes it out (BERT's eager attention with its
extended padding mask, DistilBERT's masked_fill with a bool mask), through
torch.compile(backend="kiln") on CPU tensors: the values of eager PyTorch,
and kiln's plan has the sdpa the matmul -> softmax -> matmul chain becomes
(the attention_as_sdpa rewrite, compiler/attention_rewrite.h). These CPU
tensors are f32, which no flash kernel reads: the sdpa then runs as two
SIMT matmuls around one softmax (compiler/sdpa_as_matmuls.h)."""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kiln.torch  # noqa: E402  (registers the backend)

torch.manual_seed(0)


class Heads(nn.Module):
    def __init__(self, hidden=64, heads=4):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.h, self.d).permute(0, 2, 1, 3)

    def merge(self, x):
        b, _, s, _ = x.shape
        return x.permute(0, 2, 1, 3).contiguous().view(b, s, self.h * self.d)


class BertSelfAttention(Heads):
    """transformers' BertSelfAttention (eager): scores / sqrt(d) + the extended mask [B, 1, 1, S]."""

    def forward(self, x, attention_mask):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        extended = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        probs = F.softmax(scores + extended, dim=-1)
        return self.merge(torch.matmul(probs, v))


class DistilBertAttention(Heads):
    """transformers' DistilBERT MultiHeadSelfAttention: q scaled, masked_fill with (mask == 0)."""

    def forward(self, x, mask):
        b, s, _ = x.shape
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        q = q / math.sqrt(self.d)
        scores = torch.matmul(q, k.transpose(2, 3))
        masked = (mask == 0).view(b, 1, 1, s).expand_as(scores)
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
        weights = F.softmax(scores, dim=-1)
        return self.merge(torch.matmul(weights, v))


def padding_mask(b, s):
    mask = torch.ones(b, s)
    mask[1, s // 2:] = 0  # the second sequence is padded; every row keeps a key
    return mask


@pytest.mark.parametrize("module", [BertSelfAttention, DistilBertAttention], ids=["bert", "distilbert"])
def test_written_out_attention_matches_eager_through_its_sdpa(module):
    m = module().eval()
    x, mask = torch.randn(2, 16, 64), padding_mask(2, 16)
    with torch.no_grad():
        want = m(x, mask)
        torch._dynamo.reset()
        got = torch.compile(m, backend="kiln", dynamic=False)(x, mask)
        report = kiln.torch.explain(m, x, mask)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err <= 1e-5, err
    kinds = [kind for s in report.subgraphs for kind in s["kinds"]]
    # The three projections, q·kᵀ and p·v (f32: sdpa_as_matmuls), one softmax between them.
    assert kinds.count("matmul") == 5 and kinds.count("reduction") == 1, str(report)
