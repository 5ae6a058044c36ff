"""Every convolution shape of ResNet-50 (torchvision's, stride on the 3x3) at
batch 32, channels-last bf16, each as kiln graph conv2d + bias + relu (what an
inference model with its batch norms folded runs), against cuDNN in the same
run: the conv alone (F.conv2d on channels-last tensors,
torch.backends.cudnn.benchmark on) and cuDNN's own conv + bias + relu
(torch.cudnn_convolution_relu), both timed by CUDA-graph replay (the
kernels' GPU time, as `kiln bench` times kiln's). The geometric mean over
shapes, and weighted by how often ResNet-50 runs each shape.

    python3 bench/resnet50_convs.py KILN_BINARY [--json OUT.json]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import graph_ms  # noqa: E402

N = 32
# (input size, in channels, out channels, filter, stride, padding, times ResNet-50 runs it)
SHAPES = [
    (224, 3, 64, 7, 2, 3, 1),                                                                  # stem
    (56, 64, 64, 1, 1, 0, 1), (56, 64, 64, 3, 1, 1, 3), (56, 64, 256, 1, 1, 0, 4), (56, 256, 64, 1, 1, 0, 2),  # layer1
    (56, 256, 128, 1, 1, 0, 1), (56, 128, 128, 3, 2, 1, 1), (28, 128, 512, 1, 1, 0, 4), (56, 256, 512, 1, 2, 0, 1),
    (28, 512, 128, 1, 1, 0, 3), (28, 128, 128, 3, 1, 1, 3),                                   # layer2
    (28, 512, 256, 1, 1, 0, 1), (28, 256, 256, 3, 2, 1, 1), (14, 256, 1024, 1, 1, 0, 6), (28, 512, 1024, 1, 2, 0, 1),
    (14, 1024, 256, 1, 1, 0, 5), (14, 256, 256, 3, 1, 1, 5),                                  # layer3
    (14, 1024, 512, 1, 1, 0, 1), (14, 512, 512, 3, 2, 1, 1), (7, 512, 2048, 1, 1, 0, 3), (14, 1024, 2048, 1, 2, 0, 1),
    (7, 2048, 512, 1, 1, 0, 2), (7, 512, 512, 3, 1, 1, 2),                                    # layer4
]


def graph(h, c, k, r, stride, pad):
    return {"kiln": 1, "name": f"conv{r}x{r}_s{stride}_{h}x{h}_c{c}_k{k}",
            "inputs": {"x": {"shape": [N, h, h, c], "dtype": "bf16"}, "w": {"shape": [k, r, r, c], "dtype": "bf16"},
                       "b": {"shape": [k], "dtype": "bf16"}},
            "ops": [{"op": "conv2d", "in": ["x", "w"], "out": "c", "stride": [stride, stride], "padding": [pad, pad]},
                    {"op": "add", "in": ["c", "b"], "out": "cb"},
                    {"op": "relu", "in": ["cb"], "out": "y", "dtype": "bf16"}],
            "outputs": ["y"]}


def main():
    kiln = sys.argv[1]
    json_out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    torch.backends.cudnn.benchmark = True
    folder = tempfile.mkdtemp()
    paths = []
    for h, c, k, r, stride, pad, _ in SHAPES:
        paths.append(os.path.join(folder, f"{graph(h, c, k, r, stride, pad)['name']}.json"))
        with open(paths[-1], "w") as f:
            json.dump(graph(h, c, k, r, stride, pad), f)
    kiln_ms = {r["path"]: r for r in json.loads(subprocess.run([kiln, "bench", "--json", *paths], check=True,
                                                               capture_output=True, text=True).stdout)}
    rows = []
    for path, (h, c, k, r, stride, pad, times) in zip(paths, SHAPES):
        x = torch.randn(N, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        b = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        alone = graph_ms(lambda: F.conv2d(x, w, stride=stride, padding=pad))
        fused = graph_ms(lambda: torch.cudnn_convolution_relu(x, w, b, [stride, stride], [pad, pad], [1, 1], 1))
        p = (h + 2 * pad - r) // stride + 1
        flops = 2 * N * p * p * k * c * r * r
        kr = kiln_ms[path]
        rows.append({"shape": f"{r}x{r}/{stride} {h}x{h} {c}->{k}", "times": times, "flops": flops, "kiln_ms": kr["fused_ms"],
                     "cudnn_ms": alone, "cudnn_fused_ms": fused})
    print(f"ResNet-50 convolutions, batch {N}, channels-last bf16 ({torch.cuda.get_device_name()}); kiln: conv + bias + relu")
    print(f"{'shape':<26} {'x':>2} {'kiln ms':>8} {'TFLOP/s':>8} {'cuDNN conv':>10} {'TFLOP/s':>8} {'kiln/cuDNN':>10} "
          f"{'cuDNN c+b+r':>11} {'kiln/that':>9}")
    for row in rows:
        print(f"{row['shape']:<26} {row['times']:>2} {row['kiln_ms']:>8.4f} {row['flops'] / row['kiln_ms'] / 1e9:>8.0f} "
              f"{row['cudnn_ms']:>10.4f} {row['flops'] / row['cudnn_ms'] / 1e9:>8.0f} {row['kiln_ms'] / row['cudnn_ms']:>10.2f} "
              f"{row['cudnn_fused_ms']:>11.4f} {row['kiln_ms'] / row['cudnn_fused_ms']:>9.2f}")
    geo = math.exp(sum(math.log(r["kiln_ms"] / r["cudnn_ms"]) for r in rows) / len(rows))
    total_kiln = sum(r["kiln_ms"] * r["times"] for r in rows)
    total_cudnn = sum(r["cudnn_ms"] * r["times"] for r in rows)
    total_fused = sum(r["cudnn_fused_ms"] * r["times"] for r in rows)
    print(f"geometric mean kiln/cuDNN conv alone over {len(rows)} shapes: {geo:.2f}")
    print(f"ResNet-50's 53 convolutions, each as often as the model runs it: kiln {total_kiln:.3f} ms, cuDNN conv alone "
          f"{total_cudnn:.3f} ms ({total_kiln / total_cudnn:.2f}x), cuDNN conv+bias+relu {total_fused:.3f} ms")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
