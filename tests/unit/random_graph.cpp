#include "tests/unit/random_graph.h"

#include <gtest/gtest.h>

#include <random>

namespace kiln::testing {
namespace {

struct Value {
  Tensor t;
  Shape shape;
  DType dtype;
};

class Generator {
 public:
  Generator(uint64_t seed, const RandomGraphOptions& o) : rng_(seed), o_(o), b_(fmt_name(seed)) {}

  Graph make() {
    const int inputs = pick(1, 3);
    for (int i = 0; i < inputs; ++i) values_.push_back(new_input(random_shape(pick(1, 4)), random_float_dtype()));
    const int ops = pick(1, o_.max_ops);
    for (int i = 0; i < ops; ++i) step();
    // Outputs: the last result, plus some intermediates.
    std::vector<size_t> chosen{values_.size() - 1};
    for (size_t i = inputs; i + 1 < values_.size(); ++i)
      if (chance(0.25)) chosen.push_back(i);
    for (size_t i : chosen) b_.output(values_[i].t);
    Expected<Graph> g = b_.build();
    if (!g) {
      ADD_FAILURE() << "random graph generator made an invalid graph: " << g.error().message;
      return Graph::from_json(R"({"kiln":1,"inputs":{"x":{"shape":[1],"dtype":"f32"}},"ops":[],"outputs":["x"]})").value();
    }
    return std::move(g).value();
  }

 private:
  static std::string fmt_name(uint64_t seed) { return "random_" + std::to_string(seed); }
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  DType random_float_dtype() { return std::array{DType::f32, DType::f16, DType::bf16}[static_cast<size_t>(pick(0, 2))]; }
  Shape random_shape(int rank) {
    Shape s;
    for (int i = 0; i < rank; ++i) s.push_back(chance(0.2) ? 1 : pick(2, static_cast<int>(o_.max_dim)));
    return s;
  }
  Value new_input(Shape shape, DType dtype) {
    Tensor t = b_.input("in" + std::to_string(next_input_++), shape, dtype);
    return {t, shape, dtype};
  }
  const Value& any_float() {
    std::vector<size_t> ok;
    for (size_t i = 0; i < values_.size(); ++i)
      if (values_[i].dtype != DType::boolean) ok.push_back(i);
    // Prefer recent values: chains are what fusion sees most.
    const size_t n = ok.size();
    const size_t k = chance(0.6) ? n - 1 - static_cast<size_t>(pick(0, std::min<int>(1, static_cast<int>(n) - 1)))
                                 : static_cast<size_t>(pick(0, static_cast<int>(n) - 1));
    return values_[ok[k]];
  }
  // A shape that broadcasts with `s` (a suffix with some dims set to 1).
  Shape broadcastable(const Shape& s) {
    Shape out(s.begin() + pick(0, static_cast<int>(s.size())), s.end());
    for (int64_t& d : out)
      if (chance(0.3)) d = 1;
    return out;
  }
  Value add(Tensor t, DType dtype, Shape shape) {
    values_.push_back({t, std::move(shape), dtype});
    return values_.back();
  }
  // rule 3 for tensor operands
  static DType widest(DType a, DType b) {
    if (a == b) return a;
    return DType::f32;
  }

  void step() {
    const Value x = any_float();
    const int family = pick(0, 11);
    Tensor r;
    switch (family) {
      case 0: case 1: {  // unary
        static const char* ops[] = {"neg", "abs", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh",
                                    "exp", "square", "erf", "sin", "softplus", "identity"};
        std::string op = ops[pick(0, 13)];
        if (chance(0.15)) {
          r = b_.op("clamp", {x.t}, {{"min", -0.5}, {"max", 0.75}});
        } else if (chance(0.15)) {
          const DType d = random_float_dtype();
          r = b_.cast(x.t, d);
          add(r, d, x.shape);
          return;
        } else {
          r = b_.op(op, {x.t});
        }
        add(r, x.dtype, x.shape);
        return;
      }
      case 2: case 3: {  // binary with broadcasting, maybe a scalar
        static const char* ops[] = {"add", "sub", "mul", "maximum", "minimum"};
        const std::string op = ops[pick(0, 4)];
        if (chance(0.25)) {
          r = b_.op(op, {x.t, 0.5});
          add(r, x.dtype, x.shape);
          return;
        }
        // Another existing value of a compatible shape, or a new input.
        for (const Value& y : values_)
          if (y.dtype != DType::boolean && &y != &x && y.shape == x.shape && chance(0.5)) {
            r = b_.op(op, {x.t, y.t});
            add(r, widest(x.dtype, y.dtype), x.shape);
            return;
          }
        Value y = new_input(broadcastable(x.shape), random_float_dtype());
        values_.push_back(y);
        if (chance(0.3)) {  // a cheap op on the broadcast operand: its own small domain (the planner recomputes it)
          static const char* cheap[] = {"neg", "abs", "square"};
          y = add(b_.op(cheap[pick(0, 2)], {y.t}), y.dtype, y.shape);
        }
        r = b_.op(op, chance(0.5) ? std::vector<Operand>{x.t, y.t} : std::vector<Operand>{y.t, x.t});
        add(r, widest(x.dtype, y.dtype), x.shape);
        return;
      }
      case 4: {  // comparison + where
        Tensor c = b_.op("gt", {x.t, 0.0});
        if (chance(0.3)) {
          add(c, DType::boolean, x.shape);
          return;
        }
        r = b_.op("where", {c, x.t, -1.0});
        add(r, x.dtype, x.shape);
        return;
      }
      case 5: {  // reduction
        if (x.shape.empty()) return;
        std::vector<int64_t> axes;
        for (size_t d = 0; d < x.shape.size(); ++d)
          if (chance(0.5)) axes.push_back(static_cast<int64_t>(d));
        if (axes.empty()) axes.push_back(static_cast<int64_t>(x.shape.size()) - 1);
        const bool keep = chance(0.5);
        static const char* ops[] = {"reduce_sum", "reduce_mean", "reduce_max", "reduce_min"};
        r = b_.op(ops[pick(0, 3)], {x.t}, {{"axes", axes}, {"keepdims", keep}});
        Shape s;
        for (size_t d = 0; d < x.shape.size(); ++d) {
          const bool reduced = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
          if (!reduced) s.push_back(x.shape[d]);
          else if (keep) s.push_back(1);
        }
        add(r, x.dtype, s);
        if (keep && chance(0.5)) {  // read back over the domain, as a norm written out does
          static const char* back[] = {"sub", "div", "mul"};
          add(b_.op(back[pick(0, 2)], {x.t, r}), x.dtype, x.shape);
        }
        return;
      }
      case 6: {  // normalisations
        if (x.shape.empty()) return;
        const auto rank = static_cast<int64_t>(x.shape.size());
        const int64_t axis = pick(0, static_cast<int>(rank) - 1);
        const int kind = pick(0, 4);
        if (kind == 0) r = b_.op(chance(0.5) ? "softmax" : "log_softmax", {x.t}, {{"axis", axis}});
        if (kind == 1 || kind == 2) {
          Shape ws(x.shape.begin() + axis, x.shape.end());
          const Value w = new_input(ws, x.dtype);
          values_.push_back(w);
          r = kind == 1 ? b_.op("layer_norm", {x.t, w.t}, {{"axis", axis}}) : b_.op("rms_norm", {x.t, w.t}, {{"axis", axis}});
        }
        if (kind == 3) {
          const Value m = new_input({x.shape[static_cast<size_t>(axis)]}, DType::f32);
          const Value v = new_input({x.shape[static_cast<size_t>(axis)]}, DType::f32);
          values_.push_back(m);
          values_.push_back(v);
          r = b_.op("batch_norm", {x.t, m.t, v.t}, {{"axis", axis}});
        }
        if (kind == 4) {
          if (rank < 2 || axis == 0) return;
          const int64_t c = x.shape[static_cast<size_t>(axis)];
          int64_t groups = 1;
          for (int64_t g : {4, 3, 2})
            if (c % g == 0 && chance(0.7)) { groups = g; break; }
          r = b_.op("group_norm", {x.t}, {{"axis", axis}, {"groups", groups}});
        }
        add(r, kind == 3 ? DType::f32 : x.dtype, x.shape);
        return;
      }
      case 7: {  // matmul, x as A (rank >= 2) or a fresh A
        Value a = x;
        if (a.shape.size() < 2) {
          a = new_input({static_cast<int64_t>(pick(2, 8)), a.shape.empty() ? 4 : a.shape.back()}, x.dtype);
          values_.push_back(a);
        }
        const int64_t k = a.shape.back();
        const int64_t n = pick(2, static_cast<int>(o_.max_dim));
        const bool transposed = chance(0.3);
        const Value w = new_input(transposed ? Shape{n, k} : Shape{k, n}, random_float_dtype());
        values_.push_back(w);
        Tensor bt = transposed ? b_.transpose(w.t, {1, 0}) : w.t;
        r = b_.matmul(a.t, bt);
        Shape s = a.shape;
        s.back() = n;
        add(r, widest(a.dtype, w.dtype), s);
        return;
      }
      case 8: {  // conv2d
        const bool nhwc = chance(0.5);
        const int64_t n = pick(1, 2), c = 4 * pick(1, 2), h = pick(3, 7), w = pick(3, 7);
        const Value in = new_input(nhwc ? Shape{n, h, w, c} : Shape{n, c, h, w}, random_float_dtype());
        values_.push_back(in);
        const int64_t k = 4 * pick(1, 2), groups = chance(0.3) ? 2 : 1, kr = pick(1, 3);
        const Value wt = new_input(nhwc ? Shape{k, kr, kr, c / groups} : Shape{k, c / groups, kr, kr}, in.dtype);
        values_.push_back(wt);
        const int64_t pad = kr / 2, stride = pick(1, 2);
        r = b_.conv2d(in.t, wt.t, {{"layout", std::string(nhwc ? "NHWC" : "NCHW")}, {"padding", std::vector<int64_t>{pad, pad}},
                                   {"stride", std::vector<int64_t>{stride, stride}}, {"groups", groups}});
        const int64_t p = (h + 2 * pad - kr) / stride + 1, q = (w + 2 * pad - kr) / stride + 1;
        add(r, in.dtype, nhwc ? Shape{n, p, q, k} : Shape{n, k, p, q});
        return;
      }
      case 9: {  // pooling on a rank-4 value
        if (x.shape.size() != 4 || x.shape[1] < 2 || x.shape[2] < 2) return;
        const bool max = chance(0.5);
        r = b_.op(max ? "max_pool2d" : "avg_pool2d", {x.t}, {{"kernel", std::vector<int64_t>{2, 2}}});
        add(r, x.dtype, {x.shape[0], x.shape[1] / 2, x.shape[2] / 2, x.shape[3]});
        return;
      }
      case 10: {  // views
        if (x.shape.size() >= 2 && chance(0.5)) {
          std::vector<int64_t> perm;
          for (int64_t i = static_cast<int64_t>(x.shape.size()) - 1; i >= 0; --i) perm.push_back(i);
          r = b_.transpose(x.t, perm);
          add(r, x.dtype, Shape(x.shape.rbegin(), x.shape.rend()));
        } else {
          r = b_.reshape(x.t, {-1});
          add(r, x.dtype, {element_count(x.shape)});
        }
        return;
      }
      case 11: {  // attention, written as sdpa or decomposed
        const int64_t bsz = pick(1, 2), heads = 2, s = pick(2, 8), d = 4 * pick(1, 2);
        const DType dt = random_float_dtype();
        const Value q = new_input({bsz, heads, s, d}, dt), k = new_input({bsz, heads, s, d}, dt),
                    v = new_input({bsz, heads, s, d}, dt);
        values_.push_back(q), values_.push_back(k), values_.push_back(v);
        if (chance(0.5)) {
          r = b_.op("sdpa", {q.t, k.t, v.t}, {{"causal", chance(0.5)}});
        } else {
          Tensor sc = b_.mul(b_.matmul(q.t, b_.transpose(k.t, {0, 1, 3, 2})), 0.5);
          r = b_.matmul(b_.softmax(sc), v.t);
        }
        add(r, dt, {bsz, heads, s, d});
        return;
      }
    }
  }

  std::mt19937_64 rng_;
  RandomGraphOptions o_;
  GraphBuilder b_;
  std::vector<Value> values_;
  int next_input_ = 0;
};

}  // namespace

Graph random_graph(uint64_t seed, const RandomGraphOptions& options) { return Generator(seed, options).make(); }

}  // namespace kiln::testing
