"""The GPU training benchmark's models, shared by both sides: GPT-2 124M (sequence 1024, batch 4,
bf16 mixed precision), BERT-base fine-tuning (sequence 128, batch 32, 2 classes) and ResNet-50
(224x224, batch 64), each with its cross-entropy loss.

    PYTHONPATH=build/python /usr/bin/python3 bench/cuda_training_models.py OUT_DIR

writes each model's training artifacts for onnxtrain (AdamW; a nominal checkpoint, which
bench/cuda_training.cc fills with random values, and the ONNX files gzipped: a GPT-2 graph holds
its 4 MB causal mask once per layer) and batch.txt (each input's name, dtype, dims and, for
integers, the exclusive upper bound of its values: the C++ side draws its batches from it) into
OUT_DIR/<name>/, and OUT_DIR/ops.txt, their op types.
`scripts/gpu_check.sh --prepare` runs it; on the lent GPU, bench/cuda_training.cc trains them with
Module(device=cuda) and bench/cuda_training_torch.py trains the same networks (this file's
`build`) in PyTorch, eager and torch.compile'd.
"""
import gzip
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


@dataclass(frozen=True)
class Spec:
    name: str
    what: str
    mixed_precision: str  # "" (fp32) or "bf16"
    lr: float


SPECS = (
    Spec("gpt2", "GPT-2 124M, 4 x 1024 tokens, bf16 mixed precision", "bf16", 6e-4),
    Spec("bert", "BERT-base classifier, 32 x 128 tokens, fp32", "", 2e-5),
    Spec("resnet50", "ResNet-50, 64 x 224 x 224, fp32", "", 1e-3),
)

GPT2 = models.BertConfig(vocab_size=50257, hidden=768, layers=12, heads=12, ffn=3072, max_len=1024, gelu="gelu_new")
BERT = models.BertConfig(vocab_size=30522, hidden=768, layers=12, heads=12, ffn=3072, max_len=128)


# Per model, the exclusive upper bound of the input's and the target's values (0: a float input).
VALUES = {"gpt2": (GPT2.vocab_size, GPT2.vocab_size), "bert": (BERT.vocab_size, 2), "resnet50": (0, 1000)}


class TokenRows(nn.Module):
    """A language model's logits (B, S, V) as token rows (B * S, V), for a [N, C] cross-entropy."""

    def __init__(self, model: nn.Module, vocab: int):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).reshape(-1, self.vocab)


def build(name: str, generator: torch.Generator) -> Tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(model in train mode whose output is the loss's scores, input, target) for one step."""
    if name == "gpt2":
        model = TokenRows(models.GPTDecoder(GPT2), GPT2.vocab_size)
        ids = torch.randint(0, GPT2.vocab_size, (4, 1024), generator=generator)
        return model.train(), ids, torch.randint(0, GPT2.vocab_size, (4 * 1024,), generator=generator)
    if name == "bert":
        model = models.BertClassifier(BERT, num_classes=2)
        return (model.train(), torch.randint(0, BERT.vocab_size, (32, 128), generator=generator),
                torch.randint(0, 2, (32,), generator=generator))
    if name == "resnet50":
        return (models.ResNet50().train(), torch.randn(64, 3, 224, 224, generator=generator),
                torch.randint(0, 1000, (64,), generator=generator))
    raise KeyError(name)


def main(out: str) -> None:
    import bench_training  # the training-mode export (onnxtrain's side only)
    from onnxtrain import artifacts

    torch.manual_seed(0)
    ops = set()
    for spec in SPECS:
        model, x, _ = build(spec.name, torch.Generator().manual_seed(0))
        directory = os.path.join(out, spec.name)
        data = bench_training.export_training(model, (x,), ["x"], ["logits"])
        artifacts.generate_artifacts(data, requires_grad=bench_training.parameter_names(model),
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=spec.lr),
                                     artifact_directory=directory, nominal_checkpoint=True,
                                     mixed_precision=spec.mixed_precision or None)
        for f in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
            path = os.path.join(directory, f)
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst)
            os.remove(path)
        _, _, target = build(spec.name, torch.Generator().manual_seed(0))
        with open(os.path.join(directory, "batch.txt"), "w") as f:
            for input_name, t, high in (("x", x, VALUES[spec.name][0]), ("target", target, VALUES[spec.name][1])):
                dtype = "float32" if t.is_floating_point() else "int64"
                f.write(" ".join([input_name, dtype, *map(str, t.shape), str(high)]) + "\n")
        with open(os.path.join(directory, "ops.txt")) as f:
            ops.update(line.strip() for line in f if line.strip() and not line.startswith("#"))
        print(f"cuda_training_models: {spec.name} -> {directory}", flush=True)
    with open(os.path.join(out, "ops.txt"), "w") as f:
        f.write("".join(op + "\n" for op in sorted(ops)))


if __name__ == "__main__":
    main(sys.argv[1])
