// kiln._kiln: the extension module behind `import kiln` (python.md).
//
// It binds the public C++ API (include/kiln/) and the op table; the Python
// package (python/kiln/) builds the user-facing classes on it: op methods
// generated from op_table(), arrays of every library through DLPack or
// their own attributes, outputs allocated by the inputs' library. Errors
// are raised as the classes of kiln._errors, with the CLI's messages. The
// GIL is released while NVRTC compiles and while a launch is enqueued.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "compiler/graph_internal.h"
#include "compiler/numerics.h"
#include "compiler/op_table.h"
#include "compiler/plan_printer.h"
#include "runtime/pipeline.h"
#include "kiln/kiln.h"
#include "codegen/kernel_codegen.h"
#include "runtime/cuda_driver.h"
#include "runtime/npy.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kiln::python {
namespace {

// Raises the kiln._errors class named `kind` with `message`.
[[noreturn]] void raise(const char* kind, const std::string& message) {
  nb::object cls = nb::module_::import_("kiln._errors").attr(kind);
  PyErr_SetString(cls.ptr(), message.c_str());
  throw nb::python_error();
}

// Errors of graph construction, compilation and launch, as Python sees them.
[[noreturn]] void raise_graph_error(const Error& e) { raise("GraphError", e.message); }
[[noreturn]] void raise_compile_error(const Error& e) {
  if (e.code == ErrorCode::InvalidInput) raise("GraphError", e.message);
  raise("CompileError", e.message);
}
[[noreturn]] void raise_run_error(const Error& e) {
  switch (e.code) {
    case ErrorCode::InvalidInput: raise("BindingError", e.message);
    case ErrorCode::OutOfMemory: raise("OutOfMemoryError", e.message);
    case ErrorCode::CompileOrDevice: raise("DeviceError", e.message);
    case ErrorCode::Usage:
    case ErrorCode::CheckFailed:
    case ErrorCode::Interrupted:
    case ErrorCode::Internal: break;
  }
  raise("KilnError", e.message);
}

template <class T>
T unwrap_graph(Expected<T> e) {
  if (!e) raise_graph_error(e.error());
  return std::move(*e);
}

nb::tuple to_tuple(const std::vector<int64_t>& v) {
  nb::list l;
  for (int64_t x : v) l.append(x);
  return nb::tuple(l);
}

nb::list describe(const std::vector<TensorDesc>& tensors) {
  nb::list out;
  for (const TensorDesc& t : tensors)
    out.append(nb::make_tuple(t.name, to_tuple(t.shape), std::string(to_string(t.dtype)), to_tuple(t.strides)));
  return out;
}

DType dtype_of(const std::string& name) {
  std::optional<DType> d = parse_dtype(name);
  if (!d) raise("GraphError", "unknown dtype '" + name + "' (expected f32, f16, bf16 or bool)");
  return *d;
}

// The op table, as the Python package generates its builder methods from it:
// (name, family, min inputs, max inputs, [(attribute, kind), ...]).
const char* family_name(ir::OpFamily f) {
  switch (f) {  // exhaustive: a new family is a build error here
    case ir::OpFamily::Unary: return "unary";
    case ir::OpFamily::Binary: return "binary";
    case ir::OpFamily::Compare: return "compare";
    case ir::OpFamily::Select: return "select";
    case ir::OpFamily::Reduce: return "reduce";
    case ir::OpFamily::Norm: return "norm";
    case ir::OpFamily::Matmul: return "matmul";
    case ir::OpFamily::Conv: return "conv";
    case ir::OpFamily::Pool: return "pool";
    case ir::OpFamily::View: return "view";
    case ir::OpFamily::Attention: return "attention";
    case ir::OpFamily::Concat: return "concat";
  }
  return "?";
}

const char* kind_name(ir::AttrKind k) {
  switch (k) {
    case ir::AttrKind::Float: return "float";
    case ir::AttrKind::Int: return "int";
    case ir::AttrKind::Bool: return "bool";
    case ir::AttrKind::Enum: return "enum";
    case ir::AttrKind::IntPair: return "int_pair";
    case ir::AttrKind::IntList: return "int_list";
  }
  return "?";
}

nb::list op_table() {
  nb::list out;
  for (int k = 0; k < ir::kOpKindCount; ++k) {
    const ir::OpInfo& info = ir::op_info(static_cast<ir::OpKind>(k));
    nb::list attrs;
    for (int a = 0; a < ir::kAttrKeyCount; ++a)
      if (info.attrs & ir::attr_bit(static_cast<ir::AttrKey>(a)))
        attrs.append(nb::make_tuple(std::string(ir::attr_name(static_cast<ir::AttrKey>(a))),
                                    kind_name(ir::attr_kind(static_cast<ir::AttrKey>(a)))));
    out.append(nb::make_tuple(std::string(info.name), family_name(info.family), info.min_inputs, info.max_inputs, attrs));
  }
  return out;
}

// The name of v's type, as "int" or "numpy.int64".
std::string python_type_name(nb::handle v) { return nb::cast<std::string>(nb::type_name(v.type())); }

// A Python int as an int64, or nullopt where it does not fit.
std::optional<int64_t> int64_of(nb::handle v) {
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0) return std::nullopt;
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<int64_t>(x);
}

// An attribute value from Python, as its JSON value would be.
AttrValue attr_value(const std::string& op, const std::string& key, nb::handle v) {
  auto integer = [&](nb::handle x) {
    std::optional<int64_t> i = int64_of(x);
    if (!i)
      raise("GraphError", op + ": attribute '" + key + "': " + nb::cast<std::string>(nb::str(x)) +
                              " does not fit a 64-bit integer");
    return *i;
  };
  if (nb::isinstance<nb::bool_>(v)) return nb::cast<bool>(v);
  if (nb::isinstance<nb::int_>(v)) return integer(v);
  if (nb::isinstance<nb::float_>(v)) return nb::cast<double>(v);
  if (nb::isinstance<nb::str>(v)) return nb::cast<std::string>(v);
  if (nb::isinstance<nb::list>(v) || nb::isinstance<nb::tuple>(v)) {
    bool expressions = false;  // a list holding dim expressions (graph-format.md, "Symbolic dimensions")
    for (nb::handle x : v) expressions |= nb::isinstance<nb::str>(x);
    if (expressions) {
      std::vector<DimSize> dims;
      for (nb::handle x : v) {
        if (nb::isinstance<nb::str>(x)) dims.emplace_back(nb::cast<std::string>(x));
        else if (nb::isinstance<nb::int_>(x) && !nb::isinstance<nb::bool_>(x)) dims.emplace_back(integer(x));
        else raise("GraphError", op + ": attribute '" + key + "' must be a list of integers and dim expressions");
      }
      return dims;
    }
    std::vector<int64_t> values;
    for (nb::handle x : v) {
      if (!nb::isinstance<nb::int_>(x) || nb::isinstance<nb::bool_>(x))
        raise("GraphError", op + ": attribute '" + key + "' must be a list of integers");
      values.push_back(integer(x));
    }
    return values;
  }
  raise("GraphError", op + ": attribute '" + key + "' has a value of type " + python_type_name(v));
}

// The native side of kiln.GraphBuilder: Python names tensors by the ids
// this builder returned; any other id is a GraphError, never a read.
struct PyGraphBuilder {
  explicit PyGraphBuilder(std::string name) : builder(std::move(name)) {}

  int keep(Tensor t) {
    if (Status s = builder.status(); !s) raise_graph_error(s.error());
    handed.emplace(t.id, t);
    return t.id;
  }

  Operand operand(const std::string& op, size_t i, nb::handle x) const {
    const std::string where = op + ": operand " + std::to_string(i);
    if (nb::isinstance<nb::float_>(x)) return nb::cast<double>(x);
    if (!nb::isinstance<nb::int_>(x) || nb::isinstance<nb::bool_>(x))
      raise("GraphError", where + " is a " + python_type_name(x) + ", not a tensor id or a float");
    const std::optional<int64_t> id = int64_of(x);
    const auto found = id ? handed.find(*id) : handed.end();
    if (found == handed.end())
      raise("GraphError", where + ": not a tensor of this builder (id " + nb::cast<std::string>(nb::str(x)) +
                              ": an id it never returned)");
    return found->second;
  }

  GraphBuilder builder;
  std::map<int64_t, Tensor> handed;  // by id
};

// ---- host arrays: the reference interpreter's inputs and outputs ----

using HostArray = nb::ndarray<nb::ro, nb::device::cpu>;

double element_value(const HostArray& a, int64_t offset) {
  const uint8_t* base = static_cast<const uint8_t*>(a.data());
  const nb::dlpack::dtype t = a.dtype();
  const uint8_t* p = base + offset * static_cast<int64_t>(t.bits / 8);
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Float:
      if (t.bits == 32) { float v; std::memcpy(&v, p, 4); return v; }
      if (t.bits == 64) { double v; std::memcpy(&v, p, 8); return v; }
      if (t.bits == 16) { uint16_t h; std::memcpy(&h, p, 2); return f16_bits_to_f32(h); }
      break;
    case nb::dlpack::dtype_code::Bfloat:
      if (t.bits == 16) { uint16_t h; std::memcpy(&h, p, 2); return bf16_bits_to_f32(h); }
      break;
    case nb::dlpack::dtype_code::Bool: return *p ? 1.0 : 0.0;
    case nb::dlpack::dtype_code::Int:
      if (t.bits == 8) return static_cast<double>(*reinterpret_cast<const int8_t*>(p));
      if (t.bits == 16) { int16_t v; std::memcpy(&v, p, 2); return static_cast<double>(v); }
      if (t.bits == 32) { int32_t v; std::memcpy(&v, p, 4); return static_cast<double>(v); }
      if (t.bits == 64) { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
      break;
    case nb::dlpack::dtype_code::UInt:
      if (t.bits == 8) return static_cast<double>(*p);
      if (t.bits == 16) { uint16_t v; std::memcpy(&v, p, 2); return static_cast<double>(v); }
      if (t.bits == 32) { uint32_t v; std::memcpy(&v, p, 4); return static_cast<double>(v); }
      break;
    default: break;
  }
  raise("BindingError", "unsupported array dtype (DLPack code " + std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits)");
}

// The logical values of a host array of any layout, widened to f32, then
// rounded to the declared dtype as `kiln run` does with .npy files.
HostTensor host_tensor(const HostArray& a, const TensorDesc& want) {
  HostTensor t{want.shape, want.dtype, {}};
  const int64_t count = element_count(want.shape);
  t.values.resize(static_cast<size_t>(count));
  std::vector<int64_t> index(want.shape.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = 0;
    for (size_t d = 0; d < index.size(); ++d) offset += index[d] * a.stride(d);
    // As `kiln run` reads .npy files: any dtype, rounded to the declared one in one step.
    t.values[static_cast<size_t>(i)] = kiln::round_from_f64(want.dtype, element_value(a, offset));
    for (size_t d = index.size(); d-- > 0;)
      if (++index[d] < want.shape[d]) break;
      else index[d] = 0;
  }
  return t;
}

// ---- the executable ----

struct PyExecutable {
  Executable exe;
  bool fuse = true;
};

// The plan the executable's kernels were made from, as `kiln plan --json`
// prints it: planned when asked (a program found in the cache needed none),
// by the pipeline every compile runs, for the executable's arch. With
// `tactics` (an executable's plan, its arch explicit: `kiln plan --json
// --arch`), its kernels are generated too, for each one's tactic.
std::string plan_json(const Graph& graph, const std::string& arch, bool fuse, bool tactics) {
  const codegen::ProgramTuning no_tuning;  // the plan does not depend on the tile choices
  std::optional<Expected<runtime::Planned>> planned;
  {
    nb::gil_scoped_release release;
    Expected<runtime::Target> target = runtime::compile_target(graph, {.arch = arch, .fuse = fuse}, &no_tuning);
    const runtime::Stage until = tactics ? runtime::Stage::cuda : runtime::Stage::plan;
    planned.emplace(target ? runtime::run_pipeline(graph, *target, until) : target.error());
  }
  if (!planned->ok()) raise_compile_error(planned->error());
  const runtime::Planned& p = planned->value();
  return ir::plan_to_json(ir_of(graph), p.plan, tactics ? codegen::plan_tactics(p.program, arch) : ir::PlanTactics{});
}

// For a symbolic graph: ("" when one compile serves every size in its range
// (runtime::per_size), else why it is compiled per size; whether that is a
// limit met at the range's largest sizes alone, which a narrower range avoids).
std::pair<std::string, bool> per_size_reason(const Graph& graph, const std::string& arch, bool fuse) {
  const codegen::ProgramTuning no_tuning;
  std::optional<Expected<runtime::PerSize>> why;
  {
    nb::gil_scoped_release release;
    Expected<runtime::Target> target = runtime::compile_target(graph, {.arch = arch, .fuse = fuse}, &no_tuning);
    why.emplace(target ? runtime::per_size(graph, *target) : Expected<runtime::PerSize>(target.error()));
  }
  if (!why->ok()) raise_compile_error(why->error());
  return {why->value().why, why->value().range_limit};
}

PyExecutable compile(const Graph& graph, std::optional<std::string> arch, bool fuse, bool autotune,
                     std::optional<std::string> cache_dir) {
  CompileOptions options{.arch = arch.value_or(""), .fuse = fuse, .use_cache = true, .cache_dir = cache_dir.value_or(""),
                         .fail_if_compiling = false, .autotune = autotune, .device = -1};
  std::optional<Expected<Executable>> exe;
  {
    nb::gil_scoped_release release;
    exe.emplace(Executable::compile(graph, options));
  }
  if (!exe->ok()) raise_compile_error(exe->error());
  return PyExecutable{std::move(exe->value()), fuse};
}

void launch(const PyExecutable& self, const std::vector<uintptr_t>& inputs, const std::vector<uintptr_t>& outputs,
            uintptr_t workspace, uintptr_t stream, int device, const std::vector<std::vector<int64_t>>& shapes) {
  Status s;
  {
    nb::gil_scoped_release release;
    // On a default stream, the device's primary context is the one the
    // arrays live in (as PyTorch and CuPy use them): make it current.
    if (stream == 0 || stream == 1 || stream == 2)
      if (const runtime::Driver* cu = runtime::loaded_driver()) {
        CUcontext current = nullptr, primary = runtime::primary_context(device);
        cu->cuCtxGetCurrent(&current);
        if (primary && current != primary) cu->cuCtxSetCurrent(primary);
      }
    std::vector<void*> in(inputs.size()), out(outputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) in[i] = reinterpret_cast<void*>(inputs[i]);
    for (size_t i = 0; i < outputs.size(); ++i) out[i] = reinterpret_cast<void*>(outputs[i]);
    // A symbolic graph's sizes come from the inputs' shapes (an integer graph's need not be passed).
    s = self.exe.launch(BoundArgs{in, out, shapes}, reinterpret_cast<void*>(workspace), reinterpret_cast<void*>(stream));
  }
  if (!s) raise_run_error(s.error());
}

// Runs the reference interpreter on a thread of its own while the calling
// thread, every 50 ms, runs Python's signal handlers (PyErr_CheckSignals: on
// the main thread only; elsewhere it does nothing). A handler that raises
// (Ctrl-C's KeyboardInterrupt) stops the run at its next op or output row,
// and the exception is raised here. Where no thread can be started, the run
// takes the calling thread and cannot be interrupted.
Expected<std::vector<HostTensor>> run_interruptibly(const Graph& graph, const std::vector<HostTensor>& inputs) {
  std::atomic<bool> cancel{false};
  std::optional<Expected<std::vector<HostTensor>>> out;
  bool interrupted = false;
  {
    nb::gil_scoped_release release;
    std::mutex m;
    std::condition_variable finished;
    std::optional<std::thread> worker;
    try {
      worker.emplace([&] {
        Expected<std::vector<HostTensor>> result = run_reference(graph, inputs, nullptr, &cancel);
        std::lock_guard<std::mutex> lock(m);
        out.emplace(std::move(result));
        finished.notify_one();
      });
    } catch (const std::system_error&) {
      out.emplace(run_reference(graph, inputs));
    }
    if (worker) {
      std::unique_lock<std::mutex> lock(m);
      while (!finished.wait_for(lock, std::chrono::milliseconds(50), [&] { return out.has_value(); })) {
        if (interrupted) continue;
        lock.unlock();
        {
          nb::gil_scoped_acquire gil;
          interrupted = PyErr_CheckSignals() != 0;  // the handler's exception stays set on this thread
        }
        if (interrupted) cancel = true;
        lock.lock();
      }
      lock.unlock();
      worker->join();
    }
  }
  if (interrupted) throw nb::python_error();
  return std::move(*out);
}

// Runs the reference interpreter on host arrays (in binding order); returns
// float32 (bool: bool) NumPy arrays of the logical outputs.
nb::list run_reference_on(const Graph& graph, const std::vector<HostArray>& arrays) {
  const std::vector<TensorDesc> declared = graph.inputs();
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < arrays.size(); ++i) {
    TensorDesc want = declared[i];
    if (graph.is_symbolic()) {  // the arrays' sizes (run_reference checks them against `dims`)
      if (arrays[i].ndim() != want.shape.size())
        raise("BindingError", "input '" + want.name + "': rank " + std::to_string(arrays[i].ndim()) + " given, " +
                                  std::to_string(want.shape.size()) + " expected");
      for (size_t d = 0; d < want.shape.size(); ++d) want.shape[d] = static_cast<int64_t>(arrays[i].shape(d));
    }
    inputs.push_back(host_tensor(arrays[i], want));
  }
  Expected<std::vector<HostTensor>> out = run_interruptibly(graph, inputs);
  if (!out) raise_run_error(out.error());
  nb::list result;
  nb::module_ np = nb::module_::import_("numpy");
  for (const HostTensor& t : out.value()) {
    nb::object shape = to_tuple(t.shape);
    if (t.dtype == DType::boolean) {
      nb::object a = np.attr("empty")(shape, "dtype"_a = "bool");
      nb::ndarray<nb::numpy, bool> view = nb::cast<nb::ndarray<nb::numpy, bool>>(a);
      for (size_t i = 0; i < t.values.size(); ++i) view.data()[i] = t.values[i] != 0.0f;
      result.append(a);
    } else {
      nb::object a = np.attr("empty")(shape, "dtype"_a = "float32");
      nb::ndarray<nb::numpy, float> view = nb::cast<nb::ndarray<nb::numpy, float>>(a);
      std::memcpy(view.data(), t.values.data(), t.values.size() * sizeof(float));
      result.append(a);
    }
  }
  return result;
}

// Where a DLPack array lives and how it is laid out:
// (pointer, shape, strides in elements, kiln dtype or "", DLPack device type, device id).
nb::tuple dlpack_info(nb::ndarray<> a) {
  std::vector<int64_t> shape, strides;
  for (size_t d = 0; d < a.ndim(); ++d) {
    shape.push_back(static_cast<int64_t>(a.shape(d)));
    strides.push_back(static_cast<int64_t>(a.stride(d)));
  }
  const nb::dlpack::dtype t = a.dtype();
  std::string dtype;
  if (t == nb::dtype<float>()) dtype = "f32";
  else if (t == nb::dtype<bool>()) dtype = "bool";
  else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16) dtype = "f16";
  else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) dtype = "bf16";
  return nb::make_tuple(reinterpret_cast<uintptr_t>(a.data()), to_tuple(shape), to_tuple(strides), dtype,
                        a.device_type(), a.device_id());
}

nb::list kernel_reports(const PyExecutable& self) {
  nb::list out;
  for (const KernelReport& r : self.exe.report()) {
    nb::dict d;
    d["kind"] = r.kind;
    d["key"] = r.key;
    d["cache_hit"] = r.cache_hit;
    d["ms"] = r.milliseconds;
    d["tuning"] = r.tuning;
    out.append(d);
  }
  return out;
}

// Each kernel's tactic ("wgmma", "cublasLt"; "" for kinds built one way), for
// kiln.torch.explain (the kernel reports keep python.md's keys).
nb::list kernel_tactics(const PyExecutable& self) {
  nb::list out;
  for (const KernelReport& r : self.exe.report()) out.append(r.tactic);
  return out;
}

}  // namespace

NB_MODULE(_kiln, m) {
  m.doc() = "kiln's extension module; use the `kiln` package";
  m.def("op_table", &op_table);
  m.def("set_log", [](nb::object callback) {
    // Diagnostics of the library (warnings) through a Python callable (or None).
    // The callable is released with the GIL held, and leaked once the interpreter is gone.
    struct Callback {
      PyObject* fn;
      explicit Callback(PyObject* f) : fn(f) { Py_INCREF(fn); }
      ~Callback() {
        if (!Py_IsInitialized()) return;
        nb::gil_scoped_acquire gil;
        Py_DECREF(fn);
      }
    };
    Options o = *current_options();
    if (callback.is_none()) {
      o.log = {};
    } else {
      auto held = std::make_shared<Callback>(callback.ptr());
      o.log = [held](LogLevel level, std::string_view message) {
        if (!Py_IsInitialized()) return;
        nb::gil_scoped_acquire gil;
        try {
          nb::handle(held->fn)(level == LogLevel::warning ? "warning" : "info", std::string(message));
        } catch (nb::python_error& e) {
          e.discard_as_unraisable("kiln's log callback");
        }
      };
    }
    set_options(std::move(o));
  }, "callback"_a.none());

  nb::class_<Graph>(m, "Graph")
      .def_static("load", [](const std::string& path) { return unwrap_graph(Graph::load(path)); })
      .def_static("from_json", [](const std::string& text) { return unwrap_graph(Graph::from_json(text, "<python>")); })
      .def("to_json", &Graph::to_json)
      .def_prop_ro("name", &Graph::name)
      .def_prop_ro("is_symbolic", &Graph::is_symbolic)
      .def("dims", [](const Graph& g) {
        nb::list out;
        for (const Graph::Dim& d : g.dims()) out.append(nb::make_tuple(d.name, d.min, d.max, d.multiple_of));
        return out;
      })
      .def("specialize", [](const Graph& g, const std::map<std::string, int64_t>& sizes) {
        return unwrap_graph(g.specialize(Graph::DimValues(sizes.begin(), sizes.end())));
      }, "sizes"_a)
      .def("dims_from_shapes", [](const Graph& g, const std::vector<std::vector<int64_t>>& shapes) {
        Expected<Graph::DimValues> sizes = g.dims_from_shapes(shapes);
        if (!sizes) raise("BindingError", sizes.error().message);
        return std::map<std::string, int64_t>(sizes->begin(), sizes->end());
      }, "shapes"_a)
      .def_prop_ro("hash", &Graph::hash)
      .def_prop_ro("op_count", &Graph::op_count)
      .def("ir_text", &Graph::to_ir_text)
      .def("input_specs", [](const Graph& g) { return describe(g.inputs()); })
      .def("output_specs", [](const Graph& g) { return describe(g.outputs()); })
      .def("plan_json", [](const Graph& g, bool fuse) {  // for the GPU present, else sm_90, as compile() plans
        return plan_json(g, "", fuse, false);
      }, "fuse"_a = true)
      .def("run_reference", &run_reference_on);

  nb::class_<PyGraphBuilder>(m, "GraphBuilder")
      .def(nb::init<std::string>(), "name"_a = "")
      .def("input", [](PyGraphBuilder& b, std::string name, std::vector<DimSize> shape, const std::string& dtype,
                       std::optional<std::vector<int64_t>> strides) {
        return b.keep(b.builder.symbolic_input(std::move(name), std::move(shape), dtype_of(dtype), strides.value_or(Strides{})));
      }, "name"_a, "shape"_a, "dtype"_a, "strides"_a = nb::none())
      .def("dim", [](PyGraphBuilder& b, std::string name, int64_t min, int64_t max, int64_t multiple_of) {
        b.builder.dim(std::move(name), min, max, multiple_of);
        if (Status s = b.builder.status(); !s) raise_graph_error(s.error());
      }, "name"_a, "min"_a, "max"_a, "multiple_of"_a)
      .def("op", [](PyGraphBuilder& b, const std::string& op, nb::list in, nb::dict attrs, std::optional<std::string> dtype,
                    std::string out) {
        std::vector<Operand> operands;
        for (size_t i = 0; i < in.size(); ++i) operands.push_back(b.operand(op, i, in[i]));
        Attrs list;
        for (auto [k, v] : attrs) {
          if (!nb::isinstance<nb::str>(k)) raise("GraphError", op + ": an attribute name is a " + python_type_name(k) + ", not a str");
          const std::string key = nb::cast<std::string>(k);
          list.emplace_back(key, attr_value(op, key, v));
        }
        std::optional<DType> d;
        if (dtype) d = dtype_of(*dtype);
        return b.keep(b.builder.op(op, std::move(operands), std::move(list), d, std::move(out)));
      }, "op"_a, "inputs"_a, "attrs"_a, "dtype"_a = nb::none(), "out"_a = "")
      .def("shape", [](const PyGraphBuilder& b, int64_t id) {
        const auto found = b.handed.find(id);
        if (found == b.handed.end())
          raise("GraphError", "shape: not a tensor of this builder (id " + std::to_string(id) + ": an id it never returned)");
        Expected<Shape> shape = b.builder.shape(found->second);
        if (!shape) raise_graph_error(shape.error());
        return *shape;
      }, "id"_a);

  nb::class_<PyExecutable>(m, "Executable")
      .def_prop_ro("arch", [](const PyExecutable& e) { return e.exe.arch(); })
      .def_prop_ro("plan_json", [](const PyExecutable& e) { return plan_json(e.exe.graph(), e.exe.arch(), e.fuse, true); })
      .def_prop_ro("kernel_count", [](const PyExecutable& e) { return e.exe.kernel_count(); })
      .def_prop_ro("workspace_bytes", [](const PyExecutable& e) { return e.exe.workspace_bytes(); })
      .def("workspace_bytes_at",
           [](const PyExecutable& e, const std::vector<std::vector<int64_t>>& shapes) {
             std::vector<Shape> s(shapes.begin(), shapes.end());
             Expected<size_t> bytes = e.exe.workspace_bytes(s);
             if (!bytes) raise_compile_error(bytes.error());
             return *bytes;
           })
      .def("kernel_reports", &kernel_reports)
      .def("kernel_tactics", &kernel_tactics)
      .def("output_storage_dtypes", [](const PyExecutable& e) {
        // The dtype each output is stored in (graph-format.md rule 4: unrounded results are f32).
        nb::list out;
        for (const TensorDesc& t : e.exe.graph().outputs()) {
          const ir::Graph& g = ir_of(e.exe.graph());
          for (ir::TensorId id : g.outputs)
            if (g.tensor(id).name == t.name) out.append(std::string(to_string(codegen::storage_dtype(g.tensor(id)))));
        }
        return out;
      })
      .def("launch", &launch, "inputs"_a, "outputs"_a, "workspace"_a, "stream"_a, "device"_a,
           "shapes"_a = std::vector<std::vector<int64_t>>{})
      .def("output_shapes", [](const PyExecutable& e, const std::vector<std::vector<int64_t>>& shapes) {
        Expected<std::vector<Shape>> out = e.exe.output_shapes(shapes);
        if (!out) raise_run_error(out.error());
        nb::list l;
        for (const Shape& s : *out) l.append(to_tuple(s));
        return l;
      }, "shapes"_a);

  m.def("compile", &compile, "graph"_a, "arch"_a = nb::none(), "fuse"_a = true, "autotune"_a = false,
        "cache_dir"_a = nb::none());
  m.def("per_size_reason", &per_size_reason, "graph"_a, "arch"_a = "", "fuse"_a = true);
  m.def("device_count", [] { return runtime::device_count(); });
  m.def("dlpack_info", &dlpack_info);
}

}  // namespace kiln::python
