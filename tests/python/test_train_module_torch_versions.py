"""TrainModule in both torch lanes (`make test`: Debian's torch 1.13 under /usr/bin/python3, PyPI's
torch 2.x in the torch2 peer's venv): each lane runs the torch it names, a torch too old says so
and falls back by the policy, and under torch.compile a TrainModule is a graph break."""
import copy
import os
import re
import sys

import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain.torch import TrainModule, TrainModuleError

onnxtrain.set_num_threads(1)

HAS_COMPILE = hasattr(torch, "compile")


def test_the_lane_runs_its_torch(torch_lane):
    import peers
    assert torch_lane in ("debian", "torch2"), torch_lane
    assert peers.lane_of_interpreter() == torch_lane, f"the {torch_lane} lane runs on {sys.executable}"
    where = os.path.realpath(torch.__file__)
    if torch_lane == "torch2":
        assert torch.__version__.startswith("2."), torch.__version__
        assert where.startswith(os.path.realpath(sys.prefix)), f"torch 2.x from outside the venv: {where}"
    else:
        assert torch.__version__.startswith("1.13"), torch.__version__
        assert where.startswith("/usr/lib/python3/dist-packages/"), f"not Debian's torch: {where}"


def test_a_torch_too_old_is_named_and_falls_back_by_the_policy(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "1.12.1")
    x = torch.randn(3, 4)
    with pytest.raises(TrainModuleError, match=r"Linear: torch 1\.12\.1 is too old; TrainModule needs torch >= 1\.13"):
        TrainModule(nn.Linear(4, 2))(x)
    monkeypatch.setenv("ONNXTRAIN_FALLBACK", "warn")
    plain = nn.Linear(4, 2)
    wrapped = TrainModule(copy.deepcopy(plain))
    with pytest.warns(RuntimeWarning, match=r"torch 1\.12\.1 is too old(.|\n)*Linear now runs in PyTorch"):
        out = wrapped(x)
    torch.testing.assert_close(out, plain(x))


def mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


@pytest.mark.skipif(not HAS_COMPILE, reason=f"torch {torch.__version__} has no torch.compile")
def test_torch_compile_around_a_train_module_trains_as_eager():
    """The compiled layers around a TrainModule compile; its call is a graph break."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(6, 8), mlp(), nn.ReLU(), nn.Linear(4, 3))
    wrapped = copy.deepcopy(plain)
    wrapped[1] = TrainModule(wrapped[1])
    compiled = torch.compile(wrapped, backend="aot_eager")
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(4)]
    for model in (plain, compiled):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert wrapped[1].build_stats, "the TrainModule did not build its graphs: it was traced instead"
    for (name, got), want in zip(wrapped.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(not HAS_COMPILE, reason=f"torch {torch.__version__} has no torch.compile")
def test_torch_compile_fullgraph_says_why_it_cannot():
    with pytest.raises(Exception, match="TrainModule runs its forward and backward in onnxtrain's own graphs"):
        torch.compile(TrainModule(mlp()), backend="eager", fullgraph=True)(torch.randn(2, 8))


def test_a_torch_without_the_torchscript_exporter_is_named(monkeypatch):
    def export(model, args=(), f=None, *, dynamo=True, opset_version=None):  # torch.export-based only
        raise AssertionError("not called")
    monkeypatch.setattr(torch.onnx, "export", export)
    named = f"Linear: torch {torch.__version__}'s torch.onnx.export has no TorchScript-based exporter"
    with pytest.raises(TrainModuleError, match=re.escape(named)):
        TrainModule(nn.Linear(4, 2))(torch.randn(3, 4))
