#!/usr/bin/env bash
# ThreadSanitizer over the tests where kiln's threads meet: eight threads
# compiling and running one graph set through one cache folder
# (Threads.*), the kernel cache's concurrent writers and readers
# (KernelCache.*), and parallel autotuning records (Tuning.*). Builds
# kiln_tsan_tests (the unit-test files that hold those suites) with clang
# and -fsanitize=thread in build-tsan/ (a separate tree: TSan and ASan do
# not mix); any report fails the run, and so does a test of those suites
# that kiln_tsan_tests lacks.
#
#   tools/tsan.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KILN_TSAN_BUILD_DIR:-$root/build-tsan}
jobs=$(nproc 2>/dev/null || echo 2)
command -v clang++ >/dev/null 2>&1 || { echo "tools/tsan.sh: clang++ is missing (tools/fuzz.sh installs it)" >&2; exit 1; }
"$root/tools/dev.sh" deps
if [[ ! -f $build/CMakeCache.txt ]]; then
  # Line tables alone (-g1): the sanitizers' reports still name files and lines, and clang compiles
  # each file about twice as fast as with full debug info (ASan, gemm_codegen.cpp: 16.5 -> 8.8 s).
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DKILN_TSAN=ON \
    -DKILN_NVRTC_ROOT="$("$root/tools/dev.sh" nvrtc-root)" >/dev/null
fi
printf '==> building kiln_tsan_tests with ThreadSanitizer (%s jobs)\n' "$jobs"
cmake --build "$build" -j "$jobs" --target kiln_tsan_tests
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
suites='Threads|KernelCache|Tuning'
filter='Threads.*:KernelCache.*:Tuning.*'
# Every test of those suites in the sources is in the binary (tests/CMakeLists.txt lists its files).
written=$(cat "$root"/tests/unit/*.cpp | grep -cE "^(TEST|TEST_F)\(($suites),")
built=$("$build/tests/kiln_tsan_tests" --gtest_list_tests --gtest_filter="$filter" | grep -c '^  ')
if [[ $written != "$built" ]]; then
  echo "tools/tsan.sh: tests/unit/*.cpp define $written tests of $suites, kiln_tsan_tests has $built:" \
       "add the file that holds the others to kiln_tsan_tests (tests/CMakeLists.txt)" >&2
  exit 1
fi
"$build/tests/kiln_tsan_tests" --gtest_filter="$filter"
