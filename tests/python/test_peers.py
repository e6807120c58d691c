"""The peers (scripts/setup_peers.sh, bench/peers.py): each venv holds the engine it pins and that
engine works there — ONNX Runtime 1.31 runs a model, ONNX Runtime training 1.19.2 generates
artifacts and trains them with its on-device API, PyTorch is 2.x. A missing peer is an error that
names the venv, the package and the command that installs it."""
import json
import os
import re
import subprocess
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import peers

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _mlp(path, seed=0):
    """A 2-layer MLP (8 -> 16 -> 4) with weights as initializers, opset 14, IR 7."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in [("w1", (8, 16)), ("b1", (16,)), ("w2", (16, 4)), ("b2", (4,))]]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=7)
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def test_ort_peer_runs_a_model_as_onnxruntime_1_31(tmp_path, ort_peer):
    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    report = peers.ort_time(path, {"x": x}, str(tmp_path), warmup=1, runs=2, save_outputs=True)
    assert report["ort_version"].startswith("1.31."), report["ort_version"]
    (logits,) = [np.load(o["file"]) for o in report["outputs"]]
    w = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    expected = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


ORT_TRAINING_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import onnx
    import onnxruntime
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer
    model_path, out = sys.argv[1], sys.argv[2]
    import os; os.makedirs(out, exist_ok=True)
    artifacts.generate_artifacts(onnx.load(model_path), requires_grad=["w1", "b1", "w2", "b2"],
                                 loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out)
    state = CheckpointState.load_checkpoint(out + "/checkpoint")
    module = Module(out + "/training_model.onnx", state, out + "/eval_model.onnx")
    optimizer = Optimizer(out + "/optimizer_model.onnx", module)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = rng.integers(0, 4, 16).astype(np.int64)
    module.train()
    losses = []
    for _ in range(10):
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    print(json.dumps({"version": onnxruntime.__version__, "losses": losses}))
""")


def test_ort_training_peer_generates_artifacts_and_trains_them(tmp_path, ort_training_peer):
    path = str(tmp_path / "mlp.onnx")
    _mlp(path)
    proc = peers.run("ort-training", ["-c", ORT_TRAINING_SCRIPT, path, str(tmp_path / "artifacts")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["version"] == "1.19.2"
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint"):
        assert (tmp_path / "artifacts" / name).is_file(), name
    losses = report["losses"]
    # AdamW at lr 1e-3 on one 16-example batch: every step lowers the loss, about 6% in ten steps.
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.97 * losses[0], losses


def test_torch2_peer_is_pytorch_2(torch2_peer):
    code = ("import torch; x = torch.arange(3.0, requires_grad=True); (x * x).sum().backward(); "
            "print(torch.__version__, x.grad.tolist())")
    proc = peers.run("torch2", ["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, grad = proc.stdout.split(maxsplit=1)
    assert version.startswith("2."), version
    assert json.loads(grad) == [0.0, 2.0, 4.0]


def test_a_missing_peer_names_its_venv_package_and_installer(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXTRAIN_PEERS_DIR", str(tmp_path))
    with pytest.raises(peers.PeerMissing) as info:
        peers.python("ort-training")
    message = str(info.value)
    assert str(tmp_path / "ort-training") in message
    assert "onnxruntime-training-cpu 1.19.2" in message
    assert "scripts/setup_peers.sh ort-training" in message
    # A venv whose install was cut off (no stamp) is not a peer either.
    (tmp_path / "ort-training" / "bin").mkdir(parents=True)
    os.symlink("/usr/bin/python3", tmp_path / "ort-training" / "bin" / "python")
    with pytest.raises(peers.PeerMissing):
        peers.python("ort-training")


def test_setup_peers_refuses_an_unknown_peer(tmp_path):
    env = {**os.environ, "ONNXTRAIN_PEERS_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", peers.SETUP, "onnxruntime-node"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "unknown peer 'onnxruntime-node'" in proc.stderr
    assert not os.listdir(tmp_path)  # nothing was created


def test_setup_peers_lists_each_peer_and_its_pin(tmp_path):
    env = {**os.environ, "ONNXTRAIN_PEERS_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", peers.SETUP, "--list"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()}
    assert set(rows) == set(peers.PACKAGES)
    assert all(r[0] == "missing" for r in rows.values())
    assert rows["ort"][1] == "onnxruntime==1.31.1"


NODE_USE = re.compile(r"\bnpm\s+(install|pack|ping|view|ci|run)\b|onnxruntime-node|node_modules|\bnodejs\b"
                      r"|\[\s*[\"']node[\"']\s*,|^\s*node\s+\S+\.m?js\b|^\t[^#]*\bnode\s+(--|\S+\.m?js\b)")
# The one use allowed: Node 20 (installed on every machine) running the WebAssembly module's
# tests and benchmark (web/, bench/bench_web.mjs), and emscripten finding Debian's node-acorn.
NODE_ALLOWED = re.compile(r"^\t[^#]*\bnode --test web/tests/\S*\.test\.mjs\b[^;&|]*$|^\t[^#]*\bnode bench/bench_web\.mjs\b"
                          r"|^WEB_ENV\s+:= NODE_PATH=/usr/share/nodejs$")


def test_no_project_file_runs_npm_or_node():
    """The machines reach PyPI and Debian's packages, not npm: nothing may install or run node."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    uses = []
    for rel in tracked:
        if rel == "tests/python/test_peers.py" or not rel.endswith((".py", ".sh", ".js", ".mjs", ".json", ".cmake", ".txt")) \
                and os.path.basename(rel) not in ("Makefile", "run"):
            continue
        with open(os.path.join(REPO, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if NODE_USE.search(line) and not (os.path.basename(rel) == "Makefile" and NODE_ALLOWED.search(line)):
                    uses.append(f"{rel}:{number}: {line.strip()}")
    assert not uses, "npm/node uses left:\n" + "\n".join(uses)
