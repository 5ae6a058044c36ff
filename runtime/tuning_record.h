// The autotuner's records in the kernel cache: which tuning choice won for
// each kernel of a graph, and what every candidate measured.
//
// Key: the graph's program key (program_cache.h: the exact canonical
// document, arch, fusion switch, kiln and NVRTC versions, the build's
// fingerprint), so a kiln that generates different code never reuses a
// record. Entry: <dir>/tuning/<32 hex>.json, first line kiln's header and
// the XXH3-64 of the rest (with_checksum), written atomically; a bad record
// is deleted (only if it carries kiln's header) and ignored (the
// heuristic's choices are used). Choices a kernel's generator does not
// accept are ignored by codegen (tuning.h), so even a forged record
// selects only kernels kiln would make.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/tuning.h"
#include "compiler/graph_hash.h"

namespace kiln::runtime {

struct MeasuredTrial {
  int kernel = 0;  // plan kernel id
  codegen::Tuning tuning;
  double milliseconds = 0;  // median time of the whole graph with this choice
};

struct TuningRecord {
  std::string graph_name;  // for `kiln cache ls`
  std::string device;      // the GPU it was measured on
  codegen::ProgramTuning choice;
  std::vector<MeasuredTrial> trials;
};

std::string tuning_to_text(const TuningRecord& record);
std::optional<TuningRecord> tuning_from_text(const std::string& text);

std::optional<TuningRecord> load_tuning(const std::string& cache_dir, const ir::Hash128& program_key);
// False when it could not be written (the cache is then simply without it).
bool store_tuning(const std::string& cache_dir, const ir::Hash128& program_key, const TuningRecord& record);
// Every readable record (`problems`, `remove_bad` and `foreign` as list_recipes).
std::vector<std::pair<std::string, TuningRecord>> list_tunings(const std::string& cache_dir,
                                                               std::vector<std::string>* problems = nullptr,
                                                               bool remove_bad = false,
                                                               std::vector<std::string>* foreign = nullptr);

// The choices recorded for a program in the cache at `cache_dir` (empty
// when none or the cache is unusable), remembered by this process;
// remember_tuning() replaces them (after an autotuning run).
codegen::ProgramTuning recorded_tuning(const std::string& cache_dir, const ir::Hash128& program_key);
void remember_tuning(const std::string& cache_dir, const ir::Hash128& program_key, const codegen::ProgramTuning& tuning);
// Forgets what this process read, so that the next compile reads the
// records again (after another process autotuned).
void forget_recorded_tunings();

}  // namespace kiln::runtime
