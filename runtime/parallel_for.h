// Runs body(0) .. body(count - 1) on up to every core, the calling thread
// among them.
//
// Expects: a body that is safe to call from several threads at once for
// different indices. Guarantees: every index runs exactly once before it
// returns; where no more threads can be started, fewer run the indices (the
// results the same).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <system_error>
#include <thread>
#include <vector>

namespace kiln::runtime {

template <class Body>
void parallel_for(size_t count, Body&& body) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) body(i);
  };
  const size_t threads = std::min<size_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace kiln::runtime
