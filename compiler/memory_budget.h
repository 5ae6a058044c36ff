// Budgets before allocation: how much host memory there is, and a byte
// count in words.
//
// Expects: nothing. Guarantees: available_host_memory() is what the kernel
// says a new allocation may take without swapping (MemAvailable), or, where
// /proc is missing, the free physical pages; require_host_memory throws a
// user error (exit 1) naming what needs the memory, how much, and how much
// there is, before anything is allocated.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

int64_t available_host_memory();

void require_host_memory(int64_t bytes, const std::string& what);

// "1.5 GiB", "12.0 MiB", "3.0 KiB", "12 B".
std::string human_bytes(int64_t bytes);

}  // namespace kiln
