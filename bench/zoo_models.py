"""The model zoo's table: every model that bench/zoo.py times and that
python/tests/test_zoo_tiny.py checks, built from configs and constructors
with random weights (nothing is downloaded).

Each `Spec` names a model, the package it comes from, how to build it at
its real size or tiny, how to make its inputs, and the serving batch and
sequence length (or image size) it is benchmarked at. The real sizes are
those of the released models (hidden sizes, heads, widths) with few layers
for the transformers; the tiny ones keep each model's architecture class
and its features (GQA, padding masks, grouped and depthwise convolutions,
squeeze-excitation, shifted windows, channels-last) at widths and inputs a
CPU runs in a second.

    spec.build(tiny) -> torch.nn.Module (eval mode, float32, on the CPU)
    spec.inputs(model, batch, seq, device, dtype) -> dict of keyword arguments
    spec.output(result) -> the tensor compared and timed (logits, hidden states)

Importing this module first makes torchvision importable on PyTorch's CPU
build (see `_declare_torchvision_ops_if_unloadable`).
"""
from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch


def _declare_torchvision_ops_if_unloadable() -> None:
    """torchvision's PyPI wheel is a CUDA build: on PyTorch's CPU build (the
    one CI installs) its compiled ops (_C.so, linked against libtorch_cuda)
    do not load, and torchvision 0.28's own `import` then fails registering
    fake kernels for two of those ops ("operator torchvision::nms does not
    exist"), taking transformers and timm (which import torchvision) with
    it. No zoo model calls a torchvision op: where the library does not
    load, the two schemas are declared (no kernels) so that the import goes
    through. Where it loads (a CUDA PyTorch), nothing is done."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    libraries = glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so"))
    try:
        for path in libraries:
            torch.ops.load_library(path)
        return
    except OSError:
        pass
    if hasattr(torch.ops.torchvision, "nms"):
        return
    global _TORCHVISION_SCHEMAS
    _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")  # kept alive: dropping it undefines them
    for name in ("nms", "qnms"):
        _TORCHVISION_SCHEMAS.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


_TORCHVISION_SCHEMAS = None
_declare_torchvision_ops_if_unloadable()


@dataclass(frozen=True)
class Spec:
    name: str  # the row's name (bench/zoo.py --models)
    package: str  # transformers, timm or torchvision: the model's source
    build: Callable[[bool], torch.nn.Module]  # tiny -> the model, eval(), f32, CPU
    inputs: Callable[..., Dict[str, torch.Tensor]]  # (model, batch, seq, device, dtype) -> keyword arguments
    batch: int  # the serving batch
    seq: int  # tokens per sequence, or the image's height and width
    tiny_batch: int = 2
    tiny_seq: int = 16
    output: Callable[[object], torch.Tensor] = lambda o: o
    channels_last: bool = False  # the model and its image in channels-last memory
    long_context: bool = False  # a decoder's second row: batch 1, a long sequence (same model as its first)

    @property
    def base(self) -> str:
        """The model the row runs (a long-context row's model is its decoder's)."""
        return self.name.split("@")[0]


def _generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- inputs ----------------------------------------------------------------

def token_ids(model, batch, seq, device, dtype):
    """Random token ids of the model's vocabulary."""
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=_generator())
    return {"input_ids": ids.to(device)}


def token_ids_with_padding(model, batch, seq, device, dtype):
    """Token ids and an attention mask that pads every sequence but the first
    (lengths from seq down to about seq/2), as a serving batch of sentences has."""
    inputs = token_ids(model, batch, seq, device, dtype)
    lengths = [seq - (i * seq) // (2 * batch) for i in range(batch)]
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    inputs["attention_mask"] = mask.to(device)
    return inputs


def images(model, batch, size, device, dtype):
    x = torch.randn(batch, 3, size, size, generator=_generator()).to(device=device, dtype=dtype)
    return {"x": x}


def images_channels_last(model, batch, size, device, dtype):
    return {"x": images(model, batch, size, device, dtype)["x"].contiguous(memory_format=torch.channels_last)}


def logits(o):
    return o.logits


def last_hidden_state(o):
    return o.last_hidden_state


# ---- transformers (from configs: real hidden sizes, 2 layers) ---------------

def llama(tiny):
    from transformers import LlamaConfig, LlamaForCausalLM
    size = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                vocab_size=256) if tiny else \
        dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=4, head_dim=128,
             vocab_size=32000)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, max_position_embeddings=8192, attn_implementation="sdpa",
                                        **size))


def mistral(tiny):
    from transformers import MistralConfig, MistralForCausalLM
    size = dict(hidden_size=64, intermediate_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                vocab_size=256, sliding_window=8) if tiny else \
        dict(hidden_size=1024, intermediate_size=3584, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
             vocab_size=32000, sliding_window=4096)  # (Mistral 7B v0.1's window: the long row's mask uses it)
    return MistralForCausalLM(MistralConfig(num_hidden_layers=2, max_position_embeddings=8192,
                                            attn_implementation="sdpa", **size))


def qwen2(tiny):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    size = dict(hidden_size=56, intermediate_size=112, num_attention_heads=7, num_key_value_heads=1, vocab_size=256) \
        if tiny else dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                          vocab_size=151936)  # Qwen2-0.5B's widths, GQA 14/2 at d64
    return Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, max_position_embeddings=8192, attn_implementation="sdpa",
                                        **size))


def gpt2(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel
    size = dict(n_embd=64, n_head=4, vocab_size=256) if tiny else dict(n_embd=768, n_head=12, vocab_size=50257)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_positions=8192, attn_implementation="sdpa", **size))


def bert(tiny):
    from transformers import BertConfig, BertModel
    size = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=256) if tiny else {}
    return BertModel(BertConfig(num_hidden_layers=2, attn_implementation="sdpa", **size))


def distilbert(tiny):
    from transformers import DistilBertConfig, DistilBertModel
    size = dict(dim=64, n_heads=4, hidden_dim=128, vocab_size=256) if tiny else {}
    return DistilBertModel(DistilBertConfig(n_layers=2, attn_implementation="sdpa", **size))


def t5_encoder(tiny):
    from transformers import T5Config, T5EncoderModel
    size = dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, vocab_size=256) if tiny else \
        dict(d_model=768, d_kv=64, num_heads=12, d_ff=3072, vocab_size=32128)  # t5-base's widths
    return T5EncoderModel(T5Config(num_layers=2, **size))


# ---- vision (whole models at their real widths; tiny: the same classes) ------

def vit_small(tiny):
    import timm
    from timm.models.vision_transformer import VisionTransformer
    if tiny:
        return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    return timm.create_model("vit_small_patch16_224", pretrained=False)


def swin_t(tiny):
    from torchvision.models import swin_t as real
    from torchvision.models.swin_transformer import SwinTransformer
    if tiny:  # 8x8 patches in 4x4 windows (plain, then shifted), patch merging, a 4x4 stage (one window, no shift)
        return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 1], num_heads=[1, 2], window_size=[4, 4],
                               stochastic_depth_prob=0.0, num_classes=10)
    return real(weights=None)


def resnet50(tiny):
    from torchvision.models import resnet50 as real
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10) if tiny else real(weights=None)


def resnext50(tiny):
    from torchvision.models import resnext50_32x4d as real
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], groups=32, width_per_group=4, num_classes=10) if tiny else real(weights=None)


def convnext_t(tiny):
    from torchvision.models import convnext_tiny as real
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    if tiny:
        return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)
    return real(weights=None)


def efficientnet_b0(tiny):
    from torchvision.models import efficientnet_b0 as real
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig
    if tiny:  # B0's first three stages (expansion 1 and 6, kernels 3 and 5, squeeze-excitation), narrow
        setting = [MBConvConfig(1, 3, 1, 16, 8, 1), MBConvConfig(6, 3, 2, 8, 16, 2), MBConvConfig(6, 5, 2, 16, 24, 1)]
        return EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=64)
    return real(weights=None)


def mobilenet_v3_small(tiny):
    from torchvision.models import mobilenet_v3_small as real
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3
    if tiny:  # ReLU and hard-swish blocks, with and without squeeze-excitation
        setting = [InvertedResidualConfig(16, 3, 16, 16, True, "RE", 2, 1, 1.0),
                   InvertedResidualConfig(16, 3, 32, 24, False, "RE", 2, 1, 1.0),
                   InvertedResidualConfig(24, 5, 48, 24, True, "HS", 1, 1, 1.0)]
        return MobileNetV3(setting, last_channel=64, num_classes=10)
    return real(weights=None)


def densenet121(tiny):
    from torchvision.models import densenet121 as real
    from torchvision.models.densenet import DenseNet
    if tiny:
        return DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=10)
    return real(weights=None)


# ---- the table -----------------------------------------------------------------

def _decoder(name, build, batch, seq, tiny_seq=16):
    """A decoder's two rows: the serving batch, and batch 1 with a long sequence."""
    return [Spec(name, "transformers", build, token_ids, batch, seq, 2, tiny_seq, logits),
            Spec(f"{name}@b1s8192", "transformers", build, token_ids, 1, 8192, 1, 64, logits, long_context=True)]


SPECS: List[Spec] = [
    *_decoder("llama", llama, 4, 1024),
    *_decoder("mistral", mistral, 4, 1024, tiny_seq=24),  # (tiny: past the window of 8)
    *_decoder("qwen2", qwen2, 4, 1024),
    *_decoder("gpt2", gpt2, 8, 512),
    Spec("bert", "transformers", bert, token_ids_with_padding, 32, 128, 4, 16, last_hidden_state),
    Spec("distilbert", "transformers", distilbert, token_ids_with_padding, 32, 128, 4, 16, last_hidden_state),
    Spec("t5_encoder", "transformers", t5_encoder, token_ids, 16, 256, 2, 16, last_hidden_state),
    Spec("vit_s16", "timm", vit_small, images, 32, 224, 2, 32),
    Spec("swin_t", "torchvision", swin_t, images, 32, 224, 2, 32),
    Spec("resnet50", "torchvision", resnet50, images, 32, 224, 2, 32),
    Spec("resnet50_cl", "torchvision", resnet50, images_channels_last, 32, 224, 2, 32, channels_last=True),
    Spec("resnext50_32x4d", "torchvision", resnext50, images, 32, 224, 2, 32),
    Spec("convnext_t", "torchvision", convnext_t, images, 32, 224, 2, 32),
    Spec("efficientnet_b0", "torchvision", efficientnet_b0, images, 32, 224, 2, 32),
    Spec("mobilenet_v3_s", "torchvision", mobilenet_v3_small, images, 64, 224, 2, 32),
    Spec("densenet121", "torchvision", densenet121, images, 16, 224, 2, 32),
]

BY_NAME: Dict[str, Spec] = {s.name: s for s in SPECS}


def select(names: Optional[str]) -> List[Spec]:
    """The specs named in a comma-separated list (a decoder's name selects both
    its rows); all of them for None. Unknown names raise ValueError."""
    if not names:
        return list(SPECS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME and not any(s.base == n for s in SPECS)]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(BY_NAME)}")
    return [s for s in SPECS if s.name in wanted or s.base in wanted]


def instantiate(spec: Spec, *, tiny: bool, device, dtype, batch: Optional[int] = None, seq: Optional[int] = None,
                seed: int = 0):
    """The model (eval, on `device` in `dtype`, channels-last where the spec
    says) and its keyword inputs at `batch` x `seq` (the spec's serving or
    tiny sizes by default)."""
    torch.manual_seed(seed)
    model = spec.build(tiny).eval()
    model = model.to(device=device, dtype=dtype)
    if spec.channels_last:
        model = model.to(memory_format=torch.channels_last)
    batch = batch or (spec.tiny_batch if tiny else spec.batch)
    seq = seq or (spec.tiny_seq if tiny else spec.seq)
    return model, spec.inputs(model, batch, seq, device, dtype)
