// The plan as people and scripts read it: `kiln plan` (text, --json, --dot).
//
// text: the rewrites applied before planning and the near misses declined
//   (rewrite_table.h), then one block per kernel (kind, anchor, ops, reads,
//   writes, parameters, notes), and for every tensor that crosses device
//   memory between two kernels, why the two were not merged; given its
//   tactics, a kernel's block ends "tactic for sm_90: mma.sync" and a
//   "rejected wgmma: <why>" line per tactic before it.
// json: exactly the shape of cli.md's `kiln plan --json`; given its tactics,
//   a kernel also has "tactic": {"arch", "chosen", "rejected": [{"tactic",
//   "reason"}]}.
// dot: Graphviz, one cluster per kernel, the anchor highlighted, edges between
//   clusters labelled with the tensor and its bytes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "compiler/ir.h"
#include "compiler/plan.h"

namespace kiln::ir {

// What codegen chose for one kernel on a target (codegen/tactic.h): the
// tactic that builds it and those before it that did not fit, with why.
struct KernelTactics {
  std::string arch;  // "sm_90"
  std::string chosen;
  std::vector<std::pair<std::string, std::string>> rejected;  // tactic, why it does not fit
};
using PlanTactics = std::map<int32_t, KernelTactics>;  // by plan kernel id

std::string plan_to_text(const Graph& g, const Plan& plan, const PlanTactics& tactics = {});
std::string plan_to_json(const Graph& g, const Plan& plan, const PlanTactics& tactics = {});
std::string plan_to_dot(const Graph& g, const Plan& plan);

}  // namespace kiln::ir
