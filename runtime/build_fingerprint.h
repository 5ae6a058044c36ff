// A hash of the sources that decide what kiln generates (compiler/,
// codegen/, templates/), made at build time by cmake/fingerprint.cmake: a
// part of every program recipe's cache key.
#pragma once

namespace kiln::runtime {

const char* build_fingerprint();

}  // namespace kiln::runtime
