#!/usr/bin/env bash
# kiln's one developer script: installs what is missing (Debian/Ubuntu
# packages), configures, builds with every core, and runs.
#
#   tools/dev.sh demo [GRAPH]  the main job on a bundled example graph
#   tools/dev.sh test          build and run every CPU test, C++ and Python (what CI runs)
#   tools/dev.sh python        build the Python package (in build/) into build/venv only
#   tools/dev.sh build         configure and build only
#   tools/dev.sh deps          install missing packages only
#
# Environment: KILN_BUILD_DIR (default: build), KILN_BUILD_TYPE (default:
# RelWithDebInfo), KILN_NO_INSTALL=1 to never call apt-get.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KILN_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 2)

say() { printf '==> %s\n' "$*"; }

# Packages for what is missing: "package:file-or-command" pairs.
install_missing() {
  local wanted=(
    "cmake:cmake" "ninja-build:ninja" "g++:g++" "python3:python3"
    "libfmt-dev:/usr/include/fmt/format.h"
    "nlohmann-json3-dev:/usr/include/nlohmann/json.hpp"
    "libxxhash-dev:/usr/include/xxhash.h"
    "libcli11-dev:/usr/include/CLI/CLI.hpp"
    "libgtest-dev:/usr/include/gtest/gtest.h"
    "libgmock-dev:/usr/include/gmock/gmock.h"
    "llvm-14-tools:/usr/lib/llvm-14/bin/FileCheck"
    "graphviz:dot"
    "libhiredis-dev:/usr/include/hiredis/hiredis.h"
    "libssl-dev:/usr/include/openssl/hmac.h"
    "redis-server:redis-server"
  )
  local missing=() entry pkg probe
  for entry in "${wanted[@]}"; do
    pkg=${entry%%:*}
    probe=${entry#*:}
    if [[ $probe == /* ]]; then
      [[ -e $probe || -e $root/.deps/include/${probe#/usr/include/} ]] || missing+=("$pkg")
    else
      command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ ${KILN_NO_INSTALL:-0} == 1 ]] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing packages (not installing): ${missing[*]}"
    return 0
  fi
  say "installing: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

# NVRTC: the CUDA toolkit's, else the nvidia-cuda-nvrtc wheel from PyPI
# (installed for python3 when missing). Prints the folder to pass as
# KILN_NVRTC_ROOT, or nothing when the toolkit has it.
nvrtc_root() {
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  if [[ -e $cuda/include/nvrtc.h ]] && compgen -G "$cuda/lib64/libnvrtc.so*" >/dev/null; then return 0; fi
  local probe='import nvidia.cu13 as m; print(list(m.__path__)[0])'
  local dir
  dir=$(python3 -c "$probe" 2>/dev/null) || true
  if [[ -z $dir || ! -e $dir/include/nvrtc.h ]]; then
    if [[ ${KILN_NO_INSTALL:-0} == 1 ]]; then return 0; fi
    say "installing NVRTC (nvidia-cuda-nvrtc==13.0.88, PyPI)" >&2
    python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 >&2
    dir=$(python3 -c "$probe")
  fi
  echo "$dir"
}

# A SASS disassembler (`kiln dump --stage sass`, and the golden tests that
# read a kernel's SASS): the CUDA toolkit's, else the nvidia-cuda-nvdisasm
# wheel from PyPI (installed for python3 when missing). Prints the folder
# holding it, or nothing when none can be had.
sass_tool_dir() {
  local tool
  for tool in cuobjdump nvdisasm; do
    if command -v $tool >/dev/null 2>&1; then dirname "$(command -v $tool)"; return 0; fi
  done
  local cuda=${CUDA_HOME:-/usr/local/cuda}
  if [[ -x $cuda/bin/nvdisasm ]]; then echo "$cuda/bin"; return 0; fi
  local probe='import nvidia.cu13 as m, os; print(next((os.path.join(p, "bin") for p in m.__path__ if os.path.exists(os.path.join(p, "bin", "nvdisasm"))), ""))'
  local dir
  dir=$(python3 -c "$probe" 2>/dev/null) || true
  if [[ -z $dir ]]; then
    if [[ ${KILN_NO_INSTALL:-0} == 1 ]]; then return 0; fi
    say "installing nvdisasm (nvidia-cuda-nvdisasm==13.5.37, PyPI)" >&2
    python3 -m pip install -q --disable-pip-version-check nvidia-cuda-nvdisasm==13.5.37 >&2 || return 0
    dir=$(python3 -c "$probe" 2>/dev/null) || true
  fi
  echo "$dir"
}

configure() {
  install_missing
  local generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  if [[ ! -f $build/CMakeCache.txt ]]; then
    say "configuring $build"
    # RelWithDebInfo with line tables alone (-g1): backtraces still name files and lines, and each
    # file compiles about a third faster than with full debug info (CI builds kiln three times on
    # 2 cores). KILN_BUILD_TYPE=Debug keeps full debug info.
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE="${KILN_BUILD_TYPE:-RelWithDebInfo}" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
      -DKILN_NVRTC_ROOT="$(nvrtc_root)" -DKILN_SASS_TOOL_DIR="$(sass_tool_dir)" >/dev/null
  fi
}

configure_and_build() {
  configure
  say "building with $jobs jobs"
  cmake --build "$build" -j "$jobs"
}

has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

demo() {
  configure_and_build
  local graph=${1:-$root/examples/conv/conv_bias_relu.json}
  local kiln=$build/bin/kiln
  say "kiln validate $graph"
  "$kiln" validate "$graph"
  say "kiln dump --stage ir"
  "$kiln" dump "$graph" --stage ir
  say "kiln plan"
  "$kiln" plan "$graph"
  local out
  out=$(mktemp -d)
  say "kiln dump --stage cuda (the generated kernels, first 40 lines; all in $out/kernels.cu)"
  "$kiln" dump "$graph" --stage cuda >"$out/kernels.cu"
  head -40 "$out/kernels.cu"
  say "kiln compile (NVRTC, into the kernel cache), twice: the second run finds every kernel cached"
  "$kiln" compile "$graph"
  "$kiln" compile "$graph"
  if has_gpu; then
    say "a GPU is present: running the kernels and checking them against the reference interpreter"
    "$kiln" run "$graph" --device cuda --check --random 0 --outputs "$out"
  else
    say "no GPU on this machine: running the CPU reference interpreter"
    "$kiln" run "$graph" --device cpu --random 0 --outputs "$out"
  fi
  say "inputs and outputs written as .npy to $out"
}

# What the Python package's build and tests need, in $build/venv: nanobind,
# scikit-build-core, pytest, hypothesis, NumPy, PyTorch's CPU build, and the
# model zoo's packages (transformers, timm, torchvision).
python_env() {
  local venv=$build/venv
  if [[ ! -x $venv/bin/python ]]; then
    say "creating $venv"
    python3 -m venv "$venv"
  fi
  local wanted=(nanobind scikit-build-core numpy pytest hypothesis "nvidia-cuda-nvrtc==13.0.88" "torch==2.13.0")
  if ! "$venv/bin/python" -c "import nanobind, scikit_build_core, numpy, pytest, hypothesis, torch, nvidia.cu13" 2>/dev/null; then
    say "installing into $venv: ${wanted[*]}"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${wanted[@]}"
  fi
  # The model zoo's tiny tests (python/tests/test_zoo_tiny.py): transformers, timm and torchvision,
  # pinned together with torch==2.13.0 so that nothing they pull replaces PyTorch's CPU build (timm
  # alone would bring the newest torchvision and, with it, a CUDA torch). torchvision 0.28.0 is the
  # release for torch 2.13; its PyPI wheel is a CUDA build whose compiled ops do not load on the CPU
  # build (bench/zoo_models.py makes it importable all the same; no zoo model uses those ops).
  local zoo=("torch==2.13.0" "torchvision==0.28.0" "transformers==5.24.0" "timm==1.0.31")
  local have_zoo='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("torchvision", "transformers", "timm")))'
  if ! "$venv/bin/python" -c "$have_zoo" 2>/dev/null; then
    say "installing into $venv: ${zoo[*]}"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${zoo[@]}"
  fi
}

# The Python package: pip install . into $build/venv, built in $build itself,
# the C++ build's folder, at its build type and with its tests kept on, so
# that only the extension and kiln's CLI are built (the library they link is
# the C++ build's, not a second compile of it). scikit-build-core switches
# KILN_BUILD_PYTHON on in that folder and points its Python at the venv's.
# A plain `pip install .` keeps pyproject.toml's defaults (a Release build
# of its own).
python_package() {
  python_env
  configure
  local build_type
  build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt")
  say "pip install . (the kiln package, built in $build, ${build_type:-RelWithDebInfo})"
  local start=$SECONDS
  "$build/venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
    -Cbuild-dir="$build" -Ccmake.build-type="${build_type:-RelWithDebInfo}" \
    -Ccmake.define.KILN_BUILD_TESTS=ON -Cbuild.targets="_kiln;kiln_cli" "$root"
  say "kiln package installed in $((SECONDS - start)) s"
}

run_tests() {
  install_missing
  python_env  # before the C++ build: its folder is the package's too, and its Python the venv's
  configure_and_build
  say "running the CPU tests"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L cpu
  python_package
  local shards=$((jobs < 4 ? jobs : 4))  # (each process holds PyTorch: a few, not one per core)
  say "running the Python tests ($shards shards at once: KILN_TEST_SHARD, python/tests/conftest.py)"
  # pytest exits 5 when it collects nothing: that fails here too. Each shard's output is
  # printed whole when it ends; the step fails if any shard did.
  local logs pids=() failed=0 i
  logs=$(mktemp -d)
  for ((i = 0; i < shards; ++i)); do
    (cd "$root" && KILN_TEST_SHARD="$i/$shards" "$build/venv/bin/python" -m pytest python/tests -q -p no:cacheprovider \
      >"$logs/shard$i.log" 2>&1) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
    echo "--- shard $i/$shards"; cat "$logs/shard$i.log"
  done
  rm -rf "$logs"
  return $failed
}

case ${1:-} in
  demo) shift; demo "$@" ;;
  test) run_tests ;;
  python) install_missing; python_package ;;
  build) configure_and_build ;;
  deps) install_missing ;;
  nvrtc-root) nvrtc_root ;;
  sass-tool-dir) sass_tool_dir ;;
  *) echo "usage: tools/dev.sh demo [GRAPH] | test | build | python | deps" >&2; exit 2 ;;
esac
