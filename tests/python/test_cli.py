"""The `onnxtrain` command line and the C++ training example, driven as a user would: artifacts
from a PyTorch MLP on sklearn's digits, train -> eval -> export -> InferenceSession, exact resume,
inspect, and argument errors (status 2) versus failures while running (status 1)."""
import io
import json
import subprocess

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

import onnxtrain
from onnxtrain.api import CheckpointState

from .build_paths import ONNXTRAIN, TRAIN_DIGITS


def cli(*args, check=True):
    r = subprocess.run([str(ONNXTRAIN), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"onnxtrain {' '.join(map(str, args))}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """An MLP exported from PyTorch, its artifacts, and digits data split into .npz files."""
    d = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randn(4, 64),), f, input_names=["x"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    (d / "mlp.onnx").write_bytes(f.getvalue())
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    train, test = slice(0, 1400), slice(1400, None)
    np.savez(d / "digits.npz", x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])
    # Another naming, compressed, with dtypes the graph does not take (converted, with a note).
    np.savez_compressed(d / "train.npz", features=x[train].astype(np.float64), labels=y[train].astype(np.int32))
    np.savez(d / "val.npz", features=x[test], labels=y[test])
    r = cli("artifacts", d / "mlp.onnx", "--out", d / "art", "--all", "--loss", "cross_entropy",
            "--optimizer", "adamw", "--lr", "1e-2")
    assert "trainable: 4 parameters (2410 elements)" in r.stdout
    return d


DATA = ("--inputs", "features", "--labels", "labels")


def test_train_eval_export_then_inference(work, tmp_path):
    ckpt = tmp_path / "trained"
    r = cli("train", work / "art", "--data", work / "train.npz", *DATA, "--epochs", 4, "--batch-size", 64,
            "--shuffle", "--lr-schedule", "linear", "--warmup", 5, "--eval-data", work / "val.npz",
            "--checkpoint-out", ckpt, "--progress", "lines")
    assert "note: array 'features' converted from float64 to float32 for input 'x'" in r.stderr
    assert "note: array 'labels' converted from int32 to int64 for input 'target'" in r.stderr
    epochs = [line for line in r.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 4 and "eval accuracy" in epochs[-1]
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in epochs]
    assert losses[-1] < losses[0] / 3
    assert "it/s" in r.stderr and "lr " in r.stderr  # plain progress lines: stderr is not a terminal

    r = cli("eval", work / "art", "--data", work / "val.npz", *DATA, "--checkpoint", ckpt,
            "--predictions", tmp_path / "pred.npz")
    fields = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    accuracy = float(fields["accuracy"].split()[0])
    assert accuracy > 0.85 and fields["examples"] == "397"
    untrained = cli("eval", work / "art", "--data", work / "val.npz", *DATA).stdout
    assert float(dict(line.split(" ", 1) for line in untrained.splitlines())["loss"]) > float(fields["loss"]) * 3

    cli("export", work / "art", "--checkpoint", ckpt, "--out", tmp_path / "model.onnx")
    sess = onnxtrain.InferenceSession(str(tmp_path / "model.onnx"))
    assert [i.name for i in sess.get_inputs()] == ["x"] and [o.name for o in sess.get_outputs()] == ["logits"]
    val = np.load(work / "val.npz")
    logits = sess.run(None, {"x": val["features"]})[0]
    np.testing.assert_array_equal(logits, np.load(tmp_path / "pred.npz")["logits"])
    assert (logits.argmax(1) == val["labels"]).mean() == pytest.approx(accuracy, abs=1e-4)


def test_resume_is_bit_identical(work, tmp_path):
    def run(*extra, batch_size=50, check=True):
        return cli("train", work / "art", "--data", work / "train.npz", *DATA, "--epochs", 3,
                   "--batch-size", batch_size, "--shuffle", "--seed", 11, "--lr-schedule", "cosine", "--warmup", 4,
                   "--progress", "none", *extra, check=check)

    run("--checkpoint-out", tmp_path / "whole")
    # Interrupted mid-epoch (update 40 of 84, 28 per epoch), then resumed to the end.
    r = run("--checkpoint-out", tmp_path / "part", "--max-steps", 40, "--checkpoint-every", 15)
    assert "stopped after 40 updates" in r.stdout
    state = CheckpointState.load_checkpoint(tmp_path / "part")
    assert (state.properties["train.step"], state.properties["train.epoch"],
            state.properties["train.epoch_step"]) == (40, 1, 12)
    r = run("--resume", tmp_path / "part", "--checkpoint-out", tmp_path / "resumed")
    epochs = [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("epoch")]
    assert epochs == ["epoch 2/3", "epoch 3/3"]
    # Parameters, optimizer moments, step counts and progress: the same bytes.
    assert (tmp_path / "whole").read_bytes() == (tmp_path / "resumed").read_bytes()
    # The run's data options must match, or the batches would differ.
    r = run("--resume", tmp_path / "part", batch_size=25, check=False)
    assert r.returncode == 1 and "train.batch_size = 50, this one 25" in r.stderr, r.stderr
    # A new run from trained parameters drops the old progress and optimizer state.
    run("--checkpoint", tmp_path / "part", "--checkpoint-out", tmp_path / "again", "--max-steps", 1)
    again = CheckpointState.load_checkpoint(tmp_path / "again")
    assert again.properties["train.step"] == 1


def test_training_log_is_the_uninterrupted_runs_after_resume(work, tmp_path):
    def run(log, *extra):
        return cli("train", work / "art", "--data", work / "train.npz", *DATA, "--epochs", 2, "--batch-size", 100,
                   "--eval-data", work / "val.npz", "--progress", "none", "--log", log, *extra)

    run(tmp_path / "whole.log", "--checkpoint-out", tmp_path / "whole")
    lines = [json.loads(line) for line in (tmp_path / "whole.log").read_text().splitlines()]
    updates = [r for r in lines if "epoch_end" not in r]
    assert [r["step"] for r in updates] == list(range(1, 29)) and {r["epoch"] for r in updates} == {0, 1}
    ends = [r for r in lines if "epoch_end" in r]
    assert [(r["step"], r["epoch_end"]) for r in ends] == [(14, 0), (28, 1)] and ends[-1]["eval_accuracy"] > 0.5
    assert ends[0]["loss"] == pytest.approx(np.mean([r["loss"] for r in updates[:14]]), rel=1e-12)
    # Stopped at update 10, with lines of updates 11-12 that a killed run would have left after its
    # checkpoint: the resumed run cuts them and writes them again.
    run(tmp_path / "part.log", "--checkpoint-out", tmp_path / "part", "--max-steps", 10)
    stale = [json.dumps({"step": s, "epoch": 0, "loss": 9.0, "lr": 0.0}) for s in (11, 12)]
    with open(tmp_path / "part.log", "a") as f:
        f.write("\n".join(stale) + "\n{\"step\": 13, \"ep")  # and a torn last line
    run(tmp_path / "part.log", "--resume", tmp_path / "part", "--checkpoint-out", tmp_path / "part")
    assert (tmp_path / "part.log").read_text() == (tmp_path / "whole.log").read_text()
    # A new run starts a new log.
    run(tmp_path / "part.log", "--checkpoint-out", tmp_path / "again", "--max-steps", 3)
    assert len((tmp_path / "part.log").read_text().splitlines()) == 3


def test_resume_from_an_ort_format_checkpoint(work, tmp_path):
    """An interrupted run's checkpoint converted to ONNX Runtime's format (convert-checkpoint) and
    resumed from there ends in the same bytes as the run that was never interrupted."""
    def run(*extra):
        return cli("train", work / "art", "--data", work / "train.npz", *DATA, "--epochs", 2, "--batch-size", 50,
                   "--shuffle", "--seed", 3, "--progress", "none", *extra)

    run("--checkpoint-out", tmp_path / "whole")
    run("--checkpoint-out", tmp_path / "part", "--max-steps", 30)
    r = cli("convert-checkpoint", tmp_path / "part", tmp_path / "part.ort")
    assert "(onnxtrain) -> " in r.stdout and "(ort)" in r.stdout and "optimizer state" in r.stdout
    assert CheckpointState.checkpoint_format(tmp_path / "part.ort") == "ort"
    run("--resume", tmp_path / "part.ort", "--checkpoint-out", tmp_path / "resumed")
    assert (tmp_path / "whole").read_bytes() == (tmp_path / "resumed").read_bytes()


def test_checkpoints_every_n_updates_are_resumable(work, tmp_path):
    out = tmp_path / "ckpt"
    r = cli("train", work / "art", "--data", work / "train.npz", *DATA, "--batch-size", 100, "--epochs", 1,
            "--checkpoint-every", 5, "--checkpoint-out", out, "--progress", "lines")
    saved = [line for line in r.stderr.splitlines() if line.startswith("saved checkpoint")]
    assert [line.rsplit(" ", 1)[1] for line in saved] == ["5", "10", "14"]
    r = cli("train", work / "art", "--data", work / "train.npz", *DATA, "--batch-size", 100, "--epochs", 1,
            "--resume", out, "--checkpoint-out", tmp_path / "again")
    assert "nothing to do: the checkpoint already finished 1 epochs" in r.stdout


def test_regression_reports_loss_without_accuracy(work, tmp_path):
    cli("artifacts", work / "mlp.onnx", "--out", tmp_path / "art", "--requires-grad", "2.weight,2.bias",
        "--loss", "mse", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9")
    digits = np.load(work / "digits.npz")
    onehot = np.eye(10, dtype=np.float32)[digits["y_train"]]
    np.savez(tmp_path / "reg.npz", x=digits["x_train"], target=onehot)
    cli("train", tmp_path / "art", "--data", tmp_path / "reg.npz", "--epochs", 1, "--progress", "none")
    r = cli("eval", tmp_path / "art", "--data", tmp_path / "reg.npz", "--checkpoint", tmp_path / "art" /
            "trained_checkpoint")
    assert r.stdout.startswith("examples 1400\nloss ") and "accuracy" not in r.stdout
    state = CheckpointState.load_checkpoint(tmp_path / "art" / "trained_checkpoint")
    assert not state.parameters["0.weight"].requires_grad and state.parameters["2.weight"].requires_grad


def test_inspect(work):
    r = cli("inspect", work / "art" / "checkpoint")
    assert "parameters: 4 (2,410 elements), 4 trainable" in r.stdout
    assert "0.weight float32 [32, 64] yes" in " ".join(r.stdout.split())
    assert "optimizer state: none" in r.stdout
    r = cli("inspect", work / "mlp.onnx")
    text = " ".join(r.stdout.split())
    assert "inputs: 1 x float32 [batch, 64]" in text and "Gemm 2" in text and "opsets: ai.onnx 17" in text
    assert "Gemm" in cli("inspect", work / "mlp.onnx", "--graph").stdout.split("graph:")[1]
    r = cli("inspect", work / "train.npz")
    assert "features float64 [1400, 64] deflated" in " ".join(r.stdout.split())


@pytest.mark.parametrize("args, message", [
    ([], "usage: onnxtrain <command>"),
    (["bogus"], "unknown command 'bogus'"),
    (["train"], "missing DIR"),
    (["train", "d"], "missing required option --data"),
    (["train", "d", "--data", "x.npz", "--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["train", "d", "--data", "x.npz", "--epochs", "two"], "--epochs expects an integer, got 'two'"),
    (["train", "d", "--data", "x.npz", "--grad-accum", "0"], "--grad-accum must be >= 1, got 0"),
    (["train", "d", "--data", "x.npz", "--grad-accum", "1.5"], "--grad-accum expects an integer, got '1.5'"),
    (["train", "d", "--data", "x.npz", "--lr-schedule", "exp"], "--lr-schedule must be one of constant, linear"),
    (["train", "d", "--data", "x.npz", "--gamma", "0.5"], "--step-size and --gamma apply to --lr-schedule step"),
    (["train", "d", "--data", "x.npz", "--resume", "a", "--checkpoint", "b"], "--checkpoint or --resume, not both"),
    (["train", "d", "--data", "x.npz", "--device", "tpu"], "--device must be one of cpu, cuda"),
    (["train", "d", "--data"], "option '--data' needs a value"),
    (["train", "d", "--data", "x", "--data", "y"], "option '--data' is given twice"),
    (["train", "d", "--frobnicate"], "unknown option '--frobnicate'"),
    (["train", "d", "e"], "unexpected argument 'e'"),
    (["eval", "d", "--data", "x.npz", "--inputs", "a,,b"], "comma-separated list of names"),
    (["export", "d", "--checkpoint", "c"], "missing required option --out"),
    (["artifacts", "m.onnx", "--out", "o", "--loss", "mse"], "give either --requires-grad NAMES, --all or --lora-target PATTERNS"),
    (["artifacts", "m.onnx", "--out", "o", "--all", "--loss", "hinge"], "--loss must be one of mse, cross_entropy"),
    (["artifacts", "m.onnx", "--out", "o", "--all", "--loss", "mse", "--momentum", "0.9"],
     "--momentum applies to sgd only, not adamw"),
    (["artifacts", "m.onnx", "--out", "o", "--all", "--loss", "mse", "--optimizer", "sgd", "--nesterov"],
     "nesterov"),
    (["artifacts", "m.onnx", "--out", "o", "--all", "--loss", "mse", "--betas", "0.9"], "--betas expects two"),
    (["inspect"], "missing FILE"),
])
def test_wrong_arguments_exit_2(args, message):
    r = cli(*args, check=False)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr


def test_failures_while_running_exit_1(work, tmp_path):
    r = cli("train", work / "art", "--data", tmp_path / "missing.npz", *DATA, check=False)
    assert r.returncode == 1 and f"npz '{tmp_path / 'missing.npz'}': cannot open" in r.stderr, r.stderr
    r = cli("train", work / "art", "--data", work / "train.npz", check=False)
    assert r.returncode == 1 and "has arrays (features, labels) but the training graph takes (x, target)" in r.stderr
    r = cli("train", work / "art", "--data", work / "train.npz", "--inputs", "features", check=False)
    assert r.returncode == 1 and "takes 2 inputs (x, target), but 1 arrays were named" in r.stderr, r.stderr
    r = cli("artifacts", work / "mlp.onnx", "--out", tmp_path / "a", "--requires-grad", "nope", "--loss", "mse",
            check=False)
    assert r.returncode == 1 and "'nope', which is not an initializer" in r.stderr, r.stderr
    r = cli("train", work / "art", "--data", work / "train.npz", *DATA, "--lr", "1e30", "--progress", "none",
            "--checkpoint-out", tmp_path / "diverged", check=False)
    assert r.returncode == 1 and "training diverged" in r.stderr, r.stderr
    if not onnxtrain.gpu_features()["available"]:  # a GPU machine trains there (tests/cuda)
        r = cli("train", work / "art", "--data", work / "train.npz", *DATA, "--device", "cuda", "--progress", "none",
                "--checkpoint-out", tmp_path / "on_gpu", check=False)
        assert r.returncode == 1 and "CUDA" in r.stderr and not (tmp_path / "on_gpu").exists(), r.stderr


def test_help_for_every_command():
    for command in ["artifacts", "train", "eval", "export", "inspect", "ops", "convert-checkpoint"]:
        r = cli(command, "--help")
        assert r.stdout.startswith(f"usage: onnxtrain {command}"), r.stdout
    assert "--checkpoint-every N" in cli("train", "--help").stdout
    assert "train" in cli("--help").stdout


@pytest.mark.skipif(not TRAIN_DIGITS.exists(), reason="examples not built (ONNXTRAIN_BUILD_EXAMPLES=OFF)")
def test_cpp_example_trains_digits(work, tmp_path):
    args = [str(TRAIN_DIGITS), work / "art", work / "digits.npz", tmp_path / "out"]
    r = subprocess.run([*map(str, args), "0.9", "--epochs", "8"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert sum(line.startswith("epoch") for line in lines) == 8
    accuracy = float(lines[-1].split()[2])
    assert accuracy >= 0.9
    sess = onnxtrain.InferenceSession(str(tmp_path / "out" / "model.onnx"))
    digits = np.load(work / "digits.npz")
    assert (sess.run(None, {"x": digits["x_test"]})[0].argmax(1) == digits["y_test"]).mean() == pytest.approx(accuracy, abs=1e-4)
    assert CheckpointState.load_checkpoint(tmp_path / "out" / "checkpoint").parameters["0.weight"].shape == (32, 64)
    # Below the required accuracy: status 1.
    r = subprocess.run([*map(str, args), "1.01", "--epochs", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "is below the required 1.0100" in r.stderr, r.stderr
