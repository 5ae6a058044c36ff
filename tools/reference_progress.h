// A progress line for long reference-interpreter runs: on a terminal, once a
// run has taken a second, stderr shows the share of its work done, the op it
// is at and an estimate of the time left, rewritten in place and erased when
// the run ends. Elsewhere (pipes, files, CI logs) it prints nothing.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>

#include "kiln/reference.h"

namespace kiln::cli {

class ReferenceProgressLine {
 public:
  explicit ReferenceProgressLine(const char* what) : what_(what), tty_(::isatty(STDERR_FILENO) == 1) {}
  ~ReferenceProgressLine() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
  }
  ReferenceProgressLine(const ReferenceProgressLine&) = delete;
  ReferenceProgressLine& operator=(const ReferenceProgressLine&) = delete;

  // The callback for run_reference, or none where nothing would be shown.
  std::function<void(const ReferenceProgress&)> callback() {
    if (!tty_) return nullptr;
    return [this](const ReferenceProgress& p) { show(p); };
  }

 private:
  void show(const ReferenceProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - start_).count();
    if (seconds < 1.0 || p.ops_done == p.op_count || now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double left = p.work_done > 0 ? seconds * (1 - p.work_done) / p.work_done : 0;
    std::fprintf(stderr, "\r\033[K%s: %3.0f%% of the work, op %zu of %zu, %.0f s, about %.0f s left", what_,
                 100 * p.work_done, p.ops_done + 1, p.op_count, seconds, left);
    std::fflush(stderr);
    shown_ = true;
  }

  const char* what_;
  const bool tty_;
  bool shown_ = false;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace kiln::cli
