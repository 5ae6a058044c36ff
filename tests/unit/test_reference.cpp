// The reference interpreter against hand-worked values, and conv/sdpa against
// direct loops written independently here.
#include <cmath>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "compiler/numerics.h"
#include "tests/unit/test_helpers.h"

namespace kiln {
namespace {

using testing::f32;
using testing::must_parse;
using testing::must_run;
using testing::one_op;

std::vector<float> run_one(const std::string& fields, const std::vector<HostTensor>& inputs) {
  std::vector<std::string> shapes;
  for (const HostTensor& t : inputs) shapes.push_back(to_string(t.shape));
  Graph g = must_parse(one_op(fields, shapes));
  std::vector<HostTensor> out = must_run(g, inputs);
  return out.empty() ? std::vector<float>{} : out[0].values;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tolerance = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tolerance) << "at " << i;
}

// expand, slice and concat: Python's and NumPy's semantics on small tensors.
TEST(Reference, ExpandSliceConcat) {
  const HostTensor x = f32({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(run_one(R"("op": "expand", "in": ["a"], "shape": [2, 2, -1])", {x}),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(run_one(R"("op": "expand", "in": ["a"], "shape": [2, 3, 2])", {f32({2, 3, 1}, {0, 1, 2, 3, 4, 5})}),
            (std::vector<float>{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_EQ(run_one(R"("op": "slice", "in": ["a"], "axis": 1, "start": -2)", {x}), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(run_one(R"("op": "slice", "in": ["a"], "axis": -1, "start": 0, "end": 100, "step": 2)", {x}),
            (std::vector<float>{0, 2, 3, 5}));
  EXPECT_EQ(run_one(R"("op": "slice", "in": ["a"], "axis": 0, "start": 1, "end": 2)", {x}), (std::vector<float>{3, 4, 5}));
  const HostTensor y = f32({2, 1}, {9, 8});
  EXPECT_EQ(run_one(R"("op": "concat", "in": ["a", "b", "c"], "axis": 1)", {x, y, y}),
            (std::vector<float>{0, 1, 2, 9, 9, 3, 4, 5, 8, 8}));
  EXPECT_EQ(run_one(R"("op": "concat", "in": ["a", "b"], "axis": 0)", {x, f32({1, 3}, {7, 7, 7})}),
            (std::vector<float>{0, 1, 2, 3, 4, 5, 7, 7, 7}));
}

// A slice spelled with its defaults, or with ends past the axis, is the same graph.
TEST(Reference, SliceDefaultsHashAlike) {
  const Graph a = must_parse(one_op(R"("op": "slice", "in": ["a"], "axis": 1, "start": 2)", {"[4,8]"}));
  const Graph b = must_parse(one_op(R"("op": "slice", "in": ["a"], "axis": -1, "start": -6, "end": 99, "step": 1)", {"[4,8]"}));
  EXPECT_EQ(a.hash(), b.hash());
  const Graph c = must_parse(one_op(R"("op": "slice", "in": ["a"], "axis": 1, "start": 3)", {"[4,8]"}));
  EXPECT_NE(a.hash(), c.hash());
}

TEST(Reference, UnaryFunctions) {
  const HostTensor x = f32({4}, {-2.0f, -0.5f, 0.0f, 1.0f});
  expect_near(run_one(R"("op": "relu", "in": ["a"])", {x}), {0, 0, 0, 1});
  expect_near(run_one(R"("op": "leaky_relu", "in": ["a"], "alpha": 0.1)", {x}), {-0.2f, -0.05f, 0, 1});
  expect_near(run_one(R"("op": "gelu", "in": ["a"])", {x}), {-0.0455003f, -0.1542687f, 0, 0.8413447f});
  expect_near(run_one(R"("op": "gelu_tanh", "in": ["a"])", {x}), {-0.0454023f, -0.1542859f, 0, 0.8411920f});
  expect_near(run_one(R"("op": "silu", "in": ["a"])", {x}), {-0.2384058f, -0.1887703f, 0, 0.7310586f});
  expect_near(run_one(R"("op": "sigmoid", "in": ["a"])", {x}), {0.1192029f, 0.3775407f, 0.5f, 0.7310586f});
  expect_near(run_one(R"("op": "softplus", "in": ["a"])", {x}), {0.1269280f, 0.4740770f, 0.6931472f, 1.3132617f});
  expect_near(run_one(R"("op": "square", "in": ["a"])", {x}), {4, 0.25f, 0, 1});
  expect_near(run_one(R"("op": "clamp", "in": ["a"], "min": -1, "max": 0.5)", {x}), {-1, -0.5f, 0, 0.5f});
  expect_near(run_one(R"("op": "clamp", "in": ["a"], "max": -1)", {x}), {-2, -1, -1, -1});
  expect_near(run_one(R"("op": "erf", "in": ["a"])", {x}), {-0.9953223f, -0.5204999f, 0, 0.8427008f});
  const HostTensor p = f32({3}, {0.25f, 1.0f, 4.0f});
  expect_near(run_one(R"("op": "rsqrt", "in": ["a"])", {p}), {2, 1, 0.5f});
  expect_near(run_one(R"("op": "log", "in": ["a"])", {p}), {-1.3862944f, 0, 1.3862944f});
  expect_near(run_one(R"("op": "reciprocal", "in": ["a"])", {p}), {4, 1, 0.25f});
}

TEST(Reference, NanPropagatesThroughMaxLikeOps) {
  const HostTensor x = f32({2}, {NAN, 1.0f});
  EXPECT_TRUE(std::isnan(run_one(R"("op": "relu", "in": ["a"])", {x})[0]));
  EXPECT_TRUE(std::isnan(run_one(R"("op": "maximum", "in": ["a", 0])", {x})[0]));
  EXPECT_TRUE(std::isnan(run_one(R"("op": "reduce_max", "in": ["a"])", {x})[0]));
}

TEST(Reference, BinaryBroadcastCompareWhere) {
  const HostTensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor b = f32({3}, {10, 20, 30});
  expect_near(run_one(R"("op": "add", "in": ["a", "b"])", {a, b}), {11, 22, 33, 14, 25, 36});
  expect_near(run_one(R"("op": "sub", "in": ["b", "a"])", {a, b}), {9, 18, 27, 6, 15, 24});
  expect_near(run_one(R"("op": "pow", "in": ["a", 2])", {a}), {1, 4, 9, 16, 25, 36});
  expect_near(run_one(R"("op": "div", "in": [1, "a"])", {a}), {1, 0.5f, 1.0f / 3, 0.25f, 0.2f, 1.0f / 6});
  expect_near(run_one(R"("op": "ge", "in": ["a", 3])", {a}), {0, 0, 1, 1, 1, 1});
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [2,3], "dtype": "f32"}},
    "ops": [{"op": "gt", "in": ["a", 3.5], "out": "m"}, {"op": "where", "in": ["m", "a", -1], "out": "y"},
            {"op": "cast", "in": ["m"], "out": "c", "dtype": "f32"}], "outputs": ["y", "c", "m"]})");
  auto out = must_run(g, {a});
  expect_near(out[0].values, {-1, -1, -1, 4, 5, 6});
  expect_near(out[1].values, {0, 0, 0, 1, 1, 1});
  EXPECT_EQ(out[2].dtype, DType::boolean);
}

TEST(Reference, Reductions) {
  const HostTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_near(run_one(R"("op": "reduce_sum", "in": ["a"], "axes": [1])", {x}), {6, 15});
  expect_near(run_one(R"("op": "reduce_sum", "in": ["a"], "axes": [0])", {x}), {5, 7, 9});
  expect_near(run_one(R"("op": "reduce_mean", "in": ["a"])", {x}), {3.5f});
  expect_near(run_one(R"("op": "reduce_max", "in": ["a"], "axes": [-1], "keepdims": true)", {x}), {3, 6});
  expect_near(run_one(R"("op": "reduce_min", "in": ["a"], "axes": [0])", {x}), {1, 2, 3});
}

TEST(Reference, SoftmaxAndLogSoftmax) {
  const HostTensor x = f32({2, 3}, {1, 2, 3, 0, 0, 0});
  expect_near(run_one(R"("op": "softmax", "in": ["a"])", {x}),
              {0.0900306f, 0.2447285f, 0.6652409f, 1 / 3.0f, 1 / 3.0f, 1 / 3.0f});
  expect_near(run_one(R"("op": "log_softmax", "in": ["a"])", {x}),
              {-2.4076059f, -1.4076059f, -0.4076059f, -1.0986123f, -1.0986123f, -1.0986123f});
  expect_near(run_one(R"("op": "softmax", "in": ["a"], "axis": 0)", {x}),
              {0.7310586f, 0.8807971f, 0.9525741f, 0.2689414f, 0.1192029f, 0.0474259f});
}

TEST(Reference, LayerNormRmsNormBatchNorm) {
  const HostTensor x = f32({1, 4}, {1, 2, 3, 4});
  const float inv = 1.0f / std::sqrt(1.25f + 1e-5f);
  expect_near(run_one(R"("op": "layer_norm", "in": ["a"])", {x}), {-1.5f * inv, -0.5f * inv, 0.5f * inv, 1.5f * inv});
  expect_near(run_one(R"("op": "layer_norm", "in": ["a", "b", "c"])", {x, f32({4}, {1, 2, 1, 2}), f32({4}, {0, 0, 1, 1})}),
              {-1.5f * inv, -1.0f * inv, 0.5f * inv + 1, 3.0f * inv + 1});
  const float rms = 1.0f / std::sqrt(7.5f + 1e-6f);
  expect_near(run_one(R"("op": "rms_norm", "in": ["a"])", {x}), {rms, 2 * rms, 3 * rms, 4 * rms});
  // batch_norm over channels of [2 samples, 2 channels] (axis -1).
  const HostTensor y = f32({2, 2}, {1, 10, 3, 20});
  expect_near(run_one(R"("op": "batch_norm", "in": ["a", "b", "c", "d", "e"], "eps": 0)",
                      {y, f32({2}, {1, 10}), f32({2}, {4, 25}), f32({2}, {2, 1}), f32({2}, {0, 1})}),
              {0, 1, 2, 3});
}

TEST(Reference, GroupNorm) {
  // [N=1, C=4, L=2] with channel axis 1, two groups of two channels.
  const HostTensor x = f32({1, 4, 2}, {1, 2, 3, 4, 10, 10, 10, 14});
  std::vector<float> out = run_one(R"("op": "group_norm", "in": ["a"], "groups": 2, "axis": 1, "eps": 0)", {x});
  // group 0: {1,2,3,4}: mean 2.5, var 1.25; group 1: {10,10,10,14}: mean 11, var 3.
  const float i0 = 1 / std::sqrt(1.25f), i1 = 1 / std::sqrt(3.0f);
  expect_near(out, {-1.5f * i0, -0.5f * i0, 0.5f * i0, 1.5f * i0, -i1, -i1, -i1, 3 * i1});
}

TEST(Reference, MatmulWithBatchBroadcasting) {
  const HostTensor a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  const HostTensor b = f32({3, 2}, {7, 8, 9, 10, 11, 12});
  expect_near(run_one(R"("op": "matmul", "in": ["a", "b"])", {a, b}), {58, 64, 139, 154});
  // [2,1,2,2] x [3,2,2] -> [2,3,2,2]; check one block by hand.
  const HostTensor batched_a = f32({2, 1, 2, 2}, {1, 0, 0, 1, 2, 0, 0, 2});
  const HostTensor batched_b = f32({3, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  std::vector<float> out = run_one(R"("op": "matmul", "in": ["a", "b"])", {batched_a, batched_b});
  ASSERT_EQ(out.size(), 24u);
  expect_near({out.begin(), out.begin() + 4}, {1, 2, 3, 4});       // I x b[0]
  expect_near({out.begin() + 20, out.end()}, {18, 20, 22, 24});    // 2I x b[2]
}

TEST(Reference, MatmulPrecisionRoundsF32OperandsOnly) {
  const float x = 1.0f + 0x1.0p-12f;  // not representable in bf16 or tf32
  const HostTensor a = f32({1, 1}, {x});
  const HostTensor b = f32({1, 1}, {1.0f});
  EXPECT_EQ(run_one(R"("op": "matmul", "in": ["a", "b"])", {a, b})[0], x);
  EXPECT_EQ(run_one(R"("op": "matmul", "in": ["a", "b"], "precision": "bf16")", {a, b})[0], 1.0f);
  EXPECT_EQ(run_one(R"("op": "matmul", "in": ["a", "b"], "precision": "tf32")", {a, b})[0], 1.0f);
}

// Direct NCHW convolution, written independently of the interpreter's NHWC loop.
std::vector<float> naive_conv_nchw(const std::vector<float>& x, const Shape& xs, const std::vector<float>& w,
                                   const Shape& ws, int stride, int pad, int dil, int groups, Shape& out_shape) {
  const int64_t n = xs[0], c = xs[1], h = xs[2], wd = xs[3], k = ws[0], cg = ws[1], r = ws[2], s = ws[3];
  const int64_t p = (h + 2 * pad - dil * (r - 1) - 1) / stride + 1, q = (wd + 2 * pad - dil * (s - 1) - 1) / stride + 1;
  out_shape = {n, k, p, q};
  std::vector<float> out(static_cast<size_t>(n * k * p * q), 0.0f);
  for (int64_t ni = 0; ni < n; ++ni)
    for (int64_t ki = 0; ki < k; ++ki)
      for (int64_t pi = 0; pi < p; ++pi)
        for (int64_t qi = 0; qi < q; ++qi) {
          double acc = 0;
          const int64_t g = ki / (k / groups);
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ri = 0; ri < r; ++ri)
              for (int64_t si = 0; si < s; ++si) {
                const int64_t hi = pi * stride + ri * dil - pad, wi = qi * stride + si * dil - pad;
                if (hi < 0 || wi < 0 || hi >= h || wi >= wd) continue;
                acc += x[static_cast<size_t>(((ni * c + g * cg + ci) * h + hi) * wd + wi)] *
                       static_cast<double>(w[static_cast<size_t>(((ki * cg + ci) * r + ri) * s + si)]);
              }
          out[static_cast<size_t>(((ni * k + ki) * p + pi) * q + qi)] = static_cast<float>(acc);
        }
  (void)c;
  return out;
}

TEST(Reference, Conv2dMatchesDirectLoopInBothLayouts) {
  struct Case { Shape xs, ws; int stride, pad, dil, groups; };
  for (const Case& cs : {Case{{2, 4, 7, 6}, {6, 4, 3, 3}, 1, 1, 1, 1}, Case{{1, 6, 9, 8}, {4, 3, 3, 2}, 2, 1, 2, 2},
                         Case{{1, 3, 5, 5}, {2, 3, 1, 1}, 1, 0, 1, 1}}) {
    const std::vector<float> x = random_values(static_cast<size_t>(element_count(cs.xs)), 1);
    const std::vector<float> w = random_values(static_cast<size_t>(element_count(cs.ws)), 2);
    Shape out_shape;
    const std::vector<float> want = naive_conv_nchw(x, cs.xs, w, cs.ws, cs.stride, cs.pad, cs.dil, cs.groups, out_shape);
    const std::string attrs = fmt::format(R"("stride": [{0}, {0}], "padding": [{1}, {1}], "dilation": [{2}, {2}], "groups": {3})",
                                          cs.stride, cs.pad, cs.dil, cs.groups);
    expect_near(run_one(R"("op": "conv2d", "in": ["a", "b"], "layout": "NCHW", )" + attrs, {f32(cs.xs, x), f32(cs.ws, w)}),
                want);
    // The same convolution in NHWC: transpose inputs, compare transposed output.
    auto to_nhwc = [](const std::vector<float>& v, const Shape& s) {
      std::vector<float> t(v.size());
      for (int64_t a = 0; a < s[0]; ++a)
        for (int64_t b = 0; b < s[1]; ++b)
          for (int64_t c = 0; c < s[2]; ++c)
            for (int64_t d = 0; d < s[3]; ++d)
              t[static_cast<size_t>(((a * s[2] + c) * s[3] + d) * s[1] + b)] = v[static_cast<size_t>(((a * s[1] + b) * s[2] + c) * s[3] + d)];
      return t;
    };
    const Shape xs_nhwc{cs.xs[0], cs.xs[2], cs.xs[3], cs.xs[1]}, ws_nhwc{cs.ws[0], cs.ws[2], cs.ws[3], cs.ws[1]};
    expect_near(run_one(R"("op": "conv2d", "in": ["a", "b"], )" + attrs,
                        {f32(xs_nhwc, to_nhwc(x, cs.xs)), f32(ws_nhwc, to_nhwc(w, cs.ws))}),
                to_nhwc(want, out_shape));
  }
}

TEST(Reference, Pooling) {
  const HostTensor x = f32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  expect_near(run_one(R"("op": "max_pool2d", "in": ["a"], "layout": "NCHW", "kernel": [2, 2], "stride": [1, 1])", {x}),
              {5, 6, 8, 9});
  expect_near(run_one(R"("op": "avg_pool2d", "in": ["a"], "layout": "NCHW", "kernel": [2, 2], "stride": [1, 1])", {x}),
              {3, 4, 6, 7});
  // Padding 1 with a 3x3 window: the corner sees 4 real values.
  expect_near(run_one(R"("op": "avg_pool2d", "in": ["a"], "layout": "NCHW", "kernel": [3, 3], "stride": [2, 2],
                         "padding": [1, 1])", {x}),
              {12 / 9.0f, 16 / 9.0f, 24 / 9.0f, 28 / 9.0f});
  expect_near(run_one(R"("op": "avg_pool2d", "in": ["a"], "layout": "NCHW", "kernel": [3, 3], "stride": [2, 2],
                         "padding": [1, 1], "count_include_pad": false)", {x}),
              {3, 4, 6, 7});
  expect_near(run_one(R"("op": "max_pool2d", "in": ["a"], "layout": "NCHW", "kernel": [3, 3], "stride": [2, 2],
                         "padding": [1, 1])", {f32({1, 1, 3, 3}, {-1, -2, -3, -4, -5, -6, -7, -8, -9})}),
              {-1, -2, -4, -5});  // padding is -inf, never the max
}

TEST(Reference, Views) {
  const HostTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_near(run_one(R"("op": "transpose", "in": ["a"], "perm": [1, 0])", {x}), {1, 4, 2, 5, 3, 6});
  expect_near(run_one(R"("op": "reshape", "in": ["a"], "shape": [3, 2])", {x}), {1, 2, 3, 4, 5, 6});
}

// Direct attention for one query row, written independently.
std::vector<float> naive_sdpa(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>* mask, int64_t b, int64_t h, int64_t hkv, int64_t sq,
                              int64_t skv, int64_t d, bool causal) {
  std::vector<float> out(static_cast<size_t>(b * h * sq * d), 0.0f);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t kh = hi / (h / hkv);
        std::vector<double> s(static_cast<size_t>(skv));
        double best = -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e)
            dot += q[static_cast<size_t>(((bi * h + hi) * sq + i) * d + e)] * static_cast<double>(k[static_cast<size_t>(((bi * hkv + kh) * skv + j) * d + e)]);
          dot /= std::sqrt(static_cast<double>(d));
          if (mask) dot += (*mask)[static_cast<size_t>(i * skv + j)];
          if (causal && j > i + skv - sq) dot = -INFINITY;
          s[static_cast<size_t>(j)] = dot;
          best = std::max(best, dot);
        }
        if (best == -INFINITY) continue;
        double total = 0;
        for (double& x : s) total += (x = std::exp(x - best));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < skv; ++j) acc += s[static_cast<size_t>(j)] / total * v[static_cast<size_t>(((bi * hkv + kh) * skv + j) * d + e)];
          out[static_cast<size_t>(((bi * h + hi) * sq + i) * d + e)] = static_cast<float>(acc);
        }
      }
  return out;
}

TEST(Reference, SdpaMatchesDirectLoopWithCausalGqaAndMask) {
  const int64_t b = 2, h = 4, hkv = 2, sq = 3, skv = 5, d = 8;
  const auto q = random_values(static_cast<size_t>(b * h * sq * d), 3);
  const auto k = random_values(static_cast<size_t>(b * hkv * skv * d), 4);
  const auto v = random_values(static_cast<size_t>(b * hkv * skv * d), 5);
  const auto mask = random_values(static_cast<size_t>(sq * skv), 6);
  const std::vector<HostTensor> qkv = {f32({b, h, sq, d}, q), f32({b, hkv, skv, d}, k), f32({b, hkv, skv, d}, v)};
  expect_near(run_one(R"("op": "sdpa", "in": ["a", "b", "c"], "causal": true)", qkv),
              naive_sdpa(q, k, v, nullptr, b, h, hkv, sq, skv, d, true));
  std::vector<HostTensor> with_mask = qkv;
  with_mask.push_back(f32({sq, skv}, mask));
  expect_near(run_one(R"("op": "sdpa", "in": ["a", "b", "c", "d"])", with_mask),
              naive_sdpa(q, k, v, &mask, b, h, hkv, sq, skv, d, false));
}

TEST(Reference, SdpaRowWithEveryKeyMaskedGivesZeros) {
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"q": {"shape": [1,1,2,2], "dtype": "f32"},
    "k": {"shape": [1,1,2,2], "dtype": "f32"}, "v": {"shape": [1,1,2,2], "dtype": "f32"},
    "m": {"shape": [2,2], "dtype": "bool"}},
    "ops": [{"op": "sdpa", "in": ["q", "k", "v", "m"], "out": "y"}], "outputs": ["y"]})");
  HostTensor mask{{2, 2}, DType::boolean, {0, 0, 1, 0}};  // row 0 sees nothing; row 1 sees key 0
  auto out = must_run(g, {f32({1, 1, 2, 2}, {1, 2, 3, 4}), f32({1, 1, 2, 2}, {1, 0, 0, 1}),
                          f32({1, 1, 2, 2}, {5, 6, 7, 8}), mask});
  expect_near(out[0].values, {0, 0, 5, 6});
}

TEST(Reference, RoundingHappensOnlyWhereTheGraphSaysSo) {
  // x/3*3 in f32 returns x (up to f32 rounding); rounding the quotient to bf16
  // (an explicit dtype) loses bits that the multiplication cannot restore.
  const std::string graph = R"({"kiln": 1, "inputs": {"x": {"shape": [1], "dtype": "bf16"}},
    "ops": [{"op": "div", "in": ["x", 3], "out": "q"DTYPE},
            {"op": "mul", "in": ["q", 3], "out": "y", "dtype": "f32"}], "outputs": ["y"]})";
  auto run = [&](const std::string& dtype) {
    std::string text = graph;
    text.replace(text.find("DTYPE"), 5, dtype);
    return must_run(must_parse(text), {HostTensor{{1}, DType::bf16, {1.0f}}})[0].values[0];
  };
  EXPECT_FLOAT_EQ(run(""), 1.0f);
  const float rounded = round_to_bf16(1.0f / 3) * 3;
  EXPECT_EQ(run(R"(, "dtype": "bf16")"), rounded);
  EXPECT_NE(rounded, 1.0f);
}

TEST(Reference, GraphOutputIsRoundedAndReadAsStored) {
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"x": {"shape": [1], "dtype": "bf16"}},
    "ops": [{"op": "div", "in": ["x", 3], "out": "q"},
            {"op": "mul", "in": ["q", 3], "out": "y", "dtype": "f32"}], "outputs": ["y", "q"]})");
  auto out = must_run(g, {HostTensor{{1}, DType::bf16, {1.0f}}});
  EXPECT_EQ(out[1].values[0], round_to_bf16(1.0f / 3));
  EXPECT_EQ(out[0].values[0], round_to_bf16(1.0f / 3) * 3);
}

TEST(Reference, RejectsMismatchedInputs) {
  Graph g = must_parse(one_op(R"("op": "relu", "in": ["a"])", {"[2]"}));
  Expected<std::vector<HostTensor>> out = run_reference(g, {f32({3}, {1, 2, 3})});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.error().message, ::testing::HasSubstr("input 'a': expected f32[2], got f32[3]"));
}

TEST(Reference, ReportsProgressWeighedByWork) {
  // A 64x64x64 matmul (524288 flops) beside a relu of 4096 elements (8192
  // touched): after the matmul nearly all the work is done.
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [64, 64], "dtype": "f32"}, "b": {"shape": [64, 64], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["a", "b"], "out": "c"}, {"op": "relu", "in": ["c"], "out": "y"}],
    "outputs": ["y"]})");
  std::vector<ReferenceProgress> seen;
  Expected<std::vector<HostTensor>> out =
      run_reference(g, {f32({64, 64}, std::vector<float>(4096, 1)), f32({64, 64}, std::vector<float>(4096, 1))},
                    [&](const ReferenceProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(out->at(0).values[0], 64.0f);
  // One report per matmul row (the first before any work), one after each op.
  ASSERT_EQ(seen.size(), 64u + 2u);
  EXPECT_EQ(seen[0].ops_done, 0u);
  EXPECT_EQ(seen[0].work_done, 0.0);
  EXPECT_EQ(seen[32].ops_done, 0u);
  EXPECT_NEAR(seen[32].work_done, 0.5 * 524288 / (524288 + 8192), 1e-9);
  EXPECT_EQ(seen[64].ops_done, 1u);
  EXPECT_EQ(seen[64].op_count, 2u);
  EXPECT_NEAR(seen[64].work_done, 524288.0 / (524288 + 8192), 1e-9);
  EXPECT_EQ(seen[65].ops_done, 2u);
  EXPECT_EQ(seen[65].work_done, 1.0);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].work_done, seen[i - 1].work_done);
}

// A run stops soon after its cancel flag is set: before the next op, or
// within an anchor before its next output row; set from another thread here
// (as the Python binding does on Ctrl-C), or from the progress callback.
TEST(Reference, StopsWhenCancelled) {
  Graph g = must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [64, 64], "dtype": "f32"}, "b": {"shape": [64, 64], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["a", "b"], "out": "c"}, {"op": "relu", "in": ["c"], "out": "y"}],
    "outputs": ["y"]})");
  const std::vector<HostTensor> inputs = {f32({64, 64}, std::vector<float>(4096, 1)), f32({64, 64}, std::vector<float>(4096, 1))};
  std::atomic<bool> cancel{false};
  ASSERT_TRUE(run_reference(g, inputs, nullptr, &cancel).ok());  // unset: runs to the end

  std::vector<ReferenceProgress> seen;
  Expected<std::vector<HostTensor>> out = run_reference(g, inputs, [&](const ReferenceProgress& p) {
    seen.push_back(p);
    if (seen.size() == 10) cancel = true;  // within the matmul, after 10 rows
  }, &cancel);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::Interrupted);
  EXPECT_THAT(out.error().message, ::testing::HasSubstr("interrupted"));
  EXPECT_EQ(seen.size(), 10u);  // not one row more

  // Set before the run: no op starts.
  Expected<std::vector<HostTensor>> never = run_reference(g, inputs, [&](const ReferenceProgress&) { FAIL(); }, &cancel);
  ASSERT_FALSE(never.ok());
  EXPECT_EQ(never.error().code, ErrorCode::Interrupted);

  // From another thread, on a run too long to finish first (a 1024^3 matmul: seconds).
  Graph big = must_parse(R"({"kiln": 1, "inputs": {"a": {"shape": [1024, 1024], "dtype": "f32"}},
    "ops": [{"op": "matmul", "in": ["a", "a"], "out": "y"}], "outputs": ["y"]})");
  cancel = false;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  const auto start = std::chrono::steady_clock::now();
  Expected<std::vector<HostTensor>> stopped = run_reference(big, {f32({1024, 1024}, std::vector<float>(1 << 20, 1))}, nullptr, &cancel);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stopper.join();
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.error().code, ErrorCode::Interrupted);
  EXPECT_LT(seconds, 2.0);  // (the whole run: seconds, more on a loaded machine)
}

}  // namespace
}  // namespace kiln
