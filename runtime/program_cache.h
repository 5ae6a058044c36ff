// The graph-level cache: what a warm process needs to skip planning and
// codegen entirely (the kernels' launch recipes and cache keys).
//
// Key: the exact canonical document (Graph::to_json(): tensor names and
// order matter here, because bindings and tensor ids do), the arch, the
// options, kiln's and NVRTC's versions. Entry: <dir>/graphs/<32 hex>.json,
// whose first line is kiln's header and the XXH3-64 of the rest
// (with_checksum); written atomically; a bad entry is deleted (only if it
// carries kiln's header) and ignored (the graph is simply compiled).
#pragma once

#include <optional>
#include <string>

#include "codegen/kernel_codegen.h"
#include "compiler/graph_hash.h"

namespace kiln::runtime {

// A compiled program without its sources: enough to launch.
struct ProgramRecipe {
  codegen::GeneratedProgram program;   // sources left empty
  std::vector<std::string> kernel_keys;  // per generated kernel
  std::vector<std::string> kernel_kinds;
  std::string graph_name;  // for `kiln cache ls`
};

// Every readable recipe of a cache (`problems`, `remove_bad` and `foreign`
// as KernelCache::list).
std::vector<std::pair<std::string, ProgramRecipe>> list_recipes(const std::string& cache_dir,
                                                                std::vector<std::string>* problems = nullptr,
                                                                bool remove_bad = false,
                                                                std::vector<std::string>* foreign = nullptr);

// The recipe's cache key: the graph, arch, fusion switch, NVRTC and kiln
// versions, and the build's fingerprint (a kiln with another planner or
// code generator never reuses this one's recipes).
ir::Hash128 program_key(const std::string& canonical_json, const std::string& arch, bool fuse);
// The key of the program built with `tuning` (program_key itself when it is empty).
ir::Hash128 tuned_program_key(const ir::Hash128& program_key, const codegen::ProgramTuning& tuning);

std::string recipe_to_text(const ProgramRecipe& recipe);
std::optional<ProgramRecipe> recipe_from_text(const std::string& text, size_t tensor_count);

std::optional<ProgramRecipe> load_recipe(const std::string& cache_dir, const ir::Hash128& key, size_t tensor_count);
void store_recipe(const std::string& cache_dir, const ir::Hash128& key, const ProgramRecipe& recipe);

}  // namespace kiln::runtime
