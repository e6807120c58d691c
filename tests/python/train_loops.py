"""Training loops the optimizer tests share: SGD over a torch model (a TrainModule or not) with a
cross-entropy over its last axis, and the on-device loop over generated artifacts."""
import os

import torch
from torch import nn


def train_torch(model, data, lr=0.1):
    """Losses of one SGD step per (inputs, labels) batch; logits [..., classes], labels [...]."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in data:
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def train_artifacts(directory, data):
    """Losses of one step per (inputs, targets) batch of the artifacts in `directory`, and the Module."""
    from onnxtrain.api import CheckpointState, Module, Optimizer
    state = CheckpointState.load_checkpoint(os.path.join(directory, "checkpoint"))
    module = Module(os.path.join(directory, "training_model.onnx"), state, os.path.join(directory, "eval_model.onnx"))
    optimizer = Optimizer(os.path.join(directory, "optimizer_model.onnx"), module)
    losses = []
    for x, y in data:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses, module
