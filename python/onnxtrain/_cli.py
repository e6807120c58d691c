"""The `onnxtrain` command of an installed package: runs the C++ command line shipped inside it
(onnxtrain/bin/onnxtrain), which needs no Python; pip's console script calls `main`."""
import os
import sys


def main() -> None:
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "onnxtrain")
    if not os.access(program, os.X_OK):
        sys.exit(f"onnxtrain: the command line program {program} is missing or not executable; "
                 "reinstall the package (pip install --no-build-isolation .)")
    os.execv(program, [program, *sys.argv[1:]])
