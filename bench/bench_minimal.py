#!/usr/bin/env python3
"""The minimal training runtime's footprint (make bench): stripped library size for every op, for the
digits CNN's op set and for a BERT-style classifier's op set (targets: 3 MB and 6 MB), against the
full build with the libraries it loads; peak RSS and wall time of training the digits artifacts from
C (examples/c/train_digits.c) on both builds, interleaved, medians (target: minimal within 1.3x);
startup to the first train step from the ONNX files and from the pre-compiled form (`onnxtrain
compile`) on both builds (bench/startup.cc, a fresh process per run, interleaved, medians; target:
pre-compiled at least 5x faster).

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_minimal.py [--repeats 3] [--epochs 5]
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_minimal.py --startup-only [--repeats 7]
    PYTHONPATH=build/python /usr/bin/python3 bench/bench_minimal.py --training-only [--repeats 7]

--training-only (about 1 minute) takes build/ and build-minimal-digits/ as they are: their stripped
sizes, and the digits training from C on one thread, interleaved pairs, medians of wall and CPU time.

Builds the op-set variants into build-minimal-<name>/ (cmake, ccache), writes bench/out/minimal/.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import import_onnxtrain, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "out", "minimal")
DIGITS = os.path.join(ROOT, "examples", "out")


def run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def build_minimal(name: str, ops_file: str | None) -> str:
    """Configures and builds a minimal runtime (tests and examples included); returns its directory."""
    build = os.path.join(ROOT, f"build-minimal-{name}" if ops_file else "build-minimal")
    cmd = ["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DONNXTRAIN_MINIMAL=ON",
           f"-DONNXTRAIN_OPS_FILE={ops_file or ''}"]
    if subprocess.run(["which", "ccache"], capture_output=True).returncode == 0:
        cmd += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
    run(cmd, stdout=subprocess.DEVNULL)
    run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2)], stdout=subprocess.DEVNULL)
    return build


def stripped_mb(path: str) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lib.so")
        run(["strip", "-o", out, path])
        return os.path.getsize(out) / 1e6


def loaded_libraries(lib: str) -> list:
    """The libraries ldd resolves for lib, except the C/C++ runtime every program has."""
    common = ("libc.so", "libm.so", "libstdc++", "libgcc_s", "ld-linux", "linux-vdso", "libgomp")
    paths = []
    for line in subprocess.run(["ldd", lib], capture_output=True, text=True).stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            path = parts[1].split("(")[0].strip()
            if not any(c in path for c in common):
                paths.append(os.path.realpath(path))
    return paths


def bert_ops_file() -> str:
    """Training artifacts of bench_training's BERT classifier (hidden 256, 4 layers); their ops.txt."""
    onnxtrain = import_onnxtrain()
    del onnxtrain
    from onnxtrain import artifacts

    import bench_training
    directory = os.path.join(OUT, "bert_artifacts")
    _, model, x, _ = bench_training.build("bert")
    data = bench_training.export_training(model, (x,), ["x"], ["logits"])
    artifacts.generate_artifacts(data, requires_grad=bench_training.parameter_names(model),
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.AdamW(lr=1e-3),
                                 artifact_directory=directory)
    return os.path.join(directory, "ops.txt")


def train_digits_c(build: str, epochs: int, threads: int | None = 1) -> tuple:
    """(wall seconds, peak RSS in MB, test accuracy, CPU seconds) of the C example on the digits
    artifacts, on `threads` OpenMP threads (None: the environment's)."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen([os.path.join(build, "examples", "train_digits_c"),
                                 os.path.join(DIGITS, "digits_artifacts"), os.path.join(DIGITS, "digits_raw"), out,
                                 "0", str(epochs)], stdout=subprocess.PIPE, text=True, env=env)
        stdout = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        if status != 0:
            raise RuntimeError(f"train_digits_c on {build} failed:\n{stdout}")
        accuracy = float(stdout.split("test accuracy ")[1].split()[0])
        return seconds, usage.ru_maxrss / 1024, accuracy, usage.ru_utime + usage.ru_stime


def training_speed(full: str, minimal: str, epochs: int, repeats: int) -> None:
    """The digits training from C on both builds, one thread, interleaved pairs (a warm-up pair
    first), medians of wall and CPU time and of the per-pair ratios (target: minimal <= 1.3x)."""
    train_digits_c(full, epochs), train_digits_c(minimal, epochs)
    results = {"full": [], "minimal": []}
    for _ in range(repeats):
        for name, build in (("full", full), ("minimal", minimal)):
            results[name].append(train_digits_c(build, epochs))
    for name, rows in results.items():
        print(f"digits training from C, {epochs} epochs, 1 thread, {name:7s}: median wall {median([r[0] for r in rows]):.2f} s, "
              f"CPU {median([r[3] for r in rows]):.2f} s, peak RSS {max(r[1] for r in rows):.1f} MB, "
              f"accuracy {rows[-1][2]:.4f}")
    for what, i in (("wall", 0), ("CPU", 3)):
        ratio = median([m[i] / f[i] for m, f in zip(results["minimal"], results["full"])])
        print(f"minimal / full training {what} time: {ratio:.2f}x (median of {repeats} interleaved pairs; target <= 1.3x)")


# The artifacts startup is measured on, with the inputs bench/startup.cc feeds (zeros).
STARTUP_MODELS = {
    "digits CNN, batch 32": (os.path.join(DIGITS, "digits_artifacts"), ["input=32,1,8,8", "target=32:i64"]),
    "BERT classifier, batch 8 x 128": (os.path.join(OUT, "bert_artifacts"), ["x=8,128:i64", "target=8:i64"]),
}
STARTUP_FIELDS = ("checkpoint", "module", "optimizer", "first_step", "startup", "steady_step",
                  "checkpoint_cpu", "module_cpu", "optimizer_cpu", "first_step_cpu", "startup_cpu", "steady_step_cpu",
                  "startup_faults", "first_step_faults", "steady_step_faults", "before_main")


def run_startup(build: str, directory: str, inputs: list, compile_first: bool = False) -> dict:
    """One fresh process of bench/startup.cc on one thread: its milliseconds by field."""
    program = os.path.join(build, "bench", "startup")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if compile_first:
        subprocess.run([program, "--compile", directory, *inputs], check=True, env=env, stdout=subprocess.DEVNULL)
        return {}
    env["ONNXTRAIN_BENCH_SPAWN_NS"] = str(time.clock_gettime_ns(time.CLOCK_MONOTONIC))  # for before_main
    out = subprocess.run([program, directory, *inputs], check=True, env=env, capture_output=True, text=True)
    if "note:" in out.stderr:
        raise RuntimeError(f"startup on {directory} printed a note: {out.stderr}")
    words = out.stdout.split()
    return {words[i]: float(words[i + 1]) for i in range(0, len(words), 2)}


def run_first_touch(build: str) -> dict:
    """bench/startup.cc --first-touch: ms per MiB to write fresh memory in 4 KiB and in 2 MiB pages."""
    out = subprocess.run([os.path.join(build, "bench", "startup"), "--first-touch", "64"], check=True,
                         capture_output=True, text=True)
    words = out.stdout.split()
    return {words[i]: float(words[i + 1]) for i in range(0, len(words), 2)}


def startup(builds: dict, repeats: int) -> None:
    """Startup to the first train step, ONNX files against the pre-compiled form, per build and model:
    copies of the artifacts (one compiled by the build that runs it), runs interleaved, medians.
    "overhead" is what the first step costs beyond an ordinary one: startup minus a steady step."""
    print(f"# Startup to the first train step ({time.strftime('%Y-%m-%d')}, one thread, fresh process per run, "
          f"medians of {repeats})")
    # What the startup that is left is made of on this machine: writing fresh memory.
    touch = [run_first_touch(next(iter(builds.values()))) for _ in range(repeats)]
    print(f"first write of 64 MiB of fresh memory: {median([t['first_touch_4k_ms_per_mib'] for t in touch]):.2f} ms per "
          f"MiB in 4 KiB pages, {median([t['first_touch_2m_ms_per_mib'] for t in touch]):.2f} ms per MiB in 2 MiB pages")
    for model, (source, inputs) in STARTUP_MODELS.items():
        if not os.path.isdir(source):
            print(f"{model}: no artifacts at {source}, skipped")
            continue
        for build_name, build in builds.items():
            dirs = {}
            for form in ("onnx", "compiled"):
                d = os.path.join(OUT, "startup", f"{os.path.basename(build)}_{os.path.basename(source)}_{form}")
                shutil.rmtree(d, ignore_errors=True)
                shutil.copytree(source, d)
                dirs[form] = d
            run_startup(build, dirs["compiled"], inputs, compile_first=True)
            rows = {form: [] for form in dirs}
            for _ in range(repeats):
                for form, d in dirs.items():
                    rows[form].append(run_startup(build, d, inputs))
            med = {form: {f: median([r[f] for r in rs]) for f in STARTUP_FIELDS} for form, rs in rows.items()}
            for form, m in med.items():
                print(f"{model}, {build_name:7s}, {form:8s}: checkpoint {m['checkpoint']:.1f} ms, Module "
                      f"{m['module']:.1f} ms, Optimizer {m['optimizer']:.1f} ms, first step {m['first_step']:.1f} ms; "
                      f"startup {m['startup']:.1f} ms (a steady step {m['steady_step']:.1f} ms)")
                # CPU time of the main thread (one OpenMP thread: all the work) is what load on a
                # shared machine changes least; page faults are what the VM's fault cost multiplies.
                print(f"{'':{len(model) + 20}s}CPU time: checkpoint {m['checkpoint_cpu']:.2f}, Module {m['module_cpu']:.2f}, "
                      f"Optimizer {m['optimizer_cpu']:.2f}, first step {m['first_step_cpu']:.2f}, startup "
                      f"{m['startup_cpu']:.2f} ms (a steady step {m['steady_step_cpu']:.2f} ms); page faults: startup "
                      f"{m['startup_faults']:.0f}, of them the first step {m['first_step_faults']:.0f} (a steady step at most "
                      f"{m['steady_step_faults']:.0f}); before main (spawn, exec, loading the libraries, not "
                      f"counted) {m['before_main']:.1f} ms")
            ratio = median([o["startup"] / c["startup"] for o, c in zip(rows["onnx"], rows["compiled"])])
            overhead = median([(o["startup"] - o["steady_step"]) / max(c["startup"] - c["steady_step"], 1e-3)
                               for o, c in zip(rows["onnx"], rows["compiled"])])
            graphs = median([(o["module"] + o["optimizer"]) / (c["module"] + c["optimizer"])
                             for o, c in zip(rows["onnx"], rows["compiled"])])
            cpu_ratio = median([o["startup_cpu"] / c["startup_cpu"] for o, c in zip(rows["onnx"], rows["compiled"])])
            # The most any pre-compiled form could give, since its startup includes one step: ONNX
            # startup over a steady step, in CPU time (wall time of one step swings with the load).
            bound = median([o["startup_cpu"] / c["steady_step_cpu"] for o, c in zip(rows["onnx"], rows["compiled"])])
            print(f"{model}, {build_name:7s}: ONNX / pre-compiled startup {ratio:.2f}x (CPU time {cpu_ratio:.2f}x; "
                  f"at most {bound:.2f}x: ONNX startup / a steady step, CPU), overhead beyond a steady step "
                  f"{overhead:.2f}x, Module + Optimizer construction {graphs:.2f}x (target: startup >= 5x)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--full-build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--startup-only", action="store_true",
                        help="only the startup comparison, on build/ and build-minimal/ as they are")
    parser.add_argument("--training-only", action="store_true",
                        help="only sizes and training speed, on build/ and build-minimal-digits/ as they are")
    args = parser.parse_args(argv)
    if args.training_only:
        minimal = os.path.join(ROOT, "build-minimal-digits")
        for name, build in (("full", args.full_build), ("minimal, digits CNN ops", minimal)):
            print(f"{name}: libonnxtrain.so {stripped_mb(os.path.join(build, 'libonnxtrain.so')):.2f} MB stripped")
        training_speed(args.full_build, minimal, args.epochs, args.repeats)
        return 0
    os.makedirs(OUT, exist_ok=True)
    if not os.path.isfile(os.path.join(DIGITS, "digits_artifacts", "ops.txt")):
        run([sys.executable, os.path.join(ROOT, "examples", "demo.py")], stdout=subprocess.DEVNULL)
    if args.startup_only:
        if not os.path.isdir(os.path.join(OUT, "bert_artifacts")):
            bert_ops_file()
        startup({"full": args.full_build, "minimal": os.path.join(ROOT, "build-minimal")}, args.repeats)
        return 0

    builds = {"every op": build_minimal("all", None),
              "digits CNN ops": build_minimal("digits", os.path.join(DIGITS, "digits_artifacts", "ops.txt")),
              "BERT classifier ops": build_minimal("bert", bert_ops_file())}
    full_lib = os.path.join(args.full_build, "libonnxtrain.so")
    full_deps = loaded_libraries(full_lib)
    print(f"# Minimal runtime footprint ({time.strftime('%Y-%m-%d')}, {os.uname().machine})")
    print(f"full build: libonnxtrain.so {stripped_mb(full_lib):.2f} MB stripped, plus "
          f"{sum(os.path.getsize(p) for p in full_deps) / 1e6:.1f} MB of libraries it loads "
          f"({', '.join(os.path.basename(p) for p in full_deps)})")
    for what, build in builds.items():
        lib = os.path.join(build, "libonnxtrain.so")
        print(f"minimal, {what:20s}: libonnxtrain.so {stripped_mb(lib):.2f} MB stripped; "
              f"libraries beyond libc/libstdc++/libgomp: {len(loaded_libraries(lib))}")

    # Training speed and memory: the same C program and artifacts on both builds, interleaved.
    training_speed(args.full_build, builds["digits CNN ops"], args.epochs, args.repeats)
    startup({"full": args.full_build, "minimal": builds["every op"]}, max(args.repeats, 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
