// Depthwise conv graphs for the tests of the depthwise_conv kernel: the CPU
// tests (planning, tiles, NVRTC for sm_80 and sm_90: test_depthwise.cpp)
// and the GPU tests against the reference (tests/gpu/test_depthwise.cpp)
// take the same list.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

namespace kiln::testing {

// A depthwise conv2d (NHWC, groups = C) or a grouped one (groups of
// group_in input channels), `multiplier` output channels a group, and what
// follows it.
struct DepthwiseCase {
  int64_t n = 2, h = 9, w = 11, c = 16;
  int64_t r = 3, s = 3, multiplier = 1;
  int64_t group_in = 1;
  int64_t stride = 1, padding = 1, dilation = 1;
  std::string dtype = "bf16";
  std::string precision;  // the conv's `precision` ("": the default)
  // none | bias | bn_relu6 | bias_silu | bias_gelu | hardswish | residual (x + conv, stride 1, same size) |
  // two_outputs (the conv's result and relu of it) | sliced_input (x is a slice of a wider tensor's channels) |
  // nchw_input (x is an NCHW input transposed to NHWC)
  std::string epilogue = "bias";

  std::string name() const {
    return fmt::format("n{} {}x{}x{} {}x{} m{}{} s{} p{} d{} {}{} {}", n, h, w, c, r, s, multiplier,
                       group_in == 1 ? "" : fmt::format(" g{}", group_in), stride, padding, dilation, dtype,
                       precision.empty() ? "" : "/" + precision, epilogue);
  }

  std::string json() const {
    const int64_t groups = c / group_in, k = groups * multiplier;
    std::string inputs, ops, outputs = "\"y\"";
    const std::string conv_in = epilogue == "sliced_input" || epilogue == "nchw_input" ? "xv" : "x";
    if (epilogue == "sliced_input") {
      inputs += fmt::format(R"("x": {{"shape": [{}, {}, {}, {}], "dtype": "{}"}},)", n, h, w, c + 3, dtype);
      ops += fmt::format(R"({{"op": "slice", "in": ["x"], "out": "xv", "axis": 3, "start": 1, "end": {}}},)", c + 1);
    } else if (epilogue == "nchw_input") {
      inputs += fmt::format(R"("x": {{"shape": [{}, {}, {}, {}], "dtype": "{}"}},)", n, c, h, w, dtype);
      ops += R"({"op": "transpose", "in": ["x"], "out": "xv", "perm": [0, 2, 3, 1]},)";
    } else {
      inputs += fmt::format(R"("x": {{"shape": [{}, {}, {}, {}], "dtype": "{}"}},)", n, h, w, c, dtype);
    }
    inputs += fmt::format(R"("w": {{"shape": [{}, {}, {}, {}], "dtype": "{}"}})", k, r, s, group_in, dtype);
    const std::string precision_attr = precision.empty() ? "" : fmt::format(R"(, "precision": "{}")", precision);
    ops += fmt::format(R"({{"op": "conv2d", "in": ["{}", "w"], "out": "c", "stride": [{}, {}], "padding": [{}, {}], )"
                       R"("dilation": [{}, {}], "groups": {}{}}})",
                       conv_in, stride, stride, padding, padding, dilation, dilation, groups, precision_attr);
    auto channel_input = [&](const char* name, const char* type) {
      inputs += fmt::format(R"(, "{}": {{"shape": [{}], "dtype": "{}"}})", name, k, type);
    };
    const std::string out = fmt::format(R"("dtype": "{}")", dtype);
    if (epilogue == "none") {
      ops += R"(, {"op": "identity", "in": ["c"], "out": "y", )" + out + "}";
    } else if (epilogue == "bias" || epilogue == "sliced_input" || epilogue == "nchw_input") {
      channel_input("b", dtype.c_str());
      ops += R"(, {"op": "add", "in": ["c", "b"], "out": "y", )" + out + "}";
    } else if (epilogue == "bn_relu6") {
      for (const char* p : {"mean", "var", "gamma", "beta"}) channel_input(p, "f32");
      ops += R"(, {"op": "batch_norm", "in": ["c", "mean", "var", "gamma", "beta"], "out": "bn"})";
      ops += R"(, {"op": "clamp", "in": ["bn"], "out": "y", "min": 0.0, "max": 6.0, )" + out + "}";
    } else if (epilogue == "bias_silu" || epilogue == "bias_gelu") {
      channel_input("b", "f32");
      ops += R"(, {"op": "add", "in": ["c", "b"], "out": "h"})";
      ops += fmt::format(R"(, {{"op": "{}", "in": ["h"], "out": "y", {}}})", epilogue == "bias_silu" ? "silu" : "gelu", out);
    } else if (epilogue == "hardswish") {
      channel_input("b", "f32");
      ops += R"(, {"op": "add", "in": ["c", "b"], "out": "h"}, {"op": "add", "in": ["h", 3.0], "out": "h3"},)"
             R"( {"op": "clamp", "in": ["h3"], "out": "gate", "min": 0.0, "max": 6.0},)"
             R"( {"op": "mul", "in": ["h", "gate"], "out": "hg"}, {"op": "mul", "in": ["hg", 0.16666667], "out": "y", )" +
             out + "}";
    } else if (epilogue == "residual") {
      ops += R"(, {"op": "add", "in": ["c", "x"], "out": "y", )" + out + "}";
    } else if (epilogue == "two_outputs") {
      ops += R"(, {"op": "relu", "in": ["c"], "out": "y", )" + out + "}";
      outputs = "\"c\", \"y\"";
    }
    return fmt::format(R"({{"kiln": 1, "name": "depthwise", "inputs": {{{}}}, "ops": [{}], "outputs": [{}]}})", inputs, ops,
                       outputs);
  }
};

// The shapes the kernel distinguishes: odd heights and widths, padding 0
// to r/2, stride 2, dilation 2, multipliers 2 and 3, channels not a
// multiple of 8 (and fewer than a block's), batch 1, partial tiles, every
// dtype, precision rounding of f32, the epilogues, inputs through views.
inline std::vector<DepthwiseCase> depthwise_cases() {
  std::vector<DepthwiseCase> cases;
  auto add = [&](DepthwiseCase c) { cases.push_back(std::move(c)); };
  for (const char* dtype : {"bf16", "f16", "f32"}) {
    add({.n = 2, .h = 17, .w = 15, .c = 96, .dtype = dtype, .epilogue = "bn_relu6"});
    add({.n = 1, .h = 13, .w = 11, .c = 40, .r = 5, .s = 5, .stride = 2, .padding = 2, .dtype = dtype, .epilogue = "bias_silu"});
    add({.n = 2, .h = 14, .w = 15, .c = 24, .r = 7, .s = 7, .padding = 3, .dtype = dtype, .epilogue = "bias"});
    add({.n = 1, .h = 9, .w = 11, .c = 24, .multiplier = 2, .padding = 2, .dilation = 2, .dtype = dtype, .epilogue = "hardswish"});
    add({.n = 2, .h = 7, .w = 9, .c = 12, .stride = 2, .padding = 0, .dtype = dtype, .epilogue = "bias"});  // C % 8 != 0
    add({.n = 1, .h = 5, .w = 7, .c = 3, .padding = 1, .dtype = dtype, .epilogue = "none"});               // C < 8
    add({.n = 2, .h = 11, .w = 11, .c = 32, .dtype = dtype, .epilogue = "residual"});
    add({.n = 1, .h = 10, .w = 13, .c = 16, .r = 5, .s = 5, .padding = 1, .dtype = dtype, .epilogue = "two_outputs"});
    add({.n = 1, .h = 9, .w = 9, .c = 16, .dtype = dtype, .epilogue = "sliced_input"});
    add({.n = 2, .h = 8, .w = 7, .c = 16, .dtype = dtype, .epilogue = "nchw_input"});
  }
  // Multipliers: 3 (a thread's channels x 3), 8 (one input channel a thread).
  add({.n = 1, .h = 9, .w = 10, .c = 16, .multiplier = 3, .dtype = "bf16", .epilogue = "bias"});
  add({.n = 1, .h = 6, .w = 7, .c = 10, .multiplier = 8, .stride = 2, .dtype = "f16", .epilogue = "bias_gelu"});
  // Padding 0 to r/2 of a 7x7 filter; stride 2 with dilation 2; a 1x1 image; non-square filters.
  for (int64_t pad : {0, 1, 2}) add({.n = 1, .h = 15, .w = 17, .c = 64, .r = 7, .s = 7, .padding = pad, .epilogue = "bias"});
  add({.n = 2, .h = 19, .w = 21, .c = 32, .stride = 2, .padding = 2, .dilation = 2, .epilogue = "bn_relu6"});
  add({.n = 3, .h = 1, .w = 1, .c = 48, .epilogue = "bias"});
  add({.n = 1, .h = 12, .w = 9, .c = 16, .r = 1, .s = 5, .padding = 1, .epilogue = "bias"});
  add({.n = 1, .h = 9, .w = 12, .c = 16, .r = 3, .s = 1, .padding = 1, .epilogue = "bias"});
  // f32 operands rounded to the precision; wide channels with partial channel blocks.
  add({.n = 1, .h = 9, .w = 9, .c = 48, .dtype = "f32", .precision = "tf32", .epilogue = "bias"});
  add({.n = 1, .h = 9, .w = 9, .c = 48, .dtype = "f32", .precision = "bf16", .epilogue = "bn_relu6"});
  add({.n = 1, .h = 28, .w = 28, .c = 200, .epilogue = "bn_relu6"});
  add({.n = 1, .h = 30, .w = 29, .c = 72, .r = 5, .s = 5, .padding = 2, .epilogue = "bias_silu"});
  // Grouped: groups of 2, 4 and 8 input channels (one 16-byte load), their
  // outputs 2 to 8 a group; ResNeXt's 4 x 4 and 8 x 8 with batch norm,
  // stride 2; C not a multiple of 8; views; f32 (groups of at most 4).
  add({.n = 2, .h = 14, .w = 13, .c = 128, .multiplier = 4, .group_in = 4, .epilogue = "bn_relu6"});
  add({.n = 1, .h = 15, .w = 15, .c = 256, .multiplier = 8, .group_in = 8, .stride = 2, .epilogue = "bias"});
  add({.n = 2, .h = 9, .w = 11, .c = 64, .multiplier = 8, .group_in = 8, .dtype = "f16", .epilogue = "residual"});
  add({.n = 1, .h = 10, .w = 13, .c = 64, .r = 5, .s = 5, .multiplier = 8, .group_in = 8, .padding = 2, .epilogue = "two_outputs"});
  add({.n = 1, .h = 9, .w = 10, .c = 24, .multiplier = 3, .group_in = 2, .padding = 2, .dilation = 2, .dtype = "f32",
       .epilogue = "hardswish"});
  add({.n = 2, .h = 7, .w = 9, .c = 40, .multiplier = 4, .group_in = 4, .dtype = "f32", .precision = "tf32", .epilogue = "bias"});
  add({.n = 1, .h = 8, .w = 9, .c = 12, .multiplier = 2, .group_in = 4, .epilogue = "sliced_input"});
  add({.n = 2, .h = 8, .w = 7, .c = 16, .multiplier = 2, .group_in = 2, .epilogue = "nchw_input"});
  add({.n = 1, .h = 6, .w = 5, .c = 32, .multiplier = 1, .group_in = 8, .epilogue = "none"});
  return cases;
}

}  // namespace kiln::testing
