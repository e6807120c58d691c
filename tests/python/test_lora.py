"""LoRA artifacts (src/training/lora.cc) and the quantizer (src/training/quantize.cc) end to end:
step-0 outputs equal the base's, 50 AdamW steps follow a PyTorch implementation of the same
adapters, exported adapters (PEFT key names) reproduce the outputs in PyTorch, the merged export
equals base + adapters, int4 + LoRA lowers held-out loss, and bad input fails with nothing written."""
import io
import json
import os
import struct
import subprocess

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import onnxtrain
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer
from onnxtrain.quantize import quantize

from .build_paths import ONNXTRAIN

TARGETS = ["q_proj", "v_proj"]


class Net(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.q_proj = nn.Linear(16, 32)
        self.v_proj = nn.Linear(32, 24, bias=False)
        self.out = nn.Linear(24, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.v_proj(torch.relu(self.q_proj(x)))))


def export(model):
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randn(8, 16),), f, input_names=["x"], output_names=["y"], opset_version=17,
                      do_constant_folding=False, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return f.getvalue()


class TorchLora(nn.Module):
    """The same adapters in PyTorch: y = base(x) + alpha/r (x A^T) B^T on the targeted Linears."""

    def __init__(self, base, adapters, rank, alpha):
        super().__init__()
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.scale = alpha / rank
        self.A = nn.ParameterDict({m: nn.Parameter(torch.tensor(a[0])) for m, a in adapters.items()})
        self.B = nn.ParameterDict({m: nn.Parameter(torch.tensor(a[1])) for m, a in adapters.items()})

    def lin(self, name, x):
        y = getattr(self.base, name)(x)
        return y + self.scale * (x @ self.A[name].T) @ self.B[name].T if name in self.A else y

    def forward(self, x):
        return self.lin("out", torch.tanh(self.lin("v_proj", torch.relu(self.lin("q_proj", x)))))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32).reshape(v["shape"])
            for k, v in header.items()}


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    teacher = Net(seed=7)
    with torch.no_grad():
        return x, teacher(x)


def make_artifacts(tmp_path, model_bytes, name="art", rank=4, alpha=8.0, targets=TARGETS):
    d = str(tmp_path / name)
    artifacts.generate_artifacts(model_bytes, loss=artifacts.LossType.MSELoss, optimizer=artifacts.AdamW(lr=1e-2),
                                 artifact_directory=d, additional_output_names=["y"],
                                 lora=artifacts.LoraConfig(rank=rank, alpha=alpha, target=targets))
    return d


def open_module(d, checkpoint=None):
    state = CheckpointState.load_checkpoint(checkpoint or os.path.join(d, "checkpoint"))
    module = Module(os.path.join(d, "training_model.onnx"), state, os.path.join(d, "eval_model.onnx"))
    return state, module, Optimizer(os.path.join(d, "optimizer_model.onnx"), module)


def test_lora_matches_pytorch_adapters(tmp_path):
    base = Net()
    model_bytes = export(base)
    d = make_artifacts(tmp_path, model_bytes)
    state, module, opt = open_module(d)
    params = dict(state.parameters.items())
    assert sorted(params) == sorted(f"{m}.lora_{ab}.weight" for m in TARGETS for ab in "AB")  # adapters only
    assert state.properties["onnxtrain.lora.base_hash"]
    for m, (k, n) in {"q_proj": (16, 32), "v_proj": (32, 24)}.items():
        a, b = params[f"{m}.lora_A.weight"].data, params[f"{m}.lora_B.weight"].data
        assert a.shape == (4, k) and b.shape == (n, 4) and not b.any()
        assert np.abs(a).max() <= 1 / np.sqrt(k) and a.std() > 0.2 / np.sqrt(k)   # PEFT's kaiming_uniform(a=sqrt(5))
    x, y = data(8, 1)

    # Step 0: B = 0, so the adapted model is the base.
    module.eval()
    _, y0 = module(x.numpy(), y.numpy())
    base_out = onnxtrain.InferenceSession(model_bytes).run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(y0, base_out)

    adapters = {m: (params[f"{m}.lora_A.weight"].data.copy(), params[f"{m}.lora_B.weight"].data.copy()) for m in TARGETS}
    ref = TorchLora(Net(), adapters, rank=4, alpha=8.0)
    topt = torch.optim.AdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    state, module, opt = open_module(d)
    module.train()
    losses, theirs = [], []
    for step in range(50):
        xb, yb = data(8, 100 + step)
        out = module(xb.numpy(), yb.numpy())
        losses.append(float(out[0] if isinstance(out, list) else out))
        opt.step()
        module.lazy_reset_grad()
        topt.zero_grad()
        loss = nn.functional.mse_loss(ref(xb), yb)
        loss.backward()
        topt.step()
        theirs.append(float(loss))
    np.testing.assert_allclose(losses, theirs, rtol=1e-4)
    for m in TARGETS:
        np.testing.assert_allclose(state.parameters[f"{m}.lora_B.weight"].data, ref.B[m].detach().numpy(), rtol=1e-4,
                                   atol=1e-6)
    assert losses[-1] < losses[0]

    # Exported adapters, loaded into the PyTorch model, give the same outputs.
    file = module.export_adapters(str(tmp_path / "peft"))
    assert os.path.basename(file) == "adapter_model.safetensors"
    cfg = json.load(open(tmp_path / "peft" / "adapter_config.json"))
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and sorted(cfg["target_modules"]) == TARGETS
    loaded = read_safetensors(file)
    assert sorted(loaded) == sorted(f"base_model.model.{m}.lora_{ab}.weight" for m in TARGETS for ab in "AB")
    fresh = TorchLora(Net(), {m: (loaded[f"base_model.model.{m}.lora_A.weight"],
                                  loaded[f"base_model.model.{m}.lora_B.weight"]) for m in TARGETS}, 4, 8.0)
    xt, yt = data(16, 5)
    module.eval()
    _, ours = module(xt.numpy(), yt.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(ours, fresh(xt).numpy(), rtol=1e-5, atol=1e-6)

    # Merged export == base + adapters; so is the unmerged one.
    for merge in (False, True):
        path = str(tmp_path / f"export_{merge}.onnx")
        module.export_model_for_inferencing(path, ["y"], merge_lora=merge)
        m = onnx.load(path)
        lora_nodes = [n.name for n in m.graph.node if "/lora_" in n.name]
        assert bool(lora_nodes) != merge
        got = onnxtrain.InferenceSession(path).run(None, {"x": xt.numpy()})[0]
        np.testing.assert_allclose(got, ours, rtol=1e-5, atol=1e-6)


def test_lora_bad_input_is_refused_with_nothing_written(tmp_path):
    model_bytes = export(Net())
    with pytest.raises(onnxtrain.Error, match="matches no layer; candidates: .*q_proj.*v_proj.*out"):
        make_artifacts(tmp_path, model_bytes, name="bad1", targets=["k_proj"])
    with pytest.raises(onnxtrain.Error, match="rank 20 exceeds min\\(K=16, N=32\\)"):
        make_artifacts(tmp_path, model_bytes, name="bad2", rank=20)
    assert not (tmp_path / "bad1").exists() and not (tmp_path / "bad2").exists()
    # A MatMulNBits blob inconsistent with K, N, bits and block size.
    q = onnx.load_from_string(quantize(export(Net()), bits=4, block_size=16)["model"])
    blob = next(i for i in q.graph.initializer if i.name.endswith("_Q4"))
    blob.dims[1] -= 1  # one k-block short per row
    blob.raw_data = blob.raw_data[:blob.dims[0] * blob.dims[1] * blob.dims[2]]
    with pytest.raises(onnxtrain.Error, match="expected B of uint8 \\[N, k_blocks, blob_size\\]"):
        make_artifacts(tmp_path, q.SerializeToString(), name="bad3", targets=["*"])
    assert not (tmp_path / "bad3").exists()
    # Adapters trained on one base, loaded with another base's artifacts: hash mismatch.
    d1 = make_artifacts(tmp_path, model_bytes, name="a1")
    d2 = make_artifacts(tmp_path, export(Net(seed=3)), name="a2")
    with pytest.raises(onnxtrain.Error, match="hash mismatch"):
        open_module(d2, checkpoint=os.path.join(d1, "checkpoint"))


def test_lora_dropout_trains_and_is_off_in_eval(tmp_path):
    model_bytes = export(Net())
    d = str(tmp_path / "drop")
    artifacts.generate_artifacts(model_bytes, loss=artifacts.LossType.MSELoss, artifact_directory=d,
                                 additional_output_names=["y"],
                                 lora=artifacts.LoraConfig(rank=4, alpha=8, target=TARGETS, dropout=0.5))
    state, module, opt = open_module(d)
    x, y = data(8, 1)
    module.eval()
    base_out = onnxtrain.InferenceSession(model_bytes).run(None, {"x": x.numpy()})[0]
    np.testing.assert_array_equal(module(x.numpy(), y.numpy())[1], base_out)  # B = 0; eval has no dropout
    module.train()
    for _ in range(3):
        module(x.numpy(), y.numpy())
        opt.step()
        module.lazy_reset_grad()
    module.eval()
    a = module(x.numpy(), y.numpy())[1]
    np.testing.assert_array_equal(a, module(x.numpy(), y.numpy())[1])  # no dropout in eval


def test_quantize_and_int4_lora_lowers_held_out_loss(tmp_path):
    base = Net()
    src = tmp_path / "net.onnx"
    src.write_bytes(export(base))
    out = tmp_path / "net_int4.onnx"
    proc = subprocess.run([str(ONNXTRAIN), "quantize", str(src), "--bits", "4", "--block-size", "16", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "3 layers quantized" in proc.stdout and "rel.error" in proc.stdout
    ops = [n.op_type for n in onnx.load(str(out)).graph.node]
    assert ops.count("MatMulNBits") == 3 and "Gemm" not in ops
    report = quantize(str(src), bits=4, block_size=16, symmetric=True)
    assert len(report["layers"]) == 3 and all(0 < l["relative_error"] < 0.15 for l in report["layers"])
    x, _ = data(32, 9)
    ref = base(x).detach().numpy()
    q = onnxtrain.InferenceSession(str(out)).run(None, {"x": x.numpy()})[0]
    assert 0 < np.abs(q - ref).max() < 0.1 * np.abs(ref).max()
    bad = subprocess.run([str(ONNXTRAIN), "quantize", str(src), "--block-size", "24", "--out", str(tmp_path / "b.onnx")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "power of 2" in bad.stderr and not (tmp_path / "b.onnx").exists()

    # int4 base + LoRA on every layer: held-out loss goes down.
    d = str(tmp_path / "int4art")
    artifacts.generate_artifacts(str(out), loss=artifacts.LossType.MSELoss, artifact_directory=d,
                                 optimizer=artifacts.AdamW(lr=1e-2), additional_output_names=["y"],
                                 lora=artifacts.LoraConfig(rank=4, alpha=8, target=["*"]))
    state, module, opt = open_module(d)
    xh, yh = data(64, 999)

    def held_out():
        module.eval()
        loss = float(module(xh.numpy(), yh.numpy())[0])
        module.train()
        return loss

    before = held_out()
    for step in range(60):
        xb, yb = data(16, 200 + step)
        module(xb.numpy(), yb.numpy())
        opt.step()
        module.lazy_reset_grad()
    assert held_out() < 0.7 * before


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x)


class Blocks(nn.Module):
    """Layers whose names share prefixes: fc, fc2, fc_out and block.fc."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.fc2, self.fc_out = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.block = Block()

    def forward(self, x):
        return self.block(self.fc_out(self.fc2(self.fc(x))))


def test_lora_targets_follow_peft_target_modules(tmp_path):
    """PEFT's rule: "fc" selects the modules named fc or ending in .fc, never fc2 or fc_out (a
    substring match would); a glob covers the module path; a pattern matching no module is named."""
    model_bytes = export(Blocks())

    def adapted(targets, name):
        d = make_artifacts(tmp_path, model_bytes, name=name, targets=targets)
        return sorted(a["module"] for a in onnxtrain._C.lora_info(os.path.join(d, "training_model.onnx"))["adapters"])

    assert adapted(["fc"], "fc") == ["block.fc", "fc"]
    assert adapted(["fc2", "block.fc"], "exact") == ["block.fc", "fc2"]
    assert adapted(["fc*"], "glob") == ["fc", "fc2", "fc_out"]
    with pytest.raises(onnxtrain.Error, match="target 'c' matches no layer; candidates: .*fc2"):
        make_artifacts(tmp_path, model_bytes, name="bad", targets=["c"])
    with pytest.raises(TypeError, match="list of module names"):
        make_artifacts(tmp_path, model_bytes, name="bad2", targets="fc")
