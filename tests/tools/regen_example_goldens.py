# Regenerates the golden .test files beside examples/*.json from kiln's current
# output. The goldens are reviewed snapshots: after running this, read the
# diff (git diff examples/) and keep only intended changes.
import subprocess, glob, os, re, json
import sys
root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
kiln = sys.argv[1] if len(sys.argv) > 1 else root + "/build/bin/kiln"
def run(*args):
    return subprocess.run([kiln, *args], capture_output=True, text=True, check=True).stdout
for path in sorted(glob.glob(root + "/examples/**/*.json", recursive=True)):
    name = os.path.basename(path)[:-5]
    test = path[:-5] + ".test"
    graph = json.load(open(path))
    lines = [f"# Golden tests for {name}.json: its IR, its fusion plan, and a run of the reference interpreter.",
             f"RUN: %kiln validate %S/{name}.json | FileCheck %s --check-prefix=VALID",
             f"VALID: ok: {len(graph['ops'])} ops, {len(graph['inputs'])} inputs, {len(graph['outputs'])} outputs, hash {{{{[0-9a-f]+}}}}",
             "", f"RUN: %kiln dump %S/{name}.json --stage ir | FileCheck %s --check-prefix=IR"]
    first = True
    for line in run("dump", path, "--stage", "ir").strip().split("\n"):
        line = re.sub(r"hash [0-9a-f]{32}", "hash {{[0-9a-f]+}}", line)
        lines.append(("IR-LABEL: " if first else "IR-NEXT: ") + line)
        first = False
    plan = run("plan", path)
    lines += ["", f"RUN: %kiln plan %S/{name}.json | FileCheck %s --check-prefix=PLAN"]
    kernels = 0
    for line in plan.strip().split("\n"):
        if line.startswith("plan for"):
            lines.append("PLAN-LABEL: " + re.sub(r", [0-9.]+ [KMG]?i?B through.*", ",", line))
        elif line.startswith(("rewrite ", "not rewritten ")):  # the rewrites before planning (rewrite_table.h)
            lines.append("PLAN: " + line)
        elif line.startswith("kernel "):
            kernels += 1
            lines.append("PLAN: " + line)
        elif line.strip().startswith(("ops:", "writes:", "note:", "boundary:", "recomputed")):
            lines.append("PLAN-NEXT: " + line.strip() if line.strip().startswith("ops:") else "PLAN: " + line.strip())
    lines.append(f"PLAN-NOT: kernel {kernels}:")
    if kernels == 1:
        lines.insert(len(lines) - 1, "PLAN-NOT: boundary:")
    nofuse = run("plan", path, "--no-fusion").split("\n")[0]
    lines += ["", f"RUN: %kiln plan %S/{name}.json --no-fusion | FileCheck %s --check-prefix=NOFUSE",
              "NOFUSE: " + re.sub(r", [0-9.]+ [KMG]?i?B through.*", ",", nofuse)]
    jplan = json.loads(run("plan", path, "--json"))
    lines += ["", f"RUN: %kiln plan %S/{name}.json --json | FileCheck %s --check-prefix=JSON",
              f"JSON: \"graph\": \"{graph['name']}\","]
    for k in jplan["kernels"]:
        lines.append(f"JSON: \"kind\": \"{k['kind']}\",")
    cuda_checks = {
        "scale_shift_gelu": ['CUDA: #include "kiln/common.cuh"', 'CUDA: extern "C" __global__ void __launch_bounds__(256) kiln_kernel(',
                             'CUDA: kiln::load_bf16(p1, {{.*}});  // s', 'CUDA: kiln::round_bf16(kiln::op_gelu({{.*}}));  // y = gelu',
                             'CUDA: kiln::store_bf16(p3, i, {{.*}});  // y', 'CUDA-NOT: xst ='],
        "conv_channel_stats": ['CUDA: typedef kiln::tc::Gemm<64, 64, 32, 2, 2, 4, kiln::tc::kBf16, true> G;', 'CUDA: kiln::tc::cp_async16(tile + G::a_index(row, col), {{.*}}, ok);',
                               'CUDA: kiln::atomic_combine(kiln::SumOp(), {{.*}});',
                               'CUDA: kiln::atomic_combine(kiln::SumOp(), {{.*}});', 'CUDA: if (kiln_last) {'],
        "add_layer_norm": ['CUDA: kiln::load_chunk<kiln::Storage::bf16, 8>(p0, {{.*}}, in0, kiln_vec);',
                           'CUDA: acc = kiln::block_reduce<kiln::SumOp>(acc, kiln_scratch);',
                           'CUDA: kiln::store_chunk<kiln::Storage::bf16, 8>(p4, {{.*}});  // h',
                           'CUDA: kiln::store_chunk<kiln::Storage::bf16, 8>(p5, {{.*}});  // y'],
        "wide_group_norm": ['CUDA: extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(512) kiln_kernel(',
                            'CUDA: kiln::load_chunk<kiln::Storage::bf16, 8>(p0, {{.*}}, in0, kiln_vec);',
                            'CUDA: kiln_row[q * 8 + v] = {{.*}};', 'CUDA: kiln::cluster_sync();',
                            'CUDA: acc = kiln::SumOp::combine(acc, kiln::cluster_load(&kiln_partial[0], r));',
                            'CUDA: kiln::store_chunk<kiln::Storage::bf16, 8>({{.*}});  // y'],
        "rmsnorm_matmul": ['CUDA: // kiln kernel 0: reduction', 'CUDA: stats[2 * row + 1] = 1.0f / sqrtf(var + 9.99999997e-07f);',
                           'CUDA: // kiln kernel 1: matmul', 'CUDA: (from row statistics)'],
        # Big enough (144 tiles of 128 x 128) for sm_90's TMA + wgmma kernel (the default arch without a GPU).
        "hopper_matmul_bias_gelu": ['CUDA: #include "kiln/wgmma.cuh"',
                                    'CUDA: extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) kiln_kernel(',
                                    'CUDA: const __grid_constant__ kiln::TensorMap p{{[0-9]+}},  // tensor map of x',
                                    'CUDA: typedef kiln::wg::Gemm<128, 6, kiln::tc::kBf16, false, 2, false, true> G;',
                                    'CUDA: kiln::wg::tma_load(a_tile, {{.*}}, full, (int)k0, (int)m0);',
                                    'CUDA: kiln::wg::tma_multicast(b_tile + j * 4096, {{.*}}, full, 3, (int)(n0 + 64 * j), (int)k0);',
                                    'CUDA: gemm.mma_tile(smem, ring, k_tiles);',
                                    'CUDA: kiln::round_bf16(kiln::op_gelu({{.*}}));  // y = gelu',
                                    'CUDA: kiln::wg::tma_store(&p{{[0-9]+}}, staging, {{.*}});',
                                    'CUDA: G::finish();'],
        # 136 tiles of 128 x 128 rows: sm_90's wgmma kernel, the input gathered by the producer warpgroup.
        "hopper_conv_bias_relu": ['CUDA: #include "kiln/wgmma.cuh"',
                                  'CUDA: extern "C" __global__ void __launch_bounds__(384, 1) kiln_kernel(',
                                  'CUDA: const __grid_constant__ kiln::TensorMap p{{[0-9]+}},  // tensor map of w',
                                  'CUDA: const __grid_constant__ kiln::TensorMap p{{[0-9]+}}  // tensor map of y',
                                  'CUDA: typedef kiln::wg::Gemm<64, 8, kiln::tc::kBf16, true, 1, true, true> G;',
                                  'CUDA: kiln::wg::registers_down<128>();',
                                  'CUDA: top[i] = m < 17408 ? pi * 1 - 1 : -(1 << 29);',
                                  'CUDA: kiln::tc::cp_async16(a_tile + G::a_index(chunk_row + 16 * i, chunk_col), {{.*}}, ok);',
                                  'CUDA: kiln::wg::cp_async_arrive(full);',
                                  'CUDA: kiln::wg::tma_load(b_tile, {{.*}}, full, (int)k0, (int)n0);',
                                  'CUDA: kiln::wg::registers_up<184>();',
                                  'CUDA: const kiln::i64 on = m / 17408LL, op = (m / 128LL) % 136LL, oq = m % 128LL;',
                                  'CUDA: if (staged) kiln::put_pair_bf16(staging + {{.*}}, pair{{[0-9]+}}[0], pair{{[0-9]+}}[1]);',
                                  'CUDA: kiln::wg::tma_store(&p{{[0-9]+}}, staging, (int)(n0 + blk * 64), (int)(m0 + consumer * 64));',
                                  'CUDA: kiln::wg::bulk_wait_all();',
                                  'CUDA: G::finish();'],
        # A decode step: 4 query heads share each kv head (4 rows a block), 3 chunks of 512 keys merged.
        "sdpa_decode_gqa": ['CUDA: #include "kiln/attention_decode.cuh"',
                            'CUDA: typedef kiln::decode::DecodeAttention<64, 4, 512, 1> A;',
                            'CUDA: const kiln::i64 hi = kvh * 4LL + row / 1, qi = row % 1, kj = key;',
                            'CUDA: if (!a.merge_chunks('],
        # sm_90: the Hopper kernel; causality is the template's (CAUSAL: tiles past the diagonal skipped, masks on it).
        "sdpa_causal_gqa": ['CUDA: #include "kiln/attention_wgmma.cuh"',
                            'CUDA: typedef kiln::wg::FlashAttention<64, 128, 4, kiln::tc::kBf16, true> A;',
                            'CUDA: kvh = hi / 4LL;', 'CUDA: A::produce_by_copies(smem, q, k, v, q0, kv_tiles);',
                            'CUDA: return dot * 0.125f;', 'CUDA: fa.consume(smem, q0, 64, 64, kv_tiles, 0, score);'],
    }
    if name in cuda_checks:
        lines += ["", f"RUN: %kiln dump %S/{name}.json --stage cuda | FileCheck %s --check-prefix=CUDA"] + cuda_checks[name]
    lines += ["", f"RUN: %kiln run %S/{name}.json --device cpu --random 0 | FileCheck %s --check-prefix=CPU",
              f"CPU-LABEL: ran '{graph['name']}' on cpu (reference interpreter)"]
    for o in graph["outputs"]:
        lines.append(f"CPU: output {o} : {{{{.*}}}} min {{{{.*}}}} max")
    open(test, "w").write("\n".join(lines) + "\n")
