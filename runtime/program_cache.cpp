#include "runtime/program_cache.h"

#include "runtime/cache_dir.h"
#include "runtime/remote_cache.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "runtime/build_fingerprint.h"
#include "runtime/nvrtc.h"

namespace kiln::runtime {

using json = nlohmann::json;

namespace {

json matrix_to_json(const codegen::VendorGemm::Matrix& x) {
  return {x.arg, to_string(x.dtype), x.row_stride, x.column_stride, x.batch_stride, x.offset};
}

std::optional<codegen::VendorGemm::Matrix> matrix_from_json(const json& j) {
  const std::optional<DType> dtype = parse_dtype(j.at(1).get<std::string>());
  if (!dtype || j.size() != 6) return std::nullopt;
  return codegen::VendorGemm::Matrix{j.at(0).get<int>(), *dtype, j.at(2).get<int64_t>(), j.at(3).get<int64_t>(),
                                     j.at(4).get<int64_t>(), j.at(5).get<int64_t>()};
}

json library_to_json(const codegen::VendorGemm& v) {
  return {{"mnk", {v.m, v.n, v.k, v.batches}}, {"a", matrix_to_json(v.a)}, {"b", matrix_to_json(v.b)},
          {"d", matrix_to_json(v.d)}, {"tf32", v.tf32}, {"workspace", {v.workspace_arg, v.workspace_bytes}}};
}

// A vendor call from a recipe, checked against its kernel's arguments:
// every pointer it reads or writes is one of them, in the role it needs.
std::optional<codegen::VendorGemm> library_from_json(const json& j, const std::vector<codegen::KernelArg>& args) {
  codegen::VendorGemm v;
  const json& mnk = j.at("mnk");
  v.m = mnk.at(0).get<int64_t>(), v.n = mnk.at(1).get<int64_t>(), v.k = mnk.at(2).get<int64_t>();
  v.batches = mnk.at(3).get<int64_t>();
  const auto a = matrix_from_json(j.at("a")), b = matrix_from_json(j.at("b")), d = matrix_from_json(j.at("d"));
  if (!a || !b || !d) return std::nullopt;
  v.a = *a, v.b = *b, v.d = *d;
  v.tf32 = j.at("tf32").get<bool>();
  v.workspace_arg = j.at("workspace").at(0).get<int>();
  v.workspace_bytes = j.at("workspace").at(1).get<int64_t>();
  if (!v.problem(args.size()).empty()) return std::nullopt;
  using Role = codegen::KernelArg::Role;
  auto role = [&](int arg) { return args[static_cast<size_t>(arg)].role; };
  const bool reads_ok = (role(v.a.arg) == Role::Input || role(v.a.arg) == Role::Intermediate) &&
                        (role(v.b.arg) == Role::Input || role(v.b.arg) == Role::Intermediate);
  const bool writes_ok = role(v.d.arg) == Role::Output || role(v.d.arg) == Role::Intermediate;
  if (!reads_ok || !writes_ok || role(v.workspace_arg) != Role::Workspace) return std::nullopt;
  return v;
}

}  // namespace

ir::Hash128 program_key(const std::string& canonical_json, const std::string& arch, bool fuse) {
  ir::HashBuilder h;
  h.add(std::string_view("kiln-program-v1")).add(std::string_view(KILN_VERSION)).add(std::string_view(build_fingerprint()));
  h.add(std::string_view(arch));
  h.add(std::string_view(nvrtc_version())).add(int64_t{fuse}).add(std::string_view(canonical_json));
  return h.digest();
}

ir::Hash128 tuned_program_key(const ir::Hash128& program_key, const codegen::ProgramTuning& tuning) {
  if (tuning.empty()) return program_key;
  ir::HashBuilder h;
  h.add(std::string_view("kiln-tuned-program-v1")).add(std::string_view(program_key.hex()));
  h.add(std::string_view(codegen::to_string(tuning)));
  return h.digest();
}

std::string recipe_to_text(const ProgramRecipe& r) {
  json doc;
  doc["format"] = 7;
  doc["graph"] = r.graph_name;
  doc["intermediates"] = r.program.intermediates;
  doc["workspaces"] = json::array();
  for (const auto& w : r.program.workspaces) doc["workspaces"].push_back({w.name, w.words, w.fill});
  doc["kernels"] = json::array();
  for (size_t i = 0; i < r.program.kernels.size(); ++i) {
    const codegen::GeneratedKernel& k = r.program.kernels[i];
    json args = json::array();
    for (const codegen::KernelArg& a : k.args) {
      json arg = {static_cast<int>(a.role), a.tensor, a.workspace};
      if (a.role == codegen::KernelArg::Role::TensorMap)
        arg.push_back({to_string(a.map.dtype), a.map.rank, a.map.dims, a.map.strides, a.map.box, a.map.offset_bytes});
      args.push_back(arg);
    }
    doc["kernels"].push_back({{"plan_kernel", k.plan_kernel}, {"key", r.kernel_keys[i]}, {"kind", r.kernel_kinds[i]},
                              {"grid", k.grid}, {"block", k.block}, {"shared", k.shared_bytes}, {"persistent", k.persistent_group}, {"args", args}, {"reset", k.reset_workspaces},
                              {"tuning", k.tuning.to_string()}, {"tactic", k.tactics.chosen}});
    if (k.library) doc["kernels"].back()["library"] = library_to_json(*k.library);
  }
  return with_checksum(doc.dump());
}

std::optional<ProgramRecipe> recipe_from_text(const std::string& text, size_t tensor_count) {
  const std::optional<std::string> body = checked_body(text);
  if (!body) return std::nullopt;
  try {
    const json doc = json::parse(*body);
    if (doc.at("format") != 7) return std::nullopt;
    ProgramRecipe r;
    r.graph_name = doc.value("graph", "");
    for (const auto& t : doc.at("intermediates")) r.program.intermediates.push_back(t.get<ir::TensorId>());
    for (const auto& w : doc.at("workspaces"))
      r.program.workspaces.push_back({w.at(0).get<std::string>(), w.at(1).get<int64_t>(), w.at(2).get<uint32_t>(), std::nullopt});
    for (const auto& k : doc.at("kernels")) {
      codegen::GeneratedKernel g;
      g.plan_kernel = k.at("plan_kernel").get<int>();
      g.grid = k.at("grid").get<std::array<uint32_t, 3>>();
      g.block = k.at("block").get<std::array<uint32_t, 3>>();
      g.shared_bytes = k.at("shared").get<uint32_t>();
      g.persistent_group = k.at("persistent").get<uint32_t>();
      g.reset_workspaces = k.at("reset").get<std::vector<int>>();
      std::optional<codegen::Tuning> tuning = codegen::Tuning::parse(k.at("tuning").get<std::string>());
      if (!tuning) return std::nullopt;
      g.tuning = *tuning;
      g.tactics.chosen = k.at("tactic").get<std::string>();
      for (const auto& a : k.at("args")) {
        const int role = a.at(0).get<int>();
        if (role < 0 || role > static_cast<int>(codegen::KernelArg::Role::TensorMap)) return std::nullopt;
        codegen::KernelArg arg{static_cast<codegen::KernelArg::Role>(role), a.at(1).get<ir::TensorId>(),
                               a.at(2).get<int>()};
        if (arg.role == codegen::KernelArg::Role::TensorMap) {
          const json& m = a.at(3);
          const std::optional<DType> dtype = parse_dtype(m.at(0).get<std::string>());
          if (!dtype) return std::nullopt;
          arg.map.dtype = *dtype;
          arg.map.rank = m.at(1).get<int>();
          arg.map.dims = m.at(2).get<decltype(arg.map.dims)>();
          arg.map.strides = m.at(3).get<decltype(arg.map.strides)>();
          arg.map.box = m.at(4).get<decltype(arg.map.box)>();
          arg.map.offset_bytes = m.at(5).get<uint64_t>();
          if (arg.map.offset_bytes % 16 != 0) return std::nullopt;
          if (arg.map.rank < 2 || arg.map.rank > codegen::TensorMapSpec::kMaxRank) return std::nullopt;
        } else if (a.size() != 3) {
          return std::nullopt;
        }
        const bool tensor_ok = arg.role == codegen::KernelArg::Role::Workspace ||
                               (arg.tensor >= 0 && static_cast<size_t>(arg.tensor) < tensor_count);
        const bool workspace_ok = arg.role != codegen::KernelArg::Role::Workspace ||
                                  (arg.workspace >= 0 && static_cast<size_t>(arg.workspace) < r.program.workspaces.size());
        if (!tensor_ok || !workspace_ok) return std::nullopt;
        g.args.push_back(arg);
      }
      if (k.contains("library")) {
        g.library = library_from_json(k.at("library"), g.args);
        if (!g.library) return std::nullopt;
      }
      r.program.kernels.push_back(std::move(g));
      r.kernel_keys.push_back(k.at("key").get<std::string>());
      r.kernel_kinds.push_back(k.at("kind").get<std::string>());
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<ProgramRecipe> load_recipe(const std::string& dir, const ir::Hash128& key, size_t tensor_count) {
  const std::string path = fmt::format("{}/graphs/{}.json", dir, key.hex());
  auto parse = [&](const std::string& text) { return recipe_from_text(text, tensor_count); };
  if (std::optional<ProgramRecipe> r = load_document<ProgramRecipe>(path, parse)) return r;
  return fetch_document<ProgramRecipe>("recipe", key.hex(), path, parse);
}

std::vector<std::pair<std::string, ProgramRecipe>> list_recipes(const std::string& dir, std::vector<std::string>* problems,
                                                                bool remove_bad, std::vector<std::string>* foreign) {
  return list_documents<ProgramRecipe>(dir, "graphs", "graph recipe",
                                       [](const std::string& text) { return recipe_from_text(text, SIZE_MAX); }, problems,
                                       remove_bad, foreign);
}

void store_recipe(const std::string& dir, const ir::Hash128& key, const ProgramRecipe& recipe) {
  const std::filesystem::path folder = std::filesystem::path(dir) / "graphs";
  if (!make_cache_folder(folder)) return;
  const std::string text = recipe_to_text(recipe);
  write_file_atomically((folder / (key.hex() + ".json")).string(), text);
  publish("recipe", key.hex(), text);
}

}  // namespace kiln::runtime
