#!/usr/bin/env bash
# Proves that the working tree generates the same CUDA C++ as commit BASE:
# builds kiln_codegen_digest against BASE (in a temporary worktree, with
# this tree's digest tool and random-graph generator) and against the
# working tree, and compares the digests of every example, bench graph and
# RANDOM random graph for sm_80 and sm_90. Exit 0: byte-identical.
# With --up-to-names, kernels that differ only in the emitter's variable
# names count as identical (tests/tools/same_up_to_names.py): the proof for
# a change of naming alone. With --up-to-layout, kernels that differ only in
# the whitespace that starts their lines (tests/tools/same_up_to_layout.py):
# the proof for a change of CodeWriter::lay_out alone.
#
#   tests/tools/codegen_identical.sh [--up-to-names | --up-to-layout] BASE [RANDOM]   (default 1000)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
up_to_names=0 up_to_layout=0
[[ ${1:-} == --up-to-names ]] && { up_to_names=1; shift; }
[[ ${1:-} == --up-to-layout ]] && { up_to_layout=1; shift; }
base=${1:?usage: codegen_identical.sh [--up-to-names | --up-to-layout] BASE [RANDOM]}
count=${2:-1000}
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git -C "$root" worktree add --detach "$work/base" "$base" >/dev/null
cp "$root/tests/tools/codegen_digest.cpp" "$work/base/tests/tools/"
cp "$root/tests/unit/random_graph.h" "$root/tests/unit/random_graph.cpp" "$work/base/tests/unit/"
grep -q kiln_codegen_digest "$work/base/tests/CMakeLists.txt" ||
  sed -n '/^# The codegen digest/,$p' "$root/tests/CMakeLists.txt" >>"$work/base/tests/CMakeLists.txt"
[[ -d $root/.deps ]] && cp -r "$root/.deps" "$work/base/"

digest() {  # SOURCE BUILD OUT
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DKILN_NVRTC_ROOT="$("$root/tools/dev.sh" nvrtc-root)" >/dev/null
  cmake --build "$2" --target kiln_codegen_digest >/dev/null
  mkdir -p "$3.sources"
  KILN_DIGEST_SOURCES="$3.sources" "$2/tests/kiln_codegen_digest" "$1" "$count" >"$3"
}
echo "==> digest of $base"
digest "$work/base" "$work/build-base" "$work/base.txt"
echo "==> digest of the working tree"
digest "$root" "${KILN_BUILD_DIR:-$root/build}" "$work/tree.txt"
lines=$(wc -l <"$work/tree.txt")
if diff -u "$work/base.txt" "$work/tree.txt" >"$work/diff.txt"; then
  echo "byte-identical: $lines kernels (examples, bench graphs, $count random graphs; sm_80 and sm_90), digest $(xxhsum "$work/tree.txt" 2>/dev/null | cut -d' ' -f1 || md5sum "$work/tree.txt" | cut -d' ' -f1)"
elif [[ $up_to_names == 1 ]] && python3 "$root/tests/tools/same_up_to_names.py" "$work/base.txt.sources" "$work/tree.txt.sources"; then
  echo "identical up to variable names: $lines kernels (examples, bench graphs, $count random graphs; sm_80 and sm_90)"
elif [[ $up_to_layout == 1 ]] && python3 "$root/tests/tools/same_up_to_layout.py" "$work/base.txt.sources" "$work/tree.txt.sources" &&
  diff <(sed 's/ [0-9a-f]\{16\} / /' "$work/base.txt") <(sed 's/ [0-9a-f]\{16\} / /' "$work/tree.txt") >/dev/null; then
  echo "identical up to layout (launch shapes identical): $lines kernels (examples, bench graphs, $count random graphs; sm_80 and sm_90)"
else
  echo "DIFFERENT from $base: $(grep -c '^-[^-]' "$work/diff.txt") kernels"
  grep '^[-+][^-+]' "$work/diff.txt" | head -20 || true
  kept=${KILN_IDENTICAL_KEEP:-/tmp/kiln-codegen-identical}; rm -rf "$kept"; mkdir -p "$kept"
  cp -r "$work/base.txt.sources" "$kept/base"; cp -r "$work/tree.txt.sources" "$kept/tree"
  echo "sources kept in $kept/base and $kept/tree (diff -r them)"; exit 1
fi
