#!/usr/bin/env bash
# Nsight Compute on the GPU machine: kiln's Hopper attention kernel and
# cuDNN's SDPA kernel (through PyTorch) on the same shapes, one launch each,
# after warm-up. Prints each kernel's launch (grid, cluster, registers,
# shared memory), its speed of light (SM, L2, DRAM throughput) and the
# tensor pipe's and L2's own counters; the full reports go to $OUT.
#
#   bench/profile_attention.sh KILN_BINARY [SHAPE ...]    (shapes: bench/attention.py's names)
#
# KILN_PROFILE_SOURCE=1 adds, for each kernel, the warp-state sections and
# the per-instruction page (SASS with executed counts and stall samples) as
# CSV in $OUT: read them with bench/ncu_source.py.
#
# The clocks are left as the card runs them (--clock-control none).
set -uo pipefail
kiln=$1
shift
shapes=("$@")
[[ ${#shapes[@]} -eq 0 ]] && shapes=("d128" "d128 causal")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-/tmp/kiln-profile}
work=$(mktemp -d)
mkdir -p "$out"

sections=(--section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis)
metrics=sm__cycles_elapsed.avg.per_second,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed
metrics+=,smsp__issue_active.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum.per_second
ncu_common=(--clock-control none --launch-skip 3 --launch-count 1 "${sections[@]}" --metrics "$metrics")

for shape in "${shapes[@]}"; do
  tag=${shape// /_}
  python3 - "$shape" "$work/$tag.json" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
from attention import SHAPES, graph_for
json.dump(graph_for(sys.argv[1], SHAPES[sys.argv[1]]), open(sys.argv[2], "w"))
EOF
  printf '\n===== %s: kiln =====\n' "$shape"
  ncu "${ncu_common[@]}" -k regex:kiln_kernel "$kiln" bench "$work/$tag.json" >"$out/ncu-kiln-$tag.txt" 2>&1
  grep -E "Grid Size|Cluster Size|Registers Per|Dynamic Shared|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Memory Throughput|sm__|lts__|smsp__|l1tex__" \
    "$out/ncu-kiln-$tag.txt" | sed 's/  */ /g'
  printf '\n===== %s: cuDNN (PyTorch SDPA) =====\n' "$shape"
  cat >"$work/cudnn.py" <<EOF
import sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "$root/bench")
from attention import SHAPES
b, h, hkv, sq, skv, d, causal = SHAPES["$shape"]
q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
k = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(6):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)
torch.cuda.synchronize()
EOF
  ncu "${ncu_common[@]}" -k 'regex:(?i)(sdpa|fmha|flash|attn|fprop)' python3 "$work/cudnn.py" >"$out/ncu-cudnn-$tag.txt" 2>&1
  grep -E "^  [a-z_0-9]+.*\(|Grid Size|Cluster Size|Registers Per|Dynamic Shared|Block Size|Duration|SM Frequency|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput|Memory Throughput|sm__|lts__|smsp__|l1tex__" \
    "$out/ncu-cudnn-$tag.txt" | sed 's/  */ /g' | cut -c1-200
  if [[ ${KILN_PROFILE_SOURCE:-0} == 1 ]]; then
    source_sections=(--section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters
                     --import-source no)
    ncu -f --clock-control none --launch-skip 3 --launch-count 1 "${source_sections[@]}" -k regex:kiln_kernel \
      -o "$work/kiln-$tag" "$kiln" bench "$work/$tag.json" >/dev/null 2>&1
    ncu -f --clock-control none --launch-skip 3 --launch-count 1 "${source_sections[@]}" -k 'regex:(?i)(sdpa|fmha|flash|attn|fprop)' \
      -o "$work/cudnn-$tag" python3 "$work/cudnn.py" >/dev/null 2>&1
    for who in kiln cudnn; do
      ncu -i "$work/$who-$tag.ncu-rep" --page source --csv --print-source sass >"$out/$who-$tag-sass.csv" 2>&1
      python3 "$root/bench/ncu_source.py" "$out/$who-$tag-sass.csv" loop | head -3
    done
  fi
done
rm -rf "$work"
