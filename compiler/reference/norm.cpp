#include <cmath>

#include "compiler/error.h"
#include "compiler/reference/evaluate.h"

namespace kiln::reference {
namespace {

using ir::OpKind;

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// softmax / log_softmax along `axis`: element j of line (outer, inner) sits at
// (outer * n + j) * inner + inner_index.
std::vector<float> softmax(const Value& x, size_t axis, bool log) {
  const int64_t outer = product(x.shape, 0, axis), n = x.shape[axis],
                inner = product(x.shape, axis + 1, x.shape.size());
  std::vector<float> out(x.data.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return static_cast<size_t>((o * n + j) * inner + i); };
      double m = -INFINITY;  // NaN anywhere in the line makes the whole line NaN
      for (int64_t j = 0; j < n; ++j) {
        const double v = x.data[at(j)];
        m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, v);
      }
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) sum += std::exp(x.data[at(j)] - m);
      for (int64_t j = 0; j < n; ++j) {
        const double shifted = x.data[at(j)] - m;
        out[at(j)] = static_cast<float>(log ? shifted - std::log(sum) : std::exp(shifted) / sum);
      }
    }
  return out;
}

// layer_norm / rms_norm over dimensions axis..rank-1.
std::vector<float> row_norm(const ir::Op& op, const Operands& in, bool rms) {
  const Value& x = *in[0];
  const int64_t rows = product(x.shape, 0, static_cast<size_t>(op.attrs.axis));
  const int64_t n = product(x.shape, static_cast<size_t>(op.attrs.axis), x.shape.size());
  const Value* weight = in.size() > 1 ? in[1] : nullptr;
  const Value* bias = in.size() > 2 ? in[2] : nullptr;
  std::vector<float> out(x.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &x.data[static_cast<size_t>(r * n)];
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < n; ++j) mean += row[j];
      mean /= static_cast<double>(n);
    }
    for (int64_t j = 0; j < n; ++j) var += (row[j] - mean) * (row[j] - mean);
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + op.attrs.eps);
    for (int64_t j = 0; j < n; ++j) {
      double y = (row[j] - mean) * inv;
      if (weight) y *= weight->data[static_cast<size_t>(j)];
      if (bias) y += bias->data[static_cast<size_t>(j)];
      out[static_cast<size_t>(r * n + j)] = static_cast<float>(y);
    }
  }
  return out;
}

std::vector<float> batch_norm(const ir::Op& op, const Operands& in) {
  const Value& x = *in[0];
  const size_t axis = static_cast<size_t>(op.attrs.axis);
  const int64_t channels = x.shape[axis], inner = product(x.shape, axis + 1, x.shape.size());
  std::vector<float> out(x.data.size());
  for (size_t i = 0; i < x.data.size(); ++i) {
    const size_t c = static_cast<size_t>((static_cast<int64_t>(i) / inner) % channels);
    double y = (x.data[i] - static_cast<double>(in[1]->data[c])) / std::sqrt(static_cast<double>(in[2]->data[c]) + op.attrs.eps);
    if (in.size() > 3) y *= in[3]->data[c];
    if (in.size() > 4) y += in[4]->data[c];
    out[i] = static_cast<float>(y);
  }
  return out;
}

// Statistics per (sample, group) over every other non-channel dimension and
// the group's channels.
std::vector<float> group_norm(const ir::Op& op, const Operands& in) {
  const Value& x = *in[0];
  const size_t axis = static_cast<size_t>(op.attrs.axis);
  const int64_t samples = x.shape[0], channels = x.shape[axis], groups = op.attrs.groups;
  const int64_t per_sample = static_cast<int64_t>(x.data.size()) / samples;
  const int64_t inner = product(x.shape, axis + 1, x.shape.size());
  const int64_t per_group = channels / groups;
  auto group_of = [&](int64_t i) { return ((i / inner) % channels) / per_group; };
  std::vector<double> sum(static_cast<size_t>(samples * groups), 0.0), sq(sum.size(), 0.0);
  const double count = static_cast<double>(per_sample / groups);
  for (int64_t i = 0; i < static_cast<int64_t>(x.data.size()); ++i)
    sum[static_cast<size_t>((i / per_sample) * groups + group_of(i))] += x.data[static_cast<size_t>(i)];
  for (double& s : sum) s /= count;  // now the mean
  for (int64_t i = 0; i < static_cast<int64_t>(x.data.size()); ++i) {
    const size_t g = static_cast<size_t>((i / per_sample) * groups + group_of(i));
    const double d = x.data[static_cast<size_t>(i)] - sum[g];
    sq[g] += d * d;
  }
  std::vector<float> out(x.data.size());
  for (int64_t i = 0; i < static_cast<int64_t>(x.data.size()); ++i) {
    const size_t g = static_cast<size_t>((i / per_sample) * groups + group_of(i));
    const size_t c = static_cast<size_t>((i / inner) % channels);
    double y = (x.data[static_cast<size_t>(i)] - sum[g]) / std::sqrt(sq[g] / count + op.attrs.eps);
    if (in.size() > 1) y *= in[1]->data[c];
    if (in.size() > 2) y += in[2]->data[c];
    out[static_cast<size_t>(i)] = static_cast<float>(y);
  }
  return out;
}

}  // namespace

std::vector<float> eval_norm(const ir::Op& op, const Operands& in) {
  switch (op.kind) {
    case OpKind::Softmax: return softmax(*in[0], static_cast<size_t>(op.attrs.axis), false);
    case OpKind::LogSoftmax: return softmax(*in[0], static_cast<size_t>(op.attrs.axis), true);
    case OpKind::LayerNorm: return row_norm(op, in, false);
    case OpKind::RmsNorm: return row_norm(op, in, true);
    case OpKind::BatchNorm: return batch_norm(op, in);
    case OpKind::GroupNorm: return group_norm(op, in);
#define KILN_OP(kind, name, family, ...) KILN_CASE_UNLESS(family, Norm, kind)
#include "compiler/ops.def"
#undef KILN_OP
      break;
  }
  KILN_UNREACHABLE("not a normalisation");
}

}  // namespace kiln::reference
