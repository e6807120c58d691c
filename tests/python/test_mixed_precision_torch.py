"""Mixed precision from PyTorch: TrainModule(mixed_precision=...), ONNXTRAIN_MIXED_PRECISION and
torch.autocast detection; FP16_Optimizer's loss scaling, overflow skip and master weights;
FusedAdam over bf16 parameters with fp32 state."""
import copy
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

from onnxtrain.torch import FP16_Optimizer, FusedAdam, TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402  (the shared reference models)


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = models.BertConfig(vocab_size=64, hidden=32, layers=2, heads=2, ffn=64, max_len=16)
    model = models.BertClassifier(cfg, num_classes=3)
    model.train()
    for m in model.modules():  # deterministic runs: the tests compare runs with each other
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    g = torch.Generator().manual_seed(seed)
    return model, torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 3, (4,), generator=g)


def loss_and_grads(module, x, y):
    module.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(module(x), y)
    loss.backward()
    return float(loss), {n: p.grad.clone() for n, p in module.named_parameters()}


def test_train_module_bf16_close_to_fp32_and_grads_fp32():
    model, x, y = tiny_bert()
    l32, g32 = loss_and_grads(TrainModule(copy.deepcopy(model)), x, y)
    l16, g16 = loss_and_grads(TrainModule(copy.deepcopy(model), mixed_precision="bf16"), x, y)
    assert l16 != l32 and abs(l16 - l32) < 0.02 * abs(l32)
    assert all(g.dtype == torch.float32 for g in g16.values())
    # bf16 keeps 8 bits: the gradient as a whole within a few percent (single entries that are 0
    # in exact arithmetic, such as the key bias's, come out as rounding noise).
    flat16 = torch.cat([g16[n].flatten() for n in g32])
    flat32 = torch.cat([g32[n].flatten() for n in g32])
    assert float((flat16 - flat32).norm() / flat32.norm()) < 0.05


def test_autocast_and_environment_select_the_same_graphs(monkeypatch):
    model, x, y = tiny_bert()
    l_arg, g_arg = loss_and_grads(TrainModule(copy.deepcopy(model), mixed_precision="bf16"), x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        l_ac, g_ac = loss_and_grads(TrainModule(copy.deepcopy(model)), x, y)
    monkeypatch.setenv("ONNXTRAIN_MIXED_PRECISION", "bf16")
    l_env, g_env = loss_and_grads(TrainModule(copy.deepcopy(model)), x, y)
    assert l_arg == l_ac == l_env
    for n in g_arg:
        assert torch.equal(g_arg[n], g_ac[n]) and torch.equal(g_arg[n], g_env[n]), n
    monkeypatch.setenv("ONNXTRAIN_MIXED_PRECISION", "int4")
    with pytest.raises(ValueError, match="ONNXTRAIN_MIXED_PRECISION"):
        TrainModule(copy.deepcopy(model))
    with pytest.raises(ValueError, match="'bf17'"):
        TrainModule(copy.deepcopy(model), mixed_precision="bf17")


def test_train_module_bf16_curve_follows_fp32():
    model, x, y = tiny_bert()
    curves = {}
    for mode in (None, "bf16"):
        m = TrainModule(copy.deepcopy(model), mixed_precision=mode)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        curves[mode] = np.array(losses)
    assert curves["bf16"][-1] < 0.5 * curves["bf16"][0]
    np.testing.assert_allclose(curves["bf16"][::4], curves[None][::4], rtol=0.1, atol=0.05)


# --------------------------------------------------------------------------------------------------
# FP16_Optimizer

def test_fp16_optimizer_overflow_skips_and_scale_follows_the_rules():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(torch.bfloat16)
    x, y = torch.randn(32, 8).to(torch.bfloat16), torch.randn(32, 1)
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), dynamic_loss_scale=True,
                         dynamic_loss_args=dict(init_scale=2.0 ** 131, scale_window=3))
    history = []
    for _ in range(12):
        before = [p.detach().clone() for p in model.parameters()]
        scale = opt.loss_scale
        opt.zero_grad()
        opt.backward(((model(x).float() - y) ** 2).mean())
        stepped = opt.step()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        history.append((scale, stepped, changed))
    # 2^131, 2^130, 2^129 overflow fp32 (loss * scale > 3.4e38): skipped, parameters untouched,
    # scale halved each time; then finite steps, the scale doubling after every 3 of them.
    skipped = [h for h in history if not h[1]]
    assert skipped and all(not changed for _, _, changed in skipped)
    assert all(changed for _, stepped, changed in history if stepped)
    first_ok = next(i for i, h in enumerate(history) if h[1])
    for i in range(1, first_ok + 1):
        assert history[i][0] == history[i - 1][0] / 2
    assert opt.scaler.skipped_steps == len(skipped)
    scales = [h[0] for h in history[first_ok:]]
    run = 0
    for prev, cur, (_, stepped, _) in zip(scales, scales[1:], history[first_ok:]):
        if not stepped:
            run = 0
            continue
        run += 1
        assert cur == (prev * 2 if run % 3 == 0 else prev)


def test_fp16_optimizer_over_train_module_matches_fp32():
    model, x, y = tiny_bert()
    curves = {}
    for half in (False, True):
        m = copy.deepcopy(model)
        if half:
            m = m.to(torch.bfloat16)
        tm = TrainModule(m)
        inner = FusedAdam(tm.parameters(), lr=3e-3)
        opt = FP16_Optimizer(inner, dynamic_loss_scale=True) if half else inner
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(tm(x).float(), y)
            if half:
                opt.backward(loss)
                opt.clip_master_grads(5.0)
            else:
                loss.backward()
            opt.step()
            losses.append(float(loss))
        curves[half] = np.array(losses)
        if half:
            assert all(p.dtype == torch.bfloat16 for p in m.parameters())
            assert all(q.dtype == torch.float32 for g in opt.master_params for q in g)
    assert curves[True][-1] < 0.5 * curves[True][0]
    np.testing.assert_allclose(curves[True][::4], curves[False][::4], rtol=0.1, atol=0.05)


def test_fused_adam_bf16_params_keep_fp32_state():
    torch.manual_seed(1)
    ref = nn.Parameter(torch.randn(33, 7))
    half = nn.Parameter(ref.detach().to(torch.bfloat16))
    master = nn.Parameter(half.detach().float())  # what fp32 state should track
    opt_half = FusedAdam([half], lr=1e-2)
    opt_ref = FusedAdam([master], lr=1e-2)
    for _ in range(5):
        g = torch.randn(33, 7).to(torch.bfloat16)
        half.grad, master.grad = g, g.float()
        opt_half.step()
        opt_ref.step()
    state = opt_half.state[half]
    assert state["exp_avg"].dtype == torch.float32 and state["master_param"].dtype == torch.float32
    assert torch.equal(state["master_param"], master.detach())
    assert torch.equal(half.detach(), master.detach().to(torch.bfloat16))
