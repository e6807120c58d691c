"""Pre-compiled artifacts from Python and the command line: `onnxtrain compile` and
`api.compile_artifacts` write the .otc files, Module/Optimizer load them and train bit-identically to
the ONNX files (a CNN with Dropout and BatchNorm), `onnxtrain train` uses them, and a stale or damaged
file is ignored with one note."""
import io
import shutil
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module, Optimizer, compile_artifacts

from .build_paths import ONNXTRAIN

BATCH = 8


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("compiled")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dropout(0.25), nn.Linear(64, 10))
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 1, 8, 8),), f, input_names=["x"], output_names=["logits"],
                      opset_version=17, do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    names = [n for n, p in model.named_parameters()]
    artifacts.generate_artifacts(f.getvalue(), requires_grad=names, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=d / "art")
    return d / "art"


def copy_of(onnx_dir, tmp_path, name="copy"):
    out = tmp_path / name
    shutil.copytree(onnx_dir, out)
    return out


def train(directory, steps=4):
    state = CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    state.properties["onnxtrain.random_seed"] = 5
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((BATCH, 1, 8, 8)).astype(np.float32)
        y = rng.integers(0, 10, BATCH).astype(np.int64)
        losses.append(module(x, y))
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    logits = module(x, y)
    params = {n: p.data for n, p in state.parameters.items()}
    return losses, logits, params


def assert_same_bits(a, b):
    (la, ea, pa), (lb, eb, pb) = a, b
    for u, v in zip(la + [ea] + [pa[k] for k in sorted(pa)], lb + [eb] + [pb[k] for k in sorted(pb)]):
        u, v = np.asarray(u), np.asarray(v)
        assert u.tobytes() == v.tobytes()


def test_compile_from_python_trains_bit_identically(onnx_dir, tmp_path, capfd):
    compiled = copy_of(onnx_dir, tmp_path)
    written = compile_artifacts(compiled, {"x": [BATCH, 1, 8, 8], "target": [BATCH]})
    assert [p.split("/")[-1] for p in written] == ["training_model.otc", "eval_model.otc", "optimizer_model.otc"]
    capfd.readouterr()
    got = train(compiled)
    assert capfd.readouterr().err == ""
    assert_same_bits(train(onnx_dir), got)


def test_cli_compile_and_a_stale_file(onnx_dir, tmp_path, capfd):
    compiled = copy_of(onnx_dir, tmp_path)
    r = subprocess.run([str(ONNXTRAIN), "compile", str(compiled), "--shape", f"x={BATCH},1,8,8",
                        "--shape", f"target={BATCH}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "training_model.otc" in r.stdout
    # Another model's compiled file in place of the eval model's: stale, ignored with a note.
    shutil.copy(compiled / "training_model.otc", compiled / "eval_model.otc")
    capfd.readouterr()
    got = train(compiled)
    err = capfd.readouterr().err
    assert err.count("note: ignoring pre-compiled model") == 1 and "is stale" in err
    assert_same_bits(train(onnx_dir), got)


def test_cli_compile_usage_errors(onnx_dir, tmp_path):
    compiled = copy_of(onnx_dir, tmp_path)
    r = subprocess.run([str(ONNXTRAIN), "compile", str(compiled), "--shape", "x=8,one,8,8"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "'one' is not a dim" in r.stderr
    r = subprocess.run([str(ONNXTRAIN), "compile", str(compiled)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "give its dims (--shape x=d0,d1,...)" in r.stderr


def test_damaged_file_falls_back(onnx_dir, tmp_path, capfd):
    compiled = copy_of(onnx_dir, tmp_path)
    compile_artifacts(compiled, {"x": [BATCH, 1, 8, 8], "target": [BATCH]})
    otc = compiled / "training_model.otc"
    data = bytearray(otc.read_bytes())
    data[len(data) // 2] ^= 0xFF
    otc.write_bytes(bytes(data))
    capfd.readouterr()
    got = train(compiled)
    assert "payload checksum mismatch" in capfd.readouterr().err
    assert_same_bits(train(onnx_dir), got)


def test_cli_train_uses_the_compiled_files(onnx_dir, tmp_path):
    compiled = copy_of(onnx_dir, tmp_path)
    compile_artifacts(compiled, {"x": [BATCH, 1, 8, 8], "target": [BATCH]})
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "data.npz", x=rng.standard_normal((4 * BATCH, 1, 8, 8)).astype(np.float32),
             target=rng.integers(0, 10, 4 * BATCH).astype(np.int64))
    params = []
    for directory in (onnx_dir, compiled):
        out = tmp_path / f"{directory.parent.name}_{directory.name}_trained"
        r = subprocess.run([str(ONNXTRAIN), "train", str(directory), "--data", str(tmp_path / "data.npz"),
                            "--epochs", "1", "--batch-size", str(BATCH), "--checkpoint-out", str(out)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert "note: ignoring" not in r.stderr
        state = CheckpointState.load_checkpoint(str(out))
        params.append({n: p.data.tobytes() for n, p in state.parameters.items()})
    assert params[0] == params[1]
