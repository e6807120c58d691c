"""The zoo of ONNX Runtime training's artifacts: bench/models.py's models exported with Debian's
torch in training mode, in two sizes: "test" (tiny: the golden tests, tests/python/test_ort_artifacts.py)
and "bench" (the sizes of bench_training.py and bench_cnn.py: bench_vs_ort_training.py). ORT_SCRIPT
runs in the `ort-training` peer (ONNX Runtime training 1.19.2): it generates artifacts from the
exported file, trains them for a number of steps on the batches given, and reports the losses, the
final parameters and every (domain, op_type) of the three graphs.

    path, params = export("mlp", tmp_path)              # size="test"
    batches = batches("mlp", 20)
    path, params = export("bert", tmp_path, size="bench")
"""
import io
import os
import textwrap

import numpy as np
import onnx
import torch
from torch import nn

import models  # bench/models.py

BERT_CFG = models.BertConfig(vocab_size=50, hidden=32, layers=2, heads=2, ffn=64, max_len=8)
BENCH_BERT_CFG = models.BertConfig()  # hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192, seq 128
SIZES = ("test", "bench")

# size -> name -> (input shape or (batch, seq) of token ids, classes); "bench": bench_training.py's
# MLP (bench/models.py MODELS), digits CNN and BERT, bench_cnn.py's ResNet and MobileNetV2 train step.
SHAPES = {
    "test": {"mlp": ((8, 20), 4), "digits_cnn": ((8, 1, 8, 8), 10), "resnet": ((16, 3, 16, 16), 10),
             "mobilenetv2": ((4, 3, 64, 64), 10), "bert": ((4, 8), 3), "gpt": ((4, 8), BERT_CFG.vocab_size)},
    "bench": {"mlp": ((64, 784), 10), "digits_cnn": ((64, 1, 8, 8), 10), "resnet": ((16, 3, 32, 32), 10),
              "mobilenetv2": ((16, 3, 96, 96), 10), "bert": ((8, 128), 2),
              "gpt": ((8, 128), BENCH_BERT_CFG.vocab_size)},
}
DESCRIPTIONS = {
    "mlp": "MLP 784-1024-1024-10, batch 64",
    "digits_cnn": "DigitsCNN 1x8x8, batch 64 (Dropout ratio 0)",
    "resnet": "ResNet-18-shaped (BatchNorm), widths 32-256, 3x32x32, batch 16",
    "mobilenetv2": "MobileNetV2 width 1.0, 10 classes, 3x96x96, batch 16",
    "bert": "BERT encoder h256 L4 H4 ffn1024, seq 128, batch 8, 2 classes",
    "gpt": "GPT decoder h256 L4 H4 ffn1024, vocab 8192, seq 128, batch 8",
}


class TokenRows(nn.Module):
    """A language model whose (B, S, V) logits are flattened to (B*S, V) rows, the shape ORT's
    CrossEntropyLoss block takes."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        logits = self.model(ids)
        return logits.reshape(-1, logits.shape[-1])


def _build(name, size="test"):
    assert size in SIZES, size
    torch.manual_seed(0)
    big = size == "bench"
    cfg = BENCH_BERT_CFG if big else BERT_CFG
    if name == "mlp":
        return models.MLP((784, 1024, 1024, 10) if big else (20, 32, 16, 4))
    if name == "digits_cnn":
        # Dropout's mask comes from each engine's own generator: ratio 0 keeps the Dropout and
        # DropoutGrad nodes in the graphs and makes the runs comparable.
        return models.DigitsCNN(dropout=0.0)
    if name == "resnet":
        return models.SmallResNet(widths=(32, 64, 128, 256) if big else (8, 16, 16, 16), num_classes=10)
    if name == "mobilenetv2":
        return models.MobileNetV2(num_classes=10)
    if name == "bert":
        return models.BertClassifier(cfg, num_classes=SHAPES[size]["bert"][1])
    if name == "gpt":
        return TokenRows(models.GPTDecoder(cfg))
    raise KeyError(name)


def batches(name, steps, seed=1, size="test"):
    """`steps` (input, target) numpy batches for model `name`."""
    g = torch.Generator().manual_seed(seed)
    shape, classes = SHAPES[size][name]
    vocab = (BENCH_BERT_CFG if size == "bench" else BERT_CFG).vocab_size
    out = []
    for _ in range(steps):
        if name in ("bert", "gpt"):
            x = torch.randint(0, vocab, shape, generator=g)
        elif name == "digits_cnn":
            x = torch.rand(*shape, generator=g)
        else:
            x = torch.randn(*shape, generator=g)
        rows = shape[0] * shape[1] if name == "gpt" else shape[0]
        y = torch.randint(0, classes, (rows,), generator=g)
        out.append((x.numpy(), y.numpy()))
    return out


ZOO = ["mlp", "digits_cnn", "bert", "gpt", "resnet", "mobilenetv2"]


def export(name, directory, size="test"):
    """Exports model `name` in training mode to directory/<name>.onnx; returns (path, the names
    of its trainable parameters)."""
    model = _build(name, size).train()
    x, _ = batches(name, 1, size=size)[0]
    f = io.BytesIO()
    torch.onnx.export(model, (torch.from_numpy(x),), f, input_names=["input"], output_names=["logits"],
                      opset_version=17, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    proto = onnx.load_from_string(f.getvalue())
    # torch exports LayerNormalization with its one required output; ORT's gradient for it reads the
    # optional Mean and InvStdDev outputs and fails without them, so the zoo names them.
    for node in proto.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([node.output[0] + "_mean", node.output[0] + "_inv_std_dev"])
    path = os.path.join(str(directory), f"{name}.onnx")
    onnx.save(proto, path)
    return path, [n for n, _ in model.named_parameters()]


# Runs in the ort-training peer: python -c ORT_SCRIPT model.onnx params_json batches.npz out_dir optim steps
ORT_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import onnx
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    model_path, params, batches, out, optim, steps = sys.argv[1:7]
    params, steps = json.loads(params), int(steps)
    os.makedirs(out, exist_ok=True)
    optim = {"adamw": artifacts.OptimType.AdamW, "sgd": artifacts.OptimType.SGD}[optim]
    artifacts.generate_artifacts(onnx.load(model_path), requires_grad=params,
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=optim, artifact_directory=out)
    ops = {}
    for graph in ("training_model", "eval_model", "optimizer_model"):
        m = onnx.load(os.path.join(out, graph + ".onnx"))
        ops[graph] = sorted({(n.domain or "ai.onnx", n.op_type) for n in m.graph.node})
    data = np.load(batches)
    losses = []
    if steps:
        state = CheckpointState.load_checkpoint(out + "/checkpoint")
        try:
            module = Module(out + "/training_model.onnx", state, out + "/eval_model.onnx")
            has_eval = True
        except RuntimeError as exc:  # BatchNormalization in the eval model: ORT refuses its own file
            if "BatchNormalization" not in str(exc):
                raise
            module, has_eval = Module(out + "/training_model.onnx", state), False
        optimizer = Optimizer(out + "/optimizer_model.onnx", module)
        module.train()
        for k in range(steps):
            losses.append(float(module(data[f"x{k}"], data[f"y{k}"])))
            optimizer.step()
            module.lazy_reset_grad()
        np.savez(out + "/ort_params.npz", **{n: p.data for n, p in state.parameters})
        eval_loss = None
        if has_eval:
            module.eval()
            eval_loss = float(module(data["x0"], data["y0"]))
    else:
        eval_loss = None
    print(json.dumps({"ops": ops, "losses": losses, "eval_loss": eval_loss}))
""")
