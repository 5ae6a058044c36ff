// A group of ops under construction by the planner: a kernel-to-be.
//
// Members carry a stage: 0 for values on the group's main iteration space
// (the anchor's output, the pointwise domain, the domain being reduced or
// normalised), 1 for values on the reduced space (after a reduction or a
// pooling window). Views are bijections, so they keep the stage and the
// element count of their input.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/plan.h"

namespace kiln::ir::planner {

struct Group {
  int id = 0;
  KernelKind kind = KernelKind::Pointwise;
  bool alive = true;
  int32_t anchor = -1;    // op index of the anchor (matmul/conv/sdpa or the decomposed attention's last matmul)
  int32_t norm_op = -1;   // Norm groups: the normalisation op
  bool pooling = false;   // Reduction groups made around a pooling op
  std::set<int32_t> ops;  // member op indices (views included)
  std::map<TensorId, int> stage;  // member results -> stage
  int64_t count[2] = {0, 0};      // element count of each stage
  Shape domain;                   // stage-0 shape
  std::vector<int64_t> reduce_axes;  // Reduction groups (not pooling): axes of `domain`
  // Reduction groups that hold their rows (the reduced axes are the last
  // ones): ops on the domain may read the finished reductions back, so
  // softmax or a norm written op by op is one kernel. `after_reduction`:
  // the domain values computed from a finished reduction, read only at
  // their own element.
  bool holds_rows = false;
  std::set<TensorId> after_reduction;
  int epilogue_reductions = 0;       // anchors: reductions of the output
  bool epilogue_pool = false;        // conv anchors: a pool of the output (strategies.cpp)
  std::set<int32_t> recomputed;
  std::vector<std::string> notes;
  std::vector<std::string> workspace;  // scratch buffers it writes (names for the dumps)
};

// Whether a group can take an op, at which stage, and if not, why.
struct Verdict {
  bool ok = false;
  int stage = 0;
  std::string reason;
  static Verdict yes(int stage) { return {true, stage, {}}; }
  static Verdict no(std::string why) { return {false, 0, std::move(why)}; }
};

}  // namespace kiln::ir::planner
