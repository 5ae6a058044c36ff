// The plan as people and scripts read it: `kiln plan` (text, --json, --dot).
//
// text: the rewrites applied before planning and the near misses declined
//   (rewrite_table.h), then one block per kernel (kind, anchor, ops, reads,
//   writes, parameters, notes), and for every tensor that crosses device
//   memory between two kernels, why the two were not merged.
// json: exactly the shape of cli.md's `kiln plan --json`.
// dot: Graphviz, one cluster per kernel, the anchor highlighted, edges between
//   clusters labelled with the tensor and its bytes.
#pragma once

#include <string>

#include "compiler/ir.h"
#include "compiler/plan.h"

namespace kiln::ir {

std::string plan_to_text(const Graph& g, const Plan& plan);
std::string plan_to_json(const Graph& g, const Plan& plan);
std::string plan_to_dot(const Graph& g, const Plan& plan);

}  // namespace kiln::ir
