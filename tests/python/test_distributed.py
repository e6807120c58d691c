"""Data-parallel training over MPI (src/distributed): 2 ranks with the global batch B give the
parameters of 1 process with batch B (AdamW and SGD, with and without gradient accumulation)
through the C++ API, the Python API and the CLI; a killed rank ends the job, its last checkpoint
is intact and a 2-rank resume reproduces the uninterrupted run bit for bit; bad input (another
world size on resume, ranks with different artifacts, no MPI) fails naming the rank."""
import io
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import onnxtrain.distributed as dist
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState

from .build_paths import BUILD, ONNXTRAIN

DP_TRAIN = BUILD / "tests" / "dp_train"
WORKER = Path(__file__).with_name("dist_worker.py")
PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None or not dist.mpi_built(),
                                reason="needs Open MPI (openmpi-bin) and an onnxtrain built with MPI")

# As root on a small machine: allow root, more ranks than cores, no binding; shared memory and
# loopback only (no probing of network interfaces).
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "oob_tcp_if_include", "lo", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]


def env():
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = str(BUILD / "python") + os.pathsep + e.get("PYTHONPATH", "")
    for k in [k for k in e if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))]:
        del e[k]  # pytest itself may run under a launcher
    return e


def run(args, ranks=None, check=True, timeout=120):
    cmd = [str(a) for a in args]
    if ranks:
        cmd = MPIRUN + ["-np", str(ranks)] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return r


def write_tiny_mlp_artifacts(directory, optimizers):
    """A seeded 8-16-4 MLP (Tanh) exported in training mode, with artifacts (cross-entropy, every
    weight trained) in directory/<name> for each (name, optimizer config)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    f = io.BytesIO()
    torch.onnx.export(model, (torch.randn(2, 8),), f, input_names=["x"], output_names=["logits"], opset_version=17,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING,
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    for name, opt in optimizers:
        artifacts.generate_artifacts(f.getvalue(), requires_grad=["0.weight", "0.bias", "2.weight", "2.bias"],
                                     loss=artifacts.LossType.CrossEntropyLoss, optimizer=opt,
                                     artifact_directory=str(directory / name))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    write_tiny_mlp_artifacts(d, [("adamw", artifacts.AdamW(lr=1e-2)), ("sgd", artifacts.SGD(lr=0.1, momentum=0.9)),
                                 ("adamw_lr2", artifacts.AdamW(lr=2e-2))])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 8)).astype(np.float32)
    y = (x[:, :4].argmax(1)).astype(np.int64)
    np.savez(d / "data.npz", x=x, y=y)
    return d


def params_of_checkpoint(path):
    state = CheckpointState.load_checkpoint(str(path))
    return {n: p.data for n, p in state.parameters if p.requires_grad}


def assert_close(a, b, rtol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        scale = max(float(np.abs(b[k]).max()), 1e-6)
        err = float(np.abs(a[k] - b[k]).max()) / scale
        assert err <= rtol, f"{k}: relative difference {err:.3g}"


def npz_params(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files if k not in ("losses", "stats")}


CASES = [("adamw", 1), ("sgd", 1), ("adamw", 2), ("sgd", 3)]


@pytest.mark.parametrize("opt,accum", CASES)
def test_cpp_two_ranks_equal_one_process(work, tmp_path, opt, accum):
    art, data = work / opt, work / "data.npz"
    run([DP_TRAIN, art, data, tmp_path / "one.npz", 16, 50, accum])
    run([DP_TRAIN, art, data, tmp_path / "two.npz", 16, 50, accum, "dp"], ranks=2)
    one, two = npz_params(tmp_path / "one.npz"), npz_params(tmp_path / "two.npz")
    assert_close(two, one)
    start = params_of_checkpoint(art / "checkpoint")
    assert any(np.abs(one[k] - start[k]).max() > 1e-3 for k in one), "training did not move the parameters"


@pytest.mark.parametrize("opt,accum", [("adamw", 1), ("sgd", 3)])
def test_overlapped_allreduce_is_bit_identical_to_blocking(work, tmp_path, opt, accum):
    # The same buckets, packed, reduced and unpacked the same way: during the backward of the
    # update's last micro-batch (comm thread) or after it.
    art, data = work / opt, work / "data.npz"
    run([DP_TRAIN, art, data, tmp_path / "overlap.npz", 16, 50, accum, "dp"], ranks=2)
    run([DP_TRAIN, art, data, tmp_path / "blocking.npz", 16, 50, accum, "dp-blocking"], ranks=2)
    overlap, blocking = npz_params(tmp_path / "overlap.npz"), npz_params(tmp_path / "blocking.npz")
    assert overlap.keys() == blocking.keys()
    for k in overlap:
        assert np.array_equal(overlap[k], blocking[k]), k
    run([PYTHON, WORKER, art, data, tmp_path / "py_blocking.npz", 16, 50, accum, "blocking"], ranks=2)
    py_blocking = npz_params(tmp_path / "py_blocking.npz")
    for k in overlap:
        assert np.array_equal(overlap[k], py_blocking["p_" + k]), k
    assert np.load(tmp_path / "py_blocking.npz")["stats"][3] == 0  # no step overlapped


EXTRA_MICRO_STEP = """
import os, sys
import numpy as np
import onnxtrain.distributed as dist
from onnxtrain.api import CheckpointState, Module, Optimizer
art = sys.argv[1]
dist.init()
state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
module = Module(os.path.join(art, "training_model.onnx"), state)
optimizer = Optimizer(os.path.join(art, "optimizer_model.onnx"), module, data_parallel=True,
                      gradient_accumulation_steps=2)
x, y = np.ones((4, 8), np.float32), np.zeros(4, np.int64)
for _ in range(3):  # one train step more than the update holds
    module(x, y)
"""


def test_a_train_step_after_the_reducing_one_is_an_error(work, tmp_path):
    script = tmp_path / "extra_micro_step.py"
    script.write_text(EXTRA_MICRO_STEP)
    r = run([PYTHON, script, work / "adamw"], ranks=2, check=False)
    assert r.returncode != 0
    assert "gradient_accumulation_steps = 2" in r.stderr and "averaged over the ranks" in r.stderr, r.stderr


@pytest.mark.parametrize("opt,accum", CASES)
def test_python_two_ranks_equal_one_process(work, tmp_path, opt, accum):
    art, data = work / opt, work / "data.npz"
    run([PYTHON, WORKER, art, data, tmp_path / "one.npz", 16, 50, accum])
    run([PYTHON, WORKER, art, data, tmp_path / "two.npz", 16, 50, accum], ranks=2)
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert_close(npz_params(tmp_path / "two.npz"), npz_params(tmp_path / "one.npz"))
    # The rank-0 loss is its half of the batch: the mean of both halves is the one-process loss.
    assert len(two["losses"]) == 50 * accum
    steps, calls, nbytes, overlapped = two["stats"]
    assert steps == 50 and calls >= 50 and nbytes == 50 * (8 * 16 + 16 + 16 * 4 + 4) * 4
    assert overlapped == 50  # every update reduced during its last micro-batch's backward
    assert one["stats"][0] == 0  # one process: no allreduce


def cli_train(work, opt, out, batch, ranks=None, extra=(), check=True, timeout=120):
    return run([ONNXTRAIN, "train", work / opt, "--data", work / "data.npz", "--inputs", "x", "--labels", "y",
                "--batch-size", batch, "--shuffle", "--seed", 7, "--progress", "lines", "--checkpoint-out", out,
                *extra], ranks=ranks, check=check, timeout=timeout)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_cli_two_ranks_equal_one_process(work, tmp_path, opt):
    # 96 examples, global batch 16: 6 updates per epoch, 50 updates in all.
    one = cli_train(work, opt, tmp_path / "one", 16, extra=["--epochs", 9, "--max-steps", 50])
    two = cli_train(work, opt, tmp_path / "two", 8, ranks=2,
                    extra=["--epochs", 9, "--max-steps", 50, "--bucket-mb", 0.001, "--dp-check-every", 5])
    assert_close(params_of_checkpoint(tmp_path / "two"), params_of_checkpoint(tmp_path / "one"))
    # Only rank 0 prints, and the loss it prints is the global batch's.
    assert two.stdout.count("stopped after 50 updates") == 1
    loss_lines = lambda r: [line for line in r.stderr.splitlines() if "loss" in line and "it/s" in line]  # noqa: E731
    assert len(loss_lines(two)) == len(loss_lines(one)) > 0


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_cli_two_ranks_with_grad_accum_equal_one_process(work, tmp_path, opt):
    # 2 ranks x 2 micro-batches of 5 = global batch 20: each rank's 48 examples make 5 updates per
    # epoch, the last of 5 + 3 examples per rank (16 in all), as batch 20 of one process does.
    extra = ["--epochs", 4, "--log-every", 1]
    one = cli_train(work, opt, tmp_path / "one", 20, extra=extra)
    two = cli_train(work, opt, tmp_path / "two", 5, ranks=2,
                    extra=extra + ["--grad-accum", 2, "--bucket-mb", 0.001, "--checkpoint-every", 6])
    assert_close(params_of_checkpoint(tmp_path / "two"), params_of_checkpoint(tmp_path / "one"))
    start = params_of_checkpoint(work / opt / "checkpoint")
    assert any(np.abs(p - start[k]).max() > 1e-3 for k, p in params_of_checkpoint(tmp_path / "one").items())
    updates = lambda r: [line.split("(update ")[1].split(" lr")[0] for line in r.stderr.splitlines()  # noqa: E731
                         if "(update " in line]
    assert len(updates(two)) == len(updates(one)) == 20
    for a, b in zip(updates(two), updates(one)):  # "u/20) loss L": the same update, the loss to %.4g
        assert a.split(")")[0] == b.split(")")[0]
        assert float(a.split("loss ")[1]) == pytest.approx(float(b.split("loss ")[1]), rel=1e-3)
    saved = [line.rsplit(" ", 1)[1] for line in two.stderr.splitlines() if line.startswith("saved checkpoint")]
    assert saved == ["6", "12", "18", "20"]  # counted in updates
    assert CheckpointState.load_checkpoint(str(tmp_path / "two")).properties["train.grad_accum"] == 2


def test_killed_rank_then_exact_resume(work, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = [ONNXTRAIN, "train", work / "adamw", "--data", work / "data.npz", "--inputs", "x", "--labels", "y",
            "--batch-size", 8, "--shuffle", "--epochs", 100000, "--checkpoint-every", 20, "--progress", "none",
            "--checkpoint-out", ckpt]
    cmd = MPIRUN + ["-np", "2"] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    victim = rank_pid(proc.pid, 1)
    deadline = time.time() + 60
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert ckpt.exists(), "no checkpoint appeared"
    os.kill(victim, signal.SIGKILL)  # mid-run: the job has 600000 updates to go
    t0 = time.time()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert time.time() - t0 < 30, "the surviving rank took too long to exit"
    # The checkpoint is whole (a checksum covers it) and records where the run was.
    state = CheckpointState.load_checkpoint(str(ckpt))
    done = state.properties["train.step"]
    assert done > 0 and done % 20 == 0 and state.properties["train.world_size"] == 2
    target = done + 30
    shutil.copy(ckpt, tmp_path / "saved")
    resume = [ONNXTRAIN, "train", work / "adamw", "--data", work / "data.npz", "--inputs", "x", "--labels", "y",
              "--batch-size", 8, "--shuffle", "--epochs", 100000, "--progress", "none", "--max-steps", target]
    run(resume + ["--resume", tmp_path / "saved", "--checkpoint-out", tmp_path / "resumed"], ranks=2)
    run(resume + ["--checkpoint-out", tmp_path / "straight"], ranks=2)
    a, b = params_of_checkpoint(tmp_path / "resumed"), params_of_checkpoint(tmp_path / "straight")
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k} differs after the resume"


def rank_pid(mpirun_pid, rank):
    """The pid of the process mpirun started as `rank` (its environment says so)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                environ = (p / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ and _descends(int(p.name), mpirun_pid):
                return int(p.name)
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} not found")


def _descends(pid, ancestor):
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return False


def test_hung_rank_times_out_naming_the_rank(work, tmp_path):
    ckpt = tmp_path / "ckpt"
    cmd = MPIRUN + ["-np", "2"] + [str(a) for a in [
        ONNXTRAIN, "train", work / "sgd", "--data", work / "data.npz", "--inputs", "x", "--labels", "y",
        "--batch-size", 8, "--epochs", 100000, "--checkpoint-every", 20, "--progress", "none",
        "--checkpoint-out", ckpt, "--dp-timeout", 2]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    victim = rank_pid(proc.pid, 1)
    deadline = time.time() + 60
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert ckpt.exists()
    os.kill(victim, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0
    assert "rank 0 of 2" in err and "timed out after 2 s" in err, err


def test_resume_with_another_world_size_names_it(work, tmp_path):
    cli_train(work, "sgd", tmp_path / "two", 8, ranks=2, extra=["--max-steps", 3])
    r = cli_train(work, "sgd", tmp_path / "one", 16, extra=["--resume", tmp_path / "two"], check=False)
    assert r.returncode == 1
    assert "checkpoint's run had 2 rank(s) and this one has 1" in r.stderr and "mpirun -np 2" in r.stderr


def test_ranks_with_different_artifacts_fail_naming_the_rank(work, tmp_path):
    common = ["--data", work / "data.npz", "--inputs", "x", "--labels", "y", "--batch-size", 8,
              "--progress", "none", "--checkpoint-out"]
    cmd = MPIRUN + ["-np", "1", str(ONNXTRAIN), "train", str(work / "adamw"), *map(str, common), str(tmp_path / "a"),
                    ":", "-np", "1", str(ONNXTRAIN), "train", str(work / "adamw_lr2"), *map(str, common),
                    str(tmp_path / "b")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert r.returncode != 0
    assert "ranks disagree on the training, eval and optimizer models: rank(s) 1 differ from rank 0" in r.stderr, \
        r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_too_few_examples_for_the_ranks(work, tmp_path):
    np.savez(tmp_path / "one.npz", x=np.zeros((1, 8), np.float32), y=np.zeros(1, np.int64))
    r = run([ONNXTRAIN, "train", work / "sgd", "--data", tmp_path / "one.npz", "--inputs", "x", "--labels", "y",
             "--checkpoint-out", tmp_path / "c"], ranks=2, check=False)
    assert r.returncode != 0 and "has 1 examples, fewer than the 2 ranks" in r.stderr, r.stderr


def test_launcher_without_mpi_build_names_the_rank():
    with pytest.raises(RuntimeError, match="rank 1 of 2: started by an MPI launcher, but this onnxtrain was built "
                                           "without MPI"):
        dist.launcher_environment({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, mpi=False)
    assert dist.launcher_environment({}, mpi=False) is None
    assert dist.launcher_environment({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
                                      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, mpi=True) == (3, 4, 1)


def test_single_process_init():
    w = dist.init()
    assert (w.rank, w.size, w.backend) == (0, 1, "single") or "OMPI_COMM_WORLD_SIZE" in os.environ
