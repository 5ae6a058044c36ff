#!/usr/bin/env bash
# Runs on the GPU machine (through the device tool): builds kiln there, runs
# every test ctest has (cpu and gpu labels), and cross-checks the reference
# interpreter against PyTorch. Logs go to $OUT when set.
#
# That machine has no network and no xxHash/CLI11 packages: copy their
# headers first with `tools/gpu-check.sh --prepare` here, and carry `.deps`.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [[ ${1:-} == --prepare ]]; then  # on the development machine
  mkdir -p .deps/include
  cp /usr/include/xxhash.h .deps/include/
  cp -r /usr/include/CLI .deps/include/
  echo "prepared .deps/include; carry .deps in the device call"
  exit 0
fi

out=${OUT:-/tmp/kiln-gpu-check}
mkdir -p "$out"
status=0
section() { printf '\n===== %s =====\n' "$*"; }

section "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || status=1
nvcc --version | tail -2
section "build"
start=$(date +%s)
KILN_NO_INSTALL=1 KILN_BUILD_DIR=$root/build-gpu tools/dev.sh build >"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"; echo "BUILD FAILED"; exit 1; }
grep -E "not found|not registered|skipped" "$out/build.log" || true
echo "built in $(( $(date +%s) - start )) s"
section "ctest (cpu and gpu labels)"
ctest --test-dir build-gpu -j "$(nproc)" --output-on-failure >"$out/ctest.log" 2>&1 || status=1
tail -6 "$out/ctest.log"
grep -E "tests passed|tests failed" "$out/ctest.log"
section "Python package (pip install . into the machine's python3; pytest, CPU and GPU)"
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build-gpu/python . >"$out/pip.log" 2>&1 || {
  tail -20 "$out/pip.log"; status=1; }
echo "pip install . in $(( $(date +%s) - start )) s"
# (the CPU tests as CI runs them, then the GPU tests with cuBLASLt where kiln's rule takes it)
(cd /tmp && timeout 420 python3 -m pytest "$root/python/tests" -q -rf -p no:cacheprovider -p no:logging \
  --ignore="$root/python/tests/test_gpu.py" >"$out/pytest.log" 2>&1) || status=1
tail -3 "$out/pytest.log"
(cd /tmp && KILN_VENDOR=auto timeout 420 python3 -m pytest "$root/python/tests/test_gpu.py" -q -rf -p no:cacheprovider \
  -p no:logging >"$out/pytest-gpu.log" 2>&1) || status=1
tail -3 "$out/pytest-gpu.log"
section "host time of a launch: C++ (by index, by name) and Python (kept in \$OUT)"
build-gpu/tests/kiln_gpu_tests --gtest_filter=Embedding.LaunchHostTimeFigures 2>&1 | grep FIGURE | sed 's/^FIGURE //' \
  | tee "$out/launch_figures.txt"
python3 bench/python_overhead.py 2>&1 | tail -5 | tee "$out/python_overhead.txt"
if [[ ${KILN_MODELS:-} ]]; then
  section "models through torch.compile(backend=\"kiln\") (cold kiln cache, then warm in a second process)"
  models_cache=$(mktemp -d)
  KILN_CACHE_DIR=$models_cache timeout 900 python3 bench/torch_models.py --models "$KILN_MODELS" --phase cold \
    --json "$out/models-cold.json" 2>"$out/models-cold.log" | tail -8 || status=1
  KILN_CACHE_DIR=$models_cache timeout 600 python3 bench/torch_models.py --models "$KILN_MODELS" --phase warm --no-inductor \
    --json "$out/models-warm.json" 2>"$out/models-warm.log" | tail -7 || status=1
fi
[[ ${KILN_SKIP_SANITIZERS:-0} == 1 ]] && exit $status
section "compute-sanitizer (memcheck over the GPU tests, racecheck over anchors, norms and attention)"
timeout 360 compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/tests/kiln_gpu_tests \
  --gtest_filter=-Gpu.CompileAndLaunchFigures:GpuDepthwise.ZooShapesMatchTheReference >"$out/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -5
timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/tests/kiln_gpu_tests \
  --gtest_filter=Gpu.FamiliesWithOddShapes:Gpu.EveryExampleMatchesTheReference:GpuAttention.Decode:GpuAttention.UnalignedPointers \
  >"$out/racecheck.log" 2>&1 || status=1
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$out/racecheck.log" | head -5
section "SASS for sm_90 (tensor-core instructions, local-memory spills per graph)"
for g in bench/graphs/anchors/*.json examples/*/*.json; do
  build-gpu/bin/kiln dump --stage sass --arch sm_90 "$g" >"$out/sass.txt" 2>/dev/null || continue
  printf '%-40s HGMMA %3d  HMMA %3d  LDL/STL %3d\n' "$(basename "$g" .json)" "$(grep -c HGMMA "$out/sass.txt")" \
    "$(grep -c 'HMMA\.' "$out/sass.txt")" "$(grep -cE '\b(LDL|STL)\b' "$out/sass.txt")"
done
rm -f "$out/sass.txt"
section "figures (compile, cache load, launch)"
build-gpu/tests/kiln_gpu_tests --gtest_filter=Gpu.CompileAndLaunchFigures 2>&1 | grep FIGURE | sed 's/^FIGURE //' \
  | tee "$out/figures.txt"
section "reference interpreter vs PyTorch (float64)"
python3 tests/gpu/crosscheck_reference.py build-gpu/bin/kiln "$root" >"$out/crosscheck.log" 2>&1 || status=1
grep -E "^FAIL|Traceback|Error" "$out/crosscheck.log" | head -20
tail -1 "$out/crosscheck.log"
if [[ ${KILN_SKIP_BENCH:-0} != 1 ]]; then
  section "benchmarks (same run: ceilings, kiln, eager, torch.compile)"
  timeout 420 python3 bench/run_bench.py build-gpu/bin/kiln bench/graphs/*.json --json "$out/bench.json" \
    2>"$out/bench.log" || { status=1; tail -20 "$out/bench.log"; }
fi
if [[ ${KILN_SKIP_ANCHOR_BENCH:-0} != 1 ]]; then
  # The table runs with the winners recorded here (kiln bench reads them from the cache).
  section "autotune (kiln compile --autotune over the anchor graphs: candidates, times, winners)"
  timeout 400 build-gpu/bin/kiln compile --autotune bench/graphs/anchors/*.json >"$out/autotune.log" 2>&1 || status=1
  grep -E "^\S|tiles|<- chosen" "$out/autotune.log"
  section "ResNet-50's convolutions against cuDNN (batch 32, channels-last bf16, vendor kernels by graph replay)"
  timeout 240 python3 bench/resnet50_convs.py build-gpu/bin/kiln --json "$out/resnet50.json" 2>"$out/resnet50.log" || {
    status=1; tail -20 "$out/resnet50.log"; }
  section "depthwise convs against cuDNN (MobileNetV3-S B64, EfficientNet-B0 B32, ConvNeXt-T B32, with their epilogues)"
  timeout 480 python3 bench/run_bench.py build-gpu/bin/kiln bench/graphs/anchors/depthwise/*.json \
    --json "$out/bench-depthwise.json" 2>"$out/bench-depthwise.log" || { status=1; tail -20 "$out/bench-depthwise.log"; }
  section "attention against cuDNN and FlashAttention-2 (PyTorch's SDPA backends, same shapes, same run)"
  timeout 420 python3 -u bench/attention.py --json "$out/attention.json" 2>"$out/attention.log" || {
    status=1; tail -20 "$out/attention.log"; }
  section "anchor benchmarks (matmul, conv, attention; torch.compile max-autotune for matmul graphs)"
  timeout 480 python3 bench/run_bench.py build-gpu/bin/kiln bench/graphs/anchors/*.json --json "$out/bench-anchors.json" \
    2>"$out/bench-anchors.log" || { status=1; tail -20 "$out/bench-anchors.log"; }
fi
exit $status
