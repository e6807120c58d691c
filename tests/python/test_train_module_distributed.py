"""TrainModule under torch.distributed beyond plain DDP (that is test_train_module.py): 2 gloo
processes with ZeroRedundancyOptimizer over onnxtrain's FusedAdam, and the Lightning pattern (a
LightningModule-like class owning a TrainModule, wrapped for DDP the way Lightning's DDP strategy
wraps it, driven by an automatic-optimization loop), each against one process on the whole batch."""
import copy
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.functional import cross_entropy

from onnxtrain.torch import TrainModule
from onnxtrain.torch.optim import FusedAdam

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

STEPS = 8


def model_and_batches():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = models.MLP((12, 16, 16, 5))
    return model, [(torch.randn(6, 12, generator=g), torch.randint(0, 5, (6,), generator=g)) for _ in range(STEPS)]


class LitClassifier(nn.Module):
    """The shape of a LightningModule: it owns the (wrapped) network and says how to train."""

    def __init__(self, net):
        super().__init__()
        self.net = TrainModule(net)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class _StrategyWrapper(nn.Module):
    """What Lightning's DDP strategy puts inside DistributedDataParallel: forward runs training_step."""

    def __init__(self, lit):
        super().__init__()
        self.module = lit

    def forward(self, batch, batch_idx):
        return self.module.training_step(batch, batch_idx)


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # ZeroRedundancyOptimizer: each rank updates its shard of the parameters with FusedAdam.
        model, batches = model_and_batches()
        ddp = nn.parallel.DistributedDataParallel(TrainModule(model))
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=FusedAdam, lr=1e-2, weight_decay=0.01)
        for x, y in batches:
            cross_entropy(ddp(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
            opt.step()
            opt.zero_grad()
        if rank == 0:
            torch.save(model.state_dict(), os.path.join(out_dir, "zero.pt"))
        # The Lightning pattern.
        net, batches = model_and_batches()
        lit = LitClassifier(net)
        ddp = nn.parallel.DistributedDataParallel(_StrategyWrapper(lit))
        opt = lit.configure_optimizers()
        for i, (x, y) in enumerate(batches):
            loss = ddp((x.chunk(world)[rank], y.chunk(world)[rank]), i)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            torch.save(net.state_dict(), os.path.join(out_dir, "lit.pt"))
    finally:
        dist.destroy_process_group()


def _close(ours, theirs, tol=1e-5):
    assert ours.keys() == theirs.keys()
    for k, want in theirs.items():
        err = float((ours[k] - want).norm() / max(float(want.norm()), 1e-6))
        assert err <= tol, f"'{k}': relative difference {err:.2e}"


def test_zero_fused_adam_and_lightning_pattern_match_one_process():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        zero, lit = torch.load(os.path.join(tmp, "zero.pt")), torch.load(os.path.join(tmp, "lit.pt"))

    model, batches = model_and_batches()
    start = copy.deepcopy(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for x, y in batches:
        cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    _close(zero, model.state_dict())
    assert any(float((zero[k] - start[k]).abs().max()) > 1e-3 for k in start)

    model, batches = model_and_batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    _close(lit, model.state_dict())
