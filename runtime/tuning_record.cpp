#include "runtime/tuning_record.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <mutex>

#include "runtime/cache_dir.h"
#include "runtime/remote_cache.h"

namespace kiln::runtime {

using json = nlohmann::json;

namespace {

std::mutex tuning_mutex;
// Recorded choices by (cache directory, program key), as this process last read or wrote them.
std::map<std::pair<std::string, ir::Hash128>, codegen::ProgramTuning>& tuning_memory() {
  static std::map<std::pair<std::string, ir::Hash128>, codegen::ProgramTuning> memory;
  return memory;
}

}  // namespace

codegen::ProgramTuning recorded_tuning(const std::string& cache_dir, const ir::Hash128& program_key) {
  {
    std::lock_guard<std::mutex> lock(tuning_mutex);
    if (auto it = tuning_memory().find({cache_dir, program_key}); it != tuning_memory().end()) return it->second;
  }
  codegen::ProgramTuning tuning;
  if (secure_cache_dir(cache_dir))  // (an unsafe directory is reported by the compile that uses it)
    if (std::optional<TuningRecord> r = load_tuning(cache_dir, program_key)) tuning = r->choice;
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory()[{cache_dir, program_key}] = tuning;
  return tuning;
}

void remember_tuning(const std::string& cache_dir, const ir::Hash128& program_key, const codegen::ProgramTuning& tuning) {
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory()[{cache_dir, program_key}] = tuning;
}

void forget_recorded_tunings() {
  std::lock_guard<std::mutex> lock(tuning_mutex);
  tuning_memory().clear();
}

std::string tuning_to_text(const TuningRecord& r) {
  json doc;
  doc["format"] = 1;
  doc["graph"] = r.graph_name;
  doc["device"] = r.device;
  doc["choice"] = json::array();
  for (const auto& [kernel, t] : r.choice) doc["choice"].push_back({kernel, t.to_string()});
  doc["trials"] = json::array();
  for (const MeasuredTrial& t : r.trials) doc["trials"].push_back({t.kernel, t.tuning.to_string(), t.milliseconds});
  return with_checksum(doc.dump());
}

std::optional<TuningRecord> tuning_from_text(const std::string& text) {
  const std::optional<std::string> body = checked_body(text);
  if (!body) return std::nullopt;
  try {
    const json doc = json::parse(*body);
    if (doc.at("format") != 1) return std::nullopt;
    TuningRecord r;
    r.graph_name = doc.at("graph").get<std::string>();
    r.device = doc.at("device").get<std::string>();
    for (const json& c : doc.at("choice")) {
      std::optional<codegen::Tuning> t = codegen::Tuning::parse(c.at(1).get<std::string>());
      const int kernel = c.at(0).get<int>();
      if (!t || kernel < 0 || r.choice.count(kernel)) return std::nullopt;
      r.choice[kernel] = *t;
    }
    for (const json& c : doc.at("trials")) {
      std::optional<codegen::Tuning> t = codegen::Tuning::parse(c.at(1).get<std::string>());
      if (!t) return std::nullopt;
      r.trials.push_back({c.at(0).get<int>(), *t, c.at(2).get<double>()});
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<TuningRecord> load_tuning(const std::string& dir, const ir::Hash128& key) {
  const std::string path = (std::filesystem::path(dir) / "tuning" / (key.hex() + ".json")).string();
  if (std::optional<TuningRecord> r = load_document<TuningRecord>(path, tuning_from_text)) return r;
  return fetch_document<TuningRecord>("tuning", key.hex(), path, tuning_from_text);
}

bool store_tuning(const std::string& dir, const ir::Hash128& key, const TuningRecord& record) {
  const std::filesystem::path folder = std::filesystem::path(dir) / "tuning";
  if (!make_cache_folder(folder)) return false;
  const std::string text = tuning_to_text(record);
  if (!write_file_atomically((folder / (key.hex() + ".json")).string(), text)) return false;
  publish("tuning", key.hex(), text);
  return true;
}

std::vector<std::pair<std::string, TuningRecord>> list_tunings(const std::string& dir, std::vector<std::string>* problems,
                                                               bool remove_bad, std::vector<std::string>* foreign) {
  return list_documents<TuningRecord>(dir, "tuning", "tuning record", tuning_from_text, problems, remove_bad, foreign);
}

}  // namespace kiln::runtime
