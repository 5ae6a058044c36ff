// kiln run GRAPH [--device cuda|cpu] [--inputs DIR | --random SEED]
//                [--outputs DIR] [--check] [--tolerance X]
#include <fmt/format.h>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <optional>

#include "compiler/memory_budget.h"
#include "compiler/graph_internal.h"
#include "compiler/ir.h"
#include "kiln/executable.h"
#include "kiln/graph.h"
#include "runtime/check.h"
#include "kiln/reference.h"
#include "runtime/npy.h"
#include "runtime/random_inputs.h"
#include "compiler/error.h"
#include "tools/commands.h"
#include "tools/helpers.h"
#include "tools/reference_progress.h"

namespace kiln::cli {
namespace {

struct RunArgs {
  std::string path, device = "cuda", inputs_dir, outputs_dir;
  uint64_t seed = 0;
  bool check = false;
  double tolerance = -1;
  std::vector<std::string> dims;
};

std::string summary(const HostTensor& t) {
  double sum = 0, sum_sq = 0, lo = INFINITY, hi = -INFINITY;
  int64_t finite = 0, nans = 0, infs = 0;
  for (float v : t.values) {
    if (std::isnan(v)) { ++nans; continue; }
    if (std::isinf(v)) { ++infs; continue; }
    ++finite, sum += v, sum_sq += static_cast<double>(v) * v;
    lo = std::min<double>(lo, v), hi = std::max<double>(hi, v);
  }
  if (finite == 0) return fmt::format("no finite values ({} nan, {} inf)", nans, infs);
  std::string s = fmt::format("min {:.6g}  max {:.6g}  mean {:.6g}  rms {:.6g}", lo, hi, sum / finite,
                              std::sqrt(sum_sq / finite));
  if (nans || infs) s += fmt::format("  ({} nan, {} inf)", nans, infs);
  return s;
}

Status write_all(const std::string& dir, const std::vector<TensorDesc>& descs,
                 const std::vector<HostTensor>& tensors) {
  for (size_t i = 0; i < descs.size(); ++i) {
    // Names match [A-Za-z_][A-Za-z0-9_.]*, so they are safe file names.
    Status s = write_npy((std::filesystem::path(dir) / (descs[i].name + ".npy")).string(), tensors[i]);
    if (!s) return s;
  }
  return {};
}

int run(const RunArgs& a, const CommonOptions& common) {
  // A symbolic graph takes its sizes from --dim, or from the --inputs files' shapes.
  Expected<Graph> graph = load_sized(a.path, a.dims, !a.inputs_dir.empty());
  if (!graph) return report(graph.error());
  if (a.check && a.device != "cuda")
    return report({ErrorCode::InvalidInput, "--check compares the GPU result with the reference: it needs --device cuda"});

  std::vector<HostTensor> inputs;
  if (!a.inputs_dir.empty()) {
    auto file_of = [&](const TensorDesc& d) { return (std::filesystem::path(a.inputs_dir) / (d.name + ".npy")).string(); };
    for (const TensorDesc& d : graph->inputs()) {
      Expected<HostTensor> t = read_npy(file_of(d), d.dtype);
      if (!t) return report(t.error());
      inputs.push_back(std::move(*t));
    }
    if (graph->is_symbolic()) {
      std::vector<Shape> shapes;
      for (const HostTensor& t : inputs) shapes.push_back(t.shape);
      Expected<Graph::DimValues> sizes = graph->dims_from_shapes(shapes);
      Expected<Graph> sized = sizes ? graph->specialize(*sizes) : Expected<Graph>(sizes.error());
      if (!sized) return report({sized.error().code, fmt::format("--inputs {}: {}", a.inputs_dir, sized.error().message)});
      graph = std::move(sized);
    }
    const std::vector<TensorDesc> descs = graph->inputs();
    for (size_t i = 0; i < descs.size(); ++i) {
      const TensorDesc& d = descs[i];
      const std::string file = file_of(d);
      const HostTensor* t = &inputs[i];
      if (t->shape != d.shape)
        return report({ErrorCode::InvalidInput, fmt::format("{}: input '{}' has shape {} in the graph but {} in the file",
                                                            file, d.name, to_string(d.shape), to_string(t->shape))});
      if (std::string problem = stored_layout_problem(d, *t); !problem.empty())
        return report({ErrorCode::InvalidInput, fmt::format("{}: {}", file, problem)});
    }
  } else {
    // Decided before a value is drawn: the inputs, and on the CPU (or for
    // --check) the reference interpreter's peak beside them.
    int64_t bytes = 0;
    for (const TensorDesc& d : graph->inputs()) bytes += element_count(d.shape) * int64_t{sizeof(float)};
    const bool reference = a.device != "cuda" || a.check;
    const int64_t with_reference = bytes + (reference ? reference_host_bytes(*graph) : 0);
    Expected<bool> fits = detail::catch_errors([&] {
      require_host_memory(with_reference, reference ? fmt::format("drawing the random inputs ({}) and running the reference "
                                                                  "interpreter on them ({} at its peak)",
                                                                  human_bytes(bytes), human_bytes(with_reference - bytes))
                                                    : std::string("drawing the random inputs"));
      return true;
    });
    if (!fits) return report(fits.error());
    inputs = random_inputs(*graph, a.seed);
  }

  const auto start = std::chrono::steady_clock::now();
  const bool gpu = a.device == "cuda";
  std::optional<Executable> exe;
  if (gpu) {
    // A symbolic graph that one compile serves at every size compiles as itself and runs at these inputs' sizes.
    Expected<std::optional<Graph>> once = load_symbolic_once(a.path, compile_options(common, ""));
    if (!once) return report(once.error());
    if (*once) fmt::print("compiling {} once for every size in its range\n", a.path);
    Expected<Executable> compiled = Executable::compile(*once ? **once : *graph, compile_options(common, ""));
    if (!compiled) return report(compiled.error());
    exe.emplace(std::move(compiled).value());
  }
  Expected<std::vector<HostTensor>> outputs = [&] {
    if (gpu) return exe->run_host(inputs);
    ReferenceProgressLine line("reference interpreter");
    return run_reference(*graph, inputs, line.callback());
  }();
  if (!outputs) return report(outputs.error());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const std::vector<TensorDesc> output_descs = graph->outputs();
  if (!a.outputs_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.outputs_dir, ec);
    if (ec) return report({ErrorCode::InvalidInput, fmt::format("--outputs {}: {}", a.outputs_dir, ec.message())});
    Status s = write_all(a.outputs_dir, output_descs, *outputs);
    if (s && a.inputs_dir.empty()) s = write_all(a.outputs_dir, graph->inputs(), inputs);
    if (!s) return report(s.error());
  }

  fmt::print("ran {} on {} in {:.3f} s; inputs: {}\n", graph->name().empty() ? a.path : detail::quoted(graph->name()),
             gpu ? fmt::format("the GPU ({}, {} kernel{})", exe->arch(), exe->kernel_count(), exe->kernel_count() == 1 ? "" : "s")
                 : "cpu (reference interpreter)",
             seconds, a.inputs_dir.empty() ? fmt::format("random, seed {}", a.seed) : a.inputs_dir);
  for (size_t i = 0; i < output_descs.size(); ++i)
    fmt::print("output {} : {}{}  {}\n", output_descs[i].name, to_string(output_descs[i].dtype),
               to_string(output_descs[i].shape), summary((*outputs)[i]));
  if (!a.outputs_dir.empty()) fmt::print("wrote {}\n", a.outputs_dir);
  if (!a.check) return 0;
  Expected<std::vector<HostTensor>> reference = [&] {
    ReferenceProgressLine line("--check: reference interpreter");
    return run_reference(*graph, inputs, line.callback());
  }();
  if (!reference) return report(reference.error());
  bool all_pass = true;
  for (size_t i = 0; i < output_descs.size(); ++i) {
    const double tolerance = a.tolerance > 0 ? a.tolerance : runtime::default_tolerance(ir_of(*graph), ir_of(*graph).outputs[i]);
    const runtime::Comparison c = runtime::compare((*outputs)[i], (*reference)[i]);
    const bool pass = c.passes(tolerance);
    all_pass = all_pass && pass;
    fmt::print("check {}: rel err {:.3e} (tolerance {:.0e}){} {}\n", output_descs[i].name, c.relative_error, tolerance,
               c.nonfinite_match ? "" : fmt::format(", NaN/inf differ first at element {}", c.first_mismatch),
               pass ? "ok" : "FAIL");
  }
  return all_pass ? 0 : static_cast<int>(ErrorCode::CheckFailed);
}

}  // namespace

Runner add_run(CLI::App& app, const CommonOptions& common) {
  CLI::App* cmd = app.add_subcommand("run", "run a graph on the GPU (cuda) or the reference interpreter (cpu)");
  auto a = std::make_shared<RunArgs>();
  cmd->add_option("GRAPH", a->path, "graph file")->required();
  cmd->add_option("--device", a->device, "cuda (default) or cpu")->check(CLI::IsMember({"cuda", "cpu"}));
  auto* inputs = cmd->add_option("--inputs", a->inputs_dir, "read DIR/<input>.npy for every input");
  auto* random = cmd->add_option("--random", a->seed, "draw inputs from this seed (the default, seed 0)")
                     ->check(CLI::Validator(
                         [](std::string& text) {
                           const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
                           errno = 0;
                           if (digits) std::strtoull(text.c_str(), nullptr, 10);
                           return digits && errno != ERANGE
                                      ? std::string()
                                      : "a whole number from 0 to 18446744073709551615, not '" + text + "'";
                         },
                         "SEED"));
  inputs->excludes(random);
  cmd->add_option("--outputs", a->outputs_dir, "write DIR/<output>.npy (and drawn inputs)");
  add_dim_option(cmd, a->dims);
  cmd->add_flag("--check", a->check, "run on the GPU and compare with the reference interpreter");
  cmd->add_option("--tolerance", a->tolerance, "relative error allowed by --check")
      ->check(CLI::Validator(
          [](std::string& text) {
            char* end = nullptr;
            const double v = std::strtod(text.c_str(), &end);
            return *end == '\0' && std::isfinite(v) && v > 0 ? std::string() : "a positive finite number, not '" + text + "'";
          },
          "POSITIVE"));
  return [a, &common] { return run(*a, common); };
}

}  // namespace kiln::cli
