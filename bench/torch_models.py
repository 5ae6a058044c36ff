"""Real models through torch.compile(backend="kiln") on the GPU machine
(issue 19): bf16, eval, random weights, built from configs (nothing is
downloaded). Per model, in one run: logits against eager PyTorch, the share
of ATen ops and of anchor FLOPs in kiln kernels, kiln subgraphs and kernels,
the time per forward against eager and Inductor, the host time of a call,
and the first call's time (cold or warm kiln cache: --phase).

    KILN_CACHE_DIR=/tmp/c python3 bench/torch_models.py --phase cold   # empty cache
    KILN_CACHE_DIR=/tmp/c python3 bench/torch_models.py --phase warm   # a second process, cache on disk
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

import kiln.torch as kt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_bench import median_ms  # noqa: E402  (CUDA events around each run, the median)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg), (torch.randint(0, 32000, (4, 512)),), lambda o: o.logits


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=768, n_head=12, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg), (torch.randint(0, 50257, (8, 256)),), lambda o: o.logits


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=2, attn_implementation="sdpa")
    return BertModel(cfg), (torch.randint(0, 30522, (8, 256)),), lambda o: o.last_hidden_state


def resnet50():
    import torchvision
    return torchvision.models.resnet50(weights=None), (torch.randn(32, 3, 224, 224),), lambda o: o


def vit_small():
    import timm
    return timm.create_model("vit_small_patch16_224", pretrained=False), (torch.randn(32, 3, 224, 224),), lambda o: o


MODELS = {"llama": llama, "gpt2": gpt2, "bert": bert, "resnet50": resnet50, "vit_small": vit_small}


def on_device(name, model, inputs):
    """The model and its inputs as the benchmark runs them: bf16 on the GPU,
    eval, and channels-last for the convolutional model (as its users run it)."""
    model = model.eval().cuda().to(torch.bfloat16)
    inputs = tuple(t.cuda() if t.dtype != torch.float32 else t.cuda().to(torch.bfloat16) for t in inputs)
    if name == "resnet50":
        model = model.to(memory_format=torch.channels_last)
        inputs = (inputs[0].to(memory_format=torch.channels_last),)
    return model, inputs


def host_ms(fn, iterations=20):
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def run(name, phase, with_inductor, max_autotune=False):
    model, inputs, logits = MODELS[name]()
    # The f32 forward, for the bf16 error of eager itself: kiln's error
    # against eager is judged beside it (both are bf16 approximations).
    with torch.no_grad():
        reference = model.eval().float().cuda()
        f32_inputs = tuple(t.cuda() for t in inputs)
        if name == "resnet50":
            reference = reference.to(memory_format=torch.channels_last)
            f32_inputs = (f32_inputs[0].to(memory_format=torch.channels_last),)
        exact = logits(reference(*f32_inputs)).float()
        del reference
    model, inputs = on_device(name, model, inputs)
    row = {"model": name, "phase": phase}
    with torch.no_grad():
        want = logits(model(*inputs)).float()
        torch._dynamo.reset()
        report = kt.Report()
        kt._REPORTS.report = report
        compiled = torch.compile(model, backend="kiln", dynamic=False)
        t0 = time.perf_counter()
        got = logits(compiled(*inputs)).float()
        torch.cuda.synchronize()
        row["first_call_s"] = round(time.perf_counter() - t0, 2)
        kt._REPORTS.report = None
        row["rel_err"] = float((got - want).norm() / want.norm())
        row["rel_err_f32"] = float((got - exact).norm() / exact.norm())  # kiln against the f32 forward
        row["eager_rel_err_f32"] = float((want - exact).norm() / exact.norm())  # eager bf16 against it
        in_kiln = sum(s["aten_ops"] for s in report.subgraphs)
        left = [e for e in report.left_to_pytorch]
        row["aten_ops_in_kiln"] = f"{in_kiln}/{in_kiln + len(left)}"
        flops_kiln = sum(s["flops"] for s in report.subgraphs)
        flops_all = flops_kiln + sum(e["flops"] for e in left)
        row["flops_in_kiln"] = round(flops_kiln / flops_all, 4) if flops_all else None
        row["subgraphs"] = len(report.subgraphs)
        row["kernels"] = sum(s["kernels"] for s in report.subgraphs)
        row["left_to_pytorch"] = sorted({f"{e['op']}: {e['reason']}" for e in left})
        row["kiln_ms"] = round(median_ms(lambda: compiled(*inputs)), 3)
        row["kiln_host_ms"] = round(host_ms(lambda: compiled(*inputs)), 3)
        row["eager_ms"] = round(median_ms(lambda: model(*inputs)), 3)
        if with_inductor:
            torch._dynamo.reset()
            inductor = torch.compile(model, dynamic=False)
            t0 = time.perf_counter()
            inductor(*inputs)
            torch.cuda.synchronize()
            row["inductor_first_call_s"] = round(time.perf_counter() - t0, 1)
            row["inductor_ms"] = round(median_ms(lambda: inductor(*inputs)), 3)
        if with_inductor and max_autotune:
            torch._dynamo.reset()
            tuned = torch.compile(model, dynamic=False, mode="max-autotune-no-cudagraphs")
            tuned(*inputs)
            torch.cuda.synchronize()
            row["inductor_max_autotune_ms"] = round(median_ms(lambda: tuned(*inputs)), 3)
    torch._dynamo.reset()
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", default="cold")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--max-autotune", action="store_true",
                        help="also Inductor with mode='max-autotune-no-cudagraphs' (minutes of GEMM tuning per model)")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(run(name, args.phase, not args.no_inductor, args.max_autotune))
        except Exception:  # noqa: BLE001 (a model that fails is reported, the others run)
            traceback.print_exc()
            rows.append({"model": name, "phase": args.phase, "error": traceback.format_exc(limit=3)})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print(f"\n{'model':10s} {'rel err':>9s} {'vs f32':>9s} {'eager vs f32':>12s} {'aten in kiln':>13s} {'flops':>6s} {'graphs':>6s} {'kernels':>7s} "
          f"{'kiln ms':>8s} {'host ms':>8s} {'eager ms':>9s} {'inductor':>9s} {'max-autotune':>12s} {'1st call s':>10s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:10s} ERROR")
            continue
        print(f"{r['model']:10s} {r['rel_err']:9.2e} {r['rel_err_f32']:9.2e} {r['eager_rel_err_f32']:12.2e} {r['aten_ops_in_kiln']:>13s} {r['flops_in_kiln'] or 0:6.3f} "
              f"{r['subgraphs']:6d} {r['kernels']:7d} {r['kiln_ms']:8.3f} {r['kiln_host_ms']:8.3f} {r['eager_ms']:9.3f} "
              f"{r.get('inductor_ms', float('nan')):9.3f} {r.get('inductor_max_autotune_ms', float('nan')):12.3f} "
              f"{r['first_call_s']:10.2f}")


if __name__ == "__main__":
    sys.exit(main())
