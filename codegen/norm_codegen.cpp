// Normalisation kernels: a row (or group) per block, held in registers when
// it fits (one read, one write), else re-read once per pass.
#include "codegen/kernel_builder.h"

namespace kiln::codegen {

// Element j of line `line` of a normalisation -> coordinates of its input.
Coords KernelBuilder::norm_element(const ir::Op& norm, const std::string& j) {
  const ir::Tensor& x = g_.operand(norm, 0);
  const ir::KernelParams& p = k_.params;
  const auto axis = static_cast<size_t>(norm.attrs.axis);
  const std::string e = em_.fresh("e");
  if (norm.kind == OpKind::Softmax || norm.kind == OpKind::LogSoftmax) {
    em_.emit(fmt::format("const kiln::i64 {1} = ((line / {0}LL) * {2}LL + {3}) * {0}LL + (line % {0}LL);", p.inner, e,
                         p.reduced, j));
    return em_.delinearize(e, x.shape);
  }
  if (norm.kind == OpKind::GroupNorm) {
    const int64_t channels = x.shape[axis], per_group = channels / norm.attrs.groups;
    Shape rest;
    for (size_t d = 1; d < x.shape.size(); ++d)
      if (d != axis) rest.push_back(x.shape[d]);
    em_.emit(fmt::format("const kiln::i64 {} = {} / {}LL;", e, j, per_group));
    const Coords rc = em_.delinearize(e, rest);
    Coords c(x.shape.size());
    c[0] = em_.fresh("c");
    em_.emit(fmt::format("const kiln::i64 {} = line / {}LL;", c[0], norm.attrs.groups));
    c[axis] = em_.fresh("c");
    em_.emit(fmt::format("const kiln::i64 {} = (line % {}LL) * {}LL + {} % {}LL;", c[axis], norm.attrs.groups, per_group,
                         j, per_group));
    for (size_t d = 1, r = 0; d < x.shape.size(); ++d)
      if (d != axis) c[d] = rc[r++];
    return c;
  }
  em_.emit(fmt::format("const kiln::i64 {} = line * {}LL + {};", e, p.reduced, j));
  return em_.delinearize(e, x.shape);
}

// The normalised value of `x` with its parameters, named "y", and the
// stores of everything the kernel writes at this element.
std::string KernelBuilder::norm_output(const ir::Op& norm, const Coords& c, const std::string& finale) {
  const auto axis = static_cast<size_t>(norm.attrs.axis);
  std::string e = "(" + finale + ")";
  if (norm.kind == OpKind::LayerNorm || norm.kind == OpKind::RmsNorm) {
    const Coords wc(c.begin() + static_cast<ptrdiff_t>(axis), c.end());
    if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], wc));
    if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], wc));
  } else if (norm.kind == OpKind::GroupNorm) {
    const Coords cc{c[axis]};
    if (norm.inputs.size() > 1) e = fmt::format("({} * {})", e, em_.value(norm.inputs[1], cc));
    if (norm.inputs.size() > 2) e = fmt::format("({} + {})", e, em_.value(norm.inputs[2], cc));
  }
  const ir::Tensor& y = g_.result(norm);
  em_.emit(fmt::format("const float y = {};  // {}", em_.rounded(y, e), y.name));
  em_.set_leaf(norm.output, "y");
  for (ir::TensorId t : k_.writes) {
    const Coords tc = write_coords(norm.output, c, t);
    em_.emit(store(t, em_.linearize(tc, g_.tensor(t).shape), em_.value(t, tc)) + "  // " + g_.tensor(t).name);
  }
  return em_.take(0);
}

auto KernelBuilder::norm_recipe(const ir::Op& norm) -> NormRecipe {
  const std::string count = Emitter::float_literal(static_cast<float>(k_.params.reduced));
  const std::string eps = Emitter::float_literal(norm.attrs.eps);
  switch (norm.kind) {
    case OpKind::Softmax:
    case OpKind::LogSoftmax:
      return {{{"kiln::MaxOp::identity()", "kiln::MaxOp", "acc = kiln::MaxOp::combine(acc, x);", "stat0 = acc;"},
               {"0.0f", "kiln::SumOp", "acc += expf(x - stat0);", "stat1 = acc;"}},
              norm.kind == OpKind::Softmax ? "expf(x - stat0) / stat1" : "x - stat0 - logf(stat1)"};
    case OpKind::LayerNorm:
    case OpKind::GroupNorm:
      return {{{"0.0f", "kiln::SumOp", "acc += x;", fmt::format("stat0 = acc / {};", count)},
               {"0.0f", "kiln::SumOp", "acc += (x - stat0) * (x - stat0);",
                fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
              "(x - stat0) * stat1"};
    case OpKind::RmsNorm:
      return {{{"0.0f", "kiln::SumOp", "acc += x * x;", fmt::format("stat1 = 1.0f / sqrtf(acc / {} + {});", count, eps)}},
              "x * stat1"};
    default:
      KILN_UNREACHABLE("not a normalisation kernel");
  }
}

void KernelBuilder::norm() {
  const ir::Op* norm = nullptr;
  for (int32_t oi : k_.ops)
    if (const ir::Op& op = g_.ops[static_cast<size_t>(oi)];
        ir::op_info(op.kind).family == ir::OpFamily::Norm && op.kind != OpKind::BatchNorm)
      norm = &op;
  KILN_INTERNAL_CHECK(norm != nullptr);
  const ir::KernelParams& p = k_.params;
  const int64_t lines = p.outer * p.inner, n = p.reduced;
  const NormRecipe recipe = norm_recipe(*norm);
  // Registers bound it: at most 512 threads (128 registers each) holding at
  // most 32 values each (the planner's Block bound, 16384).
  const bool persistent = (p.row == ir::RowStrategy::Warp || p.row == ir::RowStrategy::Block) && n <= 16384;
  std::string body = "  __shared__ float kiln_scratch[32];\n";
  body += fmt::format("  for (kiln::i64 line = blockIdx.x; line < {}LL; line += gridDim.x) {{\n", lines);
  body += "    float stat0 = 0.0f, stat1 = 0.0f;\n";
  int threads = kThreads;
  if (persistent) {
    // The row lives in registers: one read, statistics from registers, one write.
    threads = static_cast<int>(std::clamp<int64_t>(std::bit_ceil(static_cast<uint64_t>((n + 15) / 16)), 32, 512));
    const int64_t per = (n + threads - 1) / threads;
    body += fmt::format("    float xs[{}];\n#pragma unroll\n    for (int t = 0; t < {}; ++t) {{\n", per, per);
    body += fmt::format("      const kiln::i64 j = threadIdx.x + t * {}LL;\n      xs[t] = 0.0f;\n      if (j < {}LL) {{\n", threads, n);
    em_.begin_block();
    const Coords c = norm_element(*norm, "j");
    em_.emit(fmt::format("xs[t] = {};", em_.value(norm->inputs[0], c)));
    body += em_.take(8) + "      }\n    }\n";
    for (const auto& [init, functor, update, finish] : recipe.passes) {
      body += fmt::format("    {{\n      float acc = {};\n#pragma unroll\n      for (int t = 0; t < {}; ++t) {{\n", init, per);
      body += fmt::format("        if (threadIdx.x + t * {}LL >= {}LL) continue;\n        const float x = xs[t];\n        {}\n      }}\n",
                          threads, n, update);
      body += fmt::format("      acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n      {}\n    }}\n", functor, finish);
    }
    body += fmt::format("#pragma unroll\n    for (int t = 0; t < {}; ++t) {{\n", per);
    body += fmt::format("      const kiln::i64 j = threadIdx.x + t * {}LL;\n      if (j >= {}LL) continue;\n", threads, n);
    em_.begin_block();
    const Coords c2 = norm_element(*norm, "j");
    em_.emit("const float x = xs[t];");
    em_.set_leaf(norm->inputs[0], "x", c2);
    body += em_.take(6);
    std::string out = norm_output(*norm, c2, recipe.finale);
    em_.clear_leaf(norm->inputs[0]);
    for (size_t at = 0; at < out.size();) {  // indent
      const size_t end = out.find('\n', at);
      body += "      " + out.substr(at, end - at) + "\n";
      at = end + 1;
    }
    body += "    }\n    __syncthreads();\n  }\n";
  } else {
    // Too long to keep on chip: every pass re-reads the row.
    for (const auto& [init, functor, update, finish] : recipe.passes) {
      body += fmt::format("    {{\n      float acc = {};\n", init);
      body += fmt::format("      for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
      em_.begin_block();
      const Coords c = norm_element(*norm, "j");
      em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
      em_.emit(update);
      body += em_.take(8) + "      }\n";
      body += fmt::format("      acc = kiln::block_reduce<{}>(acc, kiln_scratch);\n      {}\n    }}\n", functor, finish);
    }
    body += fmt::format("    for (kiln::i64 j = threadIdx.x; j < {}LL; j += blockDim.x) {{\n", n);
    em_.begin_block();
    const Coords c = norm_element(*norm, "j");
    em_.emit(fmt::format("const float x = {};", em_.value(norm->inputs[0], c)));
    body += em_.take(6);
    const std::string out = norm_output(*norm, c, recipe.finale);
    for (size_t at = 0; at < out.size();) {
      const size_t end = out.find('\n', at);
      body += "      " + out.substr(at, end - at) + "\n";
      at = end + 1;
    }
    body += "    }\n  }\n";
  }
  finish(body, threads);
  out_.grid = {blocks_for(lines, 1), 1, 1};
}

}  // namespace kiln::codegen
