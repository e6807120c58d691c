#!/usr/bin/env python3
"""The minimal training runtime's footprint (make bench): stripped library size for every op, for the
digits CNN's op set and for a BERT-style classifier's op set (targets: 3 MB and 6 MB), against the
full build with the libraries it loads; peak RSS and wall time of training the digits artifacts from
C (examples/c/train_digits.c) on both builds, interleaved, medians (target: minimal within 1.3x).

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_minimal.py [--repeats 3] [--epochs 5]

Builds the op-set variants into build-minimal-<name>/ (cmake, ccache), writes bench/out/minimal/.
"""
from __future__ import annotations

import argparse
import os
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


def train_digits_c(build: str, epochs: int) -> tuple:
    """(wall seconds, peak RSS in MB, test accuracy) of the C example on the digits artifacts."""
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.Popen([os.path.join(build, "examples", "train_digits_c"),
                                 os.path.join(DIGITS, "digits_artifacts"), os.path.join(DIGITS, "digits_raw"), out,
                                 "0", str(epochs)], stdout=subprocess.PIPE, text=True)
        stdout = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        if status != 0:
            raise RuntimeError(f"train_digits_c on {build} failed:\n{stdout}")
        accuracy = float(stdout.split("test accuracy ")[1].split()[0])
        return seconds, usage.ru_maxrss / 1024, accuracy


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--full-build", default=os.path.join(ROOT, "build"))
    args = parser.parse_args(argv)
    os.makedirs(OUT, exist_ok=True)
    if not os.path.isfile(os.path.join(DIGITS, "digits_artifacts", "ops.txt")):
        run([sys.executable, os.path.join(ROOT, "examples", "demo.py")], stdout=subprocess.DEVNULL)

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
    minimal = builds["digits CNN ops"]
    results = {"full": [], "minimal": []}
    for _ in range(args.repeats):
        for name, build in (("full", args.full_build), ("minimal", minimal)):
            results[name].append(train_digits_c(build, args.epochs))
    for name, rows in results.items():
        print(f"digits training from C, {args.epochs} epochs, {name:7s}: median {median([r[0] for r in rows]):.2f} s, "
              f"peak RSS {max(r[1] for r in rows):.1f} MB, accuracy {rows[-1][2]:.4f}")
    ratio = median([m[0] / f[0] for m, f in zip(results["minimal"], results["full"])])
    print(f"minimal / full training time: {ratio:.2f}x (median of {args.repeats} interleaved pairs; target <= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
