#!/usr/bin/env python3
"""Page faults, system time and huge pages of each steady-state training step, by phase.

The loop and models of bench_vs_ortmodule.py (``--models bert,gpt``: the BERT-style encoder with a
2-class head and the GPT-style decoder with its 8192-token LM head; torch.optim.AdamW), run eager
(``torch``) and wrapped in ``onnxtrain.torch.TrainModule`` (``trainmodule``), each variant in a
fresh process; ``module``: the on-device API's step (Module + Optimizer from generate_artifacts)
on the same models. ``hf-bert``, ``hf-gpt2``, ``hf-llama``: bench_train_module.py's Hugging Face
models with their loss inside (run the script with the torch2 peer's Python). For every step after the warm-up it prints, per phase (forward, loss, backward,
optimizer step, zero_grad) and in all: minor page faults (getrusage ru_minflt), user and system
CPU time, wall time; then the process's AnonHugePages and resident set (/proc/self/smaps_rollup)
after the step, and at the end its peak RSS (ru_maxrss; with ``--phase-peaks``, the peak of each
phase of the steady steps instead, and their largest). Faults and system time do not depend on
the machine's load the way wall time does: on this VM a fault of a 4 KiB page cost 1.5-15 us, and
the kernel zero-fills every fresh page, 4 KiB or 2 MiB, on its first touch.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_step_faults.py [--models bert,gpt]
        [--variants torch,trainmodule] [--steps 10] [--warmup 3] [--repeat 1] [--json out.json]

``--strace`` runs each worker under ``strace -f -e trace=memory`` and counts, per steady-state
step, the mmap/munmap/madvise/brk calls (their sizes summed): where fresh mappings come from.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("torch", "trainmodule", "module")
PHASES = ("forward", "loss", "backward", "optimizer", "zero_grad")
STEP_MARK = "/onnxtrain-step-mark"  # an access() of this path marks a step's start in strace's log


PHASE_PEAKS = False  # --phase-peaks, in the worker


def _usage():
    """(minor faults, user s, sys s, wall s, peak RSS KiB): the process's VmHWM; with
    --phase-peaks each mark resets it to the current RSS (/proc/self/clear_refs), so that every
    phase reports its own peak. That changes what the process sees as its peak (ru_maxrss), which
    TrainModule's gradients' spare watches (python/src/torch_bridge.cc): it may stop holding."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    if PHASE_PEAKS:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return r.ru_minflt, r.ru_utime, r.ru_stime, time.perf_counter(), hwm


def _smaps_kib() -> dict:
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[0] in ("Rss:", "AnonHugePages:"):
                out[parts[0][:-1]] = int(parts[1])
    return out


def module_worker(args, model, batches, vmstat: dict) -> list:
    """The on-device API's step (Module's forward and backward with the loss, Optimizer's AdamW
    step, lazy_reset_grad) on artifacts generated from the model with a cross-entropy loss; phases
    forward (forward + backward) and optimizer (step + reset)."""
    import tempfile
    import torch
    import onnxtrain
    from bench_training import export_training, parameter_names
    from onnxtrain import artifacts
    from onnxtrain.api import CheckpointState, Module, Optimizer

    class FlatLogits(torch.nn.Module):  # cross-entropy over (tokens, classes)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            logits = self.inner(x)
            return logits.reshape(-1, logits.shape[-1])

    onnxtrain.set_num_threads(args.threads)
    flat = FlatLogits(model)
    x0 = batches[0][0]
    steps = []
    with tempfile.TemporaryDirectory() as workdir:
        paths = artifacts.generate_artifacts(export_training(flat, (x0,), ["x"], ["logits"]),
                                             requires_grad=parameter_names(flat),
                                             loss=artifacts.LossType.CrossEntropyLoss,
                                             optimizer=artifacts.AdamW(lr=1e-4), artifact_directory=workdir)
        state = CheckpointState.load_checkpoint(paths[3])
        module = Module(paths[0], state, paths[1])
        optimizer = Optimizer(paths[2], module)
        for i, (x, y) in enumerate(batches):
            feeds = (x.numpy(), y.reshape(-1).numpy())
            if i == args.warmup:
                vmstat.update(_vmstat())
            if args.mark:
                os.access(f"{STEP_MARK}-{i}", os.F_OK)
            marks = [_usage()]
            module(*feeds)
            marks.append(_usage())
            optimizer.step()
            module.lazy_reset_grad()
            marks.append(_usage())
            if i >= args.warmup:
                steps.append(_row(marks, ("forward", "optimizer")))
    return steps


def _row(marks, phases) -> dict:
    row = {"smaps_kib": _smaps_kib()}
    for name in PHASES:
        row[name] = {"faults": 0, "user_ms": 0.0, "sys_ms": 0.0, "wall_ms": 0.0, "peak_mib": 0.0}
    for name, a, b in zip(tuple(phases) + ("step",), marks[:-1] + [marks[0]], marks[1:] + [marks[-1]]):
        row[name] = {"faults": b[0] - a[0], "user_ms": (b[1] - a[1]) * 1e3, "sys_ms": (b[2] - a[2]) * 1e3,
                     "wall_ms": (b[3] - a[3]) * 1e3, "peak_mib": b[4] / 1024}
    row["step"]["peak_mib"] = max(m[4] for m in marks[1:]) / 1024
    return row


VMSTAT_KEYS = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "pgfault")


def _vmstat() -> dict:
    """System-wide counters (every process's): huge pages faulted, fallbacks to 4 KiB pages,
    direct compaction stalls."""
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key in VMSTAT_KEYS:
                out[key] = int(value)
    return out


def _result(steps, vmstat_start) -> str:
    end = _vmstat()
    return json.dumps({"steps": steps, "peak_rss_mib": max(s["step"]["peak_mib"] for s in steps) if PHASE_PEAKS
                       else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                       "vmstat": {k: end[k] - vmstat_start[k] for k in end}})


def worker(args) -> None:
    """One variant, one process: prints one JSON line with its per-step, per-phase figures."""
    global PHASE_PEAKS
    PHASE_PEAKS = args.phase_peaks
    import torch
    sys.path.insert(0, HERE)
    from models import training_loop_case
    torch.set_num_threads(args.threads)
    hf = args.model.startswith("hf-")
    if hf:  # a Hugging Face model, its loss inside: model(**batch).loss
        from bench_train_module import hf_case
        model, batches = hf_case(args.model, args.warmup + args.steps)
        batches = [(b, None) for b in batches]
    else:
        model, batches = training_loop_case(args.model, args.warmup + args.steps)
    if args.worker == "module":
        vmstat = {}
        steps = module_worker(args, model, batches, vmstat)
        print(_result(steps, vmstat))
        return
    if args.worker == "trainmodule":
        import onnxtrain
        from onnxtrain.torch import TrainModule
        onnxtrain.set_num_threads(args.threads)
        model = TrainModule(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = []
    for i, (x, y) in enumerate(batches):
        if i == args.warmup:
            vmstat = _vmstat()
        if args.mark:
            os.access(f"{STEP_MARK}-{i}", os.F_OK)
        marks = [_usage()]
        logits = model(**x) if hf else model(x)
        marks.append(_usage())
        loss = logits.loss if hf else torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                        y.reshape(-1))
        marks.append(_usage())
        loss.backward()
        marks.append(_usage())
        optimizer.step()
        marks.append(_usage())
        optimizer.zero_grad()
        marks.append(_usage())
        del logits, loss
        if i < args.warmup:
            continue
        steps.append(_row(marks, PHASES))
    print(_result(steps, vmstat))


def _strace_steps(log: str, warmup: int) -> list:
    """Per steady-state step of a `strace -f -e trace=memory,access` log: calls and bytes by kind."""
    steps, current = [], None
    size_of = {"mmap": 1, "munmap": 1, "madvise": 1}  # the length's argument position
    for line in log.splitlines():
        m = re.search(re.escape(STEP_MARK) + r"-(\d+)", line)
        if m:
            current = {} if int(m.group(1)) >= warmup else None
            if current is not None:
                steps.append(current)
            continue
        if current is None:
            continue
        m = re.search(r"\b(mmap|munmap|madvise|brk|mremap)\((.*?)\)\s+=", line)
        if not m:
            continue
        kind, argv = m.group(1), [a.strip() for a in m.group(2).split(",")]
        if kind == "madvise" and len(argv) > 2:
            kind = f"madvise {argv[2]}"
        entry = current.setdefault(kind, [0, 0])
        entry[0] += 1
        pos = size_of.get(kind.split()[0])
        if pos is not None and len(argv) > pos and argv[pos].isdigit():
            entry[1] += int(argv[pos])
    return steps


def run_worker(variant: str, model: str, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--model", model, "--threads",
           str(args.threads), "--warmup", str(args.warmup), "--steps", str(args.steps)]
    cmd += ["--phase-peaks"] if args.phase_peaks else []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    trace = None
    if args.strace:
        trace = f"/tmp/bench_step_faults.{os.getpid()}.strace"
        cmd = ["strace", "-f", "-qq", "-e", "trace=memory,access", "-o", trace] + cmd + ["--mark"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{variant} on {model} failed: {lines[-1][:300] if lines else proc.returncode}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if trace:
        with open(trace) as f:
            result["syscalls"] = _strace_steps(f.read(), args.warmup)
        os.unlink(trace)
    return result


def _median(steps, phase, key):
    return statistics.median(s[phase][key] for s in steps)


def report(model: str, variant: str, result: dict, verbose: bool) -> None:
    steps = result["steps"]
    if verbose:
        for i, s in enumerate(steps):
            print(f"    step {i}: " + "  ".join(
                f"{p} {s[p]['faults']:6d}f {s[p]['sys_ms']:5.1f}s {s[p]['wall_ms']:6.1f}w" for p in PHASES + ("step",))
                + f"  AnonHuge {s['smaps_kib'].get('AnonHugePages', 0) // 1024} MiB")
    cells = "  ".join(f"{p} {_median(steps, p, 'faults'):7.0f}" for p in PHASES)
    print(f"  {model:4s} {variant:11s} faults/step {_median(steps, 'step', 'faults'):7.0f} ({cells})")
    print(f"  {'':4s} {'':11s} sys {_median(steps, 'step', 'sys_ms'):6.1f} ms  user {_median(steps, 'step', 'user_ms'):6.1f} ms"
          f"  wall {_median(steps, 'step', 'wall_ms'):6.1f} ms  AnonHugePages {steps[-1]['smaps_kib'].get('AnonHugePages', 0) / 1024:.0f} MiB"
          f"  RSS {steps[-1]['smaps_kib']['Rss'] / 1024:.0f} MiB  peak RSS {result['peak_rss_mib']:.0f} MiB")
    if any("--phase-peaks" in a for a in sys.argv):
        peaks = "  ".join(f"{p} {_median(steps, p, 'peak_mib'):5.0f}" for p in PHASES)
        print(f"  {'':4s} {'':11s} peak RSS by phase (MiB): {peaks}")
    n = len(steps)
    print(f"  {'':4s} {'':11s} system-wide per step: " + ", ".join(
        f"{k} {v / n:.1f}" for k, v in result["vmstat"].items() if k != "pgfault"))
    for i, calls in enumerate(result.get("syscalls", [])[:3 if not verbose else None]):
        text = ", ".join(f"{k} x{n}" + (f" {b / 2**20:.1f} MiB" if b else "") for k, (n, b) in sorted(calls.items()))
        print(f"  {'':4s} {'':11s} step {i} memory syscalls: {text or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,gpt")
    ap.add_argument("--variants", default="torch,trainmodule", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="measured steps per process")
    ap.add_argument("--repeat", type=int, default=1, help="processes per variant (interleaved)")
    ap.add_argument("--strace", action="store_true", help="count memory syscalls per step under strace")
    ap.add_argument("--verbose", action="store_true", help="every step, not only medians")
    ap.add_argument("--phase-peaks", action="store_true", help="peak RSS of each phase (resets the process's peak)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--json")
    ap.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mark", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, HERE)
    from bench_vs_ort_training import machine_line
    print(f"step faults: {machine_line()}", flush=True)
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        for r in range(args.repeat):
            for variant in [v for v in args.variants.split(",") if v]:
                result = run_worker(variant, model, args)
                report(model, variant, result, args.verbose)
                rows.append({"model": model, "variant": variant, "round": r, **result})
    print(f"end: {machine_line()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
