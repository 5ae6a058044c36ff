"""Host time of kiln's Python call path on the GPU machine (issue 18): a
one-kernel graph through `exe(**inputs)` (outputs allocated by PyTorch),
`exe.run(inputs, outputs)` (outputs given), against a PyTorch eager call
of one op on the same tensors. The C++ launch of the same graph is the
FIGURE line of `kiln_gpu_tests --gtest_filter=Embedding.LaunchHostTimeFigures`.

    python3 bench/python_overhead.py [GRAPH]
"""
import statistics
import sys
import time

import torch

import kiln

CALLS = 10_000


def median_us(fn):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(CALLS):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1000)
        if i % 500 == 499:
            torch.cuda.synchronize()  # keep the launch queue from filling
    torch.cuda.synchronize()
    return statistics.median(samples)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "examples/pointwise/scale_shift_gelu.json"
    g = kiln.Graph.load(path)
    exe = kiln.compile(g)
    dtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    ins = {n: torch.randn(*s.shape, device="cuda").to(dtypes[s.dtype]) for n, s in g.inputs.items()}
    outs = {n: torch.empty(*s.shape, device="cuda", dtype=dtypes[s.dtype]) for n, s in g.outputs.items()}
    first = next(iter(ins.values()))
    call = median_us(lambda: exe(**ins))
    run = median_us(lambda: exe.run(ins, outs))
    eager = median_us(lambda: torch.nn.functional.gelu(first))
    print(f"graph {g.name}: {len(exe.kernels)} kernel(s), inputs {', '.join(f'{n}{list(s.shape)}' for n, s in g.inputs.items())}")
    print(f"{'path':44s} {'median us':>10s}")
    print(f"{'exe(**inputs) (outputs allocated by torch)':44s} {call:10.2f}")
    print(f"{'exe.run(inputs, outputs) (outputs given)':44s} {run:10.2f}")
    print(f"{'torch eager F.gelu on the same tensor':44s} {eager:10.2f}")


if __name__ == "__main__":
    main()
