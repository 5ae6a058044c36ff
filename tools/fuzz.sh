#!/usr/bin/env bash
# The sanitizer job: builds kiln with clang, AddressSanitizer, UBSan and
# libFuzzer coverage (build-fuzz/), runs every CPU test under the
# sanitizers, then each libFuzzer target for a bounded time on a seed corpus
# of the example graphs and the malformed-graph corpus. Any sanitizer
# report, crash, hang or uncaught exception fails it; what a fuzzer finds
# is left in build-fuzz/findings/ (make it a regression test).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET]   (default 60)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KILN_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${1:-60}
jobs=$(nproc 2>/dev/null || echo 2)
say() { printf '==> %s\n' "$*"; }

if ! command -v clang++ >/dev/null 2>&1; then
  if [[ ${KILN_NO_INSTALL:-0} != 1 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing clang (libFuzzer)"
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq clang >/dev/null
  else
    echo "clang++ is missing" >&2; exit 1
  fi
fi
"$root/tools/dev.sh" deps
if [[ ! -f $build/CMakeCache.txt ]]; then
  say "configuring $build (clang, ASan, UBSan, libFuzzer)"
  # Line tables alone (-g1): the sanitizers' reports still name files and lines, and clang compiles
  # each file about twice as fast as with full debug info (ASan, gemm_codegen.cpp: 16.5 -> 8.8 s).
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DKILN_FUZZ=ON \
    -DKILN_NVRTC_ROOT="$("$root/tools/dev.sh" nvrtc-root)" >/dev/null
fi
say "building with $jobs jobs"
cmake --build "$build" -j "$jobs"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
say "the CPU tests under ASan + UBSan"
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L cpu

# The generated CUDA must not depend on the C++ compiler kiln was built with
# (a clang-built and a GCC-built kiln share kernel caches): this clang
# build's digest of every example and bench graph, every tuning choice,
# sm_80 and sm_90, against the GCC build's of the tests.
gcc_build=${KILN_BUILD_DIR:-$root/build}
if [[ -x $gcc_build/tests/kiln_codegen_digest ]]; then
  say "generated CUDA identical to the GCC build's ($gcc_build)"
  cmake --build "$build" -j "$jobs" --target kiln_codegen_digest >/dev/null
  digests=$(mktemp -d)
  "$gcc_build/tests/kiln_codegen_digest" "$root" 0 >"$digests/gcc.txt" &  # the two at once
  gcc_digest=$!
  "$build/tests/kiln_codegen_digest" "$root" 0 >"$digests/clang.txt"
  wait $gcc_digest
  diff "$digests/gcc.txt" "$digests/clang.txt" >/dev/null || {
    echo "the clang and GCC builds generate different CUDA (tests/tools/codegen_digest.cpp lists the kernels)"; exit 1; }
  echo "  $(wc -l <"$digests/clang.txt") kernels identical"
  rm -rf "$digests"
else
  say "no GCC build at $gcc_build: the cross-compiler codegen check is skipped"
fi

mkdir -p "$build/findings"
# The three targets fuzz at once, each on its own core, or sharing fewer
# cores for longer: each gets $seconds s of one core's time.
targets=3
wall=$(( jobs >= targets ? seconds : (seconds * targets + jobs - 1) / jobs ))
work=$(mktemp -d)
pids=() names=()
# fuzz TARGET SEEDS MAX_LEN: starts the libFuzzer target (in the background,
# for $wall s) on a copy of the seed folder; finish_fuzzing waits for them.
fuzz() {
  local target=$1 seeds=$2 max_len=$3
  say "$target for $wall s, $seconds s of a core ($(ls "$seeds" | wc -l) seeds)"
  mkdir "$work/$target"
  cp "$seeds"/* "$work/$target/"
  "$build/fuzz/$target" "$work/$target" -max_total_time="$wall" -timeout=20 -rss_limit_mb=4096 -max_len="$max_len" \
    -artifact_prefix="$build/findings/$target-" -print_final_stats=1 2>"$build/findings/$target.log" &
  pids+=($!) names+=("$target")
}
# Each target's result in turn; a finding fails the job.
finish_fuzzing() {
  local i target failed=0
  for i in "${!pids[@]}"; do
    target=${names[$i]}
    if wait "${pids[$i]}"; then
      say "$target"
      grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/findings/$target.log" | sed "s/^/  /"
      echo "  corpus now $(ls "$work/$target" | wc -l) inputs; 0 crashes"
    else
      tail -40 "$build/findings/$target.log"; echo "FUZZ FINDING in $target (see $build/findings)"; failed=1
    fi
  done
  rm -rf "$work"
  return $failed
}

graphs=$(mktemp -d)
find "$root/examples" "$root/tests/malformed" "$root/tests/cli" "$root/bench/graphs" -name '*.json' -exec cp {} "$graphs/" \;
fuzz fuzz_graph_load "$graphs" 65536
fuzz fuzz_plan_codegen "$graphs" 65536
rm -rf "$graphs"

# The .npy reader, on seeds of every dtype kind, both orders and a few shapes.
npy_seeds=$(mktemp -d)
python3 - "$npy_seeds" <<'PY'
import struct, sys
def npy(descr, shape, fortran, payload, name):
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, repr(tuple(shape)))
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    open(f"{sys.argv[1]}/{name}.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload)
npy("<f4", [2, 3], False, struct.pack("<6f", *range(6)), "f4")
npy("<f2", [4], False, b"\x00\x3c" * 4, "f2")
npy(">f8", [3, 1], True, struct.pack(">3d", 1.5, -2, 3), "f8")
npy("|b1", [5], False, b"\x01\x00\x01\x01\x00", "b1")
npy("<i8", [], False, struct.pack("<q", 7), "i8")
npy("|u1", [2, 2, 2], False, bytes(range(8)), "u1")
npy("|u1", [0, 6, 8888888888, 88, 88888888, 2], False, b"", "empty_huge")  # once overflowed the strides
PY
fuzz fuzz_npy "$npy_seeds" 4096
rm -rf "$npy_seeds"
finish_fuzzing
