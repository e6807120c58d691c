"""Crash consistency: starts real training processes, kills them with SIGKILL at random instants
and checks what they leave on disk (docs/ROBUSTNESS.md, "Crash consistency").

    PYTHONPATH=build/python /usr/bin/python3 tests/crash/kill_test.py --kills 200 [--front-ends python,cpp,cli]

Front ends: the Python API and the C++ API (tests/crash/crash_train.py, crash_train.cc: a
checkpoint save and a model export after every update, in onnxtrain's format and ONNX Runtime's,
the C++ one also with "<path>.data"), and `onnxtrain train --checkpoint-every 1 --log FILE`.

A chain trains from the artifacts' checkpoint to the end, each process resuming from the
checkpoint the killed one left. Half of the processes run with ONNXTRAIN_DEBUG_SAVE_PAUSE_MS
(core/file_io.h), which makes every atomic write sleep at each of its steps, so many kills land
inside a save. After every kill:
  - the checkpoint loads (its CRC-32C verified; an interrupted commit of "<path>.data" finished
    by the load, done on a copy so that the next process meets the files as the kill left them);
  - it is byte for byte the uninterrupted run's checkpoint of the update it records, and that
    update is no earlier than the one the killed process started from (nothing lost);
  - the exported model is byte for byte the uninterrupted run's export of that update or of an
    earlier one, no earlier than the export seen after the previous kill (an export follows each
    save; a resumed process exports after its first update);
  - the CLI's log is a prefix of the uninterrupted run's log that covers the checkpoint.
When a chain ends, the checkpoint, export and log equal the uninterrupted run's, the parameters
compare equal bit for bit, and no temporary file is left. Exit status 1 on any failure.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from onnxtrain.api import CheckpointState

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
ONNXTRAIN = BUILD / "onnxtrain"
CRASH_TRAIN = BUILD / "tests" / "crash_train"
PY_TRAIN = ROOT / "tests" / "crash" / "crash_train.py"
MODEL = ROOT / "tests" / "models" / "mlp_classifier.onnx"  # 2 -> 32 -> 32 -> 3, output "logits"

BATCH = 16
STEPS = 24          # updates of the Python and C++ loops
CLI_EPOCHS = 2      # 128 examples / 16: 8 updates an epoch
EXAMPLES = 128
FORMATS = {"python": ["onnxtrain", "ort"], "cpp": ["onnxtrain", "ort", "ort-external"], "cli": ["onnxtrain"]}


class Failure(Exception):
    pass


def files_of(ckpt: Path):
    """The checkpoint's files: the main one and, in ORT's format, its data file and pending data file."""
    return [p for p in (ckpt, Path(str(ckpt) + ".data"), Path(str(ckpt) + ".data.new")) if p.exists()]


def load_verified(ckpt: Path, scratch: Path):
    """Loads a copy of the checkpoint (so a roll-forward happens in the copy); returns the state,
    the bytes of the copy's main and data files after the load, and whether the load finished an
    interrupted commit (renamed "<path>.data.new")."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir()
    for p in files_of(ckpt):
        shutil.copyfile(p, scratch / p.name.replace(ckpt.name, "ckpt", 1))
    pending = scratch / "ckpt.data.new"
    was_pending = pending.exists()
    state = CheckpointState.load_checkpoint(scratch / "ckpt")
    data = scratch / "ckpt.data"
    return state, (scratch / "ckpt").read_bytes(), data.read_bytes() if data.exists() else None, \
        was_pending and not pending.exists()


def same_checkpoint(got_main, got_data, ref: Path, external: bool):
    ref_data = Path(str(ref) + ".data")
    return got_main == ref.read_bytes() and (not external or got_data == ref_data.read_bytes())


def parameters(state):
    return {name: np.array(p.data) for name, p in state.parameters}


class FrontEnd:
    """How one front end is run and read back."""

    def __init__(self, name, work: Path):
        self.name, self.work = name, work
        self.art, self.data = work / "art", work / "data.npz"
        self.step_key = "train.step" if name == "cli" else "crash.step"

    def command(self, fmt, ckpt: Path, export: Path, log: Path, keep: Path = None, max_steps=None, start=None):
        if self.name == "cli":
            cmd = [str(ONNXTRAIN), "train", str(self.art), "--data", str(self.data), "--inputs", "x", "--labels", "y",
                   "--batch-size", str(BATCH), "--epochs", str(CLI_EPOCHS), "--checkpoint-every", "1",
                   "--checkpoint-out", str(ckpt), "--log", str(log), "--progress", "none"]
            if max_steps:
                cmd += ["--max-steps", str(max_steps)]
            resume_from = start if start is not None else ckpt
            return cmd + (["--resume", str(resume_from)] if resume_from.exists() else [])
        args = [str(self.art), str(self.data), str(ckpt), fmt, str(STEPS), str(BATCH), str(export), "logits"]
        args += [str(keep)] if keep else []
        if self.name == "cpp":
            return [str(CRASH_TRAIN)] + args
        return [sys.executable, str(PY_TRAIN)] + args

    def total_steps(self):
        return CLI_EPOCHS * (EXAMPLES // BATCH) if self.name == "cli" else STEPS


def run(cmd, env):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}")
    return r.stdout


def reference(fe: FrontEnd, fmt: str, env) -> dict:
    """The uninterrupted run: its checkpoint (and export) after every update, its log, its time."""
    ref = fe.work / f"ref-{fe.name}-{fmt}"
    ref.mkdir()
    t0 = time.monotonic()
    if fe.name == "cli":
        run(fe.command(fmt, ref / "final", None, ref / "log"), env)
        seconds = time.monotonic() - t0
        # Each update's checkpoint: --max-steps k resumed from k - 1 (their end equals the uninterrupted
        # run's, checked below, as the chains check the rest).
        prev = fe.art / "checkpoint"
        for k in range(1, fe.total_steps() + 1):
            cmd = fe.command(fmt, ref / f"ckpt-{k}", None, ref / "scratch-log", max_steps=k, start=prev)
            if k == 1:
                cmd = cmd[:cmd.index("--resume")] if "--resume" in cmd else cmd
            run(cmd, env)
            prev = ref / f"ckpt-{k}"
        if (ref / "final").read_bytes() != prev.read_bytes():
            raise Failure("cli: the run stopped and resumed at every update differs from the uninterrupted run")
    else:
        run(fe.command(fmt, ref / "run", ref / "run.onnx", None, keep=ref), env)
        seconds = (time.monotonic() - t0) / 2  # it saves and exports twice per update
    return {"dir": ref, "seconds": seconds}


def check_after_kill(fe, fmt, ref, chain: Path, durable: int, exported: int, scratch: Path):
    """The checks after a kill; returns the checkpoint's update (0: none yet), the export's update
    (0: none yet) and whether the load finished an interrupted commit."""
    ckpt, export, log = chain / "ckpt", chain / "model.onnx", chain / "log"
    external = fmt == "ort-external"
    step = 0
    if ckpt.exists():
        try:
            state, main, data, rolled = load_verified(ckpt, scratch)
        except Exception as e:  # noqa: BLE001 - any load error is the failure being tested for
            raise Failure(f"the checkpoint does not load: {e}")
        step = int(state.properties[fe.step_key])
        if not same_checkpoint(main, data, ref / f"ckpt-{step}", external):
            raise Failure(f"the checkpoint of update {step} differs from the uninterrupted run's")
    elif durable:
        raise Failure(f"the checkpoint is gone (update {durable} was saved)")
    if step < durable:
        raise Failure(f"the checkpoint went back from update {durable} to {step}")
    if fe.name != "cli":
        # An export follows each save, and a resumed process exports after its first update: the
        # export may be several updates behind the checkpoint, never ahead, never going back.
        if export.exists():
            got = export.read_bytes()
            same = [k for k in range(1, STEPS + 1) if got == (ref / f"model-{k}.onnx").read_bytes()]
            if not same or not exported <= same[-1] <= step:
                raise Failure(f"the exported model is update {same or 'none'}'s, expected one of {exported}..{step}")
            exported = same[-1]
        elif exported:
            raise Failure("the exported model is gone")
    else:
        text = log.read_text() if log.exists() else ""
        ref_log = (ref / "log").read_text()
        if not ref_log.startswith(text):
            raise Failure("the log is not a prefix of the uninterrupted run's log")
        if step and f'{{"step": {step},' not in text:
            raise Failure(f"the log does not reach the checkpoint's update {step}")
    return step, exported, rolled if ckpt.exists() else False


def check_end(fe, fmt, ref, chain: Path, scratch: Path):
    ckpt = chain / "ckpt"
    final = ref / ("final" if fe.name == "cli" else f"ckpt-{STEPS}")
    state, main, data, _ = load_verified(ckpt, scratch)
    expect = CheckpointState.load_checkpoint(final)
    got_p, want_p = parameters(state), parameters(expect)
    if got_p.keys() != want_p.keys() or any(got_p[k].tobytes() != want_p[k].tobytes() for k in want_p):
        raise Failure("the resumed chain's parameters differ from the uninterrupted run's")
    if not same_checkpoint(main, data, final, fmt == "ort-external"):
        raise Failure("the resumed chain's checkpoint differs from the uninterrupted run's")
    if fe.name == "cli":
        if (chain / "log").read_text() != (ref / "log").read_text():
            raise Failure("the resumed chain's log differs from the uninterrupted run's")
    elif (chain / "model.onnx").read_bytes() != (ref / f"model-{STEPS}.onnx").read_bytes():
        raise Failure("the resumed chain's exported model differs from the uninterrupted run's")
    left = [p.name for p in chain.iterdir() if ".tmp-" in p.name or p.name.endswith(".new")]
    if left:
        raise Failure(f"files left behind: {left}")


def campaign(fe: FrontEnd, kills: int, rng: random.Random, pause_ms: int, log=print) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ONNXTRAIN_DEBUG_SAVE_PAUSE_MS", None)
    refs = {fmt: reference(fe, fmt, env) for fmt in FORMATS[fe.name]}
    # inside_save: kills that left a temporary file of the killed process, by the file it was for;
    # rolled_forward: kills between the commit of "<path>.data" and its rename, finished by the load.
    stats = {"kills": 0, "inside_save": 0, "inside_save_of": {}, "rolled_forward": 0, "before_first_save": 0,
             "chains": 0, "processes": 0, "resumed_to_end": 0, "failures": []}
    scratch = fe.work / f"scratch-{fe.name}"
    t0 = time.monotonic()
    while stats["kills"] < kills:
        fmt = FORMATS[fe.name][stats["chains"] % len(FORMATS[fe.name])]
        ref = refs[fmt]
        chain = fe.work / f"chain-{fe.name}-{stats['chains']}"
        chain.mkdir()
        stats["chains"] += 1
        durable, exported = 0, 0
        try:
            while True:
                paused = rng.random() < 0.5
                run_env = dict(env, ONNXTRAIN_DEBUG_SAVE_PAUSE_MS=str(pause_ms)) if paused else env
                # Uniform over the time an uninterrupted run takes (more with the pauses), so a
                # process often does a few updates, and sometimes dies before its first save.
                horizon = ref["seconds"] * (3.0 if paused else 1.0) * 0.6
                cmd = fe.command(fmt, chain / "ckpt", chain / "model.onnx", chain / "log")
                p = subprocess.Popen(cmd, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                stats["processes"] += 1
                try:
                    p.wait(timeout=rng.uniform(0, horizon))
                except BaseException as e:  # the kill below, or the driver itself interrupted
                    if not isinstance(e, subprocess.TimeoutExpired):
                        p.kill()
                        raise
                    p.send_signal(signal.SIGKILL)
                    p.wait()
                    p.stderr.close()
                    stats["kills"] += 1
                    left = [q.name.split(".tmp-")[0] for q in chain.iterdir() if f".tmp-{p.pid}-" in q.name]
                    if left:
                        stats["inside_save"] += 1
                        for name in left:
                            stats["inside_save_of"][name] = stats["inside_save_of"].get(name, 0) + 1
                    durable, exported, rolled = check_after_kill(fe, fmt, ref["dir"], chain, durable, exported,
                                                                 scratch)
                    stats["rolled_forward"] += int(rolled)
                    if durable == 0:
                        stats["before_first_save"] += 1
                    continue
                err = p.stderr.read().decode()
                p.stderr.close()
                if p.returncode != 0:
                    raise Failure(f"a resumed process failed ({p.returncode}): {err}")
                check_end(fe, fmt, ref["dir"], chain, scratch)
                stats["resumed_to_end"] += 1
                break
        except Failure as e:
            stats["failures"].append(f"chain {stats['chains'] - 1} ({fmt}), kill {stats['kills']}: {e}")
            log(f"{fe.name}: FAILURE {stats['failures'][-1]}")
        shutil.rmtree(chain, ignore_errors=True)
    stats["seconds"] = round(time.monotonic() - t0, 1)
    stats["reference_seconds"] = {fmt: round(r["seconds"], 2) for fmt, r in refs.items()}
    return stats


def prepare(work: Path):
    subprocess.run([str(ONNXTRAIN), "artifacts", str(MODEL), "--out", str(work / "art"), "--all",
                    "--loss", "cross_entropy"], check=True, stdout=subprocess.DEVNULL)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 2)).astype(np.float32)
    y = ((x[:, 0] > x[:, 1]).astype(np.int64) + (x[:, 0] > 1)).astype(np.int64)
    np.savez(work / "data.npz", x=x, y=y)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=int(os.environ.get("KILLS", "200")), help="kills per front end")
    ap.add_argument("--front-ends", default="python,cpp,cli")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    ap.add_argument("--pause-ms", type=int, default=5, help="ONNXTRAIN_DEBUG_SAVE_PAUSE_MS for half the processes")
    ap.add_argument("--json", help="write the figures there")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else int(time.time())
    print(f"kill test: seed {seed}, {a.kills} kills per front end", flush=True)
    rng = random.Random(seed)
    results, failed = {"seed": seed}, False
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="onnxtrain-kill-") as tmp:
        work = Path(tmp)
        prepare(work)
        for name in a.front_ends.split(","):
            s = campaign(FrontEnd(name, work), a.kills, rng, a.pause_ms, log=lambda m: print(m, flush=True))
            results[name] = s
            failed |= bool(s["failures"])
            print(f"{name}: {s['kills']} kills ({s['inside_save']} inside an atomic write {s['inside_save_of']}, "
                  f"{s['rolled_forward']} between a .data commit and its rename, {s['before_first_save']} before the "
                  f"chain's first save) in {s['chains']} chains of {s['processes']} processes, "
                  f"{s['resumed_to_end']} resumed to the end equal, {len(s['failures'])} failures, {s['seconds']} s",
                  flush=True)
    results["seconds"] = round(time.monotonic() - t0, 1)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"kill test: {'FAILED' if failed else 'passed'} in {results['seconds']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
