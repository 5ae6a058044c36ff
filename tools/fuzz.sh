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
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON \
    -DKILN_NVRTC_ROOT="$("$root/tools/dev.sh" nvrtc-root)" >/dev/null
fi
say "building with $jobs jobs"
cmake --build "$build" -j "$jobs"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
say "the CPU tests under ASan + UBSan"
ctest --test-dir "$build" --output-on-failure -j "$jobs" -L cpu

corpus=$(mktemp -d)
find "$root/examples" "$root/tests/malformed" "$root/bench/graphs" -name '*.json' -exec cp {} "$corpus/" \;
mkdir -p "$build/findings"
for target in fuzz_graph_load fuzz_plan_codegen; do
  say "$target for $seconds s ($(ls "$corpus" | wc -l) seeds)"
  work=$(mktemp -d)
  cp "$corpus"/* "$work/"
  "$build/fuzz/$target" "$work" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$build/findings/$target-" -print_final_stats=1 2>"$build/findings/$target.log" || {
      tail -40 "$build/findings/$target.log"; echo "FUZZ FINDING in $target (see $build/findings)"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/findings/$target.log" | sed "s/^/  /"
  echo "  corpus now $(ls "$work" | wc -l) inputs; 0 crashes"
  rm -rf "$work"
done
rm -rf "$corpus"
