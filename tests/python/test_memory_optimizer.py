"""The memory optimizer from the front ends: TrainModule (ONNXTRAIN_MEMORY_OPT_LEVEL/CONFIG) trains
the encoder and GPT models identically at every level with fewer saved bytes; artifacts at level 1
train like level 0; `onnxtrain inspect` prints the plan table with the bytes computed by hand.
"""
import copy
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.torch import TrainModule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import models  # noqa: E402

from .build_paths import ONNXTRAIN  # noqa: E402
from .test_train_module import steps_with_blocks  # noqa: E402
from .train_loops import train_artifacts, train_torch  # noqa: E402

onnxtrain.set_num_threads(1)

BATCH, SEQ = 2, 8


def cfg():
    return models.BertConfig(vocab_size=40, hidden=16, layers=2, heads=2, ffn=32, max_len=12)


def build(name):
    torch.manual_seed(0)
    if name == "bert":
        return nn.Sequential(models.BertEncoder(cfg()), nn.Linear(16, 40)).train()
    return models.GPTDecoder(cfg()).train()


def batches(steps):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 40, (BATCH, SEQ), generator=g), torch.randint(0, 40, (BATCH, SEQ), generator=g))
            for _ in range(steps)]


train = train_torch


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_train_module_levels_train_identically(monkeypatch, name):
    data = batches(20)
    base = build(name)
    runs = {}
    for level, config in [("0", ""), ("1", ""), ("2", ""), ("0", "Gelu+:1:-1")]:
        monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_LEVEL", level)
        monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_CONFIG", config)
        model = copy.deepcopy(base)
        wrapped = TrainModule(model)
        losses = train(wrapped, data)
        runs[(level, config)] = (losses, model.state_dict(), wrapped.build_stats[0])
    ref_losses, ref_state, ref_stats = runs[("0", "")]
    for key, (losses, state, stats) in runs.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=str(key))
        for k, v in ref_state.items():
            torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-7, msg=f"{key}: {k}")
    saved0, saved1 = ref_stats["saved_bytes"], runs[("1", "")][2]["saved_bytes"]
    assert saved1 < 0.6 * saved0, (saved0, saved1, runs[("1", "")][2]["memory_plan"])
    assert runs[("0", "Gelu+:1:-1")][2]["saved_bytes"] < saved0
    assert "Gelu+" in runs[("1", "")][2]["memory_plan"]


def level1_plan(monkeypatch, name):
    monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_LEVEL", "1")
    wrapped = TrainModule(build(name))
    train(wrapped, batches(1))
    return wrapped.build_stats[0]


def test_level1_recomputes_most_bytes_per_flop_first_gpt(monkeypatch):
    """The GPT test model (hidden 16, ffn 32, 2 heads, seq 8, batch 2, fp32) by hand. Stashed and
    read for data: 28672 bytes; level 1 recomputes inside the layers, best bytes per FLOP first
    (every other stashed value kept), until 45% (12902 bytes) are saved. Per layer:
      LayerNorm outputs [2, 8, 16]: 1024 B for 8 FLOPs per element (2048): 1/2 B per FLOP
      GELU output [2, 8, 32]: 2048 B for 8 per element (4096): 1/2
      attention context (probabilities x V, transposed back): 1024 B for 2*(2*2*8*8)*8 + 256 = 4352
      attention probabilities [2, 2, 8, 8]: 1024 B for scores 4096 + scale 256 + mask 256 + softmax
        2048 = 6656
      Q, K, V (projection, bias, transpose): 1024 B for 2*256*16 + 256 + 256 = 8704
      FFN up-projection [2, 8, 32]: 2048 B for 2*512*16 = 16384 (1/8)
    Both layers' LayerNorm and GELU outputs (8192 B), contexts (2048) and probabilities (2048) make
    12288 B; 614 are missing, and the first Q projection (1024 B for 8704) reaches the goal alone
    for less than the next by ratio (an up-projection, 16384): 13312 B saved, 15360 kept."""
    stats = level1_plan(monkeypatch, "gpt")
    table = stats["memory_plan"]
    for row in ["LayerNormalization+ | 5 | 1024 | 1024 | - | 2048 | 1:4",  # the final LayerNorm is outside
                "Gelu+ | 2 | 2048 | 2048 | - | 4096 | 1:2",
                "MatMul+Mul+Add+Softmax+ | 2 | 1024 | 1024 | - | 6656 | 1:2",
                "MatMul+Transpose+Reshape+ | 2 | 1024 | 1024 | 0 | 4096 | 1:2",
                "FusedMatMul+Reshape+Transpose+ | 6 | 1024 | 1024 | 0 | 8192 | 1:1",
                "FusedMatMul+ | 2 | 2048 | 2048 | - | 16384 | 0:0",
                "11 of 18 stashed values inside the layers recomputed",
                "(28672 and 15360 bytes)"]:
        assert row in table, f"{row!r} not in\n{table}"
    assert stats["saved_bytes"] == 15360, table


def test_level1_recomputes_most_bytes_per_flop_first_encoder(monkeypatch):
    """The encoder (post-LayerNorm: its LayerNorm outputs are the residual boundaries, kept, so
    none is a candidate): the GELU outputs, attention contexts and probabilities of both layers
    (1/2 to 1/6.25 B per FLOP, 8192 B) go first as on GPT; the rest of the 45% of 28672 bytes comes
    from the projections (about 1/8 B per FLOP), and no more than needed."""
    stats = level1_plan(monkeypatch, "bert")
    table = stats["memory_plan"]
    for row in ["Gelu+ | 2 | 2048 | 2048 | - | 4096 | 1:2",
                "MatMul+Mul+Softmax+ | 2 | 1024 | 1024 | - | 6400 | 1:2",
                "MatMul+Transpose+Reshape+ | 2 | 1024 | 1024 | 0 | 4096 | 1:2",
                "LayerNormalization+ | 5 | 1024 | 1024 | - | 2048 | 0:0"]:
        assert row in table, f"{row!r} not in\n{table}"
    before, after = [int(b) for b in table.split("after (")[1].split(" bytes")[0].split(" and ")]
    assert before == 28672 and 0.45 * before <= before - after < 0.6 * before, table
    assert stats["saved_bytes"] == after, table


def test_train_module_bad_config_lists_clusters(monkeypatch):
    monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_CONFIG", "NoSuch+:1:-1")
    x, y = batches(1)[0]
    with pytest.raises(Exception, match=r"names no cluster.*Gelu\+"):
        train(TrainModule(build("gpt")), [(x, y)])


def export_model(name, directory):
    model = build(name).eval()
    ids = torch.randint(0, 40, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    path = os.path.join(directory, f"{name}.onnx")
    models.export(model, (ids,), path, ["ids"], ["logits"])
    return path


def inspect(path):
    return subprocess.run([str(ONNXTRAIN), "inspect", path], check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_plan_table_bytes_by_hand(tmp_path, name):
    path = export_model(name, str(tmp_path))
    params = [p.name for p in __import__("onnx").load(path).graph.initializer if len(p.dims) > 0]
    artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path / "l0"))
    table = inspect(str(tmp_path / "l0" / "training_model.onnx"))
    # GELU's output [batch, seq, ffn] fp32, read by the second Linear's weight gradient; its input
    # stays for GeluGrad, so one Gelu recomputes it: one per layer.
    gelu = BATCH * SEQ * cfg().ffn * 4
    assert f"Gelu+ | {cfg().layers} | {gelu} | {gelu} |" in table, table
    assert "applied memory plan" not in table

    artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.MSELoss,
                                 artifact_directory=str(tmp_path / "l1"), memory_opt_level=1)
    table1 = inspect(str(tmp_path / "l1" / "training_model.onnx"))
    assert "applied memory plan:\nMemory optimizer plan (level 1)" in table1, table1

    with pytest.raises(Exception, match=r"level must be 0, 1 or 2, got 5.*Gelu\+"):
        artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.MSELoss,
                                     artifact_directory=str(tmp_path / "bad"), memory_opt_level=5)


def test_artifacts_level1_trains_like_level0(tmp_path):
    path = export_model("gpt", str(tmp_path))
    params = [p.name for p in __import__("onnx").load(path).graph.initializer if len(p.dims) > 0]
    g = np.random.default_rng(0)
    data = [(g.integers(0, 40, (BATCH, SEQ)).astype(np.int64), g.standard_normal((BATCH, SEQ, 40)).astype(np.float32))
            for _ in range(20)]
    results, stashed = [], []
    for level in (0, 1):
        d = str(tmp_path / f"a{level}")
        artifacts.generate_artifacts(path, requires_grad=params, loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=d, memory_opt_level=level)
        losses, module = train_artifacts(d, data)
        results.append(losses)
        report = module.memory_report()  # "... (all stashed: X MiB) ..."
        stashed.append(float(report.split("all stashed: ")[1].split(" MiB")[0]))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5)
    assert 0 < stashed[1] < 0.6 * stashed[0], stashed


def test_ortmodule_aliases(monkeypatch):
    from onnxtrain.torch.debug import Settings
    for name in ("ONNXTRAIN_OPSET", "ONNXTRAIN_FALLBACK", "ONNXTRAIN_MEMORY_OPT_LEVEL", "ONNXTRAIN_MEMORY_OPT_CONFIG",
                 "ONNXTRAIN_MEMORY_LEVEL", "ONNXTRAIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORTMODULE_ONNX_OPSET_VERSION", "15")
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_UNSUPPORTED_DEVICE|FALLBACK_UNSUPPORTED_DATA")
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "1")
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_CONFIG", "Gelu+:1:-1")
    monkeypatch.setenv("ORTMODULE_LOG_LEVEL", "INFO")
    s = Settings.load(None)
    assert (s.opset, s.fallback, s.memory_opt_level, s.memory_opt_config) == (15, "warn", 1, "Gelu+:1:-1")
    assert s.debug.log_level.name == "INFO"
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    monkeypatch.setenv("ONNXTRAIN_OPSET", "16")  # the onnxtrain name wins
    s = Settings.load(None)
    assert (s.opset, s.fallback) == (16, "raise")
    monkeypatch.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "5")
    with pytest.raises(ValueError, match="ORTMODULE_MEMORY_OPT_LEVEL=5"):
        Settings.load(None)


def test_cli_memory_options(tmp_path):
    path = export_model("gpt", str(tmp_path))
    run = lambda *a: subprocess.run([str(ONNXTRAIN), *a], capture_output=True, text=True)  # noqa: E731
    out = run("artifacts", path, "--out", str(tmp_path / "cli"), "--all", "--loss", "mse",
              "--memory-opt-level", "0", "--memory-opt-config", "Gelu+:1:-1")
    assert out.returncode == 0, out.stderr
    table = inspect(str(tmp_path / "cli" / "training_model.onnx"))
    assert f"Gelu+ | {cfg().layers} | " in table and " | 1:2\n" in table, table
    bad = run("artifacts", path, "--out", str(tmp_path / "bad"), "--all", "--loss", "mse", "--memory-opt-level", "3")
    assert bad.returncode != 0 and "--memory-opt-level must be 0, 1 or 2" in bad.stderr
    bad = run("artifacts", path, "--out", str(tmp_path / "bad"), "--all", "--loss", "mse", "--memory-opt-config", "X:1")
    assert bad.returncode != 0 and "is not cluster:strategy:count" in bad.stderr and "Gelu+" in bad.stderr


def _shared_block(report):
    """(block bytes, saved bytes, gradient bytes) of a memory report's step block, or None."""
    m = re.search(r"gradients over the saved values: one block of (\d+) bytes for (\d+) of saved values and (\d+) of "
                  r"gradients", report)
    return tuple(int(g) for g in m.groups()) if m else None


def test_level1_lays_the_gradients_over_the_saved_values_the_backward_has_finished_with(monkeypatch):
    # At level 1 a step's saved values and gradients share one block, each gradient over saved
    # values read for the last time before the step that writes it. The results must be bit for bit
    # those of a step without blocks (a fresh TrainModule's first step), also with two graphs alive
    # at once (each backward writes into its own forward's block), and the block must be smaller
    # than the saved values and the gradients side by side.
    monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_LEVEL", "1")
    base = models.WithCrossEntropy(build("gpt")).train()  # the loss inside: the fused output layer
    report = steps_with_blocks(base, batches(7), lambda m, x, y: m(x, y))
    shared = _shared_block(report)
    assert shared, report
    block, saved, gradients = shared
    assert saved < block < saved + gradients, report


def test_level1_second_backward_through_one_forward_is_an_error(monkeypatch):
    # retain_graph=True: the first backward wrote gradients over saved values, so a second one
    # must refuse rather than compute from them; level 0 keeps the saved values whole.
    data = batches(3)
    for level in ("0", "1"):
        monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_LEVEL", level)
        wrapped = TrainModule(models.WithCrossEntropy(build("gpt")).train())
        for x, y in data[:2]:  # the step block is laid out after these
            wrapped(x, y).backward()
        loss = wrapped(*data[2])
        loss.backward(retain_graph=True)
        if level == "0":
            loss.backward()
        else:
            with pytest.raises(Exception, match="retain_graph=True"):
                loss.backward()


class _SavedOutput(nn.Module):
    """Returns its hidden activation too, which the backward also reads: a saved value the caller
    holds, over which no gradient may go."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        h = torch.relu(self.up(x))
        return self.down(h).square().mean(), h


def test_level1_leaves_saved_values_the_caller_holds_alone(monkeypatch):
    torch.manual_seed(0)
    base = _SavedOutput()
    xs = [torch.randn(8, 16) for _ in range(4)]
    runs = {}
    for level in ("0", "1"):
        monkeypatch.setenv("ONNXTRAIN_MEMORY_OPT_LEVEL", level)
        model = copy.deepcopy(base)
        wrapped = TrainModule(model)
        hidden, grads = [], []
        for x in xs:
            loss, h = wrapped(x)
            before = h.clone()
            loss.backward()
            assert torch.equal(h, before), f"level {level}: the returned activation changed in the backward"
            hidden.append(h)
            grads.append([p.grad.clone() for p in model.parameters()])
            model.zero_grad(set_to_none=True)
        runs[level] = hidden, grads
    for k in range(len(xs)):
        assert torch.equal(runs["0"][0][k], runs["1"][0][k])
        for g0, g1 in zip(runs["0"][1][k], runs["1"][1][k]):
            torch.testing.assert_close(g1, g0, rtol=1e-6, atol=0)
