// Graphs: load them from the JSON format of graph-format.md, or build them in
// code with GraphBuilder. Both paths run the same construction and checks, so
// they give the same IR and the same graph hash.
//
//   kiln::GraphBuilder b("mlp");
//   auto x = b.input("x", {64, 512}, kiln::DType::bf16);
//   auto w = b.input("w", {512, 256}, kiln::DType::bf16);
//   auto y = b.gelu(b.matmul(x, w));
//   b.output(y);
//   kiln::Expected<kiln::Graph> g = b.build();  // g->hash(), g->to_json()
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/status.h"
#include "kiln/types.h"

namespace kiln {

namespace ir {
class Graph;
}

// A graph input or output as a caller binds it.
struct TensorDesc {
  std::string name;
  Shape shape;
  Strides strides;  // inputs: as declared (contiguous by default); outputs: contiguous
  DType dtype = DType::f32;
};

// An immutable, validated graph. Cheap to copy (shared).
class Graph {
 public:
  static Expected<Graph> from_json(std::string_view text,
                                   std::string_view source_name = "<graph>");
  static Expected<Graph> load(const std::string& path);

  std::string to_json() const;     // canonical JSON; loads back to the same graph
  std::string hash() const;        // 128-bit canonical hash, 32 lowercase hex digits
  std::string to_ir_text() const;  // the IR as `kiln dump --stage ir` prints it
  const std::string& name() const;
  std::vector<TensorDesc> inputs() const;   // in binding order
  std::vector<TensorDesc> outputs() const;  // in the document's order
  int op_count() const;

  // Symbolic dimensions (graph-format.md): inputs() and outputs() show the
  // shapes at every symbol's smallest size. Executable::compile compiles it
  // once for every size where it can (else its error says: specialize() it);
  // run_reference and launches read the sizes from the inputs' shapes.
  struct Dim {
    std::string name;
    int64_t min = 1, max = 1, multiple_of = 1;
  };
  using DimValues = std::map<std::string, int64_t, std::less<>>;
  bool is_symbolic() const;
  std::vector<Dim> dims() const;  // the `dims` table, in the document's order
  // The integer graph at these sizes (every symbol given, each in range);
  // an integer graph takes no sizes and comes back as it is.
  Expected<Graph> specialize(const DimValues& sizes) const;
  // The symbols' values read from the inputs' shapes (binding order),
  // checked to agree and lie in range: a binding error otherwise.
  Expected<DimValues> dims_from_shapes(const std::vector<Shape>& input_shapes) const;

  // kiln's own passes reach the IR through Graph::Internal
  // (compiler/graph_internal.h); it is not part of the API.
  struct Internal;

 private:
  friend struct Internal;
  Graph(std::shared_ptr<const ir::Graph> ir, std::shared_ptr<const ir::Graph> planned)
      : ir_(std::move(ir)), planned_(std::move(planned)) {}
  std::shared_ptr<const ir::Graph> ir_;       // as written: its hash, JSON and IR text
  std::shared_ptr<const ir::Graph> planned_;  // what the planner, codegen and runtime take (may be ir_)
};

// A handle to a tensor of a GraphBuilder: only the builder that made it
// accepts it (any other handle, a made-up id or one of another builder,
// is an error of that builder, never a crash).
struct Tensor {
  int id = -1;
  uint64_t builder = 0;  // which builder made it (0: none; an invalid handle)
  bool valid() const { return id >= 0 && builder != 0; }
};

// A dimension that may be a dim expression (graph-format.md, "Symbolic
// dimensions"): 64, "B", "B*S", "3*S".
using DimSize = std::variant<int64_t, std::string>;

// The value of an op attribute, as its JSON value would be. A size attribute
// may hold dim expressions: reshape's and expand's `shape` as a list of
// DimSize ({"B", -1, 64}), slice's `start`/`end` as a string ("S").
using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<DimSize>>;
using Attrs = std::vector<std::pair<std::string, AttrValue>>;
// An op operand: a tensor or an f32 scalar constant.
using Operand = std::variant<Tensor, double>;

// Builds a graph op by op. Each call is checked at once; the first error is
// kept (later calls do nothing) and returned by build().
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "");
  ~GraphBuilder();
  GraphBuilder(GraphBuilder&&) noexcept;
  GraphBuilder& operator=(GraphBuilder&&) noexcept;

  Tensor input(std::string name, Shape shape, DType dtype, Strides strides = {});

  // Symbolic dimensions: declare each symbol first (before any input), then
  // give shapes that hold them:
  //   b.dim("B", 1, 64);
  //   auto x = b.symbolic_input("x", {"B", "S*4", 64}, kiln::DType::bf16);
  void dim(std::string name, int64_t min = 1, int64_t max = (int64_t{1} << 31) - 1, int64_t multiple_of = 1);
  Tensor symbolic_input(std::string name, std::vector<DimSize> shape, DType dtype, Strides strides = {});

  // Any op of the catalogue, by its graph-format.md name. `out` names the
  // result (a fresh name is made when empty); `dtype` is the op's `dtype` key.
  Tensor op(std::string_view op, std::vector<Operand> in, Attrs attrs = {},
            std::optional<DType> dtype = std::nullopt, std::string out = {});

  // Conveniences for the common ops.
  Tensor add(Operand a, Operand b) { return op("add", {a, b}); }
  Tensor sub(Operand a, Operand b) { return op("sub", {a, b}); }
  Tensor mul(Operand a, Operand b) { return op("mul", {a, b}); }
  Tensor div(Operand a, Operand b) { return op("div", {a, b}); }
  Tensor relu(Tensor x) { return op("relu", {x}); }
  Tensor gelu(Tensor x) { return op("gelu", {x}); }
  Tensor silu(Tensor x) { return op("silu", {x}); }
  Tensor exp(Tensor x) { return op("exp", {x}); }
  Tensor cast(Tensor x, DType dtype) { return op("cast", {x}, {}, dtype); }
  Tensor matmul(Tensor a, Tensor b, Attrs attrs = {}) { return op("matmul", {a, b}, std::move(attrs)); }
  Tensor conv2d(Tensor x, Tensor w, Attrs attrs = {}) { return op("conv2d", {x, w}, std::move(attrs)); }
  Tensor softmax(Tensor x, int64_t axis = -1) { return op("softmax", {x}, {{"axis", axis}}); }
  Tensor reduce_sum(Tensor x, std::vector<int64_t> axes, bool keepdims = false) {
    return op("reduce_sum", {x}, {{"axes", std::move(axes)}, {"keepdims", keepdims}});
  }
  Tensor transpose(Tensor x, std::vector<int64_t> perm) {
    return op("transpose", {x}, {{"perm", std::move(perm)}});
  }
  Tensor reshape(Tensor x, std::vector<int64_t> shape) {
    return op("reshape", {x}, {{"shape", std::move(shape)}});
  }

  void output(Tensor t);
  // The shape shape inference gave `t` (a graph with `dims`: at its
  // symbols' smallest sizes); an error where `t` is not a tensor of this
  // builder or a call before failed.
  Expected<Shape> shape(Tensor t) const;
  // The first error of the calls so far (build() returns it too).
  Status status() const;
  Expected<Graph> build();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
