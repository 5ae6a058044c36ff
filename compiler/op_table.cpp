#include "compiler/op_table.h"

#include <algorithm>
#include <array>
#include <vector>

namespace kiln::ir {
namespace {

#define A(key) attr_bit(AttrKey::key)
constexpr std::array<OpInfo, kOpKindCount> kOps = {{
#define KILN_OP(kind, name, family, min_in, max_in, attrs, device, cost) \
  {OpKind::kind, name, OpFamily::family, min_in, max_in, attrs, device, OpCost::cost},
#include "compiler/ops.def"
#undef KILN_OP
}};
#undef A

struct AttrInfo {
  std::string_view name;
  AttrKind kind;
};
constexpr std::array<AttrInfo, kAttrKeyCount> kAttrs = {{
#define KILN_ATTR(key, kind) {#key, AttrKind::kind},
#include "compiler/attrs.def"
#undef KILN_ATTR
}};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

const OpInfo& op_info(OpKind kind) { return kOps[static_cast<size_t>(kind)]; }

std::optional<OpKind> find_op(std::string_view name) {
  for (const OpInfo& info : kOps)
    if (info.name == name) return info.kind;
  return std::nullopt;
}

std::string_view closest_op_name(std::string_view name) {
  const OpInfo* best = &kOps[0];
  size_t best_distance = SIZE_MAX;
  for (const OpInfo& info : kOps) {
    size_t d = edit_distance(name, info.name);
    if (d < best_distance) best = &info, best_distance = d;
  }
  return best->name;
}

std::string_view attr_name(AttrKey key) { return kAttrs[static_cast<size_t>(key)].name; }
AttrKind attr_kind(AttrKey key) { return kAttrs[static_cast<size_t>(key)].kind; }

std::optional<AttrKey> find_attr(std::string_view name) {
  for (size_t i = 0; i < kAttrs.size(); ++i)
    if (kAttrs[i].name == name) return static_cast<AttrKey>(i);
  return std::nullopt;
}

}  // namespace kiln::ir
