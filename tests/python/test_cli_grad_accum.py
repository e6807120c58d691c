"""`onnxtrain train --grad-accum N`: N micro-batches of --batch-size B per update, their gradients
averaged by rows, so the update equals one of --batch-size B*N (SGD with momentum and AdamW, a
partial last update included, with and without --drop-last); steps, schedules and checkpoints
count updates; a resume continues at the same micro-batch, bit for bit. The 2-rank case is in
test_distributed.py."""
import re

import numpy as np
import pytest

from onnxtrain import artifacts
from onnxtrain.api import CheckpointState

from .test_cli import cli
from .test_distributed import write_tiny_mlp_artifacts


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("accum")
    write_tiny_mlp_artifacts(d, [("adamw", artifacts.AdamW(lr=1e-2)), ("sgd", artifacts.SGD(lr=0.1, momentum=0.9))])
    rng = np.random.default_rng(0)
    # 90 examples: updates of 16 leave 10, micro-batches of 4 then end with one of 2.
    x = rng.standard_normal((90, 8)).astype(np.float32)
    np.savez(d / "data.npz", x=x, y=x[:, :4].argmax(1).astype(np.int64))
    return d


def train(tiny, opt, out, batch, *extra, check=True):
    return cli("train", tiny / opt, "--data", tiny / "data.npz", "--inputs", "x", "--labels", "y", "--batch-size",
               batch, "--shuffle", "--seed", 3, "--lr-schedule", "cosine", "--warmup", 3, "--progress", "lines",
               "--log-every", 1, "--checkpoint-out", out, *extra, check=check)


def params(path):
    state = CheckpointState.load_checkpoint(str(path))
    return {n: p.data for n, p in state.parameters if p.requires_grad}


def relative_difference(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) / max(float(np.abs(b[k]).max()), 1e-6) for k in a)


def updates(r):
    """(update, loss, lr) of every progress line."""
    found = re.findall(r"\(update (\d+)/\d+\) loss (\S+) lr (\S+)", r.stderr)
    return [(int(u), float(loss), float(lr)) for u, loss, lr in found]


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_accumulated_updates_equal_one_large_batch(tiny, tmp_path, opt, drop_last):
    extra = ["--epochs", 3] + (["--drop-last"] if drop_last else [])
    big = train(tiny, opt, tmp_path / "big", 16, *extra)
    small = train(tiny, opt, tmp_path / "small", 4, "--grad-accum", 4, *extra)
    assert relative_difference(params(tmp_path / "small"), params(tmp_path / "big")) <= 1e-5
    # Updates, learning rates and losses per update: those of batch 16 (the last of an epoch holds
    # 10 examples, or is dropped).
    a, b = updates(small), updates(big)
    assert len(a) == len(b) == 3 * (5 if drop_last else 6)
    assert [(u, lr) for u, _, lr in a] == [(u, lr) for u, _, lr in b]
    np.testing.assert_allclose([loss for _, loss, _ in a], [loss for _, loss, _ in b], rtol=1e-3)
    # Not vacuous: training moved the parameters, and updates of one micro-batch end elsewhere.
    # (SGD tells summed gradients, 4x the mean, from averaged ones; AdamW is nearly blind to the
    # scale but not to a wrong weight of the partial micro-batch.)
    start = params(tiny / opt / "checkpoint")
    assert relative_difference(params(tmp_path / "big"), start) > 1e-2, "training did not move the parameters"
    train(tiny, opt, tmp_path / "micro", 4, *extra)
    assert relative_difference(params(tmp_path / "micro"), params(tmp_path / "big")) > 1e-2


def test_resume_continues_at_the_same_micro_batch(tiny, tmp_path):
    # 90 examples, updates of 3 x 4 = 12: 8 per epoch (the last of 6 examples), 24 in all.
    run = lambda *extra, **kw: train(tiny, "adamw", *extra, **kw)  # noqa: E731
    whole = run(tmp_path / "whole", 4, "--grad-accum", 3, "--epochs", 3)
    assert updates(whole)[-1][0] == 24
    r = run(tmp_path / "part", 4, "--grad-accum", 3, "--epochs", 3, "--checkpoint-every", 5, "--max-steps", 11)
    saved = [line.rsplit(" ", 1)[1] for line in r.stderr.splitlines() if line.startswith("saved checkpoint")]
    assert saved == ["5", "10", "11"] and "stopped after 11 updates" in r.stdout
    state = CheckpointState.load_checkpoint(tmp_path / "part")
    p = state.properties
    assert (p["train.step"], p["train.epoch"], p["train.epoch_step"], p["train.grad_accum"]) == (11, 1, 3, 3)
    assert p["onnxtrain.train_steps"] == 23 + 9  # micro-batches run: 7 x 3 + 2 in epoch 1, 3 x 3 in epoch 2
    resumed = run(tmp_path / "resumed", 4, "--grad-accum", 3, "--epochs", 3, "--resume", tmp_path / "part")
    assert [u for u, _, _ in updates(resumed)] == list(range(12, 25))
    assert updates(resumed) == updates(whole)[11:]
    assert (tmp_path / "whole").read_bytes() == (tmp_path / "resumed").read_bytes()
    # Another accumulation would take other examples per update: refused, naming both values.
    r = run(tmp_path / "other", 4, "--grad-accum", 2, "--epochs", 3, "--resume", tmp_path / "part", check=False)
    assert r.returncode == 1 and "train.grad_accum = 3, this one 2" in r.stderr, r.stderr
    r = run(tmp_path / "other", 4, "--epochs", 3, "--resume", tmp_path / "part", check=False)
    assert r.returncode == 1 and "train.grad_accum = 3, this one 1" in r.stderr, r.stderr


def test_too_few_examples_for_one_update(tiny, tmp_path):
    r = train(tiny, "sgd", tmp_path / "none", 32, "--grad-accum", 3, "--drop-last", check=False)
    assert r.returncode == 1 and "90 examples make no full batch of 32 x 3 micro-batches" in r.stderr, r.stderr


def test_help_states_the_scaling():
    text = " ".join(cli("train", "--help").stdout.split())
    assert "--grad-accum N" in text and "gradients averaged" in text and "--batch-size B*N" in text
