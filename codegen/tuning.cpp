#include "codegen/tuning.h"

#include <fmt/format.h>

#include <charconv>
#include <sstream>
#include <vector>

namespace kiln::codegen {
namespace {

struct Field {
  const char* name;
  int Tuning::*member;
};
constexpr Field kFields[] = {{"tile_n", &Tuning::tile_n}, {"tile_m", &Tuning::tile_m}, {"cluster", &Tuning::cluster},
                             {"raster", &Tuning::raster}, {"splits", &Tuning::splits}};

}  // namespace

std::string Tuning::to_string() const {
  std::string out;
  for (const Field& f : kFields)
    if (this->*f.member != 0) out += fmt::format("{}{}={}", out.empty() ? "" : " ", f.name, this->*f.member);
  if (epilogue != 0) out += fmt::format("{}epilogue={}", out.empty() ? "" : " ", epilogue == kRolled ? "rolled" : "unrolled");
  if (pingpong != 0) out += fmt::format("{}pingpong={}", out.empty() ? "" : " ", pingpong);
  if (vendor != 0) out += fmt::format("{}vendor={}", out.empty() ? "" : " ", vendor == kCublasLt ? "cublasLt" : "own");
  return out;
}

std::optional<Tuning> Tuning::parse(const std::string& text) {
  Tuning t;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return std::nullopt;
    const std::string name = word.substr(0, eq);
    if (name == "epilogue") {
      const std::string value = word.substr(eq + 1);
      if (t.epilogue != 0 || (value != "rolled" && value != "unrolled")) return std::nullopt;
      t.epilogue = value == "rolled" ? kRolled : kUnrolled;
      continue;
    }
    if (name == "vendor") {
      const std::string value = word.substr(eq + 1);
      if (t.vendor != 0 || (value != "cublasLt" && value != "own")) return std::nullopt;
      t.vendor = value == "cublasLt" ? kCublasLt : kOwn;
      continue;
    }
    if (name == "pingpong") {
      if (t.pingpong != 0 || word.substr(eq + 1) != "1") return std::nullopt;
      t.pingpong = 1;
      continue;
    }
    int value = 0;
    const char* first = word.data() + eq + 1;
    const char* last = word.data() + word.size();
    auto [end, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || end != last || value <= 0 || value > 4096) return std::nullopt;
    bool known = false;
    for (const Field& f : kFields)
      if (name == f.name) {
        if (t.*f.member != 0) return std::nullopt;  // given twice
        t.*f.member = value;
        known = true;
      }
    if (!known) return std::nullopt;
  }
  return t;
}

std::string to_string(const ProgramTuning& tuning) {
  std::string out;
  for (const auto& [kernel, t] : tuning)
    if (!t.empty()) out += fmt::format("{}k{}{{{}}}", out.empty() ? "" : " ", kernel, t.to_string());
  return out;
}

}  // namespace kiln::codegen
