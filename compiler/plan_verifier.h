// Checks a plan's invariants (plan.h): every op in a kernel; ops in several
// kernels only where recomputed on purpose or views; reads are graph inputs
// or written by an earlier kernel; each graph output (that is not also a
// graph input) written by exactly one kernel; writes are results the kernel
// computes. Runs after planning in every build: a failure is a planner bug.
#pragma once

#include <string>

#include "compiler/ir.h"
#include "compiler/plan.h"

namespace kiln::ir {

// Empty when the plan is valid, else what is wrong.
std::string verify_plan(const Graph& g, const Plan& plan);

}  // namespace kiln::ir
