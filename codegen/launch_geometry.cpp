#include "codegen/launch_geometry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace kiln::codegen {

LaunchGeometry launch_geometry(const GeneratedKernel& k, const ir::DimValues& values) {
  LaunchGeometry g{k.grid, k.block, k.shared_bytes};
  if (const std::optional<GridRule>& rule = k.grid_rule) {
    const int64_t items = ir::evaluate(rule->work, values) / rule->per_item;
    const int64_t blocks = std::clamp<int64_t>((items + rule->per_block - 1) / rule->per_block, 1, kMaxGridBlocks);
    g.grid[0] = static_cast<uint32_t>(
        std::min<int64_t>(blocks * rule->multiplier * ir::evaluate(rule->times, values), (int64_t{1} << 31) - 1));
  }
  return g;
}

std::string to_string(const LaunchGeometry& g) {
  std::string text = fmt::format("grid [{}] block [{}]", fmt::join(g.grid, ","), fmt::join(g.block, ","));
  if (g.shared_bytes > 0) text += fmt::format(" shared {} bytes", g.shared_bytes);
  return text;
}

}  // namespace kiln::codegen
