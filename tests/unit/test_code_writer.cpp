// CodeWriter: generated kernels are laid out by structure, whatever their
// generators wrote at the start of a line; and every generator says what it
// decided.
#include <gtest/gtest.h>

#include "codegen/code_writer.h"
#include "codegen/kernel_codegen.h"
#include "compiler/graph_internal.h"
#include "compiler/planner/planner.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

using codegen::CodeWriter;

TEST(CodeWriter, IndentsByBlocksNotByWhatWasWritten) {
  const std::string written =
      "      extern \"C\" __global__ void k(\n"
      "const void* p0,  // a\n"
      "void* p1  // b (with a parenthesis\n"
      ") {\n"
      "for (int i = 0; i < 4; ++i) {\n"
      "        if (i == 2) {\n"
      "x += \"}{\";  // braces in a literal { and a comment {\n"
      "} else {\n"
      "y = '{';\n"
      "}\n"
      "\n"
      "}\n"
      "}\n";
  EXPECT_EQ(CodeWriter::lay_out(written),
            "extern \"C\" __global__ void k(\n"
            "    const void* p0,  // a\n"
            "    void* p1  // b (with a parenthesis\n"
            ") {\n"
            "  for (int i = 0; i < 4; ++i) {\n"
            "    if (i == 2) {\n"
            "      x += \"}{\";  // braces in a literal { and a comment {\n"
            "    } else {\n"
            "      y = '{';\n"
            "    }\n"
            "\n"
            "  }\n"
            "}\n");
}

TEST(CodeWriter, HangsTheStatementOfABracelessHeader) {
  EXPECT_EQ(CodeWriter::lay_out("{\nif (a)\nfor (int j = 0; j < 2; ++j)\nf(j);\ng();\n#pragma unroll\nfor (;;) {\nh();\n}\n}\n"),
            "{\n  if (a)\n    for (int j = 0; j < 2; ++j)\n      f(j);\n  g();\n  #pragma unroll\n  for (;;) {\n    h();\n  }\n}\n");
  // A statement on the header's own line does not hang the next one.
  EXPECT_EQ(CodeWriter::lay_out("{\nif (a) b();\nc();\nelse\nd();\n}"), "{\n  if (a) b();\n  c();\n  else\n    d();\n}");
}

TEST(CodeWriter, WritesLinesAndBlocks) {
  CodeWriter w;
  w.line("int n = {};", 4);
  w.block("for (int i = 0; i < n; ++i)", [&] { w.lines("f(i);\ng(i);"); });
  EXPECT_EQ(CodeWriter::lay_out(w.take()), "int n = 4;\nfor (int i = 0; i < n; ++i) {\n  f(i);\n  g(i);\n}\n");
}

// What each kernel kind's generator decided, as `kiln dump --stage plan --arch` prints it.
std::string decisions(const char* example, int sm, size_t kernel = 0) {
  Graph g = Graph::load(std::string(KILN_SOURCE_DIR "/examples/") + example).value();
  return codegen::generate_program(ir_of(g), ir::plan_fusion(ir_of(g), {.sm = sm}), sm).kernels.at(kernel).decisions;
}

TEST(CodeWriter, EveryGeneratorSaysWhatItDecided) {
  EXPECT_EQ(decisions("pointwise/scale_shift_gelu.json", 90), "8-element vectors, scalar tail");
  EXPECT_EQ(decisions("norm/add_layer_norm.json", 90), "rows in registers, 8-element chunks, 8 rows a block (a warp each)");
  EXPECT_EQ(decisions("norm/long_row_softmax.json", 90), "two passes over each row");
  EXPECT_EQ(decisions("reduction/mean_variance_columns.json", 90),
            "columns: a block of 32 column threads (4-element vectors) x 8 row lanes, 4 splits");
  EXPECT_EQ(decisions("held_rows/rms_norm_as_llama_writes_it.json", 90),
            "held rows: 1 passes, the row in registers, 32 threads, 8-element chunks");
  EXPECT_EQ(decisions("attention/sdpa_causal_gqa.json", 90),
            "flash attention (TMA + wgmma): 128 query rows x 128 keys a tile, 4 stages, head dim 64 as 64, 2 consumer "
            "warpgroups, causal tiles skipped, mask on the diagonal only, registers 40/232, a block per query tile");
  EXPECT_EQ(decisions("attention/sdpa_causal_gqa.json", 80),
            "flash attention (mma.sync): 64 query rows x 64 keys a tile, 128 threads");
  EXPECT_EQ(decisions("attention/sdpa_decode_gqa.json", 90),
            "flash decoding: 4 query rows (4 heads x 1 queries) a block, 2 chunks of 1024 keys merged by the last block");
  // (f32 q, k, v: matmuls and a softmax (sdpa_as_matmuls.h). Written-out attention is an sdpa by now: f16
  // attention_decomposed is flash.)
  EXPECT_EQ(decisions("attention/sdpa_bool_mask.json", 90),
            "SIMT f32 64x64x16 tiles; epilogue: stores direct, row partials for o.reduce_max5");
  EXPECT_EQ(decisions("attention/attention_decomposed.json", 90),
            "flash attention (TMA + wgmma): 128 query rows x 128 keys a tile, 4 stages, head dim 32 as 64, 2 consumer "
            "warpgroups, registers 40/232, persistent");
  EXPECT_EQ(decisions("pool/relu_max_pool.json", 90), "a thread per pooled element");
  EXPECT_EQ(decisions("conv/conv_bias_relu.json", 70), "SIMT f32 64x64x16 tiles; epilogue: stores direct");
}

}  // namespace
}  // namespace kiln
