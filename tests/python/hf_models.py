"""Small Hugging Face transformers models, built from configs (no download), and their batches: what
the tests of tests/python/test_hf_*.py train through TrainModule and compare with eager PyTorch.

    model, batch = hf_models.make("llama")   # train mode, seeded; batch() draws the next batch (a dict)
    loss = model(**batch()).loss

Dropout is off (its masks are drawn by each engine from its own generator, so a comparison step by
step needs none), and so is the causal LMs' key/value cache (training reads none; transformers 5
returns it as a DynamicCache object, which TrainModule refuses, naming it); everything else is each architecture's default, including its attention
implementation (PyTorch's scaled_dot_product_attention where transformers picks it).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch
import transformers as hf

VOCAB = 64
NAMES = ("bert", "distilbert", "gpt2", "llama", "vit", "t5")


def _mask(batch: int, seq: int, padded: int) -> torch.Tensor:
    """An attention mask whose last row has its last `padded` tokens masked out (right padding)."""
    m = torch.ones(batch, seq, dtype=torch.long)
    m[-1, seq - padded:] = 0
    return m


def make(name: str, batch: int = 2, seq: int = 8, seed: int = 0) -> Tuple[torch.nn.Module, Callable[[], Dict]]:
    """The model `name` (train mode, weights drawn from torch.manual_seed(seed)) and a function
    drawing its next batch: token ids (B, seq) with a right-padded last row, or images."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)

    def ids(s=seq):
        return torch.randint(1, VOCAB, (batch, s), generator=g)

    def classes():
        return torch.randint(0, 3, (batch,), generator=g)

    def causal_lm():
        x = ids()
        return {"input_ids": x, "attention_mask": _mask(batch, seq, 3), "labels": x}

    if name == "bert":
        cfg = hf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, num_labels=3)
        model = hf.BertForSequenceClassification(cfg)
        draw = lambda: {"input_ids": ids(), "attention_mask": _mask(batch, seq, 3), "labels": classes()}  # noqa: E731
    elif name == "distilbert":
        cfg = hf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                  max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
                                  seq_classif_dropout=0.0, num_labels=3)
        model = hf.DistilBertForSequenceClassification(cfg)
        draw = lambda: {"input_ids": ids(), "attention_mask": _mask(batch, seq, 3), "labels": classes()}  # noqa: E731
    elif name == "gpt2":
        cfg = hf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=1, use_cache=False)
        model = hf.GPT2LMHeadModel(cfg)
        draw = causal_lm
    elif name == "llama":  # RoPE, RMSNorm, SwiGLU, grouped-query attention (2 key/value heads for 4)
        cfg = hf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0, use_cache=False)
        model = hf.LlamaForCausalLM(cfg)
        draw = causal_lm
    elif name == "vit":
        cfg = hf.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, num_labels=3)
        model = hf.ViTForImageClassification(cfg)
        draw = lambda: {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g), "labels": classes()}  # noqa: E731
    elif name == "t5":  # encoder-decoder: the decoder's inputs are the labels shifted right
        cfg = hf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                          num_heads=4, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)
        model = hf.T5ForConditionalGeneration(cfg)
        draw = lambda: {"input_ids": ids(), "attention_mask": _mask(batch, seq, 3),  # noqa: E731
                        "labels": torch.randint(1, VOCAB, (batch, 5), generator=g)}
    else:
        raise KeyError(name)
    return model.train(), draw
