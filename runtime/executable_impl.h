// What an Executable is made of: the compiled program, how each kernel
// argument is found at launch (resolved once, at compile time), and the
// kernels loaded into each CUDA context that has launched it.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "codegen/kernel_codegen.h"
#include "codegen/launch_geometry.h"
#include "compiler/size_probe.h"
#include "kiln/executable.h"
#include "runtime/program_cache.h"
#include "runtime/vendor_gemm.h"

namespace kiln {
namespace runtime {

// A program compiled or loaded by this process (shared by every executable
// of the same graph, arch and tuning).
struct Compiled {
  ProgramRecipe recipe;
  std::vector<std::string> cubins;
};

// Where a pointer argument of a kernel comes from at launch.
struct ArgSource {
  enum class From : uint8_t { Input, Output, Workspace, Size };
  From from = From::Input;
  size_t index = 0;  // Input, Output: the binding index; Workspace: the slot (Impl::slot_offsets); Size: the symbol's index
};

// One kernel's launch, resolved once: every argument's source, and which
// arguments are tensor maps (encoded from that source's pointer).
struct KernelLaunch {
  std::vector<ArgSource> args;
  std::vector<bool> is_map;
  int map_count = 0;
};

// What a launch computes from the inputs' shapes, kept for the next launch
// of the same shapes (a model's steady state): the sizes bound and checked,
// the workspace layout, each kernel's grid, each kernel workspace's words
// and each output's bytes. A symbolic graph evaluates its expressions once
// per new set of shapes instead of at every launch.
struct SizedLaunch {
  std::vector<Shape> input_shapes;
  ir::DimValues sizes;
  std::vector<int64_t> size_of_symbol;  // by the probe's symbol order: kernels' size parameters
  std::vector<size_t> offsets;          // the workspace's slots, the bytes of them all last
  std::vector<codegen::LaunchGeometry> geometry;  // per kernel
  std::vector<uint8_t> runs;            // per kernel: launched at these sizes (one variant of each plan kernel)
  std::vector<size_t> workspace_words;  // per kernel workspace
  std::vector<size_t> output_bytes;     // per output
  // The kernel workspaces one kernel resets, filled before the first kernel
  // runs: a memset per run of them with one fill (Impl::reset_order).
  struct Reset {
    size_t offset = 0, words = 0;
    uint32_t fill = 0;
  };
  std::vector<Reset> resets;
};

// The kernels of one executable loaded into one CUDA context.
struct DeviceState {
  CUcontext context = nullptr;
  std::vector<CUmodule> modules;
  std::vector<CUfunction> functions;  // per kernel (null for a vendor library's call)
  std::vector<std::unique_ptr<VendorGemmCall>> vendor_calls;  // per kernel: a vendor library's call, made ready
  std::vector<uint32_t> resident_blocks;  // per kernel: how many of its blocks run at once (persistent kernels)
  // Tensor maps by (argument, the pointer it describes), per kernel: a map
  // depends on its own pointer alone, so a launch encodes only the maps whose
  // pointers it has not seen (a model's weights keep theirs; its outputs and
  // workspace, from PyTorch's allocator, move among a few).
  std::mutex maps_mutex;
  // Per kernel: (argument, pointer, the sizes for a symbolic graph's maps) -> the encoded map.
  std::vector<std::map<std::tuple<size_t, CUdeviceptr, std::vector<int64_t>>, CUtensorMap>> maps;
  ~DeviceState();
};

}  // namespace runtime

struct Executable::Impl {
  Graph graph;
  std::string arch;
  int device = -1;
  std::shared_ptr<const runtime::Compiled> compiled;
  std::vector<KernelReport> reports;
  // A symbolic graph compiled once for every size (runtime/pipeline.h): the
  // probe its kernels were made at and the graph at it (whose tensor ids the
  // kernels' arguments name); null for an integer graph.
  std::shared_ptr<const ir::SizeProbe> probe;
  std::shared_ptr<const Graph> probe_graph;

  // Bindings and scratch, resolved when the executable is made.
  std::vector<std::string> input_names, output_names;
  std::vector<size_t> input_bytes, output_bytes;  // a symbolic graph's: at its largest sizes
  std::vector<size_t> input_alignment, output_alignment;  // an element's bytes: what a binding's address is a multiple of
  std::vector<int> output_is_input;     // per output: the input it is, or -1
  std::vector<bool> input_contiguous;
  // The workspace's slots, in order: each intermediate of the program, then
  // each kernel workspace (WorkspaceSpec); their offsets (an integer
  // graph's; a symbolic graph's at its largest sizes: layout_at gives them
  // at bound ones) and the bytes of them all.
  std::vector<size_t> slot_offsets;
  size_t workspace_bytes = 0;
  // The kernel workspaces in the layout's order: those one kernel resets
  // first, by fill value (each fill's run set by one memset before the
  // first kernel: DenseNet-121 had 87 memsets a forward, one before each
  // kernel that reduces across blocks), then the others. A workspace two
  // kernels reset (none is, so far) is reset before each instead.
  std::vector<int> workspace_order;
  std::vector<bool> reset_up_front;  // per kernel workspace
  std::vector<runtime::KernelLaunch> launches;

  // The last launch's shapes and what they gave (SizedLaunch).
  mutable std::mutex sized_mutex;
  mutable std::shared_ptr<const runtime::SizedLaunch> last_sized;

  // Kernels loaded per context, made on a context's first launch.
  mutable std::shared_mutex devices_mutex;
  mutable std::unordered_map<CUcontext, std::unique_ptr<runtime::DeviceState>> devices;

  Impl(Graph g, std::string a) : graph(std::move(g)), arch(std::move(a)) {}
  const codegen::GeneratedProgram& program() const { return compiled->recipe.program; }
  // Fills the binding tables, the workspace layout and `launches` from `compiled`.
  void resolve();
  // The IR the kernels were generated from (the probe graph's, for a symbolic graph).
  const ir::Graph& planned_ir() const;
  // A symbolic graph's sizes read from the inputs' shapes (one per input),
  // checked against its `dims`; an InvalidInput error naming the symbol, the
  // input and the sizes. Empty values for an integer graph (whose shapes,
  // where given, must be its own).
  Expected<ir::DimValues> bind_sizes(std::span<const Shape> input_shapes) const;
  // The elements of a tensor of the planned IR at bound sizes.
  int64_t elements_at(const ir::Tensor& t, const ir::DimValues& values) const;
  Shape shape_at(const ir::Tensor& t, const ir::DimValues& values) const;
  // An input's strides at `shape` (shape_at's), and output o's bytes at bound sizes.
  Strides strides_at(const ir::Tensor& t, const Shape& shape) const;
  size_t output_bytes_at(size_t o, const ir::DimValues& values) const;
  // The workspace's slot offsets at bound sizes, the bytes of them all last
  // (a symbolic graph's workspace at a small size is small).
  std::vector<size_t> layout_at(const ir::DimValues& values) const;
  // Everything a launch of these input shapes needs from them: the last
  // launch's when the shapes are the same, else computed (bind_sizes's errors).
  Expected<std::shared_ptr<const runtime::SizedLaunch>> sized_launch(std::span<const Shape> input_shapes) const;
  // The kernels loaded into `context` (loaded now on its first use).
  Expected<runtime::DeviceState*> device_state(CUcontext context) const;
  Status tensor_maps(runtime::DeviceState& state, size_t kernel, const CUdeviceptr* values, const ir::DimValues& sizes,
                     const std::vector<int64_t>& size_key, CUtensorMap* out) const;
};

}  // namespace kiln
