// K padding of matmuls (matmul_k_padding.h): one pass over the ops in order,
// each padded operand emitted just before its matmul.
#include "compiler/matmul_k_padding.h"

#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/error.h"
#include "compiler/memory_budget.h"
#include "compiler/zero_padding.h"

namespace kiln::ir {
namespace {

constexpr int64_t kKMultiple = 8;  // 16 bytes of a 16-bit type
constexpr int64_t kFlopsPerCopiedByte = 256;  // see the header
constexpr const char* kRow = "matmul_k_padding";

int64_t padded_k(int64_t k) { return (k + kKMultiple - 1) / kKMultiple * kKMultiple; }

// The transpose that swaps the last two axes of its input (and keeps the
// rest in place) producing `t`, or nullopt: B as x @ w^T reads it.
std::optional<int32_t> swapping_transpose(const Graph& g, TensorId t) {
  const Tensor& tensor = g.tensor(t);
  if (tensor.kind != TensorKind::OpResult || tensor.producer < 0) return std::nullopt;
  const Op& op = g.ops[static_cast<size_t>(tensor.producer)];
  const size_t r = op.attrs.perm.size();
  if (op.kind != OpKind::Transpose || r < 2) return std::nullopt;
  for (size_t d = 0; d + 2 < r; ++d)
    if (op.attrs.perm[d] != static_cast<int64_t>(d)) return std::nullopt;
  if (op.attrs.perm[r - 2] != static_cast<int64_t>(r - 1) || op.attrs.perm[r - 1] != static_cast<int64_t>(r - 2))
    return std::nullopt;
  return tensor.producer;
}

// A matmul this row is about: 16-bit operands of one type, K no multiple of 8.
bool odd_k(const Graph& g, const Op& op) {
  if (op.kind != OpKind::Matmul) return false;
  const Tensor& a = g.operand(op, 0);
  const Tensor& b = g.operand(op, 1);
  return a.sixteen_bit_values() && b.sixteen_bit_values() && a.dtype == b.dtype && a.shape.back() % kKMultiple != 0;
}

// Why an odd-K matmul keeps its operands as written; empty where it is padded.
// `where` learns the site's description.
std::string why_not_padded(const Graph& g, int32_t index, std::string& where) {
  const Op& op = g.ops[static_cast<size_t>(index)];
  const Tensor& a = g.operand(op, 0);
  const Tensor& b = g.operand(op, 1);
  const Tensor& y = g.result(op);
  const int64_t k = a.shape.back(), to = padded_k(k), n = b.shape.back();
  const int64_t m = a.shape[a.shape.size() - 2];
  const int64_t batches = element_count(y.shape) / (y.shape[y.shape.size() - 2] * n);
  const bool b_k_major = swapping_transpose(g, op.inputs[1]).has_value();
  // The copies: each operand read as written and written padded.
  const int64_t bytes = byte_size(a.dtype) * ((element_count(a.shape) + element_count(a.shape) / k * to) +
                                               (element_count(b.shape) + element_count(b.shape) / k * to));
  const double flops = 2.0 * static_cast<double>(batches) * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(k);
  where = fmt::format("{}: K = {} padded to {} in both operands ({} copied for {:.2f} GFLOP)", op_named(g, index), k, to,
                      human_bytes(bytes), flops / 1e9);
  if (!b_k_major && n % kKMultiple != 0) {
    where = fmt::format("{}: K = {}", op_named(g, index), k);
    return fmt::format("B ('{}') has rows of {} elements, no 16-byte multiple with K padded or not: no tensor map loads it",
                       b.name, n);
  }
  if (flops < static_cast<double>(kFlopsPerCopiedByte) * static_cast<double>(bytes)) {
    where = fmt::format("{}: K = {}", op_named(g, index), k);
    return fmt::format("copying its operands padded to K = {} ({}) costs more than it saves on {:.2f} GFLOP (padded where "
                       "the GEMM does at least {} flops per byte copied)",
                       to, human_bytes(bytes), flops / 1e9, kFlopsPerCopiedByte);
  }
  return {};
}

class Padder {
 public:
  Padder(const Graph& g, const RowMatches& m) : g_(g), out_(g) {
    for (const RewriteSite& s : m.sites) matmuls_.insert(s.op);
    // A transpose read only by the matmuls padded here, as their B, is made again from its padded source.
    for (int32_t mm : matmuls_) {
      const std::optional<int32_t> tr = swapping_transpose(g, g.ops[static_cast<size_t>(mm)].inputs[1]);
      if (!tr) continue;
      const TensorId t = g.ops[static_cast<size_t>(*tr)].output;
      bool only_padded = !g.tensor(t).is_output;
      for (int32_t user : g.users[static_cast<size_t>(t)])
        only_padded = only_padded && matmuls_.count(user) && g.ops[static_cast<size_t>(user)].inputs[0] != t;
      if (only_padded) dropped_.insert(*tr);
    }
  }

  Graph run() {
    for (size_t i = 0; i < g_.ops.size(); ++i) {
      if (dropped_.count(static_cast<int32_t>(i))) continue;
      Op copy = g_.ops[i];
      if (matmuls_.count(static_cast<int32_t>(i))) {
        const int64_t to = padded_k(g_.operand(copy, 0).shape.back());
        copy.inputs[0] = padded(copy.inputs[0], g_.operand(copy, 0).shape.size() - 1, to);
        copy.inputs[1] = padded_b(copy.inputs[1], to);
      }
      out_.emit(std::move(copy));
    }
    return out_.take();
  }

 private:
  // concat(t, zeros) along `axis` to `to`; once per tensor and axis.
  TensorId padded(TensorId t, size_t axis, int64_t to) {
    const auto key = std::make_pair(t, axis);
    if (auto it = padded_.find(key); it != padded_.end()) return it->second;
    const TensorId p = zero_padded(out_, t, axis, to, "zero_k", fmt::format("k{}", to));
    padded_.emplace(key, p);
    return p;
  }

  // B read through a transpose of its last two axes: its source padded along
  // its last axis, transposed again (K-major, as the source is stored);
  // any other B padded along K, its axis -2.
  TensorId padded_b(TensorId b, int64_t to) {
    const size_t rank = g_.tensor(b).shape.size();
    const std::optional<int32_t> tr = swapping_transpose(g_, b);
    if (!tr) return padded(b, rank - 2, to);
    if (auto it = transposed_.find(*tr); it != transposed_.end()) return it->second;
    const Op& transpose = g_.ops[static_cast<size_t>(*tr)];
    const TensorId source = padded(transpose.inputs[0], rank - 1, to);
    Tensor r = g_.tensor(b);
    r.name = fmt::format("{}.k{}", r.name, to);
    r.shape[rank - 2] = to;
    r.strides = contiguous_strides(r.shape);
    r.producer = -1;
    r.is_output = false;
    const TensorId result = out_.add(std::move(r));
    out_.emit(Op{OpKind::Transpose, {source}, result, transpose.attrs, false});
    transposed_.emplace(*tr, result);
    return result;
  }

  const Graph& g_;
  GraphRewrite out_;
  std::map<std::pair<TensorId, size_t>, TensorId> padded_;
  std::map<int32_t, TensorId> transposed_;
  std::set<int32_t> matmuls_, dropped_;
};

}  // namespace

RowMatches find_odd_k_matmuls(const Graph& g) {
  RowMatches m;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (!odd_k(g, g.ops[i])) continue;
    std::string where;
    const std::string why = why_not_padded(g, static_cast<int32_t>(i), where);
    if (why.empty())
      m.sites.push_back({static_cast<int32_t>(i), where, {}});
    else
      m.declined.push_back({kRow, false, where, why});
  }
  return m;
}

Graph pad_matmul_k(const Graph& g, const RowMatches& m) { return Padder(g, m).run(); }

}  // namespace kiln::ir
