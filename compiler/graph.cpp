// The public Graph and GraphBuilder (include/kiln/graph.h) over the IR.
#include "kiln/graph.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "compiler/error.h"
#include "compiler/graph_internal.h"
#include "compiler/graph_construction.h"
#include "compiler/graph_hash.h"
#include "compiler/ir_printer.h"
#include "compiler/json_graph.h"
#include "compiler/specialize.h"

namespace kiln {

Expected<Graph> Graph::from_json(std::string_view text, std::string_view source_name) {
  return detail::catch_errors([&] {
    return Graph::Internal::make(std::make_shared<const ir::Graph>(ir::graph_from_json(text, source_name)));
  });
}

Expected<Graph> Graph::load(const std::string& path) {
  // Non-blocking, so that a FIFO is refused instead of waited on; only a
  // regular file is a graph file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return Error{ErrorCode::InvalidInput, fmt::format("{}: cannot open the file: {}", path, std::strerror(errno))};
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool folder = S_ISDIR(st.st_mode);
    ::close(fd);
    return Error{ErrorCode::InvalidInput,
                 fmt::format("{}: {}, not a graph file", path,
                             folder ? "this is a directory" : "this is not a regular file (a FIFO, device or socket)")};
  }
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Error{ErrorCode::InvalidInput, fmt::format("{}: cannot read the file: {}", path, why)};
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return from_json(text, path);
}

std::string Graph::to_json() const { return ir::graph_to_json(*ir_); }
std::string Graph::hash() const { return ir::graph_hash(*ir_).hex(); }
std::string Graph::to_ir_text() const { return ir::print_ir(*ir_); }
const std::string& Graph::name() const { return ir_->name; }
int Graph::op_count() const { return static_cast<int>(ir_->ops.size()); }

bool Graph::is_symbolic() const { return ir_->is_symbolic(); }

std::vector<Graph::Dim> Graph::dims() const {
  std::vector<Dim> out;
  if (ir_->dims)
    for (const ir::DimSymbol& s : ir_->dims->symbols) out.push_back({s.name, s.min, s.max, s.multiple_of});
  return out;
}

Expected<Graph> Graph::specialize(const DimValues& sizes) const {
  if (!is_symbolic() && sizes.empty()) return *this;
  return detail::catch_errors([&] {
    return Graph::Internal::make(std::make_shared<const ir::Graph>(ir::specialize(*ir_, {sizes.begin(), sizes.end()})));
  });
}

Expected<Graph::DimValues> Graph::dims_from_shapes(const std::vector<Shape>& input_shapes) const {
  return detail::catch_errors([&] {
    KILN_USER_CHECK(input_shapes.size() == ir_->inputs.size(), "graph {}: {} input shapes given for its {} inputs",
                    detail::quoted(ir_->name), input_shapes.size(), ir_->inputs.size());
    const ir::DimValues values = ir::dim_values_from_shapes(*ir_, input_shapes);
    return DimValues(values.begin(), values.end());
  });
}

static TensorDesc describe(const ir::Tensor& t) { return {t.name, t.shape, t.strides, t.dtype}; }

std::vector<TensorDesc> Graph::inputs() const {
  std::vector<TensorDesc> out;
  for (ir::TensorId id : ir_->inputs) out.push_back(describe(ir_->tensor(id)));
  return out;
}

std::vector<TensorDesc> Graph::outputs() const {
  std::vector<TensorDesc> out;
  for (ir::TensorId id : ir_->outputs) out.push_back(describe(ir_->tensor(id)));
  return out;
}

// Each builder's handles carry its serial, so that a handle of another
// builder (or a made-up one) is refused instead of read as one of its own.
static uint64_t next_builder_serial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

struct GraphBuilder::Impl {
  explicit Impl(std::string name) : graph(std::move(name)) {}
  ir::GraphConstructor graph;
  const uint64_t serial = next_builder_serial();
  std::vector<bool> handed_out;  // by tensor id: a handle this builder returned (not a scalar's constant)
  std::optional<Error> error;
  std::vector<std::string> outputs;
  int next_name = 0;

  template <class F>
  Tensor record(F&& body) {
    if (error) return {};
    Expected<ir::TensorId> id = detail::catch_errors(body);
    if (!id) {
      error = id.error();
      return {};
    }
    const auto slot = static_cast<size_t>(*id);
    if (handed_out.size() <= slot) handed_out.resize(slot + 1, false);
    handed_out[slot] = true;
    return Tensor{*id, serial};
  }

  // The name of the tensor `t` stands for; a UserError naming `what` when
  // `t` is not a handle this builder returned.
  const std::string& name_of(const Tensor& t, const std::string& what) const {
    if (t.builder != serial || t.id < 0 || static_cast<size_t>(t.id) >= handed_out.size() ||
        !handed_out[static_cast<size_t>(t.id)])
      throw_user_error(fmt::format("{}: not a tensor of this builder (id {}: {})", what, t.id,
                                   t.builder == serial ? "an id it never returned"
                                   : t.builder == 0   ? "a handle no builder returned"
                                                      : "a handle of another builder"));
    return graph.name_of(t.id);
  }
};

GraphBuilder::GraphBuilder(std::string name) : impl_(std::make_unique<Impl>(std::move(name))) {}
GraphBuilder::~GraphBuilder() = default;
GraphBuilder::GraphBuilder(GraphBuilder&&) noexcept = default;
GraphBuilder& GraphBuilder::operator=(GraphBuilder&&) noexcept = default;

Tensor GraphBuilder::input(std::string name, Shape shape, DType dtype, Strides strides) {
  return impl_->record([&] {
    std::optional<Strides> given;
    if (!strides.empty() || shape.empty()) given = strides;
    return impl_->graph.add_input(name, shape, dtype, given);
  });
}

void GraphBuilder::dim(std::string name, int64_t min, int64_t max, int64_t multiple_of) {
  if (impl_->error) return;
  Expected<bool> ok = detail::catch_errors([&] {
    impl_->graph.declare_dim(name, min, max, multiple_of);
    return true;
  });
  if (!ok) impl_->error = ok.error();
}

Tensor GraphBuilder::symbolic_input(std::string name, std::vector<DimSize> shape, DType dtype, Strides strides) {
  return impl_->record([&] {
    std::optional<Strides> given;
    if (!strides.empty() || shape.empty()) given = strides;
    return impl_->graph.add_input(name, shape, dtype, given);
  });
}

Tensor GraphBuilder::op(std::string_view op, std::vector<Operand> in, Attrs attrs,
                        std::optional<DType> dtype, std::string out) {
  return impl_->record([&] {
    ir::OpDeclaration decl;
    decl.op = std::string(op);
    for (size_t i = 0; i < in.size(); ++i) {
      if (const double* scalar = std::get_if<double>(&in[i])) {
        decl.in.emplace_back(*scalar);
        continue;
      }
      decl.in.emplace_back(impl_->name_of(std::get<Tensor>(in[i]), fmt::format("{}: operand {}", op, i)));
    }
    if (out.empty()) {
      do out = fmt::format("t{}", impl_->next_name++);
      while (impl_->graph.has_name(out));
    }
    decl.out = std::move(out);
    decl.dtype = dtype;
    decl.attrs = std::move(attrs);
    return impl_->graph.add_op(decl);
  });
}

Expected<Shape> GraphBuilder::shape(Tensor t) const {
  if (impl_->error) return *impl_->error;
  return detail::catch_errors([&] {
    impl_->name_of(t, "shape");
    return impl_->graph.shape_of(t.id);
  });
}

void GraphBuilder::output(Tensor t) {
  if (impl_->error) return;
  Expected<std::string> name = detail::catch_errors([&] { return impl_->name_of(t, "output"); });
  if (!name) {
    impl_->error = name.error();
    return;
  }
  impl_->outputs.push_back(std::move(*name));
}

Status GraphBuilder::status() const {
  if (impl_->error) return *impl_->error;
  return {};
}

Expected<Graph> GraphBuilder::build() {
  if (impl_->error) return *impl_->error;
  return detail::catch_errors([&] {
    impl_->graph.set_outputs(impl_->outputs);
    return Graph::Internal::make(std::make_shared<const ir::Graph>(std::move(impl_->graph).finish()));
  });
}

}  // namespace kiln
