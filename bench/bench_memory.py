#!/usr/bin/env python3
"""Memory optimizer benchmark: peak memory and step time of a train step, PyTorch eager against
TrainModule at memory-optimizer levels 0, 1 and 2, and at level 0 with memory-efficient gradient
management ("memgrad": ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1, each gradient handed to torch's
.grad as soon as the backward finishes it instead of all at its end).

Models: the BERT-style encoder with a classifier head and the GPT-style decoder of
bench_train_module.py (hidden 256, 4 layers, seq 128, batch 8, vocabulary 8192), trained with
torch.optim.SGD; the loss is computed by torch on the module's logits, except for ``gpt-loss``, the
decoder with its cross-entropy inside the module (as Hugging Face's causal LMs compute it when given
labels), where the loss is part of what TrainModule runs.

1. **Peak memory**, each variant in a fresh process: build, one warm-up step (export, plans), then
   freed heap memory goes back to the system (malloc_trim, so that neither engine's peak hides in
   memory its allocator kept from the warm-up), VmHWM is reset and 3 steps run; reported is the
   VmHWM growth over the RSS before them (MiB; also after the first of them, before the
   allocator's fragmentation over steps adds to it),
   with the activation memory held between forward and backward: for PyTorch the bytes of the
   tensors autograd saves (saved_tensors_hooks, each storage once), for onnxtrain the saved values
   of the forward graph, plus onnxtrain's own arena report.
2. **Step time**: levels 0, 1 and 2 in one process, steps interleaved, median of the steps after
   the warm-up (wall clock, and the process's CPU time, steadier on a loaded machine).

Targets (issue 11): level 0 peak no more than PyTorch eager; level 1 at least 40% less activation
memory than level 0 at no more than 25% more step time; and (issue "Speed where real models spend
it", item 3) the level-1 peak growth of the whole step at least 40% below level 0's.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_memory.py [--threads 2] [--models bert,gpt]
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_torch_argument, import_onnxtrain, median, run_torch_lanes, status_kib, torch_description  # noqa: E402

VARIANTS = ["torch", "level0", "memgrad", "level1", "level2"]
MEMORY_STEPS = 3


def training_case(name: str, steps: int):
    """(model, batches) of bench/models.py's training_loop_case; ``gpt-loss`` is the decoder with its
    loss inside (models.WithCrossEntropy), called as model(x, y)."""
    import models
    if name == "gpt-loss":
        model, batches = models.training_loop_case("gpt", steps)
        return models.WithCrossEntropy(model).train(), batches
    return models.training_loop_case(name, steps)


def loss_of(model, x, y, loss_inside: bool):
    """The step's loss: the module's own (``loss_inside``), else cross-entropy over its logits."""
    import torch
    if loss_inside:
        return model(x, y)
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def make_step(model, variant: str):
    """A callable running one SGD step of ``model`` (wrapped unless variant is torch)."""
    import torch

    import models
    loss_inside = isinstance(model, models.WithCrossEntropy)
    if variant != "torch":
        os.environ["ONNXTRAIN_MEMORY_OPT_LEVEL"] = "0" if variant == "memgrad" else variant[-1]
        os.environ["ONNXTRAIN_ENABLE_MEM_EFFICIENT_GRAD_MGMT"] = "1" if variant == "memgrad" else "0"
        from onnxtrain.torch import TrainModule
        model = TrainModule(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        loss = loss_of(model, x, y, loss_inside)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    def phases(x, y, mark):
        """The same step, calling mark(name) as the forward, the backward and the update begin."""
        mark("forward")
        loss = loss_of(model, x, y, loss_inside)
        mark("backward")
        loss.backward()
        mark("update")
        opt.step()
        opt.zero_grad()
    step.model, step.phases = model, phases
    return step


def torch_saved_bytes(model, x, y) -> int:
    """Bytes of the tensors autograd saves for backward in one eager step (each storage once)."""
    import torch

    import models

    storages = {}

    def pack(t):
        storages[t.storage().data_ptr()] = t.storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(model, x, y, isinstance(model, models.WithCrossEntropy))
    loss.backward()
    model.zero_grad()
    params = {p.storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params)


class RssTimeline:
    """The process's RSS growth over `base` (KiB), sampled every 0.2 ms by a thread while the
    steps run (the runs release the GIL), per phase: its first, last and largest sample (MiB)."""

    def __init__(self, base_kib: int):
        import threading
        self.base, self.phase, self.rows, self.running = base_kib, "", {}, True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        with open("/proc/self/statm") as f:
            while self.running:
                f.seek(0)
                mib = (int(f.read().split()[1]) * 4 - self.base) / 1024.0
                row = self.rows.setdefault(self.phase, [mib, mib, mib])
                row[1], row[2] = mib, max(row[2], mib)
                time.sleep(0.0002)

    def mark(self, phase: str):
        self.phase = phase

    def stop(self) -> dict:
        self.running = False
        self.thread.join()
        return {p: {"first": r[0], "last": r[1], "max": r[2]} for p, r in self.rows.items() if p}


def child(name: str, variant: str, threads: int, timeline: bool = False) -> dict:
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(threads)
    ot.set_num_threads(threads)
    model, batches = training_case(name, MEMORY_STEPS + 1)
    out = {}
    if variant == "torch":
        out["activation_bytes"] = torch_saved_bytes(model, *batches[0])
    step = make_step(model, variant)
    step(*batches[0])  # export and plans
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status_kib("VmRSS")
    sampler = RssTimeline(before) if timeline else None
    for k, (x, y) in enumerate(batches[1:]):
        if sampler:
            step.phases(x, y, lambda phase: sampler.mark(f"step {k + 1} {phase}"))
        else:
            step(x, y)
        if k == 0:  # the later steps add what the allocator's fragmentation holds
            out["first_step_peak_growth_mib"] = (status_kib("VmHWM") - before) / 1024.0
    out["peak_growth_mib"] = (status_kib("VmHWM") - before) / 1024.0
    if sampler:
        out["rss_timeline_mib"] = sampler.stop()
    if variant != "torch":
        stats = step.model.build_stats[0]
        out["activation_bytes"] = stats["saved_bytes"]
        out["arena"] = stats["memory"]
    return out


def fresh(name: str, variant: str, threads: int) -> dict:
    proc = subprocess.run([sys.executable, "-u", os.path.abspath(__file__), "--child", name, variant, "--threads", str(threads)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        print(f"{name}/{variant} failed: {proc.stderr.strip().splitlines()[-1:]}")
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def step_times(name: str, steps: int, threads: int) -> dict:
    """Levels 0, 1, 2 in this process, steps interleaved; median seconds after the first step."""
    import torch
    ot = import_onnxtrain()
    torch.set_num_threads(threads)
    ot.set_num_threads(threads)
    model, batches = training_case(name, steps)
    runs = {v: make_step(copy.deepcopy(model), v) for v in VARIANTS[1:]}
    times = {v: [] for v in runs}
    cpu = {v: [] for v in runs}  # the process's CPU time: steadier than wall time on a loaded machine
    losses = {v: [] for v in runs}
    order = list(runs)
    for i, (x, y) in enumerate(batches):
        order = order[1:] + order[:1]  # each variant leads a round in turn: no order bias
        for v in order:
            step = runs[v]
            start, start_cpu = time.perf_counter(), time.process_time()
            losses[v].append(step(x, y))
            if i:
                times[v].append(time.perf_counter() - start)
                cpu[v].append(time.process_time() - start_cpu)
    drift = max(abs(a - b) / abs(b) for v in runs for a, b in zip(losses[v], losses["level0"]))
    return {"ms": {v: 1e3 * median(t) for v, t in times.items()},
            "best_ms": {v: 1e3 * min(t) for v, t in times.items()},
            "cpu_ms": {v: 1e3 * median(t) for v, t in cpu.items()}, "max_loss_rel_diff": drift}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--models", default="bert,gpt")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-memory", action="store_true", help="step times only")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    parser.add_argument("--timeline", action="store_true",
                        help="with --child: the RSS growth sampled through each step's forward, backward and update")
    add_torch_argument(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, threads=args.threads, timeline=args.timeline)))
        return 0
    if not run_torch_lanes(args, argv):
        return 0
    print(f"memory optimizer benchmark, {args.threads} threads (SGD train step, batch 8, seq 128); "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}; {torch_description()}", flush=True)
    for name in args.models.split(","):
        mem = {v: ({} if args.skip_memory else fresh(name, v, args.threads)) for v in VARIANTS}
        t = step_times(name, args.steps, args.threads)
        print(f"\n{name}: peak RSS growth over {MEMORY_STEPS} steps (MiB, fresh process) / activation memory (MiB)")
        for v in VARIANTS:
            m = mem[v]
            if not m:
                if v != "torch":
                    print(f"  {v:7s} step {t['ms'][v]:7.1f} ms")
                continue
            line = (f"  {v:7s} {m['peak_growth_mib']:8.1f} MiB peak growth ({m['first_step_peak_growth_mib']:6.1f} in the first step)"
                    f"  {m['activation_bytes'] / 2**20:8.1f} MiB activations")
            if v != "torch":
                line += f"  step {t['ms'][v]:7.1f} ms"
            print(line)
            if "arena" in m:
                print(f"          {m['arena']}")
        if mem["torch"] and mem["level0"]:
            print(f"  level 0 peak / PyTorch eager peak: {mem['level0']['peak_growth_mib'] / mem['torch']['peak_growth_mib']:.2f}"
                  f" (target <= 1); first step only: "
                  f"{mem['level0']['first_step_peak_growth_mib'] / mem['torch']['first_step_peak_growth_mib']:.2f}")
        if mem["level0"] and mem["memgrad"]:
            print(f"  memory-efficient gradients: peak growth {mem['memgrad']['peak_growth_mib']:.1f} MiB against "
                  f"{mem['level0']['peak_growth_mib']:.1f} MiB at level 0 ({mem['memgrad']['peak_growth_mib'] - mem['level0']['peak_growth_mib']:+.1f} MiB); "
                  f"step {t['ms']['memgrad'] / t['ms']['level0']:.2f}x level 0")
        if mem["level0"] and mem["level1"]:
            saved = 1 - mem["level1"]["activation_bytes"] / mem["level0"]["activation_bytes"]
            print(f"  level 1 activation memory: {100 * saved:.0f}% less than level 0 (target >= 40%)")
            print(f"  level 1 peak growth (the whole step's): {100 * (1 - mem['level1']['peak_growth_mib'] / mem['level0']['peak_growth_mib']):.0f}%"
                  f" below level 0 (target >= 40%)")
        print(f"  step time (median): level 1 {t['ms']['level1'] / t['ms']['level0']:.2f}x level 0 (target <= 1.25), "
              f"level 2 {t['ms']['level2'] / t['ms']['level0']:.2f}x; best runs: level 1 "
              f"{t['best_ms']['level1'] / t['best_ms']['level0']:.2f}x, level 2 {t['best_ms']['level2'] / t['best_ms']['level0']:.2f}x")
        print(f"  step CPU time (median): level 1 {t['cpu_ms']['level1'] / t['cpu_ms']['level0']:.2f}x level 0, "
              f"level 2 {t['cpu_ms']['level2'] / t['cpu_ms']['level0']:.2f}x")
        print(f"  losses across levels: max relative difference {t['max_loss_rel_diff']:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
