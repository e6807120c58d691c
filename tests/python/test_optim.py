"""onnxtrain's fused multi-tensor optimizers against torch.optim, and the LR schedules.

Each rule runs 20 steps on random parameters and gradients (several tensors, one of them spread
over many chunks) next to its torch.optim counterpart; the worst normwise relative difference over
parameters and state must stay below 1e-6 in float64 and 1e-5 in float32.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnxtrain  # noqa: E402
from onnxtrain import _C  # noqa: E402

optim = _C.optim

SHAPES = [(7,), (3, 5), (), (0, 3), (70000,), (17, 9)]
STEPS = 20
TOL = {np.float64: 1e-6, np.float32: 1e-5}


def rel_diff(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size == 0:
        return 0.0
    den = np.max(np.abs(b))
    num = np.max(np.abs(a - b))
    return num / den if den > 0 else num


def make_data(dtype, seed=0):
    rng = np.random.default_rng(seed)
    init = [np.asarray(rng.standard_normal(s), dtype=dtype) for s in SHAPES]
    grads = [[np.asarray(0.5 * rng.standard_normal(s), dtype=dtype) for s in SHAPES] for _ in range(STEPS)]
    return init, grads


def run_torch(cls, kw, init, grads, clip=0.0):
    params = [torch.tensor(x.copy(), requires_grad=True) for x in init]
    opt = cls(params, **kw)
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = torch.from_numpy(g.copy())
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    return params, opt


def run_ours(kind, kw, init, grads):
    config = optim.OptimizerConfig(kind, **kw)
    params = [x.copy() for x in init]
    fill = kw.get("initial_accumulator_value", 0.0)
    state = {name: [np.full_like(x, fill if name == "sum" else 0.0) for x in init]
             for name in config.state_names()}
    for k, gs in enumerate(grads, start=1):
        optim.multi_tensor_step(config, k, params, gs, state)
    return params, state


def worst_difference(ours, state, theirs, opt):
    worst = 0.0
    for i, (p, q) in enumerate(zip(ours, theirs)):
        worst = max(worst, rel_diff(p, q.detach().numpy()))
        for name, arrays in state.items():
            worst = max(worst, rel_diff(arrays[i], opt.state[q][name].numpy()))
    return worst


CASES = {
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), "adamw", {}),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True), "adamw", {}),
    "adamw_maximize": (torch.optim.AdamW, dict(lr=1e-2, maximize=True, betas=(0.8, 0.99), eps=1e-6), "adamw", {}),
    "adam": (torch.optim.Adam, dict(lr=1e-2), "adam", {}),
    "adam_l2_amsgrad": (torch.optim.Adam, dict(lr=1e-2, weight_decay=0.05, amsgrad=True), "adam", {}),
    "sgd": (torch.optim.SGD, dict(lr=0.05), "sgd", {}),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2), "sgd", {}),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3), "sgd", {}),
    "adagrad": (torch.optim.Adagrad, dict(lr=0.05), "adagrad", {}),
    "adagrad_full": (torch.optim.Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.01,
                                               initial_accumulator_value=0.1, eps=1e-9), "adagrad", {}),
}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch(case, dtype):
    cls, kw, kind, extra = CASES[case]
    init, grads = make_data(dtype)
    theirs, opt = run_torch(cls, kw, init, grads)
    ours, state = run_ours(kind, {**kw, **extra}, init, grads)
    assert ours[0].dtype == dtype
    assert worst_difference(ours, state, theirs, opt) < TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", ["adamw", "sgd_momentum", "adagrad"])
def test_clipping_matches_clip_grad_norm(case, dtype):
    cls, kw, kind, _ = CASES[case]
    init, grads = make_data(dtype, seed=1)
    theirs, opt = run_torch(cls, kw, init, grads, clip=1.5)
    ours, state = run_ours(kind, {**kw, "max_grad_norm": 1.5}, init, grads)
    assert worst_difference(ours, state, theirs, opt) < TOL[dtype]


def hf_adamw_reference(init, grads, lr, betas, eps, wd, correct_bias):
    """transformers.optimization.AdamW, step by step in float64."""
    ps = [x.astype(np.float64) for x in init]
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    for k, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            step_size = lr
            if correct_bias:
                step_size = lr * math.sqrt(1 - betas[1] ** k) / (1 - betas[0] ** k)
            ps[i] = ps[i] - step_size * m[i] / (np.sqrt(v[i]) + eps)
            if wd > 0:
                ps[i] = ps[i] - lr * wd * ps[i]
    return ps


@pytest.mark.parametrize("correct_bias", [True, False])
def test_hf_adamw(correct_bias):
    init, grads = make_data(np.float64)
    ours, _ = run_ours("hf_adamw", dict(lr=1e-2, weight_decay=0.1, correct_bias=correct_bias), init, grads)
    ref = hf_adamw_reference(init, grads, 1e-2, (0.9, 0.999), 1e-6, 0.1, correct_bias)
    assert max(rel_diff(a, b) for a, b in zip(ours, ref)) < 1e-10


def test_optimizer_object_and_state_views():
    config = optim.OptimizerConfig("adamw", lr=1e-2)
    assert config.weight_decay == 0.01 and config.betas == (0.9, 0.999) and config.eps == 1e-8
    opt = optim.MultiTensorOptimizer(config)
    state = optim.OptimizerState()
    init, grads = make_data(np.float32)
    params = [x.copy() for x in init]
    for gs in grads[:3]:
        stats = opt.step(params, gs, state)
    assert state.step == 3 and stats["clip_coef"] == 1.0
    theirs, topt = run_torch(torch.optim.AdamW, dict(lr=1e-2), init, grads[:3])
    views = state.tensors
    assert sorted(views) == ["exp_avg", "exp_avg_sq"]
    for i, q in enumerate(theirs):
        assert rel_diff(params[i], q.detach().numpy()) < 1e-5
        assert rel_diff(views["exp_avg"][i], topt.state[q]["exp_avg"].numpy()) < 1e-5
    opt.lr = 0.5
    assert opt.lr == 0.5


def test_bad_arrays_are_clear_errors():
    config = optim.OptimizerConfig("sgd", lr=0.1, momentum=0.9)
    p = np.zeros((4, 4), np.float32)
    g = np.zeros((4, 4), np.float32)
    buf = {"momentum_buffer": [np.zeros((4, 4), np.float32)]}
    with pytest.raises(onnxtrain.InvalidArgument, match="not C-contiguous"):
        optim.multi_tensor_step(config, 1, [p[:, ::2]], [g[:, ::2]], buf)
    ro = p.copy()
    ro.flags.writeable = False
    with pytest.raises(onnxtrain.InvalidArgument, match="read-only"):
        optim.multi_tensor_step(config, 1, [ro], [g], buf)
    with pytest.raises(onnxtrain.InvalidArgument, match="momentum_buffer"):
        optim.multi_tensor_step(config, 1, [p], [g], {})
    with pytest.raises(onnxtrain.InvalidArgument, match="gradient 0"):
        optim.multi_tensor_step(config, 1, [p], [np.zeros((4, 5), np.float32)], buf)
    with pytest.raises(onnxtrain.InvalidArgument, match="unknown option"):
        optim.OptimizerConfig("adamw", learning_rate=1.0)
    with pytest.raises(onnxtrain.InvalidArgument, match="nesterov"):
        optim.OptimizerConfig("sgd", nesterov=True)
    # A non-contiguous gradient is only read: it is accepted.
    big = np.ones((4, 8), np.float32)
    optim.multi_tensor_step(config, 1, [p], [big[:, ::2]], buf)
    assert np.allclose(p, -0.1)


# ---- FusedAdam -------------------------------------------------------------------------------------

def small_model(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)


def train(model, opt, steps=STEPS, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=g, dtype=dtype)
        y = torch.randn(32, 4, generator=g, dtype=dtype)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-6)], ids=["f32", "f64"])
@pytest.mark.parametrize("mode,reference", [("adamw", torch.optim.AdamW), ("adam_l2", torch.optim.Adam)])
def test_fused_adam_trains_like_torch(dtype, tol, mode, reference):
    from onnxtrain.torch import FusedAdam

    a, b = small_model(dtype), small_model(dtype)
    kw = dict(lr=1e-2, weight_decay=0.05)
    ours = FusedAdam(a.parameters(), mode=mode, **kw)
    theirs = reference(b.parameters(), **kw)
    train(a, ours, dtype=dtype)
    train(b, theirs, dtype=dtype)
    for p, q in zip(a.parameters(), b.parameters()):
        assert rel_diff(p.detach().numpy(), q.detach().numpy()) < tol
        for name in ("exp_avg", "exp_avg_sq"):
            assert rel_diff(ours.state[p][name].numpy(), theirs.state[q][name].numpy()) < tol
        assert float(ours.state[p]["step"]) == STEPS


def test_fused_adam_defaults_and_state_dict_interop():
    from onnxtrain.torch import FusedAdam
    from onnxtrain.torch.optim import FusedAdam as Direct

    assert FusedAdam is Direct
    a, b = small_model(torch.float32), small_model(torch.float32)
    ours = FusedAdam(a.parameters())  # torch.optim.AdamW's defaults
    theirs = torch.optim.AdamW(b.parameters())
    group = ours.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-3, (0.9, 0.999), 1e-8, 1e-2)
    train(a, ours, steps=5)
    train(b, theirs, steps=5)
    # FusedAdam's state is torch AdamW's: a state_dict moves across and training continues alike.
    b2 = small_model(torch.float32)
    b2.load_state_dict(a.state_dict())
    cont = torch.optim.AdamW(b2.parameters())
    cont.load_state_dict(ours.state_dict())
    train(a, ours, steps=5)
    train(b2, cont, steps=5)
    for p, q in zip(a.parameters(), b2.parameters()):
        assert rel_diff(p.detach().numpy(), q.detach().numpy()) < 1e-5


def test_fused_adam_hf_mode_and_clipping():
    from onnxtrain.torch import FusedAdam

    init, grads = make_data(np.float64, seed=2)
    params = [torch.tensor(x.copy(), requires_grad=True) for x in init]
    opt = FusedAdam(params, lr=1e-2, weight_decay=0.1, mode="hf", eps=1e-6)
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    ref = hf_adamw_reference(init, grads, 1e-2, (0.9, 0.999), 1e-6, 0.1, True)
    assert max(rel_diff(p.detach().numpy(), r) for p, r in zip(params, ref)) < 1e-10

    a, b = small_model(torch.float64), small_model(torch.float64)
    ours = FusedAdam(a.parameters(), lr=1e-2, max_grad_norm=0.1)
    theirs = torch.optim.AdamW(b.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        x, y = torch.randn(16, 8, generator=g, dtype=torch.float64), torch.randn(16, 4, generator=g, dtype=torch.float64)
        for m, o in ((a, ours), (b, theirs)):
            o.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            if o is theirs:
                torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
            o.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert rel_diff(p.detach().numpy(), q.detach().numpy()) < 1e-6


def test_fused_adam_updates_in_place():
    from onnxtrain.torch import FusedAdam

    p = torch.nn.Parameter(torch.ones(10))
    before = p.data_ptr()
    opt = FusedAdam([p], lr=0.1)
    p.grad = torch.ones(10)
    opt.step()
    assert p.data_ptr() == before
    assert torch.all(p < 1)
    q = torch.nn.Parameter(torch.ones(4, 4).t())  # non-contiguous: cannot be updated in place
    q.grad = torch.ones(4, 4)
    with pytest.raises(RuntimeError, match="contiguous"):
        FusedAdam([q]).step()


# ---- LR schedules ------------------------------------------------------------------------------------

def lambda_lrs(fn, n, base=0.1):
    """Learning rates torch's LambdaLR reports after 0..n-1 scheduler steps."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def ours_lrs(schedule, n):
    return [schedule.value(step) for step in range(n)]


def test_linear_schedule_matches_onnxruntime_and_transformers():
    warmup, total = 4, 12

    def ort(step):  # onnxruntime training_api LinearLRScheduler multiplier
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    got = ours_lrs(optim.LRSchedule.linear(warmup, total, 0.1), 16)
    assert np.allclose(got, lambda_lrs(ort, 16), rtol=1e-12, atol=1e-15)
    assert got[0] == 0.0 and got[warmup] == pytest.approx(0.1) and got[total] == 0.0
    assert [optim.linear_lr(s, warmup, total, 0.1) for s in range(16)] == got


def test_cosine_and_constant_schedules_match_transformers_formulas():
    warmup, total = 3, 20

    def cosine(step, cycles=0.5):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress)))

    def constant(step):
        return step / max(1.0, warmup) if step < warmup else 1.0

    assert np.allclose(ours_lrs(optim.LRSchedule.cosine(warmup, total, 0.1), 25), lambda_lrs(cosine, 25),
                       rtol=1e-12, atol=1e-15)
    assert np.allclose(ours_lrs(optim.LRSchedule.cosine(warmup, total, 0.1, num_cycles=1.5), 25),
                       lambda_lrs(lambda s: cosine(s, 1.5), 25), rtol=1e-12, atol=1e-15)
    assert np.allclose(ours_lrs(optim.LRSchedule.constant(warmup, 0.1), 10), lambda_lrs(constant, 10),
                       rtol=1e-12, atol=1e-15)


def test_step_schedule_matches_torch_steplr():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ours = optim.LRSchedule.stepped(3, 0.5, 0.3)
    for step in range(12):
        assert ours.value(step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12)
        opt.step()
        sched.step()
    with pytest.raises(onnxtrain.InvalidArgument):
        optim.LRSchedule.linear(10, 5, 0.1)
    with pytest.raises(onnxtrain.InvalidArgument):
        optim.LRSchedule.stepped(0, 0.5, 0.1)
