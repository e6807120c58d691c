"""A small decoder-only language model in the layout ONNX Runtime GenAI's model builder emits, built
with onnx.helper: byte-level tokens (vocab 256), SimplifiedLayerNormalization / SkipSimplified-
LayerNormalization (RMSNorm with the residual adds fused), RotaryEmbedding on q and k,
GroupQueryAttention (causal, seqlens_k and total_sequence_length computed in the graph from the
input's shape), a SwiGLU MLP (gate/up/down, SiLU as x * Sigmoid(x)), and an lm_head. Nodes and
weights are named as the builder names them ("/model/layers.0/attn/q_proj/MatMul",
"model.layers.0.attn.q_proj.MatMul.weight"), so LoRA targets read "q_proj", "v_proj", ...

Used by examples/lora_finetune.py and bench/bench_lora.py (which also uses TorchLM, the same
network in PyTorch, for the eager-LoRA baseline).
"""
from __future__ import annotations

import dataclasses

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


@dataclasses.dataclass
class Config:
    vocab: int = 256
    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    intermediate: int = 1408
    max_pos: int = 512
    eps: float = 1e-5

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads


def count_params(cfg: Config) -> int:
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_size
    per_layer = 2 * h + h * h * 2 + 2 * h * kv + 3 * h * cfg.intermediate
    return 2 * cfg.vocab * h + h + cfg.layers * per_layer


def rope_cache(cfg: Config):
    half = cfg.head_size // 2
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    ang = np.arange(cfg.max_pos)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def init_weights(cfg: Config, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = {}

    def lin(name, k, n, std=0.02):
        w[name] = (rng.standard_normal((k, n)) * std).astype(np.float32)

    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_size
    w["model.embed_tokens.weight"] = (rng.standard_normal((cfg.vocab, h)) * 0.02).astype(np.float32)
    out_std = 0.02 / np.sqrt(2 * cfg.layers)
    for i in range(cfg.layers):
        p = f"model.layers.{i}"
        w[f"{p}.input_layernorm.weight"] = np.ones(h, np.float32)
        w[f"{p}.post_attention_layernorm.weight"] = np.ones(h, np.float32)
        lin(f"{p}.attn.q_proj.MatMul.weight", h, h)
        lin(f"{p}.attn.k_proj.MatMul.weight", h, kv)
        lin(f"{p}.attn.v_proj.MatMul.weight", h, kv)
        lin(f"{p}.attn.o_proj.MatMul.weight", h, h, out_std)
        lin(f"{p}.mlp.gate_proj.MatMul.weight", h, cfg.intermediate)
        lin(f"{p}.mlp.up_proj.MatMul.weight", h, cfg.intermediate)
        lin(f"{p}.mlp.down_proj.MatMul.weight", cfg.intermediate, h, out_std)
    w["model.norm.weight"] = np.ones(h, np.float32)
    lin("lm_head.MatMul.weight", h, cfg.vocab)
    return w


def build_model(cfg: Config, weights: dict):
    """The ONNX model: input_ids [B, S] int64 -> logits [B, vocab, S] (class dim second, as
    cross-entropy losses take it)."""
    nodes, inits = [], []
    cos, sin = rope_cache(cfg)
    consts = {"cos_cache": cos, "sin_cache": sin, "pos0": np.array([0], np.int64),
              "one_i32": np.array(1, np.int32), "idx0": np.array(0, np.int64), "idx1": np.array(1, np.int64),
              "axes0": np.array([0], np.int64)}
    for name, arr in list(weights.items()) + list(consts.items()):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))

    def node(op, ins, outs, name, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=name, domain=domain, **attrs))
        return outs[0]

    # seqlens_k = S - 1 per batch row, total_sequence_length = S (no padding, no past)
    node("Shape", ["input_ids"], ["ids_shape"], "/model/attn_mask_reformat/Shape")
    node("Gather", ["ids_shape", "idx1"], ["seq_len64"], "/model/attn_mask_reformat/Gather_S", axis=0)
    node("Gather", ["ids_shape", "idx0"], ["batch64"], "/model/attn_mask_reformat/Gather_B", axis=0)
    node("Cast", ["seq_len64"], ["total_seq_len"], "/model/attn_mask_reformat/Cast", to=TensorProto.INT32)
    node("Sub", ["total_seq_len", "one_i32"], ["seqlen_m1"], "/model/attn_mask_reformat/Sub")
    node("Unsqueeze", ["batch64", "axes0"], ["batch_vec"], "/model/attn_mask_reformat/Unsqueeze")
    node("Expand", ["seqlen_m1", "batch_vec"], ["seqlens_k"], "/model/attn_mask_reformat/Expand")

    x = node("Gather", ["model.embed_tokens.weight", "input_ids"], ["/model/embed_tokens/output_0"],
             "/model/embed_tokens/Gather", axis=0)
    h = node("SimplifiedLayerNormalization", [x, "model.layers.0.input_layernorm.weight"],
             ["/model/layers.0/input_layernorm/output_0"], "/model/layers.0/input_layernorm/LayerNorm", axis=-1,
             epsilon=cfg.eps)
    residual = x
    for i in range(cfg.layers):
        p, w = f"/model/layers.{i}", f"model.layers.{i}"

        def mm(src, proj, part):
            return node("MatMul", [src, f"{w}.{part}.{proj}.MatMul.weight"], [f"{p}/{part}/{proj}/MatMul/output_0"],
                        f"{p}/{part}/{proj}/MatMul")
        q, k, v = mm(h, "q_proj", "attn"), mm(h, "k_proj", "attn"), mm(h, "v_proj", "attn")
        q = node("RotaryEmbedding", [q, "pos0", "cos_cache", "sin_cache"], [f"{p}/attn/q_rotary/output_0"],
                 f"{p}/attn/q_rotary/RotaryEmbedding", domain=MS)
        k = node("RotaryEmbedding", [k, "pos0", "cos_cache", "sin_cache"], [f"{p}/attn/k_rotary/output_0"],
                 f"{p}/attn/k_rotary/RotaryEmbedding", domain=MS)
        a = node("GroupQueryAttention", [q, k, v, "", "", "seqlens_k", "total_seq_len"], [f"{p}/attn/GQA/output_0"],
                 f"{p}/attn/GroupQueryAttention", domain=MS, num_heads=cfg.heads, kv_num_heads=cfg.kv_heads)
        o = mm(a, "o_proj", "attn")
        # SkipSimplifiedLayerNormalization: residual + o, normalised; output 3 is the new residual
        outs = [f"{p}/post_attention_layernorm/output_0", "", "", f"{p}/post_attention_layernorm/output_3"]
        node("SkipSimplifiedLayerNormalization", [residual, o, f"{w}.post_attention_layernorm.weight"], outs,
             f"{p}/post_attention_layernorm/SkipLayerNorm", domain=MS, epsilon=cfg.eps)
        h, residual = outs[0], outs[3]
        gate, up = mm(h, "gate_proj", "mlp"), mm(h, "up_proj", "mlp")
        sig = node("Sigmoid", [gate], [f"{p}/mlp/act_fn/Sigmoid/output_0"], f"{p}/mlp/act_fn/Sigmoid")
        act = node("Mul", [gate, sig], [f"{p}/mlp/act_fn/Mul/output_0"], f"{p}/mlp/act_fn/Mul")
        prod = node("Mul", [act, up], [f"{p}/mlp/Mul/output_0"], f"{p}/mlp/Mul")
        d = mm(prod, "down_proj", "mlp")
        norm_w = f"model.layers.{i + 1}.input_layernorm.weight" if i + 1 < cfg.layers else "model.norm.weight"
        nxt = f"/model/layers.{i + 1}/input_layernorm" if i + 1 < cfg.layers else "/model/norm"
        outs = [f"{nxt}/output_0", "", "", f"{nxt}/output_3"]
        node("SkipSimplifiedLayerNormalization", [residual, d, norm_w], outs, f"{nxt}/SkipLayerNorm", domain=MS,
             epsilon=cfg.eps)
        h, residual = outs[0], outs[3]
    logits = node("MatMul", [h, "lm_head.MatMul.weight"], ["/lm_head/MatMul/output_0"], "/lm_head/MatMul")
    node("Transpose", [logits], ["logits"], "/lm_head/Transpose", perm=[0, 2, 1])
    graph = helper.make_graph(
        nodes, "tiny_llm", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", cfg.vocab, "seq"])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def byte_windows(data: bytes, seq: int, rng: np.random.Generator, batch: int):
    """A batch of random windows: input bytes [B, S] and the next bytes [B, S] (int64)."""
    arr = np.frombuffer(data, np.uint8)
    starts = rng.integers(0, len(arr) - seq - 1, batch)
    x = np.stack([arr[s:s + seq] for s in starts]).astype(np.int64)
    y = np.stack([arr[s + 1:s + seq + 1] for s in starts]).astype(np.int64)
    return x, y


def torch_lm(cfg: Config, weights: dict, lora_rank: int = 0, lora_alpha: float = 16.0, targets=()):
    """The same network in PyTorch (eager), optionally with LoRA adapters on `targets` (frozen base)."""
    import torch
    from torch import nn

    class Linear(nn.Module):
        def __init__(self, w, adapt):
            super().__init__()
            self.w = nn.Parameter(torch.tensor(w), requires_grad=not lora_rank)
            self.adapt = adapt
            if adapt:
                k, n = w.shape
                self.A = nn.Parameter(torch.empty(lora_rank, k).uniform_(-k ** -0.5, k ** -0.5))
                self.B = nn.Parameter(torch.zeros(n, lora_rank))

        def forward(self, x):
            y = x @ self.w
            if self.adapt:
                y = y + (lora_alpha / lora_rank) * (x @ self.A.T) @ self.B.T
            return y

    cos, sin = (torch.tensor(c) for c in rope_cache(cfg))

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.eps) * g

    def rope(x, heads):
        b, s, _ = x.shape
        x = x.view(b, s, heads, cfg.head_size)
        half = cfg.head_size // 2
        c, sn = cos[:s, None, :], sin[:s, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Parameter(torch.tensor(weights["model.embed_tokens.weight"]), requires_grad=not lora_rank)
            self.lins = nn.ModuleDict()
            self.norms = nn.ParameterDict()
            for name, arr in weights.items():
                if name.endswith(".MatMul.weight"):
                    key = name[:-len(".MatMul.weight")].replace(".", "_")
                    self.lins[key] = Linear(arr, any(t in name for t in targets))
                elif name.endswith("layernorm.weight") or name == "model.norm.weight":
                    self.norms[name.replace(".", "_")] = nn.Parameter(torch.tensor(arr), requires_grad=not lora_rank)

        def forward(self, ids):
            b, s = ids.shape
            x = self.embed[ids]
            mask = torch.full((s, s), float("-inf")).triu(1)
            group = cfg.heads // cfg.kv_heads
            for i in range(cfg.layers):
                p = f"model_layers_{i}_"
                h = rms(x, self.norms[p + "input_layernorm_weight"])
                q = rope(self.lins[p + "attn_q_proj"](h), cfg.heads).transpose(1, 2)
                k = rope(self.lins[p + "attn_k_proj"](h), cfg.kv_heads).transpose(1, 2).repeat_interleave(group, 1)
                v = self.lins[p + "attn_v_proj"](h).view(b, s, cfg.kv_heads, -1).transpose(1, 2)
                v = v.repeat_interleave(group, 1)
                att = torch.softmax(q @ k.transpose(-1, -2) * cfg.head_size ** -0.5 + mask, -1)
                x = x + self.lins[p + "attn_o_proj"]((att @ v).transpose(1, 2).reshape(b, s, -1))
                h = rms(x, self.norms[p + "post_attention_layernorm_weight"])
                g = self.lins[p + "mlp_gate_proj"](h)
                x = x + self.lins[p + "mlp_down_proj"](g * torch.sigmoid(g) * self.lins[p + "mlp_up_proj"](h))
            return self.lins["lm_head"](rms(x, self.norms["model_norm_weight"])).transpose(1, 2)

    return LM()
