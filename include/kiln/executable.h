// Compiling a graph into GPU kernels and running them.
//
//   kiln::Expected<kiln::Executable> exe = kiln::Executable::compile(graph);
//   // once: where each tensor goes, and the scratch memory a launch needs
//   const int x = exe->input_index("x").value(), y = exe->output_index("y").value();
//   void* workspace = my_pool.allocate(exe->workspace_bytes());  // 256-byte aligned
//   // then, from any thread, on any stream, as often as you like:
//   void* inputs[] = {x_ptr};
//   void* outputs[] = {y_ptr};
//   kiln::Status s = exe->launch({inputs, outputs}, workspace, stream);
//
// compile() plans, generates and NVRTC-compiles every kernel (or takes it
// from the kernel cache); it needs no GPU. launch() needs one. A launch
// allocates nothing and changes nothing in the executable a caller can see:
// one executable serves any number of threads and streams at once, each
// launch with its own workspace. The device is the stream's (its context);
// on the null stream, the context current on the calling thread, else the
// primary context of CompileOptions::device. Kernels are loaded into each
// context the first time a launch runs there, and unloaded when the
// executable is destroyed: destroy the executables that launched in a
// context of your own before you destroy that context.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"
#include "kiln/status.h"

namespace kiln {

// Per compile. Library-wide settings (cache size, dumps, diagnostics) are
// kiln::Options (kiln/options.h); the fields here override them for one compile.
// Every member has an initializer, the strings `{}`: GCC warns of a
// designated initializer that skips a member without one (GCC bug 96868).
struct CompileOptions {
  std::string arch{};       // "sm_90"; empty: the GPU of `device` (else 0), else sm_90
  bool fuse = true;         // false: one kernel per op
  bool use_cache = true;    // the on-disk kernel cache (and Options::use_cache)
  std::string cache_dir{};  // empty: Options::cache_dir
  // Fail instead of compiling anything: proves a warm cache. Also on when
  // Options::fail_if_compiling is (KILN_FAIL_IF_COMPILING=1).
  bool fail_if_compiling = false;
  // Times the alternatives of every tunable kernel (matmul and conv: tile
  // width, cluster shape, tile order, K split) on the GPU present, keeps
  // the fastest and records the winners in the cache, where every later
  // compile of the same graph for this arch finds them. Needs a GPU whose
  // arch is `arch`.
  bool autotune = false;
  // The device a launch on the null stream uses when no CUDA context is
  // current on the launching thread (its primary context); -1: device 0.
  int device = -1;
};

// One candidate an autotuning compile timed: the whole graph's median time
// with that kernel built this way.
struct TuningTrial {
  std::string tuning;  // "tile_n=128 cluster=2 raster=8"
  double milliseconds = 0;
};

struct KernelReport {
  int kernel = 0;
  std::string kind;     // as in the plan
  std::string key;      // cache key, 32 hex digits
  bool cache_hit = false;
  double milliseconds = 0;  // compile time, or the time to load from the cache
  std::string tuning;       // the kernel's tile choices; empty for kernels without any
  bool tuned = false;       // chosen by autotuning (this compile or a record in the cache)
  std::vector<TuningTrial> trials;  // this compile autotuned: every candidate's time, the choice's among them
  // The tactic that built it (matmul, conv, attention: "wgmma", "cublasLt", ...); empty for kinds built one way.
  std::string tactic;
};

// Device pointers by binding index: inputs in the order of
// Graph::inputs() (input_index), outputs in the order of Graph::outputs()
// (output_index). Each points at binding_bytes() of device memory at least.
//
// A graph with symbolic dimensions (graph-format.md) launches at the sizes
// its inputs have: `input_shapes`, one per input in binding order, from
// which each symbol is read and checked against the graph's `dims` (range,
// multiple_of, and agreement between inputs) before anything runs; outputs
// then have the shapes those sizes give. An integer graph may leave it
// empty (given, each shape must be the input's own).
struct BoundArgs {
  std::span<void* const> inputs;
  std::span<void* const> outputs;
  std::span<const Shape> input_shapes{};
};

// A device buffer bound to a graph input or output by name.
struct DeviceBinding {
  std::string name;
  void* pointer = nullptr;  // CUdeviceptr
  size_t bytes = 0;
};

class Executable {
 public:
  static Expected<Executable> compile(const Graph& graph, const CompileOptions& options = {});

  const Graph& graph() const;
  const std::string& arch() const;
  const std::vector<KernelReport>& report() const;
  size_t kernel_count() const;

  // Where a tensor goes in BoundArgs; an Error naming the graph's inputs
  // (outputs) for a name that is not one.
  Expected<int> input_index(std::string_view name) const;
  Expected<int> output_index(std::string_view name) const;
  // Bytes a binding of this input or output must have (strided span for
  // inputs; contiguous outputs); a symbolic graph's: at its largest sizes.
  Expected<size_t> binding_bytes(std::string_view name) const;

  // The outputs' shapes (Graph::outputs() order) for inputs of these shapes
  // (binding order): a symbolic graph's at the sizes they bind, checked as a
  // launch checks them (an InvalidInput binding error naming the symbol, the
  // input and the sizes); an integer graph's own, its inputs' shapes checked.
  Expected<std::vector<Shape>> output_shapes(std::span<const Shape> input_shapes) const;

  // Scratch memory one launch needs (intermediates, split-K and reduction
  // partials, counters); 0 for many graphs; a symbolic graph's: enough for
  // its largest sizes. The caller owns it; a launch
  // uses it until its kernels finish on the stream, so launches that may
  // run at the same time need workspaces of their own.
  size_t workspace_bytes() const;
  // A symbolic graph's scratch at the sizes its inputs' shapes bind (what a
  // launch with those shapes uses; a binding error where they break
  // `dims`); an integer graph's workspace_bytes().
  Expected<size_t> workspace_bytes(std::span<const Shape> input_shapes) const;
  static constexpr size_t kWorkspaceAlignment = 256;

  // Enqueues every kernel on `stream` (a CUstream; null for the default
  // stream) and returns without waiting. Allocates nothing; safe from any
  // number of threads at once. `workspace`: workspace_bytes() bytes,
  // kWorkspaceAlignment-aligned, on the stream's device (may be null when
  // workspace_bytes() is 0). An output that is also a graph input is
  // copied to its output pointer when that differs.
  Status launch(const BoundArgs& args, void* workspace, void* stream) const;

  // The same, bound by name (every input and output, each with at least
  // binding_bytes()), with a workspace allocated and freed on the stream
  // (stream-ordered, cuMemAllocAsync): for callers who do not keep one.
  Status launch(const std::vector<DeviceBinding>& bindings, void* stream = nullptr) const;

  // Copies host tensors in, runs, copies the outputs back (in the order of
  // Graph::outputs()). Outputs are poisoned (all bits set) first, so an
  // element no kernel wrote reads back as NaN.
  Expected<std::vector<HostTensor>> run_host(const std::vector<HostTensor>& inputs) const;

  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;

  // kiln's runtime builds executables (runtime/executable_impl.h); the type
  // is opaque outside it.
  struct Impl;
  explicit Executable(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
