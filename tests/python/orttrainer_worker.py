"""Run by tests/python/test_orttrainer.py, alone or under mpirun: an MLP trained by ORTTrainer
with options.distributed from setup_with_mpi(); each rank feeds its half of every batch.

    orttrainer_worker.py OUT.npz"""
import sys

import numpy as np
import torch
from torch import nn

from onnxtrain import optim, orttrainer


def train(rank, size, local_rank):
    """The weights after 20 train steps (10 optimizer steps) on this rank's halves of the batches."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))
    desc = {"inputs": [("x", ["batch", 10]), ("label", ["batch"])], "outputs": [("loss", [], True)]}
    options = orttrainer.ORTTrainerOptions({
        "batch": {"gradient_accumulation_steps": 2},
        "distributed": {"world_rank": rank, "world_size": size, "local_rank": local_rank,
                        "allreduce_post_accumulation": True}})
    trainer = orttrainer.ORTTrainer(model, desc, optim.AdamConfig(lr=1e-2, lambda_coef=0.01,
                                                                  params=[{"params": ["2.bias"], "lr": 5e-2}]),
                                    loss_fn=nn.functional.cross_entropy, options=options)
    for _ in range(20):
        x, y = torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)
        trainer.train_step(x.chunk(size)[rank], y.chunk(size)[rank])
    return trainer.state_dict()["model"]["full_precision"]


def main():
    rank, size, local_rank = orttrainer.setup_with_mpi()
    weights = train(rank, size, local_rank)
    if rank == 0:
        np.savez(sys.argv[1], **weights)


if __name__ == "__main__":
    main()
