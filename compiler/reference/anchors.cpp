// matmul and conv2d: f64 accumulation of products of the operands, each
// operand first rounded to the op's `precision` where its values are f32
// (numerics rule 5; f16/bf16-valued operands are exact in every precision).
#include <cmath>

#include "compiler/error.h"
#include "compiler/numerics.h"
#include "compiler/reference/evaluate.h"

namespace kiln::reference {
namespace {

std::vector<float> operand_at_precision(const ir::Graph& g, const ir::Op& op, size_t slot,
                                        const Value& v) {
  const ir::Tensor& t = g.operand(op, slot);
  if (t.value_dtype() != DType::f32 || op.attrs.precision == ir::Precision::f32) return v.data;
  std::vector<float> out(v.data.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const float x = v.data[i];
    switch (op.attrs.precision) {
      case ir::Precision::tf32: out[i] = round_to_tf32(x); break;
      case ir::Precision::bf16: out[i] = round_to_bf16(x); break;
      case ir::Precision::f16: out[i] = round_to_f16(x); break;
      case ir::Precision::f32: out[i] = x; break;
    }
  }
  return out;
}

// [N,C,H,W] <-> [N,H,W,C] style moves of axis 1 to the end and back.
std::vector<float> channels_last(const std::vector<float>& data, const Shape& s) {
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  std::vector<float> out(data.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        out[static_cast<size_t>((i * hw + p) * c + ch)] = data[static_cast<size_t>((i * c + ch) * hw + p)];
  return out;
}

std::vector<float> channels_first(const std::vector<float>& data, const Shape& nchw) {
  const int64_t n = nchw[0], c = nchw[1], hw = nchw[2] * nchw[3];
  std::vector<float> out(data.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        out[static_cast<size_t>((i * c + ch) * hw + p)] = data[static_cast<size_t>((i * hw + p) * c + ch)];
  return out;
}

}  // namespace

std::vector<float> eval_matmul(const ir::Graph& g, const ir::Op& op, const Shape& out_shape,
                               const Operands& in, const OpProgress& progress) {
  const std::vector<float> a = operand_at_precision(g, op, 0, *in[0]);
  const std::vector<float> b = operand_at_precision(g, op, 1, *in[1]);
  const Shape& as = in[0]->shape;
  const Shape& bs = in[1]->shape;
  const int64_t m = as[as.size() - 2], k = as[as.size() - 1], n = bs[bs.size() - 1];
  // Batch dimensions: walk the output's, with each operand's matrix stride.
  const Shape batch(out_shape.begin(), out_shape.end() - 2);
  auto matrix_strides = [&](const Shape& s, int64_t matrix) {
    Strides st = broadcast_strides(Shape(s.begin(), s.end() - 2), batch);
    for (int64_t& x : st) x *= matrix;
    return st;
  };
  std::vector<float> out(static_cast<size_t>(element_count(out_shape)));
  std::vector<double> row(static_cast<size_t>(n));
  for_each_index(batch, {matrix_strides(as, m * k), matrix_strides(bs, k * n)},
                 [&](int64_t batch_index, const std::vector<int64_t>& at) {
    const float* pa = a.data() + at[0];
    const float* pb = b.data() + at[1];
    float* po = out.data() + batch_index * m * n;
    for (int64_t i = 0; i < m; ++i) {
      progress.at(batch_index * m + i, element_count(batch) * m);
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double x = pa[i * k + kk];
        const float* brow = pb + kk * n;
        for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] += x * brow[j];
      }
      for (int64_t j = 0; j < n; ++j) po[i * n + j] = static_cast<float>(row[static_cast<size_t>(j)]);
    }
  });
  return out;
}

std::vector<float> eval_conv(const ir::Graph& g, const ir::Op& op, const Shape& out_shape,
                             const Operands& in, const OpProgress& progress) {
  const ir::Attributes& a = op.attrs;
  const bool nchw = a.layout == ir::Layout::NCHW;
  std::vector<float> x = operand_at_precision(g, op, 0, *in[0]);
  std::vector<float> w = operand_at_precision(g, op, 1, *in[1]);
  if (nchw) {  // compute in NHWC with weights [K,R,S,C/groups]
    x = channels_last(x, in[0]->shape);
    w = channels_last(w, in[1]->shape);
  }
  const Shape& xs = in[0]->shape;
  const Shape& ws = in[1]->shape;
  const int64_t n = xs[0], c = nchw ? xs[1] : xs[3], h = nchw ? xs[2] : xs[1], wd = nchw ? xs[3] : xs[2];
  const int64_t k = ws[0], cg = nchw ? ws[1] : ws[3], r = nchw ? ws[2] : ws[1], s = nchw ? ws[3] : ws[2];
  const int64_t p = nchw ? out_shape[2] : out_shape[1], q = nchw ? out_shape[3] : out_shape[2];
  const int64_t k_per_group = k / a.groups;
  std::vector<float> out(static_cast<size_t>(n * p * q * k));
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t pi = 0; pi < p; ++pi) {
      progress.at(ni * p + pi, n * p);
      for (int64_t qi = 0; qi < q; ++qi)
        for (int64_t ki = 0; ki < k; ++ki) {
          const int64_t c0 = (ki / k_per_group) * cg;
          double acc = 0;
          for (int64_t ri = 0; ri < r; ++ri) {
            const int64_t hi = pi * a.stride[0] - a.padding[0] + ri * a.dilation[0];
            if (hi < 0 || hi >= h) continue;
            for (int64_t si = 0; si < s; ++si) {
              const int64_t wi = qi * a.stride[1] - a.padding[1] + si * a.dilation[1];
              if (wi < 0 || wi >= wd) continue;
              const float* px = &x[static_cast<size_t>(((ni * h + hi) * wd + wi) * c + c0)];
              const float* pw = &w[static_cast<size_t>(((ki * r + ri) * s + si) * cg)];
              for (int64_t ci = 0; ci < cg; ++ci) acc += static_cast<double>(px[ci]) * pw[ci];
            }
          }
          out[static_cast<size_t>(((ni * p + pi) * q + qi) * k + ki)] = static_cast<float>(acc);
        }
    }
  return nchw ? channels_first(out, out_shape) : out;
}

std::vector<float> eval_pool(const ir::Op& op, const Shape& out_shape, const Operands& in) {
  const ir::Attributes& a = op.attrs;
  const bool nchw = a.layout == ir::Layout::NCHW;
  const bool is_max = op.kind == ir::OpKind::MaxPool2d;
  const Shape& xs = in[0]->shape;
  const std::vector<float> x = nchw ? channels_last(in[0]->data, xs) : in[0]->data;
  const int64_t n = xs[0], c = nchw ? xs[1] : xs[3], h = nchw ? xs[2] : xs[1], wd = nchw ? xs[3] : xs[2];
  const int64_t p = nchw ? out_shape[2] : out_shape[1], q = nchw ? out_shape[3] : out_shape[2];
  std::vector<float> out(static_cast<size_t>(n * p * q * c));
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t pi = 0; pi < p; ++pi)
      for (int64_t qi = 0; qi < q; ++qi)
        for (int64_t ci = 0; ci < c; ++ci) {
          double acc = is_max ? -INFINITY : 0.0;
          int64_t inside = 0;
          for (int64_t ri = 0; ri < a.kernel[0]; ++ri) {
            const int64_t hi = pi * a.stride[0] - a.padding[0] + ri;
            if (hi < 0 || hi >= h) continue;
            for (int64_t si = 0; si < a.kernel[1]; ++si) {
              const int64_t wi = qi * a.stride[1] - a.padding[1] + si;
              if (wi < 0 || wi >= wd) continue;
              const double v = x[static_cast<size_t>(((ni * h + hi) * wd + wi) * c + ci)];
              ++inside;
              if (is_max) acc = std::isnan(v) || std::isnan(acc) ? NAN : std::max(acc, v);
              else acc += v;
            }
          }
          if (!is_max) acc /= static_cast<double>(a.count_include_pad ? a.kernel[0] * a.kernel[1] : inside);
          out[static_cast<size_t>(((ni * p + pi) * q + qi) * c + ci)] = static_cast<float>(acc);
        }
  return nchw ? channels_first(out, out_shape) : out;
}

std::vector<float> eval_sdpa(const ir::Graph& g, const ir::Op& op, const Operands& in,
                             const OpProgress& progress) {
  const Value& q = *in[0];
  const Value& k = *in[1];
  const Value& v = *in[2];
  const Value* mask = in.size() > 3 ? in[3] : nullptr;
  const Value* mask2 = in.size() > 4 ? in[4] : nullptr;  // (attention_as_sdpa's: additive)
  const bool bool_mask = mask && g.operand(op, 3).dtype == DType::boolean;
  // Rule 6: probabilities are rounded to v's dtype when v holds f16/bf16 values.
  const DType p_dtype = g.operand(op, 2).value_dtype();
  // Scores the graph rounded, rounded where it did (a rewritten written-out attention).
  const DType rounded_to = op.attrs.scores_rounded_to;
  const uint8_t rounds = op.attrs.score_roundings;
  const int64_t b = q.shape[0], h = q.shape[1], sq = q.shape[2], d = q.shape[3];
  const int64_t hkv = k.shape[1], skv = k.shape[2], group = h / hkv;
  const Shape scores_shape{b, h, sq, skv};
  Strides mask_strides = mask ? broadcast_strides(mask->shape, scores_shape) : Strides(4, 0);
  Strides mask2_strides = mask2 ? broadcast_strides(mask2->shape, scores_shape) : Strides(4, 0);
  std::vector<float> out(q.data.size());
  std::vector<double> s(static_cast<size_t>(skv));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi) {
      const int64_t kv_head = hi / group;
      const float* kb = &k.data[static_cast<size_t>((bi * hkv + kv_head) * skv * d)];
      const float* vb = &v.data[static_cast<size_t>((bi * hkv + kv_head) * skv * d)];
      for (int64_t i = 0; i < sq; ++i) {
        progress.at((bi * h + hi) * sq + i, b * h * sq);
        const float* qi = &q.data[static_cast<size_t>(((bi * h + hi) * sq + i) * d)];
        double m = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          double score = 0;
          for (int64_t e = 0; e < d; ++e) score += static_cast<double>(qi[e]) * kb[j * d + e];
          if (rounds & ir::kRoundProduct) score = round_to(rounded_to, static_cast<float>(score));
          score *= op.attrs.scale;
          if (rounds & ir::kRoundScaled) score = round_to(rounded_to, static_cast<float>(score));
          if (mask) {
            const float mv = mask->data[static_cast<size_t>(bi * mask_strides[0] + hi * mask_strides[1] +
                                                            i * mask_strides[2] + j * mask_strides[3])];
            if (bool_mask) score = mv != 0 ? score : -INFINITY;
            else score += mv;
            if (rounds & ir::kRoundMasked) score = round_to(rounded_to, static_cast<float>(score));
          }
          if (mask2) {
            score += mask2->data[static_cast<size_t>(bi * mask2_strides[0] + hi * mask2_strides[1] + i * mask2_strides[2] +
                                                     j * mask2_strides[3])];
            if (rounds & ir::kRoundMasked2) score = round_to(rounded_to, static_cast<float>(score));
          }
          if (op.attrs.causal && j > i + skv - sq) score = -INFINITY;
          s[static_cast<size_t>(j)] = score;
          m = std::isnan(score) || std::isnan(m) ? NAN : std::max(m, score);
        }
        float* o = &out[static_cast<size_t>(((bi * h + hi) * sq + i) * d)];
        if (m == -INFINITY) {  // every key masked: zeros
          std::fill(o, o + d, 0.0f);
          continue;
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        std::vector<double> acc(static_cast<size_t>(d), 0.0);
        for (int64_t j = 0; j < skv; ++j) {
          const double p = round_to(p_dtype, static_cast<float>(s[static_cast<size_t>(j)] / sum));
          for (int64_t e = 0; e < d; ++e) acc[static_cast<size_t>(e)] += p * vb[j * d + e];
        }
        for (int64_t e = 0; e < d; ++e) o[e] = static_cast<float>(acc[static_cast<size_t>(e)]);
      }
    }
  return out;
}

}  // namespace kiln::reference
