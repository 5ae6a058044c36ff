// Compiling a graph into GPU kernels and running them.
//
//   kiln::Expected<kiln::Executable> exe = kiln::Executable::compile(graph);
//   // on a GPU, with device pointers bound by tensor name, on a stream:
//   kiln::Status s = exe->launch({{"x", x_ptr, x_bytes}, {"y", y_ptr, y_bytes}}, stream);
//
// compile() plans, generates and NVRTC-compiles every kernel (or takes it
// from the kernel cache); it needs no GPU. launch() needs one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/graph.h"
#include "kiln/host_tensor.h"
#include "kiln/status.h"

namespace kiln {

struct CompileOptions {
  std::string arch;       // "sm_90"; empty: the GPU present, else sm_90
  bool fuse = true;       // false: one kernel per op
  bool use_cache = true;  // the on-disk kernel cache
  std::string cache_dir;  // empty: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln, ~/.cache/kiln
  // Fail instead of compiling anything: proves a warm cache. Also set by
  // the environment variable KILN_FAIL_IF_COMPILING=1.
  bool fail_if_compiling = false;
  // Times the alternatives of every tunable kernel (matmul and conv: tile
  // width, cluster shape, tile order, K split) on the GPU present, keeps
  // the fastest and records the winners in the cache, where every later
  // compile of the same graph for this arch finds them. Needs a GPU whose
  // arch is `arch`.
  bool autotune = false;
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

  // Bytes a binding of this input or output must have (strided span for
  // inputs; contiguous outputs).
  Expected<size_t> binding_bytes(const std::string& name) const;
  // Runs every kernel on `stream` (a CUstream; null for the default stream).
  // Every input and output must be bound, with at least binding_bytes().
  Status launch(const std::vector<DeviceBinding>& bindings, void* stream = nullptr);

  // Copies host tensors in, runs, copies the outputs back (in the order of
  // Graph::outputs()). Outputs are poisoned (all bits set) first, so an
  // element no kernel wrote reads back as NaN.
  Expected<std::vector<HostTensor>> run_host(const std::vector<HostTensor>& inputs);

  ~Executable();
  Executable(Executable&&) noexcept;
  Executable& operator=(Executable&&) noexcept;

 private:
  friend struct ExecutableFactory;  // runtime/autotune.h: compiles with chosen tunings
  struct Impl;
  explicit Executable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
