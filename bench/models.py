"""Reference PyTorch models and their ONNX export, shared by benchmarks, examples and golden tests.

Three models cover the op families onnxtrain must run fast:

* ``mlp``  -- MatMul/Gemm + Relu (784-1024-1024-10, batch 64).
* ``cnn``  -- Conv + BatchNormalization + Relu x3, pooling and a Linear head (3x32x32, batch 32).
* ``bert`` -- a BERT-style encoder (vocab 8192, hidden 256, 4 layers, 4 heads, FFN 1024, GELU,
  LayerNorm, seq 128, batch 8). Attention is written out with MatMul/Softmax so the export contains
  only plain ONNX ops; the token-embedding Gather takes int64 ids.

Typical use::

    from models import MODELS, export
    spec = MODELS["bert"]
    model, inputs = spec.build(seed=0)
    export(model, inputs, "bert.onnx", spec.input_names, spec.output_names)

Every builder returns the model in eval mode and a tuple of example inputs; weights and inputs are
deterministic for a given seed.
"""
from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

OPSET = 17

# --------------------------------------------------------------------------------------------------
# MLP


class MLP(nn.Module):
    """Fully connected classifier: Linear+ReLU for every hidden size, then a Linear head."""

    def __init__(self, sizes: Sequence[int] = (784, 1024, 1024, 10)):
        super().__init__()
        layers = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --------------------------------------------------------------------------------------------------
# CNN


class ConvBlock(nn.Module):
    """3x3 convolution (no bias), BatchNorm, ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    """conv-bn-relu x3 (the last two with stride 2), global average pool, Linear head."""

    def __init__(self, in_channels: int = 3, widths: Sequence[int] = (32, 64, 128),
                 num_classes: int = 10):
        super().__init__()
        blocks, c_in = [], in_channels
        for i, width in enumerate(widths):
            blocks.append(ConvBlock(c_in, width, stride=1 if i == 0 else 2))
            c_in = width
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)  # exports as GlobalAveragePool
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.head(torch.flatten(x, 1))


class DigitsCNN(nn.Module):
    """For sklearn's 8x8 digits (1x8x8 images, 10 classes): conv-bn-relu(32), conv-bn-relu(64),
    2x2 max pool to 4x4, Dropout, Linear head. About 29k parameters; trains to ~99% in seconds."""

    def __init__(self, num_classes: int = 10, dropout: float = 0.25):
        super().__init__()
        self.features = nn.Sequential(ConvBlock(1, 32), ConvBlock(32, 64), nn.MaxPool2d(2))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(64 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(torch.flatten(self.features(x), 1)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion (conv-bn-ReLU6), 3x3 depthwise (conv-bn-ReLU6), 1x1
    linear projection (conv-bn), with the identity added when the shapes allow."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        layers = []
        if expand != 1:
            layers += [nn.Conv2d(c_in, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), nn.BatchNorm2d(hidden),
                   nn.ReLU6(), nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (width 1.0, torchvision's layer table: depthwise convolutions, ReLU6 that exports
    as Clip, BatchNorm after every convolution), with a ``num_classes`` Linear head."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # expansion, channels, repeats, first stride

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
        c_in = 32
        for expand, c_out, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(c_in, c_out, stride if i == 0 else 1, expand))
                c_in = c_out
        layers += [nn.Conv2d(c_in, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv-bn (ReLU between), the identity or a strided 1x1
    conv-bn projection added, ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A ResNet-18-shaped network for small images: a 3x3 stem, four stages of two basic blocks
    (widths ``widths``, strides 1, 2, 2, 2), 2x2 max pool after the stem, global average pool, Linear head."""

    def __init__(self, widths: Sequence[int] = (32, 64, 128, 256), num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(2))
        blocks, c_in = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [BasicBlock(c_in, width, 1 if i == 0 else 2), BasicBlock(width, width, 1)]
            c_in = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class Bottleneck(nn.Module):
    """ResNet-50's bottleneck block: 1x1 conv-bn down to `width`, 3x3 conv-bn (strided), 1x1 conv-bn
    up to 4 * width, the identity or a strided 1x1 conv-bn projection added, ReLU."""

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = 4 * width
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.shortcut(x))


class ResNet50(nn.Module):
    """ResNet-50 as torchvision's resnet50 lays it out (7x7 stem, 3x3 max pool, stages of 3, 4, 6
    and 3 bottlenecks of widths 64-512, stride in the 3x3 conv), for 224x224 images: the GPU
    benchmark's CNN (bench/cuda_training_torch.py), here so both engines train the same network."""

    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, c_in = [], 64
        for i, (width, count) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
            for k in range(count):
                blocks.append(Bottleneck(c_in, width, 2 if k == 0 and i > 0 else 1))
                c_in = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def _randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Gives BatchNorm layers non-trivial running statistics and affine parameters, so that an
    engine that skips or mis-fuses BatchNorm in eval mode is caught by the output comparison."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=generator) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=generator) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=generator) * 0.1)


# --------------------------------------------------------------------------------------------------
# BERT-style encoder


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 8192
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    ffn: int = 1024
    max_len: int = 128
    layer_norm_eps: float = 1e-12
    # Token id of padding: nn.Embedding's padding_idx, and the encoder's attention ignores padded
    # keys (so padded positions cannot change the other tokens: what padding sparsity needs).
    pad_id: Optional[int] = None
    # The decoder MLP's GELU: "none" (erf, nn.GELU()), "tanh" (nn.GELU(approximate="tanh"), Hugging
    # Face's gelu_pytorch_tanh) or "gelu_new" (GPT-2's written-out tanh form, NewGELU below).
    gelu: str = "none"


class SelfAttention(nn.Module):
    """Multi-head self-attention written with MatMul/Softmax (no fused attention op)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        if cfg.hidden % cfg.heads:
            raise ValueError(f"hidden {cfg.hidden} is not divisible by heads {cfg.heads}")
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        # (B, S, H*D) -> (B, H, S, D); -1 keeps batch and sequence free in the export.
        return x.reshape(x.shape[0], -1, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, key_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if key_bias is not None:  # (B, 1, 1, S): -1e9 at padded keys
            scores = scores + key_bias
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2)                  # (B, S, H, D)
        ctx = ctx.reshape(x.shape[0], -1, self.heads * self.head_dim)  # (B, S, H*D)
        return self.out(ctx)


class EncoderLayer(nn.Module):
    """Post-LayerNorm transformer layer, as in BERT."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ffn = nn.Sequential(nn.Linear(cfg.hidden, cfg.ffn), nn.GELU(),
                                 nn.Linear(cfg.ffn, cfg.hidden))
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, key_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, key_bias))
        return self.norm2(x + self.ffn(x))


class BertEncoder(nn.Module):
    """Token + learned position embeddings, LayerNorm, then ``cfg.layers`` encoder layers.

    Input: int64 token ids (B, S) with S <= cfg.max_len. Output: hidden states (B, S, hidden).
    """

    def __init__(self, cfg: BertConfig = BertConfig()):
        super().__init__()
        self.cfg = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.positions = nn.Parameter(torch.randn(1, cfg.max_len, cfg.hidden) * 0.02)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions[:, : ids.shape[1]]
        x = self.norm(x)
        key_bias = None
        if self.cfg.pad_id is not None:
            key_bias = (ids == self.cfg.pad_id).to(x.dtype)[:, None, None, :] * -1e9
        for layer in self.layers:
            x = layer(x, key_bias)
        return x


class BertClassifier(nn.Module):
    """BertEncoder with a Linear head on the first token, for training benchmarks and tests."""

    def __init__(self, cfg: BertConfig = BertConfig(), num_classes: int = 2):
        super().__init__()
        self.encoder = BertEncoder(cfg)
        self.head = nn.Linear(cfg.hidden, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(ids)[:, 0])


# --------------------------------------------------------------------------------------------------
# GPT-style decoder and LSTM (golden tests and training benchmarks)


class CausalSelfAttention(SelfAttention):
    """SelfAttention with a causal mask: position i attends to positions <= i."""

    def __init__(self, cfg: BertConfig):
        super().__init__(cfg)
        mask = torch.triu(torch.full((cfg.max_len, cfg.max_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        seq = x.shape[1]
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        probs = torch.softmax(scores + self.mask[:seq, :seq], dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2)
        return self.out(ctx.reshape(x.shape[0], -1, self.heads * self.head_dim))


class NewGELU(nn.Module):
    """GPT-2's gelu_new as Hugging Face writes it (NewGELUActivation): the tanh form, op by op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def decoder_gelu(cfg: BertConfig) -> nn.Module:
    return NewGELU() if cfg.gelu == "gelu_new" else nn.GELU(approximate=cfg.gelu)


class DecoderLayer(nn.Module):
    """Pre-LayerNorm transformer block, as in GPT-2."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, cfg.ffn), decoder_gelu(cfg), nn.Linear(cfg.ffn, cfg.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPTDecoder(nn.Module):
    """Token + position embeddings, causal decoder blocks, final LayerNorm, LM head.

    Input: int64 ids (B, S). Output: logits (B, S, vocab). Padding (cfg.pad_id) goes at the end of a
    sequence: causal attention keeps it from the tokens before it.
    """

    def __init__(self, cfg: BertConfig = BertConfig()):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.positions = nn.Parameter(torch.randn(1, cfg.max_len, cfg.hidden) * 0.02)
        self.blocks = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden, eps=1e-5)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions[:, : ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class LSTMClassifier(nn.Module):
    """A one-layer LSTM over (S, B, F) sequences; a Linear head on the last hidden state."""

    def __init__(self, features: int = 16, hidden: int = 32, num_classes: int = 4):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[-1])


# --------------------------------------------------------------------------------------------------
# Registry and export


@dataclass(frozen=True)
class ModelSpec:
    """How to build one benchmark model and what to call its graph inputs and outputs."""

    name: str
    description: str
    build: Callable[..., Tuple[nn.Module, Tuple[torch.Tensor, ...]]]
    input_names: Tuple[str, ...]
    output_names: Tuple[str, ...]


def build_mlp(seed: int = 0, batch: int = 64, sizes: Sequence[int] = (784, 1024, 1024, 10)):
    """The MLP and a float32 input batch (batch, sizes[0])."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MLP(sizes).eval()
    return model, (torch.randn(batch, sizes[0], generator=gen),)


def build_cnn(seed: int = 0, batch: int = 32, image: int = 32, **kwargs):
    """The CNN (eval mode, randomized BatchNorm statistics) and an image batch (batch, 3, H, W)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = SmallCNN(**kwargs)
    _randomize_batchnorm(model, gen)
    model.eval()
    return model, (torch.randn(batch, 3, image, image, generator=gen),)


def build_mobilenetv2(seed: int = 0, batch: int = 16, image: int = 96, num_classes: int = 1000):
    """MobileNetV2 (eval mode, randomized BatchNorm statistics) and an image batch (batch, 3, H, W)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = MobileNetV2(num_classes)
    _randomize_batchnorm(model, gen)
    return model.eval(), (torch.randn(batch, 3, image, image, generator=gen),)


def build_resnet(seed: int = 0, batch: int = 16, image: int = 32, **kwargs):
    """SmallResNet (eval mode, randomized BatchNorm statistics) and an image batch (batch, 3, H, W)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = SmallResNet(**kwargs)
    _randomize_batchnorm(model, gen)
    return model.eval(), (torch.randn(batch, 3, image, image, generator=gen),)


def build_bert(seed: int = 0, batch: int = 8, seq: int = 128, cfg: Optional[BertConfig] = None):
    """The BERT-style encoder and int64 token ids (batch, seq)."""
    cfg = cfg or BertConfig()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = BertEncoder(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen, dtype=torch.int64)
    return model, (ids,)


MODELS: Dict[str, ModelSpec] = {
    "mlp": ModelSpec("mlp", "MLP 784-1024-1024-10, batch 64", build_mlp, ("input",), ("logits",)),
    "cnn": ModelSpec("cnn", "CNN conv-bn-relu x3 + pool + linear, 3x32x32, batch 32", build_cnn,
                     ("input",), ("logits",)),
    "bert": ModelSpec("bert", "BERT encoder h256 L4 H4 ffn1024, seq 128, batch 8", build_bert,
                      ("input_ids",), ("hidden_states",)),
    "mobilenetv2": ModelSpec("mobilenetv2", "MobileNetV2 width 1.0, 3x96x96", build_mobilenetv2, ("input",),
                             ("logits",)),
    "resnet": ModelSpec("resnet", "ResNet-18-shaped, widths 32-256, 3x32x32", build_resnet, ("input",),
                        ("logits",)),
}


class WithCrossEntropy(nn.Module):
    """``model`` followed by its cross-entropy loss: one module whose output is the loss, the form
    training-mode exports and the training benchmarks take. Logits (B, S, C) and targets (B, S)
    are flattened to token rows first (a language model's loss); targets equal to -100 are ignored."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, target):
        logits = self.model(x)
        if logits.dim() > 2:
            logits, target = logits.reshape(-1, logits.shape[-1]), target.reshape(-1)
        return self.loss(logits, target)


def padded_ids(cfg: BertConfig, batch: int, seq: int, padding: float, generator: torch.Generator) -> torch.Tensor:
    """Token ids (batch, seq) in [1, vocab) whose rows end in ``cfg.pad_id``, about ``padding`` of
    all positions (row lengths vary by up to a quarter around the mean; each keeps one token)."""
    ids = torch.randint(1, cfg.vocab_size, (batch, seq), generator=generator)
    kept = max(1, round((1 - padding) * seq))
    jitter = kept // 4
    lengths = (kept + torch.randint(-jitter, jitter + 1, (batch,), generator=generator)).clamp(1, seq)
    ids[torch.arange(seq)[None, :] >= lengths[:, None]] = cfg.pad_id
    return ids


def ignore_labels(labels: torch.Tensor, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """``labels`` with about ``fraction`` of them set to -100 (CrossEntropyLoss's ignore_index)."""
    labels = labels.clone()
    labels[torch.rand(labels.shape, generator=generator) < fraction] = -100
    return labels


def training_loop_case(name: str, steps: int, seed: int = 0):
    """A model in train mode and ``steps`` (input, target) batches for an ordinary torch training
    loop (cross-entropy over the last dim): ``bert`` (a 2-class head), ``gpt`` (next-token targets)
    or ``cnn``. Deterministic for a seed."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig()
    if name == "bert":
        model = BertClassifier(cfg, num_classes=2)
        batch = lambda: (torch.randint(0, cfg.vocab_size, (8, 128), generator=g),  # noqa: E731
                         torch.randint(0, 2, (8,), generator=g))
    elif name == "gpt":
        model = GPTDecoder(cfg)
        batch = lambda: (torch.randint(0, cfg.vocab_size, (8, 128), generator=g),  # noqa: E731
                         torch.randint(0, cfg.vocab_size, (8, 128), generator=g))
    elif name == "cnn":
        model = SmallCNN()
        batch = lambda: (torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))  # noqa: E731
    else:
        raise KeyError(name)
    return model.train(), [batch() for _ in range(steps)]


def torchscript_exporter() -> dict:
    """torch.onnx.export's keyword arguments that pick the TorchScript-based exporter, the one the
    benchmarks' options (training mode, dynamic_axes) are for: torch 2.9+ defaults to the
    torch.export-based one (python/onnxtrain/torch/_compat.py says why TrainModule does not use it);
    torch 1.13 has only the TorchScript-based one."""
    return {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}


def export(model: nn.Module, inputs: Tuple[torch.Tensor, ...], path: str,
           input_names: Sequence[str], output_names: Sequence[str], opset: int = OPSET,
           dynamic_batch: bool = False, training: bool = False,
           fold_batchnorm: bool = False) -> str:
    """Exports ``model`` to ``path`` with torch.onnx.export and returns the path.

    ``dynamic_batch`` makes dimension 0 of every input and output symbolic ("batch").
    ``training=True`` keeps training-mode ops (Dropout, BatchNorm statistics) and skips constant
    folding so that parameters stay initializers; the default exports an inference graph.
    In an inference graph, BatchNormalization stays a node unless ``fold_batchnorm`` lets the
    exporter fold it into the preceding Conv (folding is then the engine's job, as in a model
    exported by other tools).
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    dynamic_axes = None
    if dynamic_batch:
        dynamic_axes = {name: {0: "batch"} for name in (*input_names, *output_names)}
    if training:
        mode = torch.onnx.TrainingMode.TRAINING
    else:  # PRESERVE exports the eval-mode model as is; EVAL also folds BatchNorm into Conv.
        model.eval()
        mode = torch.onnx.TrainingMode.EVAL if fold_batchnorm else torch.onnx.TrainingMode.PRESERVE
    with torch.no_grad():
        torch.onnx.export(model, inputs, path, input_names=list(input_names),
                          output_names=list(output_names), opset_version=opset,
                          do_constant_folding=not training, dynamic_axes=dynamic_axes,
                          training=mode, **torchscript_exporter())
    return path


def export_spec(name: str, directory: str, seed: int = 0, **build_kwargs):
    """Builds model ``name`` from MODELS, exports it to ``directory/<name>.onnx``.

    Returns (path, model, inputs) so callers can run the PyTorch reference on the same weights.
    """
    spec = MODELS[name]
    model, inputs = spec.build(seed=seed, **build_kwargs)
    path = export(model, inputs, os.path.join(directory, f"{name}.onnx"), spec.input_names,
                  spec.output_names)
    return path, model, inputs
