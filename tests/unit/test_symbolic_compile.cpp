// One compile for every size (graph-format.md, "Symbolic dimensions"): the
// Dim queries, the probe sizes, the pipeline's symbolic plan and kernels
// (sizes as kernel parameters, the launch geometry at bound sizes, the same
// plan and launch as the graph written with integers), the graphs it does
// not cover yet (compiled per size, saying why), NVRTC over the symbolic
// kernels, and the binding errors a launch gives before the GPU is touched.
#include <fmt/format.h>

#include <regex>
#include <string>
#include <vector>

#include "codegen/launch_geometry.h"
#include "codegen/size_text.h"
#include "compiler/dim.h"
#include "compiler/graph_internal.h"
#include "compiler/size_probe.h"
#include "kiln/executable.h"
#include "runtime/pipeline.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using testing::must_parse;

const std::string kDims = R"("dims": {"B": {"min": 1, "max": 64}, "S": {"min": 1, "max": 4096, "multiple_of": 8}})";

// x + res, rms_norm, + bias, gelu over [B, S, 768] (examples/symbolic/residual_rms_norm_gelu.json).
std::string residual_norm(const std::string& b, const std::string& s, bool symbolic) {
  return fmt::format(R"({{"kiln": 1, "name": "rn", {}
 "inputs": {{"x": {{"shape": [{}, {}, 768], "dtype": "bf16"}}, "res": {{"shape": [{}, {}, 768], "dtype": "bf16"}},
            "w": {{"shape": [768], "dtype": "bf16"}}, "bias": {{"shape": [768], "dtype": "bf16"}}}},
 "ops": [
  {{"op": "add", "in": ["x", "res"], "out": "h", "dtype": "bf16"}},
  {{"op": "rms_norm", "in": ["h", "w"], "out": "n"}},
  {{"op": "add", "in": ["n", "bias"], "out": "nb"}},
  {{"op": "gelu", "in": ["nb"], "out": "y", "dtype": "bf16"}}
 ],
 "outputs": ["y", "h"]}})",
                     symbolic ? kDims + "," : "", b, s, b, s);
}

ir::DimTable table() {
  ir::DimTable t;
  t.symbols = {{"B", 1, 64, 1}, {"S", 8, 4096, 8}};
  return t;
}

TEST(SymbolicCompile, DimQueriesHoldForTheWholeRange) {
  const ir::DimTable t = table();
  const ir::Dim s(ir::DimExpr{1, {"S"}}, &t), bs768(ir::DimExpr{768, {"B", "S"}}, &t), b(ir::DimExpr{1, {"B"}}, &t);
  EXPECT_TRUE(s.known_multiple_of(8));
  EXPECT_FALSE(s.known_multiple_of(16));
  EXPECT_FALSE(b.known_multiple_of(2));
  EXPECT_TRUE(bs768.known_multiple_of(8 * 768));
  EXPECT_FALSE(bs768.known_multiple_of(5));
  EXPECT_EQ(bs768.lower(), 8 * 768);
  EXPECT_EQ(bs768.upper(), 64 * 4096 * 768);
  EXPECT_TRUE(bs768.known_le(64 * 4096 * 768));
  EXPECT_FALSE(bs768.known_le(64 * 4096 * 768 - 1));
  EXPECT_TRUE(b.known_ge(1));
  EXPECT_FALSE(b.known_ge(2));
  EXPECT_TRUE(bs768.known_equal(ir::Dim(ir::DimExpr{768, {"B", "S"}}, &t)));
  EXPECT_FALSE(b.known_equal(ir::Dim::constant(1)));
  EXPECT_TRUE(ir::Dim::constant(48).known_multiple_of(16));
}

TEST(SymbolicCompile, ProbeValuesFactorBackIntoExpressions) {
  const Graph g = must_parse(residual_norm("\"B\"", "\"S\"", true));
  const ir::SizeProbe probe(ir_of(g), int64_t{1} << 17);
  const int64_t b = probe.values().at("B"), s = probe.values().at("S");
  EXPECT_EQ(s % 8, 0);
  EXPECT_EQ(probe.expr_of(b * s * 768), (ir::DimExpr{768, {"B", "S"}}));
  EXPECT_EQ(probe.expr_of(768), ir::DimExpr::constant(768));
  EXPECT_EQ(probe.expr_of(s / 8), std::nullopt);  // a quotient of a size is not a product
  EXPECT_FALSE(probe.involves_symbol(768));
  EXPECT_EQ(ir::with_symbols(fmt::format("domain=[{},{},768] n={}", b, s, b * s * 768), probe),
            "domain=[B,S,768] n=B*S*768");
  // The one helper: constants print as they always did, symbols as parameters.
  codegen::SizeText sizes(&probe);
  EXPECT_EQ(sizes(768), "768LL");
  EXPECT_EQ(sizes(768, "u"), "768u");
  EXPECT_EQ(sizes(b * s * 768), "(kiln_size0 * kiln_size1 * 768LL)");
  EXPECT_EQ(sizes(b, "u"), "(kiln::u32)kiln_size0");
  EXPECT_EQ(sizes.used(), (std::set<size_t>{0, 1}));
  EXPECT_THROW(sizes(s / 8), codegen::NotSymbolic);
}

runtime::Planned must_plan(const Graph& g) {
  Expected<runtime::Planned> p = runtime::run_pipeline(g, runtime::Target{.arch = "sm_90"});
  EXPECT_TRUE(p.ok()) << p.error().message;
  return std::move(p).value();
}

// Why the backend would compile `g` per size on sm_90 ("" where one compile serves every size; the
// error's message where the question itself failed).
std::string per_size_reason_on_sm90(const Graph& g) {
  Expected<std::string> why = runtime::per_size_reason(g, runtime::Target{.arch = "sm_90"});
  return why.ok() ? *why : "error: " + why.error().message;
}

// No probe value is left in a symbolic kernel's source: every number in it is a constant of
// the graph or of codegen (the sizes are expressions over its parameters).
void expect_no_probe_sizes(const codegen::GeneratedKernel& k, const ir::SizeProbe& probe) {
  const std::regex number("\\b[0-9]+\\b");
  for (std::sregex_iterator it(k.canonical.begin(), k.canonical.end(), number), end; it != end; ++it)
    EXPECT_FALSE(probe.involves_symbol(std::stoll(it->str()))) << it->str();
}

TEST(SymbolicCompile, OnePlanAndKernelsServeEverySize) {
  const Graph g = must_parse(residual_norm("\"B\"", "\"S\"", true));
  const runtime::Planned symbolic = must_plan(g);
  ASSERT_TRUE(symbolic.probe != nullptr);
  for (const codegen::GeneratedKernel& k : symbolic.program.kernels) {
    EXPECT_NE(k.canonical.find("const kiln::i64 kiln_size"), std::string::npos) << k.source;
    EXPECT_TRUE(k.grid_rule.has_value());
    expect_no_probe_sizes(k, *symbolic.probe);
  }
  // At any size, the plan and each kernel's launch are those of the graph written with integers.
  for (const auto& [b, s] : std::vector<std::pair<int, int>>{{1, 8}, {7, 24}, {64, 4096}, {13, 1000}}) {
    const Graph sized = must_parse(residual_norm(std::to_string(b), std::to_string(s), false));
    const runtime::Planned integer = must_plan(sized);
    ASSERT_EQ(integer.plan.kernels.size(), symbolic.plan.kernels.size());
    ASSERT_EQ(integer.program.kernels.size(), symbolic.program.kernels.size());
    for (size_t i = 0; i < integer.program.kernels.size(); ++i) {
      EXPECT_EQ(integer.plan.kernels[i].kind, symbolic.plan.kernels[i].kind);
      EXPECT_EQ(integer.plan.kernels[i].ops, symbolic.plan.kernels[i].ops);
      const codegen::LaunchGeometry at = codegen::launch_geometry(symbolic.program.kernels[i], {{"B", b}, {"S", s}});
      EXPECT_EQ(codegen::to_string(at), codegen::to_string(codegen::launch_geometry(integer.program.kernels[i], {})))
          << "B=" << b << " S=" << s;
    }
  }
}

TEST(SymbolicCompile, SoftmaxRowsOverASymbolicCount) {
  const Graph g = must_parse(R"({"kiln": 1, "dims": {"N": {"min": 1, "max": 100000}},
    "inputs": {"x": {"shape": ["N", 1000], "dtype": "f32"}},
    "ops": [{"op": "softmax", "in": ["x"], "out": "p"}, {"op": "mul", "in": ["p", 2.0], "out": "y"}],
    "outputs": ["y"]})");
  const runtime::Planned p = must_plan(g);
  ASSERT_EQ(p.program.kernels.size(), 1u);
  EXPECT_EQ(codegen::launch_geometry(p.program.kernels[0], {{"N", 77}}).grid[0], 77u);
}

// Row reductions over symbolic rows: one written op by op (a layer norm
// whose kernel holds its rows) and a plain row reduction; the launch at each
// size is that of the integer graph.
std::string written_layer_norm(const std::string& rows, bool symbolic) {
  return fmt::format(R"({{"kiln": 1, {}
    "inputs": {{"x": {{"shape": [{}, 512], "dtype": "f32"}}}},
    "ops": [{{"op": "reduce_mean", "in": ["x"], "out": "m", "axes": [1], "keepdims": true}},
            {{"op": "sub", "in": ["x", "m"], "out": "d"}}, {{"op": "mul", "in": ["d", "d"], "out": "d2"}},
            {{"op": "reduce_mean", "in": ["d2"], "out": "v", "axes": [1], "keepdims": true}},
            {{"op": "add", "in": ["v", 1e-5], "out": "ve"}}, {{"op": "rsqrt", "in": ["ve"], "out": "r"}},
            {{"op": "mul", "in": ["d", "r"], "out": "y"}},
            {{"op": "reduce_max", "in": ["x"], "out": "top", "axes": [1]}}],
    "outputs": ["y", "top"]}})",
                     symbolic ? R"("dims": {"R": {"min": 1, "max": 50000}},)" : "", rows);
}

TEST(SymbolicCompile, RowReductionsAndHeldRowsOverSymbolicRows) {
  const runtime::Planned symbolic = must_plan(must_parse(written_layer_norm("\"R\"", true)));
  bool held = false;
  for (const ir::PlannedKernel& k : symbolic.plan.kernels) held |= k.params.holds_rows;
  EXPECT_TRUE(held);
  for (int rows : {1, 77, 50000}) {
    const runtime::Planned integer = must_plan(must_parse(written_layer_norm(std::to_string(rows), false)));
    ASSERT_EQ(integer.program.kernels.size(), symbolic.program.kernels.size());
    for (size_t i = 0; i < integer.program.kernels.size(); ++i)
      EXPECT_EQ(codegen::to_string(codegen::launch_geometry(symbolic.program.kernels[i], {{"R", rows}})),
                codegen::to_string(codegen::launch_geometry(integer.program.kernels[i], {})))
          << "R=" << rows;
  }
}

// A softmax written out over rows of symbolic length (scores over a cache's keys): the row is too
// long to keep in registers at some size in range, so every pass re-reads it, its loop bound and a
// mean's divisor the size parameter.
TEST(SymbolicCompile, HeldRowsOfSymbolicLengthAreReReadByEveryPass) {
  const Graph g = Graph::load(KILN_SOURCE_DIR "/tests/cli/symbolic_keys_softmax.json").value();
  EXPECT_EQ(per_size_reason_on_sm90(g), "");
  const runtime::Planned symbolic = must_plan(g);
  ASSERT_EQ(symbolic.program.kernels.size(), 1u);
  ASSERT_TRUE(symbolic.plan.kernels[0].params.holds_rows);
  const codegen::GeneratedKernel& k = symbolic.program.kernels[0];
  expect_no_probe_sizes(k, *symbolic.probe);
  EXPECT_NE(k.canonical.find("j0 < kiln_size1; j0 += 512"), std::string::npos) << k.source;
  EXPECT_NE(k.canonical.find("acc / (float)kiln_size1"), std::string::npos) << k.source;
}

TEST(SymbolicCompile, WhatOneCompileDoesNotCoverIsCompiledPerSizeAndSaysWhy) {
  // A matmul of f32 operands (the SIMT kernel) over symbolic rows is covered; over symbolic
  // columns its source spells them as integers.
  const Graph mm = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 1, "max": 64}},
    "inputs": {"x": {"shape": ["B", 64], "dtype": "f32"}, "w": {"shape": [64, 32], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  Expected<std::string> why = runtime::per_size_reason(mm, runtime::Target{.arch = "sm_90"});
  ASSERT_TRUE(why.ok());
  EXPECT_EQ(*why, "");
  const Graph columns = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 1, "max": 64}},
    "inputs": {"x": {"shape": [32, 64], "dtype": "f32"}, "w": {"shape": [64, "B"], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  why = runtime::per_size_reason(columns, runtime::Target{.arch = "sm_90"});
  ASSERT_TRUE(why.ok());
  EXPECT_THAT(*why, ::testing::HasSubstr("kernel 0's source (tactic simt) depends on the sizes"));
  // The same matmul of bf16 operands on sm_80 (mma.sync) is covered; batches of them are not (a
  // symbolic batch count). A conv over a symbolic batch is covered (its rows N*P*Q are M).
  const Graph mm16 = must_parse(std::regex_replace(mm.to_json(), std::regex("\"f32\""), "\"bf16\""));
  why = runtime::per_size_reason(mm16, runtime::Target{.arch = "sm_80"});
  ASSERT_TRUE(why.ok());
  EXPECT_EQ(*why, "");
  const Graph batched = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 1, "max": 64}},
    "inputs": {"x": {"shape": ["B", 64, 64], "dtype": "bf16"}, "w": {"shape": ["B", 64, 32], "dtype": "bf16"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})");
  why = runtime::per_size_reason(batched, runtime::Target{.arch = "sm_80"});
  ASSERT_TRUE(why.ok());
  EXPECT_THAT(*why, ::testing::HasSubstr("symbolic batches"));
  const Graph conv = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 1, "max": 64}},
    "inputs": {"x": {"shape": ["B", 8, 8, 16], "dtype": "bf16"}, "w": {"shape": [16, 3, 3, 16], "dtype": "bf16"}},
    "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "y", "layout": "NHWC", "padding": [1, 1]}], "outputs": ["y"]})");
  for (const char* arch : {"sm_90", "sm_80"}) {
    why = runtime::per_size_reason(conv, runtime::Target{.arch = arch});
    ASSERT_TRUE(why.ok());
    EXPECT_EQ(*why, "") << arch;
  }
  Expected<Executable> exe = Executable::compile(columns, {.arch = "sm_90", .use_cache = false});
  ASSERT_FALSE(exe.ok());
  EXPECT_THAT(exe.error().message, ::testing::HasSubstr("one compile for every size does not cover it yet"));
  EXPECT_THAT(exe.error().message, ::testing::HasSubstr("Graph::specialize"));
  // A reduction over a symbolic extent (row lengths are integers so far).
  const Graph sum = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 1, "max": 64}},
    "inputs": {"x": {"shape": ["B", 64], "dtype": "f32"}},
    "ops": [{"op": "reduce_sum", "in": ["x"], "out": "y", "axes": [0]}], "outputs": ["y"]})");
  why = runtime::per_size_reason(sum, runtime::Target{.arch = "sm_90"});
  ASSERT_TRUE(why.ok());
  EXPECT_THAT(*why, ::testing::HasSubstr("a reduction over a symbolic extent"));
  // A covered graph.
  why = runtime::per_size_reason(must_parse(residual_norm("\"B\"", "\"S\"", true)), runtime::Target{.arch = "sm_90"});
  ASSERT_TRUE(why.ok());
  EXPECT_EQ(*why, "");
}

// x [B, S, 768] -> matmul 3072 + bias, GELU -> matmul 768 + x (examples/symbolic/mlp.json):
// the Hopper kernel over rows M = B*S, its tiles counted and its tensor maps
// sized at launch.
std::string mlp(const std::string& b, const std::string& s, bool symbolic) {
  return fmt::format(R"({{"kiln": 1, "name": "mlp", {}
 "inputs": {{"x": {{"shape": [{}, {}, 768], "dtype": "bf16"}}, "w": {{"shape": [768, 3072], "dtype": "bf16"}},
            "b": {{"shape": [3072], "dtype": "bf16"}}, "w2": {{"shape": [3072, 768], "dtype": "bf16"}}}},
 "ops": [{{"op": "reshape", "in": ["x"], "out": "x2", "shape": [{}, 768]}},
         {{"op": "matmul", "in": ["x2", "w"], "out": "h"}},
         {{"op": "add", "in": ["h", "b"], "out": "hb"}},
         {{"op": "gelu", "in": ["hb"], "out": "g", "dtype": "bf16"}},
         {{"op": "matmul", "in": ["g", "w2"], "out": "y2"}},
         {{"op": "add", "in": ["y2", "x2"], "out": "r", "dtype": "bf16"}},
         {{"op": "reshape", "in": ["r"], "out": "y", "shape": [{}, {}, 768]}}],
 "outputs": ["y"]}})",
                     symbolic ? kDims + "," : "", b, s, symbolic ? "\"B*S\"" : std::to_string(std::stoll(b) * std::stoll(s)),
                     b, s);
}

TEST(SymbolicCompile, HopperMatmulsOverSymbolicRows) {
  const runtime::Planned symbolic = must_plan(must_parse(mlp("\"B\"", "\"S\"", true)));
  // Two plan kernels, each built at 128 columns and, for the sizes where the integer rule takes
  // 256 or 192, at those (size buckets' variants, before it)
  ASSERT_EQ(symbolic.program.kernels.size(), 6u);
  EXPECT_EQ(std::ranges::count_if(symbolic.program.kernels, [](const auto& k) { return !k.when; }), 2);
  for (const codegen::GeneratedKernel& k : symbolic.program.kernels) {
    EXPECT_EQ(k.tactics.chosen, "wgmma");
    EXPECT_NE(k.canonical.find("const int units_m = (int)(((kiln_size0 * kiln_size1) + 127LL) / 128LL)"), std::string::npos)
        << k.source;
    expect_no_probe_sizes(k, *symbolic.probe);
    EXPECT_TRUE(k.grid_rule.has_value());
    // A (rows B*S) and the staged result's maps: extents and strides as expressions.
    bool rows_map = false;
    for (const codegen::KernelArg& a : k.args)
      if (a.role == codegen::KernelArg::Role::TensorMap && a.map.dim_exprs.size() >= 2)
        rows_map |= ir::to_string(a.map.dim_exprs[1]) == "B*S";
    EXPECT_TRUE(rows_map) << k.source;
  }
  // The persistent grid at bound sizes: the units the integer graph's kernel walks where it
  // chose the same tiles (its tiles are chosen for its M; the symbolic kernel's for many rows).
  int compared = 0;
  for (const auto& [b, s] : std::vector<std::pair<int, int>>{{1, 8}, {3, 200}, {4, 500}, {64, 4096}}) {
    const runtime::Planned integer = must_plan(must_parse(mlp(std::to_string(b), std::to_string(s), false)));
    ASSERT_EQ(integer.program.kernels.size(), 2u);
    std::vector<const codegen::GeneratedKernel*> launched;  // the variant of each plan kernel at these sizes
    const std::vector<uint8_t> runs = codegen::kernels_run_at(symbolic.program.kernels, {{"B", b}, {"S", s}});
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i]) launched.push_back(&symbolic.program.kernels[i]);
    ASSERT_EQ(launched.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      if (integer.program.kernels[i].tactics.chosen != "wgmma" || !(integer.program.kernels[i].tuning == launched[i]->tuning))
        continue;  // (a few rows: mma.sync splits K)
      ++compared;
      EXPECT_EQ(codegen::to_string(codegen::launch_geometry(*launched[i], {{"B", b}, {"S", s}})),
                codegen::to_string(codegen::launch_geometry(integer.program.kernels[i], {})))
          << "B=" << b << " S=" << s;
    }
  }
  EXPECT_GE(compared, 4);
}

// A fused QKV projection, attention with a padding mask, the output
// projection (tests/cli/symbolic_attention.json): the Hopper attention
// kernel's query tiles, ceil(S / 128) of each of B*12 heads, counted by the
// kernel and its launch; the same launch as the integer graph's.
std::string attention_layer(const std::string& b, const std::string& s) {
  auto product = [&](const std::string& x) { return b[0] == '"' ? fmt::format("\"B*{}\"", x) : std::to_string(std::stoll(b) * std::stoll(x)); };
  return fmt::format(R"({{"kiln": 1, "name": "attention", {}
 "inputs": {{"x": {{"shape": [{}, {}, 768], "dtype": "bf16"}}, "wqkv": {{"shape": [768, 2304], "dtype": "bf16"}},
            "wo": {{"shape": [768, 768], "dtype": "bf16"}}, "mask": {{"shape": [{}, 1, 1, {}], "dtype": "bf16"}}}},
 "ops": [{{"op": "reshape", "in": ["x"], "out": "x2", "shape": [{}, 768]}},
         {{"op": "matmul", "in": ["x2", "wqkv"], "out": "qkv", "dtype": "bf16"}},
         {{"op": "reshape", "in": ["qkv"], "out": "qkv5", "shape": [{}, {}, 3, 12, 64]}},
         {{"op": "transpose", "in": ["qkv5"], "out": "qkvt", "perm": [2, 0, 3, 1, 4]}},
         {{"op": "slice", "in": ["qkvt"], "out": "q1", "axis": 0, "start": 0, "end": 1}},
         {{"op": "slice", "in": ["qkvt"], "out": "k1", "axis": 0, "start": 1, "end": 2}},
         {{"op": "slice", "in": ["qkvt"], "out": "v1", "axis": 0, "start": 2, "end": 3}},
         {{"op": "reshape", "in": ["q1"], "out": "q", "shape": [{}, 12, {}, 64]}},
         {{"op": "reshape", "in": ["k1"], "out": "k", "shape": [{}, 12, {}, 64]}},
         {{"op": "reshape", "in": ["v1"], "out": "v", "shape": [{}, 12, {}, 64]}},
         {{"op": "sdpa", "in": ["q", "k", "v", "mask"], "out": "a", "dtype": "bf16"}},
         {{"op": "transpose", "in": ["a"], "out": "at", "perm": [0, 2, 1, 3]}},
         {{"op": "reshape", "in": ["at"], "out": "a2", "shape": [{}, 768]}},
         {{"op": "matmul", "in": ["a2", "wo"], "out": "o"}},
         {{"op": "add", "in": ["o", "x2"], "out": "r", "dtype": "bf16"}},
         {{"op": "reshape", "in": ["r"], "out": "y", "shape": [{}, {}, 768]}}],
 "outputs": ["y"]}})",
                     b[0] == '"' ? R"("dims": {"B": {"min": 1, "max": 64}, "S": {"min": 1, "max": 4096}},)" : "", b, s, b, s,
                     product(b[0] == '"' ? "S" : s), b, s, b, s, b, s, b, s, product(b[0] == '"' ? "S" : s), b, s);
}

// Indices a range can take past 2^31 (a backend's wide ranges) divide by a
// symbolic size through a kiln::Divisor made once per kernel: no 64-bit
// division by a value the compiler cannot see. Below 2^31, 32-bit division.
TEST(SymbolicCompile, WideIndicesDivideBySizesThroughDivisors) {
  auto heads_first = [](int64_t max) {
    return fmt::format(R"({{"kiln": 1, "dims": {{"B": {{"min": 1, "max": {0}}}, "S": {{"min": 1, "max": {0}}}}},
      "inputs": {{"x": {{"shape": ["B", "S", 8, 64], "dtype": "bf16"}}}},
      "ops": [{{"op": "transpose", "in": ["x"], "out": "t", "perm": [0, 2, 1, 3]}},
              {{"op": "mul", "in": ["t", 2.0], "out": "y", "dtype": "bf16"}}], "outputs": ["y"]}})", max);
  };
  const runtime::Planned wide = must_plan(must_parse(heads_first(32768)));
  ASSERT_EQ(wide.program.kernels.size(), 1u);
  const std::string& source = wide.program.kernels[0].canonical;
  EXPECT_NE(source.find("const kiln::NarrowDivisor kiln_div1(kiln_size1);"), std::string::npos) << source;
  EXPECT_NE(source.find("kiln_div1.div("), std::string::npos) << source;
  EXPECT_NE(source.find("kiln_div1.mod("), std::string::npos) << source;
  EXPECT_FALSE(std::regex_search(source, std::regex(R"([/%] \(?kiln_size)"))) << source;
  const runtime::Planned narrow = must_plan(must_parse(heads_first(64)));
  EXPECT_EQ(narrow.program.kernels[0].canonical.find("kiln::Divisor"), std::string::npos);
}

// f32 operands in full precision take the SIMT kernel: over a symbolic M its
// tile rows lie along x, walked by a loop, and a grid rule sizes the launch.
TEST(SymbolicCompile, SimtMatmulsOverSymbolicRows) {
  const std::string json = std::regex_replace(mlp("\"B\"", "\"S\"", true), std::regex("\"bf16\""), "\"f32\"");
  const runtime::Planned symbolic = must_plan(must_parse(json));
  ASSERT_EQ(symbolic.program.kernels.size(), 2u);
  for (const codegen::GeneratedKernel& k : symbolic.program.kernels) {
    EXPECT_EQ(k.tactics.chosen, "simt");
    EXPECT_NE(k.canonical.find("m0 < (kiln_size0 * kiln_size1); m0 += (kiln::i64)gridDim.x * 128"), std::string::npos)
        << k.source;
    expect_no_probe_sizes(k, *symbolic.probe);
    ASSERT_TRUE(k.grid_rule.has_value());
  }
  // 3 x 45 = 135 rows: 2 tile rows of 128 along x; 3072 and 768 columns: 24 and 6 tiles along y.
  EXPECT_EQ(codegen::to_string(codegen::launch_geometry(symbolic.program.kernels[0], {{"B", 3}, {"S", 45}})),
            "grid [2,24,1] block [256,1,1]");
  EXPECT_EQ(codegen::to_string(codegen::launch_geometry(symbolic.program.kernels[1], {{"B", 3}, {"S", 45}})),
            "grid [2,6,1] block [256,1,1]");
}

// An integer M of more tile rows than a grid's y takes (65535 of 64 rows, N = 8)
// walks them by the same loop along x, instead of a launch the GPU refuses.
TEST(SymbolicCompile, SimtMatmulsOverMoreTileRowsThanAGridTakesWalkThem) {
  const runtime::Planned tall = must_plan(must_parse(R"({"kiln": 1,
    "inputs": {"x": {"shape": [5000000, 16], "dtype": "f32"}, "w": {"shape": [16, 8], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})"));
  ASSERT_EQ(tall.program.kernels.size(), 1u);
  const codegen::GeneratedKernel& k = tall.program.kernels[0];
  EXPECT_EQ(k.tactics.chosen, "simt");
  EXPECT_NE(k.canonical.find("m0 < 5000000LL; m0 += (kiln::i64)gridDim.x * 64"), std::string::npos) << k.source;
  EXPECT_EQ(codegen::to_string(codegen::launch_geometry(k, {})), "grid [78125,1,1] block [256,1,1]");
  // Many columns too (their tiles along y past 65535): an error naming the op, not a launch the
  // GPU refuses. Many columns over few rows keep their tiles along x.
  Expected<Executable> both = Executable::compile(must_parse(R"({"kiln": 1,
    "inputs": {"x": {"shape": [9000000, 4], "dtype": "f32"}, "w": {"shape": [4, 9000000], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})"),
                                                      {.arch = "sm_90", .use_cache = false});
  ASSERT_FALSE(both.ok());
  EXPECT_THAT(both.error().message, ::testing::HasSubstr("9000000 rows and 70313 column tiles exceed"));
  const runtime::Planned wide = must_plan(must_parse(R"({"kiln": 1,
    "inputs": {"x": {"shape": [2, 4], "dtype": "f32"}, "w": {"shape": [4, 4200000], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["x", "w"], "out": "y"}], "outputs": ["y"]})"));
  EXPECT_EQ(codegen::to_string(codegen::launch_geometry(wide.program.kernels[0], {})), "grid [32813,1,1] block [256,1,1]");
}

TEST(SymbolicCompile, HopperAttentionOverSymbolicBatchAndSequence) {
  const runtime::Planned symbolic = must_plan(must_parse(attention_layer("\"B\"", "\"S\"")));
  // (three plan kernels; a projection also built as a size bucket's variant of 256 columns)
  ASSERT_EQ(std::ranges::count_if(symbolic.program.kernels, [](const auto& k) { return !k.when; }), 3);
  const auto at = std::ranges::find(symbolic.program.kernels, std::string("flash wgmma"),
                                    [](const codegen::GeneratedKernel& k) { return k.tactics.chosen; });
  ASSERT_NE(at, symbolic.program.kernels.end());
  const codegen::GeneratedKernel& attention = *at;
  ASSERT_TRUE(attention.grid_rule.has_value());
  EXPECT_EQ(ir::to_string(attention.grid_rule->times), "B*12");
  for (const auto& [b, s] : std::vector<std::pair<int, int>>{{1, 1}, {3, 300}, {64, 4096}}) {
    const runtime::Planned integer = must_plan(must_parse(attention_layer(std::to_string(b), std::to_string(s))));
    ASSERT_EQ(integer.program.kernels.size(), 3u);
    const codegen::GeneratedKernel& k = integer.program.kernels[1];
    if (k.tactics.chosen != "flash wgmma" || !(k.tuning == attention.tuning)) continue;  // (its key tiles chosen for its S)
    EXPECT_EQ(codegen::to_string(codegen::launch_geometry(attention, {{"B", b}, {"S", s}})),
              codegen::to_string(codegen::launch_geometry(k, {})))
        << "B=" << b << " S=" << s;
  }
}

// A static KV cache's prefill (bench/generate.py): S query rows against the
// cache's 288 keys (an integer) with an additive mask, causal or not. The
// kernels spell the causal offset 288 - S as a difference of their size
// parameters (a sum is no product of sizes); the Hopper kernel (bf16, sm_90)
// and the exact two-pass kernel (f32) serve every S from one compile.
TEST(SymbolicCompile, AttentionOverAStaticCacheServesEveryPromptLength) {
  for (const char* dtype : {"bf16", "f32"})
    for (const char* causal : {"false", "true"}) {
      const Graph g = must_parse(fmt::format(R"({{"kiln": 1, "dims": {{"S": {{"min": 1, "max": 288}}}},
        "inputs": {{"q": {{"shape": [2, 8, "S", 64], "dtype": "{0}"}}, "k": {{"shape": [2, 8, 288, 64], "dtype": "{0}"}},
                   "v": {{"shape": [2, 8, 288, 64], "dtype": "{0}"}}, "mask": {{"shape": [2, 1, "S", 288], "dtype": "{0}"}}}},
        "ops": [{{"op": "sdpa", "in": ["q", "k", "v", "mask"], "out": "a", "causal": {1}}}], "outputs": ["a"]}})",
                                             dtype, causal));
      EXPECT_EQ(per_size_reason_on_sm90(g), "") << dtype << " causal " << causal;
      const runtime::Planned symbolic = must_plan(g);
      ASSERT_EQ(symbolic.program.kernels.size(), 1u);
      const codegen::GeneratedKernel& k = symbolic.program.kernels[0];
      EXPECT_EQ(k.tactics.chosen, std::string(dtype) == "bf16" ? "flash wgmma" : "exact two-pass") << dtype;
      expect_no_probe_sizes(k, *symbolic.probe);
      if (std::string(causal) == "true") EXPECT_NE(k.canonical.find("(288LL - kiln_size0)"), std::string::npos) << k.source;
    }
}

// A decode step over a static cache whose length is a symbol (the cache made for each prompt's
// length plus the tokens to generate): flash decoding counts its chunks of 1024 keys at launch,
// the grid is a block per chunk of each batch and key head at every length, and the partials'
// workspace holds the range's most chunks. Below 512 keys, where the integer graph takes the
// flash kernel, a size bucket's variant takes it too.
TEST(SymbolicCompile, ADecodeStepOverACacheOfSymbolicLengthIsOneCompile) {
  const Graph g = Graph::load(KILN_SOURCE_DIR "/tests/cli/symbolic_decode_step.json").value();
  EXPECT_EQ(per_size_reason_on_sm90(g), "");
  const runtime::Planned symbolic = must_plan(g);
  ASSERT_EQ(symbolic.program.kernels.size(), 2u);
  const codegen::GeneratedKernel &few = symbolic.program.kernels[0], &k = symbolic.program.kernels[1];
  EXPECT_EQ(few.tactics.chosen, "flash wgmma");
  ASSERT_TRUE(few.when.has_value());
  EXPECT_EQ(few.when->to_string(), "L in 2..511");
  EXPECT_EQ(k.tactics.chosen, "flash decoding");
  EXPECT_FALSE(k.when.has_value());
  expect_no_probe_sizes(few, *symbolic.probe);
  expect_no_probe_sizes(k, *symbolic.probe);
  EXPECT_NE(k.canonical.find("const int chunks = (int)((kiln_size"), std::string::npos) << k.source;
  ASSERT_EQ(symbolic.program.workspaces.size(), 2u);
  ASSERT_TRUE(symbolic.program.workspaces[0].words_expr.has_value());
  EXPECT_EQ(ir::to_string(*symbolic.program.workspaces[0].words_expr), fmt::format("B*{}", 8 * 20 * (4 * 128 + 2 * 4)));
  for (const auto& [b, l] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {2, 300}, {3, 512}, {3, 1025}, {8, 20000}}) {
    const ir::DimValues at_sizes{{"B", b}, {"L", l}};
    const std::vector<uint8_t> runs = codegen::kernels_run_at(symbolic.program.kernels, at_sizes);
    EXPECT_EQ(runs[0], l < 512) << "L = " << l;
    EXPECT_EQ(runs[1], l >= 512) << "L = " << l;
    Expected<Graph> sized = g.specialize(at_sizes);
    ASSERT_TRUE(sized.ok()) << sized.error().message;
    const runtime::Planned integer = must_plan(*sized);
    ASSERT_EQ(integer.program.kernels.size(), 1u);
    EXPECT_EQ(integer.program.kernels[0].tactics.chosen, runs[0] ? "flash wgmma" : "flash decoding") << "L = " << l;
    const codegen::LaunchGeometry at = codegen::launch_geometry(runs[0] ? few : k, at_sizes);
    const codegen::LaunchGeometry want = codegen::launch_geometry(integer.program.kernels[0], {});
    EXPECT_EQ(at.grid, want.grid) << "B = " << b << ", L = " << l;
    EXPECT_EQ(at.block, want.block) << "B = " << b << ", L = " << l;
  }
}

// A vocabulary's projection over symbolic rows (an LM head over T tokens): cuBLASLt takes it by
// the rule, as at integer sizes, its M a product of the sizes the runtime evaluates at launch
// (layouts and timed algorithms for each M); one compile serves every size.
TEST(SymbolicCompile, AVocabularyProjectionOverSymbolicRowsTakesCublasLt) {
  const Graph g = must_parse(R"({"kiln": 1, "dims": {"T": {"min": 1, "max": 262144}},
      "inputs": {"h": {"shape": ["T", 1024], "dtype": "bf16"}, "w": {"shape": [32000, 1024], "dtype": "bf16"}},
      "ops": [{"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]}, {"op": "matmul", "in": ["h", "wt"], "out": "logits"}],
      "outputs": ["logits"]})");
  const runtime::Target target{.arch = "sm_90", .vendors = {.cublaslt = true}};
  Expected<std::string> why = runtime::per_size_reason(g, target);
  ASSERT_TRUE(why.ok()) << why.error().message;
  EXPECT_EQ(*why, "");
  Expected<runtime::Planned> p = runtime::run_pipeline(g, target);
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->program.kernels.size(), 1u);
  const codegen::GeneratedKernel& k = p->program.kernels[0];
  EXPECT_EQ(k.tactics.chosen, "cublasLt");
  ASSERT_TRUE(k.library.has_value() && k.library->m_expr.has_value());
  EXPECT_EQ(ir::to_string(*k.library->m_expr), "T");
  EXPECT_EQ(k.library->m_at({{"T", 2331}}), 2331);
  EXPECT_EQ(k.decisions, "cublasLt T x32000x1024 x1: a bf16 [m][k] (row 1024), b bf16 [n][k] (column 1024), "
                         "d bf16 [m][n] (row 32000)");
  EXPECT_EQ(k.library->problem(k.args.size()), "");
}

// Size buckets: a Hopper matmul over symbolic rows is built at 128 columns, and, where the integer
// graph's rule takes 256 or 192 at some sizes of the range, again at those widths as variants run
// at those sizes (GeneratedKernel::when). At every size the variant launched has the integer
// graph's tile width and grid (Llama's MLP: N = 2816 over K = 1024 took 256 at 4000 rows, 192 at
// 1000, 128 at 300).
TEST(SymbolicCompile, AMatmulsTileWidthIsChosenPerSizeBucket) {
  const Graph g = must_parse(R"({"kiln": 1, "dims": {"T": {"min": 1, "max": 65536}},
      "inputs": {"x": {"shape": ["T", 1024], "dtype": "bf16"}, "w": {"shape": [1024, 2816], "dtype": "bf16"}},
      "ops": [{"op": "matmul", "in": ["x", "w"], "out": "h", "dtype": "bf16"}, {"op": "silu", "in": ["h"], "out": "y"}],
      "outputs": ["y"]})");
  const runtime::Planned symbolic = must_plan(g);
  ASSERT_EQ(symbolic.program.kernels.size(), 3u);
  const codegen::GeneratedKernel &wide = symbolic.program.kernels[0], &middle = symbolic.program.kernels[1],
                                 &narrow = symbolic.program.kernels[2];
  EXPECT_EQ(wide.plan_kernel, narrow.plan_kernel);
  EXPECT_EQ(middle.plan_kernel, narrow.plan_kernel);
  ASSERT_TRUE(wide.when.has_value() && middle.when.has_value());
  EXPECT_FALSE(narrow.when.has_value());
  EXPECT_EQ(wide.tuning.tile_n, 256);
  EXPECT_EQ(middle.tuning.tile_n, 192);
  EXPECT_EQ(narrow.tuning.tile_n, 128);
  EXPECT_EQ(ir::to_string(wide.when->extent), "T");
  expect_no_probe_sizes(wide, *symbolic.probe);
  expect_no_probe_sizes(middle, *symbolic.probe);
  int compared = 0;
  for (int64_t t : {1, 64, 300, 1000, 1409, 1536, 1537, 4000, 30000, 65536}) {
    const std::vector<uint8_t> runs = codegen::kernels_run_at(symbolic.program.kernels, {{"T", t}});
    ASSERT_EQ(runs[0] + runs[1] + runs[2], 1) << "T = " << t;
    const codegen::GeneratedKernel& launched = runs[0] ? wide : runs[1] ? middle : narrow;
    Expected<Graph> sized = g.specialize({{"T", t}});
    ASSERT_TRUE(sized.ok()) << sized.error().message;
    const runtime::Planned integer = must_plan(*sized);
    ASSERT_EQ(integer.program.kernels.size(), 1u);
    if (integer.program.kernels[0].tactics.chosen != "wgmma") continue;  // (a few rows: mma.sync splits K)
    ++compared;
    EXPECT_EQ(launched.tuning.tile_n, integer.program.kernels[0].tuning.tile_n) << "T = " << t;
    EXPECT_EQ(codegen::to_string(codegen::launch_geometry(launched, {{"T", t}})),
              codegen::to_string(codegen::launch_geometry(integer.program.kernels[0], {})))
        << "T = " << t;
  }
  EXPECT_GE(compared, 7);
  // One compile serves every size: both probes build the same variants
  EXPECT_EQ(per_size_reason_on_sm90(g), "");
}

// BERT's pooler over a symbolic batch: its A (the first token of each
// sequence) is gathered, so the mma.sync kernel takes it, tiled at the
// probe's many rows. Where B is at most 64 the integer graph takes the
// few-rows tile, B rounded up to 16 rows: variants of 16, 32 and 64 rows run
// there, with the integer graph's grid (H200, B32: 55 us at 6 tiles of
// 128 x 128, 40 at 12 of 64 x 64, 28 at 12 of 32 x 64).
TEST(SymbolicCompile, AFewRowsMatmulTakesTheFewRowsTilesInItsSizeBuckets) {
  const Graph g = must_parse(R"({"kiln": 1, "dims": {"B": {"min": 2, "max": 32768}, "S": {"min": 2, "max": 512}},
      "inputs": {"h": {"shape": ["B", "S", 768], "dtype": "bf16"}, "w": {"shape": [768, 768], "dtype": "bf16"},
                 "bias": {"shape": [768], "dtype": "bf16"}},
      "ops": [{"op": "slice", "in": ["h"], "out": "first", "axis": 1, "start": 0, "end": 1},
              {"op": "reshape", "in": ["first"], "out": "a", "shape": ["B", 768]},
              {"op": "transpose", "in": ["w"], "out": "wt", "perm": [1, 0]},
              {"op": "matmul", "in": ["a", "wt"], "out": "p"},
              {"op": "add", "in": ["p", "bias"], "out": "pb", "dtype": "bf16"},
              {"op": "tanh", "in": ["pb"], "out": "y", "dtype": "bf16"}],
      "outputs": ["y"]})");
  // Three buckets of few rows (B to 16, 17 to 32, 33 to 64), each the integer graph's tile height
  // there, then the many-rows build.
  const runtime::Planned symbolic = must_plan(g);
  ASSERT_EQ(symbolic.program.kernels.size(), 4u);
  const std::vector<std::pair<std::string, int>> buckets = {{"B in 2..16", 16}, {"B in 17..32", 32}, {"B in 33..64", 64}};
  for (size_t i = 0; i < buckets.size(); ++i) {
    const codegen::GeneratedKernel& few = symbolic.program.kernels[i];
    EXPECT_EQ(few.tactics.chosen, "mma.sync");
    ASSERT_TRUE(few.when.has_value());
    EXPECT_EQ(few.when->to_string(), buckets[i].first);
    EXPECT_EQ(few.tuning.tile_m, buckets[i].second);
    EXPECT_NE(few.source.find(fmt::format("kiln::tc::Gemm<{}, 64, 64, 1, 4, 4,", buckets[i].second)), std::string::npos);
    expect_no_probe_sizes(few, *symbolic.probe);
  }
  const codegen::GeneratedKernel& many = symbolic.program.kernels[3];
  EXPECT_EQ(many.tactics.chosen, "mma.sync");
  EXPECT_FALSE(many.when.has_value());
  EXPECT_EQ(many.tuning.tile_m, 0);
  for (int64_t b : {2, 7, 16, 17, 32, 33, 64, 65, 300}) {
    const std::vector<uint8_t> runs = codegen::kernels_run_at(symbolic.program.kernels, {{"B", b}, {"S", 128}});
    ASSERT_EQ(runs[0] + runs[1] + runs[2] + runs[3], 1) << "B = " << b;
    EXPECT_EQ(runs[3], b > 64) << "B = " << b;
    if (b > 64) continue;
    const size_t bucket = b <= 16 ? 0 : b <= 32 ? 1 : 2;
    EXPECT_EQ(runs[bucket], 1) << "B = " << b;
    Expected<Graph> sized = g.specialize({{"B", b}, {"S", 128}});
    ASSERT_TRUE(sized.ok()) << sized.error().message;
    const runtime::Planned integer = must_plan(*sized);
    ASSERT_EQ(integer.program.kernels.size(), 1u);
    EXPECT_EQ(integer.program.kernels[0].tactics.chosen, "mma.sync");
    // (the same grid and block; the integer tile fits B to 16 rows, the bucket's is its top: the
    // same tile, and so the same shared memory, where B is within 16 rows of that top)
    const codegen::GeneratedKernel& few = symbolic.program.kernels[bucket];
    const codegen::LaunchGeometry at = codegen::launch_geometry(few, {{"B", b}, {"S", 128}});
    const codegen::LaunchGeometry want = codegen::launch_geometry(integer.program.kernels[0], {});
    EXPECT_EQ(at.grid, want.grid) << "B = " << b;
    EXPECT_EQ(at.block, want.block) << "B = " << b;
    if (b == 7 || b == 17 || b == 32 || b == 64) EXPECT_EQ(at.shared_bytes, want.shared_bytes) << "B = " << b;
  }
}

TEST(SymbolicCompile, NvrtcCompilesTheSymbolicKernelsOnceForEverySize) {
  const Graph g = must_parse(residual_norm("\"B\"", "\"S\"", true));
  const std::string dir = testing::fresh_cache("symbolic-compile").string();
  Expected<Executable> cold = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir});
  ASSERT_TRUE(cold.ok()) << cold.error().message;
  // The kernel cache keys them by their symbolic source: a second compile compiles nothing.
  Expected<Executable> warm = Executable::compile(g, {.arch = "sm_90", .cache_dir = dir, .fail_if_compiling = true});
  ASSERT_TRUE(warm.ok()) << warm.error().message;
  for (const KernelReport& r : warm->report()) EXPECT_TRUE(r.cache_hit);
  // Bytes and workspace for the largest sizes.
  EXPECT_EQ(*cold->binding_bytes("x"), size_t{64} * 4096 * 768 * 2);
  std::filesystem::remove_all(dir);
}

// A launch's sizes are checked against `dims` before anything runs: a
// binding error naming the symbol, the input and the sizes.
TEST(SymbolicCompile, LaunchSizesOutsideTheRangeAreBindingErrors) {
  const Graph g = must_parse(residual_norm("\"B\"", "\"S\"", true));
  Expected<Executable> exe = Executable::compile(g, {.arch = "sm_90", .use_cache = false});
  ASSERT_TRUE(exe.ok()) << exe.error().message;
  // Pointers that are never dereferenced: the checks come first.
  void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
  const std::vector<void*> inputs(4, fake), outputs(2, fake);
  auto launch_error = [&](std::vector<Shape> shapes) {
    Status s = exe->launch(BoundArgs{inputs, outputs, shapes}, nullptr, nullptr);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : s.error().message;
  };
  const int xi = *exe->input_index("x"), ri = *exe->input_index("res"), wi = *exe->input_index("w"),
            bi = *exe->input_index("bias");
  auto shapes = [&](Shape x, Shape res) {
    std::vector<Shape> out(4);
    out[static_cast<size_t>(xi)] = x, out[static_cast<size_t>(ri)] = res;
    out[static_cast<size_t>(wi)] = out[static_cast<size_t>(bi)] = {768};
    return out;
  };
  EXPECT_THAT(launch_error(shapes({65, 8, 768}, {65, 8, 768})),
              ::testing::HasSubstr("binding error: input 'x' [65,8,768] (dimension 0 of [B,S,768]): B = 65 is outside its "
                                   "range (B in [1, 64])"));
  EXPECT_THAT(launch_error(shapes({2, 12, 768}, {2, 12, 768})),
              ::testing::HasSubstr("S = 12 is outside its range (S in [1, 4096], a multiple of 8)"));
  EXPECT_THAT(launch_error(shapes({2, 8, 768}, {3, 8, 768})),
              ::testing::AllOf(::testing::HasSubstr("gives B = 3"), ::testing::HasSubstr("gives B = 2")));
  EXPECT_THAT(launch_error(shapes({2, 8, 512}, {2, 8, 512})), ::testing::HasSubstr("has shape [2,8,512]"));
  EXPECT_THAT(launch_error({}), ::testing::HasSubstr("has symbolic dimensions: bind the inputs' shapes"));
  // run_host reads the sizes from the host tensors, and checks them before it looks for a GPU.
  std::vector<HostTensor> host(4);
  host[static_cast<size_t>(xi)] = HostTensor{{2, 16, 768}, DType::bf16, std::vector<float>(2 * 16 * 768)};
  host[static_cast<size_t>(ri)] = HostTensor{{2, 24, 768}, DType::bf16, std::vector<float>(2 * 24 * 768)};
  host[static_cast<size_t>(wi)] = host[static_cast<size_t>(bi)] = HostTensor{{768}, DType::bf16, std::vector<float>(768)};
  Expected<std::vector<HostTensor>> ran = exe->run_host(host);
  ASSERT_FALSE(ran.ok());
  EXPECT_THAT(ran.error().message, ::testing::HasSubstr("gives S = 24"));
}

}  // namespace
}  // namespace kiln
