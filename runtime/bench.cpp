#include "compiler/error.h"
#include "runtime/bench.h"

#include <fmt/format.h>

#include <algorithm>

#include "compiler/graph_internal.h"
#include "compiler/op_work.h"
#include "codegen/kernel_codegen.h"
#include "runtime/cuda_driver.h"
#include "runtime/random_inputs.h"
#include "runtime/storage.h"

namespace kiln::runtime {

int64_t min_bytes(const ir::Graph& g) {
  int64_t bytes = 0;
  for (ir::TensorId id : g.inputs) bytes += element_count(g.tensor(id).shape) * byte_size(g.tensor(id).dtype);
  for (ir::TensorId id : g.outputs) {
    const ir::Tensor& t = g.tensor(id);
    if (t.kind != ir::TensorKind::Input) bytes += element_count(t.shape) * byte_size(codegen::storage_dtype(t));
  }
  return bytes;
}

int64_t anchor_flops(const ir::Graph& g) {
  int64_t flops = 0;
  for (const ir::Op& op : g.ops) flops += ir::anchor_flops(g, op);
  return flops;
}

Expected<BenchBuffers> BenchBuffers::make(const Executable& exe, uint64_t seed) {
  Expected<const Driver*> d = driver();
  if (!d) return d.error();
  const Driver& cu = **d;
  const ir::Graph& g = ir_of(exe.graph());
  int64_t input_bytes = 0;
  for (const TensorDesc& t : exe.graph().inputs()) input_bytes += static_cast<int64_t>(exe.binding_bytes(t.name).value());
  // Enough input sets that one pass over them is several times the L2 (50-60 MB).
  const int input_sets = static_cast<int>(std::clamp<int64_t>((256LL << 20) / std::max<int64_t>(input_bytes, 1), 1, 8));
  int64_t output_bytes = static_cast<int64_t>(exe.workspace_bytes());
  for (const TensorDesc& t : exe.graph().outputs()) output_bytes += static_cast<int64_t>(exe.binding_bytes(t.name).value());
  if (Status st = require_device_memory(cu, input_sets * input_bytes + output_bytes,
                                        fmt::format("benchmarking graph {} ({} input sets, outputs and workspace)",
                                                    detail::quoted(exe.graph().name()), input_sets));
      !st)
    return st.error();
  BenchBuffers b;
  auto allocate = [&](size_t bytes) -> Expected<CUdeviceptr> {
    CUdeviceptr p;
    if (Status st = check(cu.cuMemAlloc(&p, std::max<size_t>(bytes, 4)), "cuMemAlloc"); !st) return st.error();
    b.allocations_.push_back(p);
    return p;
  };
  b.sets_.resize(static_cast<size_t>(input_sets));
  for (int s = 0; s < input_sets; ++s) {
    const std::vector<HostTensor> inputs = random_inputs(exe.graph(), seed + static_cast<uint64_t>(s));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::Tensor& t = g.tensor(g.inputs[i]);
      const std::string bytes = to_storage(inputs[i], t.strides);
      Expected<CUdeviceptr> p = allocate(bytes.size());
      if (!p) return p.error();
      if (Status st = check(cu.cuMemcpyHtoD(*p, bytes.data(), bytes.size()), "cuMemcpyHtoD"); !st) return st.error();
      b.sets_[static_cast<size_t>(s)].push_back({t.name, reinterpret_cast<void*>(*p), bytes.size()});
    }
  }
  for (const TensorDesc& t : exe.graph().outputs()) {
    const size_t bytes = exe.binding_bytes(t.name).value();
    Expected<CUdeviceptr> p = allocate(bytes);
    if (!p) return p.error();
    for (auto& set : b.sets_)
      if (std::none_of(set.begin(), set.end(), [&](const DeviceBinding& x) { return x.name == t.name; }))
        set.push_back({t.name, reinterpret_cast<void*>(*p), bytes});
  }
  return b;
}

BenchBuffers::BenchBuffers(BenchBuffers&& other) noexcept
    : sets_(std::move(other.sets_)), allocations_(std::move(other.allocations_)) {
  other.allocations_.clear();
}

BenchBuffers::~BenchBuffers() {
  if (allocations_.empty()) return;
  if (Expected<const Driver*> d = driver(); d)
    for (uint64_t p : allocations_) (*d)->cuMemFree(static_cast<CUdeviceptr>(p));
}

Expected<Timing> time_runs(const Executable& exe, const BenchBuffers& buffers, double budget_ms,
                           const std::vector<Shape>& input_shapes) {
  Expected<const Driver*> d = driver();
  if (!d) return d.error();
  const Driver& cu = **d;
  // Bound by index once per set, one workspace for every run: the launches
  // timed are the ones an embedder makes.
  std::vector<std::vector<void*>> inputs, outputs;
  for (const std::vector<DeviceBinding>& set : buffers.sets()) {
    inputs.emplace_back(exe.graph().inputs().size());
    outputs.emplace_back(exe.graph().outputs().size());
    for (const DeviceBinding& b : set) {
      if (Expected<int> i = exe.input_index(b.name); i) inputs.back()[static_cast<size_t>(*i)] = b.pointer;
      if (Expected<int> o = exe.output_index(b.name); o) outputs.back()[static_cast<size_t>(*o)] = b.pointer;
    }
  }
  // (A symbolic graph's workspace at the sizes of the shapes given, not its range's largest.)
  Expected<size_t> workspace_bytes = input_shapes.empty() ? Expected<size_t>(exe.workspace_bytes()) : exe.workspace_bytes(input_shapes);
  if (!workspace_bytes) return workspace_bytes.error();
  CUdeviceptr workspace = 0;
  if (*workspace_bytes > 0)
    if (Status st = check(cu.cuMemAlloc(&workspace, *workspace_bytes), "cuMemAlloc (workspace)"); !st) return st.error();
  struct Release {
    const Driver& cu;
    CUdeviceptr p;
    ~Release() { if (p) cu.cuMemFree(p); }
  } release{cu, workspace};
  Timing timing;
  timing.input_sets = static_cast<int>(inputs.size());
  // Events around every run, recorded back to back: the queue stays full, so
  // launch gaps on the host do not count.
  auto run = [&](int iterations, std::vector<float>* ms) -> Status {
    std::vector<CUevent> events(static_cast<size_t>(2 * iterations));
    for (CUevent& e : events) cu.cuEventCreate(&e, CU_EVENT_DEFAULT);
    Status status;
    for (int i = 0; i < iterations && status; ++i) {
      cu.cuEventRecord(events[static_cast<size_t>(2 * i)], nullptr);
      const size_t set = static_cast<size_t>(i % timing.input_sets);
      status = exe.launch(BoundArgs{inputs[set], outputs[set], input_shapes}, reinterpret_cast<void*>(workspace), nullptr);
      cu.cuEventRecord(events[static_cast<size_t>(2 * i + 1)], nullptr);
    }
    if (status) status = check(cu.cuCtxSynchronize(), "running the graph");
    for (int i = 0; i < iterations && status && ms; ++i) {
      float t = 0;
      cu.cuEventElapsedTime(&t, events[static_cast<size_t>(2 * i)], events[static_cast<size_t>(2 * i + 1)]);
      ms->push_back(t);
    }
    for (CUevent& e : events) cu.cuEventDestroy(e);
    return status;
  };
  std::vector<float> first;
  Status st = run(3, &first);  // warm-up (module load, first touch)
  std::vector<float> ms;
  if (st) {
    const float estimate = *std::min_element(first.begin(), first.end());
    const int iterations = static_cast<int>(std::clamp<double>(budget_ms / std::max(estimate, 1e-3f), 10, 200));
    st = run(iterations, &ms);
  }
  if (!st) return st.error();
  std::sort(ms.begin(), ms.end());
  timing.median_ms = ms[ms.size() / 2];
  timing.min_ms = ms.front();
  timing.runs = static_cast<int>(ms.size());
  return timing;
}

Expected<Timing> time_executable(const Executable& exe, uint64_t seed) {
  Expected<BenchBuffers> buffers = BenchBuffers::make(exe, seed);
  if (!buffers) return buffers.error();
  return time_runs(exe, *buffers);
}

}  // namespace kiln::runtime
