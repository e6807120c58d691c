"""Memory-efficient gradient management for TrainModule (ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1,
alias ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT): each parameter's gradient reaches torch during
onnxtrain's backward, as soon as the backward graph has finished it, through the parameter's
AccumulateGrad node, so its hooks (DistributedDataParallel's) fire mid-backward. The gradients are
the flag-off ones; DDP on 2 gloo processes gives the same parameters with the flag on and off."""
import gc
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.functional import cross_entropy

from onnxtrain.torch import TrainModule
from onnxtrain.torch import train_module as tm

FLAG = "ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT"


def mlp(hidden=16):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 5))


def batches(n=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 12, generator=g), torch.randint(0, 5, (6,), generator=g)) for _ in range(n)]


def track_backward(monkeypatch=None):
    """Patches _RunGraph.backward to note when onnxtrain's backward runs; returns the flag list."""
    inside = [False]
    original = tm._RunGraph.backward

    def backward(ctx, *grads):
        inside[0] = True
        try:
            return original(ctx, *grads)
        finally:
            inside[0] = False

    if monkeypatch is not None:
        monkeypatch.setattr(tm._RunGraph, "backward", staticmethod(backward))
    else:
        tm._RunGraph.backward = staticmethod(backward)
    return inside


def grads_after(flag, monkeypatch, name=FLAG, accumulate=2):
    """.grad of every parameter after `accumulate` backward calls (torch sums them into .grad)."""
    monkeypatch.setenv(name, "1" if flag else "0")
    model = mlp()
    wrapped = TrainModule(model)
    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(2), requires_grad=True)
    for x_b, y_b in batches(accumulate):
        cross_entropy(wrapped(x_b + x), y_b).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, x.grad.clone()


def test_gradients_equal_the_flag_off_ones(monkeypatch):
    off, x_off = grads_after(False, monkeypatch)
    on, x_on = grads_after(True, monkeypatch)
    alias, x_alias = grads_after(True, monkeypatch, name="ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT")
    monkeypatch.delenv(FLAG)
    assert off.keys() == on.keys()
    for k in off:  # the same kernels in the same order: the same bits
        assert torch.equal(off[k], on[k]), k
        assert torch.equal(off[k], alias[k]), k
    assert torch.equal(x_off, x_on)  # an input's gradient still goes back through autograd
    assert float(x_off.abs().sum()) > 0


def test_gradients_are_handed_over_during_the_backward_in_the_order_they_finish(monkeypatch):
    inside = track_backward(monkeypatch)
    for flag in (True, False):
        monkeypatch.setenv(FLAG, "1" if flag else "0")
        model = mlp()
        wrapped = TrainModule(model)
        order, during, nodes = [], [], []

        def note(name):
            order.append(name)
            during.append(inside[0])

        for name, p in model.named_parameters():
            # The parameter's AccumulateGrad node: where DDP hangs its hooks.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(lambda *_, name=name: note(name))
            nodes.append(acc)  # the hook lives as long as the node
        x, y = batches(1)[0]
        cross_entropy(wrapped(x), y).backward()
        assert sorted(order) == sorted(n for n, _ in model.named_parameters()), order
        if flag:
            assert all(during), during  # every hook fired inside onnxtrain's backward
            layer = [int(n.split(".")[0]) for n in order]
            assert layer == sorted(layer, reverse=True), order  # the head's gradients finish first
        else:
            assert not any(during), during  # all after it, from the gradients it returned


def _ddp_worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    inside = track_backward()
    try:
        for flag in (0, 1):
            os.environ[FLAG] = str(flag)
            # DDP's first bucket holds 1 MB: a 600-wide layer (1.4 MB) closes it, and the first
            # layer's gradients (tiny buckets) are computed after it is reduced.
            model = mlp(600)
            ddp = nn.parallel.DistributedDataParallel(TrainModule(model), bucket_cap_mb=0.001)
            during = []

            def hook(state, bucket):  # DDP's default: average by allreduce; notes when it runs
                during.append(inside[0])
                t = bucket.buffer().div_(world)
                # Synchronous, and no Python callback on gloo's threads: with one (fut.then), torch
                # 1.13 can deadlock destroying the process group while gloo runs it.
                dist.all_reduce(t)
                done = torch.futures.Future()
                done.set_result(t)
                return done

            ddp.register_comm_hook(None, hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for x, y in batches(4):
                cross_entropy(ddp(x.chunk(world)[rank]), y.chunk(world)[rank]).backward()
                opt.step()
                opt.zero_grad()
            if rank == 0:
                torch.save({"state": model.state_dict(), "during": during}, os.path.join(out_dir, f"flag{flag}.pt"))
            # Free DDP (its reducer holds the Python hook) here, under the GIL: torch 1.13 can
            # deadlock when the last reference goes while destroy_process_group joins gloo's threads.
            del ddp, opt, hook
            gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ddp_on_gloo_gives_the_same_parameters_with_the_flag_on_and_off():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        off, on = torch.load(os.path.join(tmp, "flag0.pt")), torch.load(os.path.join(tmp, "flag1.pt"))
    for k, want in off["state"].items():
        assert torch.allclose(on["state"][k], want, rtol=1e-6, atol=1e-7), k
    # Several buckets per step; with the flag DDP's bucket hooks ran during onnxtrain's backward.
    assert len(on["during"]) >= 8 and all(on["during"]), on["during"]
    assert len(off["during"]) >= 8 and not any(off["during"]), off["during"]
    start = mlp(600).state_dict()
    assert any(float((on["state"][k] - start[k]).abs().max()) > 1e-3 for k in start)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
