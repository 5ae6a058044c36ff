"""Each benchmark graph as a PyTorch user writes it: tensors in their storage
dtype, torch's own ops (F.layer_norm, F.rms_norm, torch.softmax, F.gelu,
F.scaled_dot_product_attention), convolutions on channels-last tensors with
cuDNN's autotuner on (set by run_bench.py). These are the primary baselines
of bench/run_bench.py, eager and under torch.compile.

A graph stored NHWC ([N, H, W, C], weights [K, R, S, C]) is what PyTorch calls
a channels-last NCHW tensor: `cl` gives PyTorch's view of the same memory, no
copy. Norms written out by hand upcast to f32 as model code does (Llama's
RMSNorm). Each function takes the graph's inputs by name and returns its
outputs in the graph's order.

    NATIVE[graph_name](inputs) -> tuple of tensors
"""
import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


def cl(x):
    """A [N, H, W, C] tensor (or [K, R, S, C] weights) as PyTorch's channels-last [N, C, H, W]."""
    return x.permute(0, 3, 1, 2)


def layer_norm_written_out(x, w, b):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    c = xf - mean
    var = (c * c).mean(-1, keepdim=True)
    return ((c * torch.rsqrt(var + 1e-5)) * w + b).to(BF16)


def rms_norm_as_llama_writes_it(x, w):
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return w * (xf * torch.rsqrt(var + 1e-6)).to(BF16)


def softmax_written_out(x):
    xf = x.float()
    e = torch.exp(xf - xf.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)).to(BF16)


def residual_rms_norm(a, w, r, g):  # a Llama layer's o_proj, residual and RMSNorm
    h = r + a @ w
    return h, rms_norm_as_llama_writes_it(h, g)


def channel_stats(c):
    return c, c.sum((0, 2, 3)), (c * c).sum((0, 2, 3))


def depthwise(epilogue, stride, padding):
    """A depthwise conv (groups = C) or a grouped one (ResNeXt: groups of
    C / w.shape[1]) and what follows it as the zoo's models write it: the
    conv's bias (ConvNeXt), or an inference BatchNorm2d and ReLU, ReLU6,
    Hardswish or SiLU (MobileNetV3, EfficientNet, ResNeXt)."""
    def run(i):
        x, w = cl(i["x"]), cl(i["w"])
        groups = x.shape[1] // w.shape[1]
        if epilogue == "bias":
            return (F.conv2d(x, w, i["b"], stride=stride, padding=padding, groups=groups),)
        y = F.batch_norm(F.conv2d(x, w, stride=stride, padding=padding, groups=groups), i["mean"], i["var"], i["gamma"],
                         i["beta"], training=False)
        return ({"relu": F.relu, "relu6": F.relu6, "hardswish": F.hardswish, "silu": F.silu}[epilogue](y),)
    return run


NATIVE = {
    # memory-bound
    "add_layer_norm": lambda i: (F.layer_norm(i["x"] + i["r"], (i["x"].shape[-1],), i["w"], i["b"]),),
    "bn_stats": lambda i: (i["x"].sum((0, 1, 2)), (i["x"] * i["x"]).sum((0, 1, 2))),
    "gelu_chain": lambda i: (F.gelu(i["x"] * i["s"] + i["t"]),),
    "group_norm_silu": lambda i: (F.silu(F.group_norm(cl(i["x"]), 32, i["w"], i["b"])),),
    "layer_norm": lambda i: (F.layer_norm(i["x"], (i["x"].shape[-1],), i["w"], i["b"]),),
    "layer_norm_written_out": lambda i: (layer_norm_written_out(i["x"], i["w"], i["b"]),),
    "long_row_softmax": lambda i: (torch.softmax(i["x"], -1),),
    "reduce_sum_first": lambda i: (i["x"].sum(0),),
    "reduce_sum_last": lambda i: (i["x"].sum(1),),
    "rms_norm": lambda i: (F.rms_norm(i["x"], (i["x"].shape[-1],), i["w"], eps=1e-6),),
    "rms_norm_written_out": lambda i: (rms_norm_as_llama_writes_it(i["x"], i["w"]),),
    "softmax": lambda i: (torch.softmax(i["x"], -1),),
    "softmax_scale_mask": lambda i: (torch.softmax(i["x"] * 0.125 + i["mask"], -1),),
    "softmax_written_out": lambda i: (softmax_written_out(i["x"]),),
    # anchors
    "batched_matmul_scale": lambda i: (torch.bmm(i["a"], i["b"]) * 0.125,),
    "conv1x1": lambda i: (F.conv2d(cl(i["x"]), cl(i["w"])),),
    "conv3x3_bias_relu": lambda i: (F.relu(F.conv2d(cl(i["x"]), cl(i["w"]), i["b"], padding=1)),),
    "conv3x3_stride2": lambda i: (F.conv2d(cl(i["x"]), cl(i["w"]), stride=2, padding=1),),
    "conv_bias_residual_relu": lambda i: (F.relu(F.conv2d(cl(i["x"]), cl(i["w"]), i["b"], padding=1) + cl(i["r"])),),
    "conv_bias_relu_max_pool": lambda i: (F.max_pool2d(F.relu(F.conv2d(cl(i["x"]), cl(i["w"]), i["b"], padding=1)), 2),),
    "conv_bn_relu": lambda i: (F.relu(F.batch_norm(F.conv2d(cl(i["x"]), cl(i["w"]), padding=1), i["mean"], i["var"],
                                                   i["gamma"], i["beta"], training=False)),),
    "conv_channel_stats": lambda i: channel_stats(F.conv2d(cl(i["x"]), cl(i["w"]), padding=1)),
    "matmul_bias_gelu": lambda i: (F.gelu(i["a"] @ i["w"] + i["b"]),),
    "matmul_bias_residual_relu": lambda i: (F.relu(i["a"] @ i["w"] + i["b"] + i["r"]),),
    "matmul_plain": lambda i: (i["a"] @ i["w"],),
    "residual_rms_norm_after_matmul": lambda i: residual_rms_norm(i["a"], i["w"], i["r"], i["g"]),
    "rms_norm_matmul": lambda i: (F.rms_norm(i["x"], (i["x"].shape[-1],), i["g"], eps=1e-6) @ i["w"],),
    "rms_norm_narrow_matmul": lambda i: (F.rms_norm(i["x"], (i["x"].shape[-1],), i["g"], eps=1e-6) @ i["w"],),
    "rms_norm_written_out_narrow_matmul": lambda i: (rms_norm_as_llama_writes_it(i["x"], i["g"]) @ i["w"],),
    "sdpa_causal": lambda i: (F.scaled_dot_product_attention(i["q"], i["k"], i["v"], is_causal=True),),
    "sdpa_gqa": lambda i: (F.scaled_dot_product_attention(i["q"], i["k"], i["v"], enable_gqa=True),),
    "skinny_matmul": lambda i: (i["a"] @ i["w"],),
    "maxpool_stem": lambda i: (F.max_pool2d(cl(i["x"]), 3, 2, 1),),
    "attention_output_projection": lambda i: (F.linear(i["o"].transpose(1, 2).reshape(-1, i["w"].shape[1]), i["w"], i["bias"])
                                              + i["residual"],),
    "resnet_stem": lambda i: (F.relu(F.batch_norm(F.conv2d(cl(i["x"]), cl(i["w"]), stride=2, padding=3), i["mean"], i["var"],
                                                  i["gamma"], i["beta"], training=False)),),
    "bert_projection": lambda i: (F.linear(i["x"], i["w"], i["bias"]),),
    # f32 operands in full f32 (bench/graphs/anchors/f32/; torch's default allow_tf32=False: cuBLAS's SGEMM)
    "f32_t5_scores": lambda i: (torch.matmul(i["q"], i["k"].transpose(-1, -2)),),
    "f32_t5_probs_v": lambda i: (torch.matmul(i["p"], i["v"]),),
    "f32_linear_bias_gelu": lambda i: (F.gelu(F.linear(i["x"], i["w"], i["b"])),),
    "f32_matmul_4096": lambda i: (i["a"] @ i["w"],),
    "f32_decode_linear": lambda i: (F.linear(i["x"], i["w"]),),
    # depthwise convs (bench/graphs/anchors/depthwise/)
    "depthwise_3x3_c384_56_b32": depthwise("relu6", 1, 1),
    "depthwise_convnext_7x7_c192_b32": depthwise("bias", 1, 3),
    "depthwise_convnext_7x7_c384_b32": depthwise("bias", 1, 3),
    "depthwise_convnext_7x7_c768_b32": depthwise("bias", 1, 3),
    "depthwise_convnext_7x7_c96_b32": depthwise("bias", 1, 3),
    "depthwise_effb0_3x3_c144_b32": depthwise("silu", 1, 1),
    "depthwise_effb0_3x3_c32_b32": depthwise("silu", 1, 1),
    "depthwise_effb0_3x3_c480_b32": depthwise("silu", 1, 1),
    "depthwise_effb0_3x3s2_c96_b32": depthwise("silu", 2, 1),
    "depthwise_effb0_5x5_c1152_b32": depthwise("silu", 1, 2),
    "depthwise_effb0_5x5_c240_b32": depthwise("silu", 1, 2),
    "depthwise_effb0_5x5_c672_b32": depthwise("silu", 1, 2),
    "depthwise_effb0_5x5s2_c144_b32": depthwise("silu", 2, 2),
    "depthwise_mnv3s_3x3_c88_b64": depthwise("relu", 1, 1),
    "depthwise_mnv3s_3x3s2_c16_b64": depthwise("relu", 2, 1),
    "depthwise_mnv3s_3x3s2_c72_b64": depthwise("relu", 2, 1),
    "depthwise_mnv3s_5x5_c240_b64": depthwise("hardswish", 1, 2),
    "depthwise_mnv3s_5x5_c576_b64": depthwise("hardswish", 1, 2),
    "depthwise_mnv3s_5x5s2_c96_b64": depthwise("hardswish", 2, 2),
    "grouped_resnext_3x3_c128g32_56_b32": depthwise("relu", 1, 1),
    "grouped_resnext_3x3_c256g32_28_b32": depthwise("relu", 1, 1),
    "grouped_resnext_3x3s2_c256g32_56_b32": depthwise("relu", 2, 1),
    # ResNeXt's wider groups (16 and 32 channels: the conv kernel), bench/graphs/anchors/
    "grouped_resnext_3x3s2_c512g32_28_b32": depthwise("relu", 2, 1),
    "grouped_resnext_3x3_c512g32_14_b32": depthwise("relu", 1, 1),
    "grouped_resnext_3x3_c1024g32_7_b32": depthwise("relu", 1, 1),
}
