#!/usr/bin/env bash
# The digits demo's prepared artifacts trained by the same C++ and C programs on the full build and
# on the minimal runtime: both must reach MIN_ACCURACY; prints each accuracy and how far the
# trained parameters of the two builds are apart (they differ in the last bits: the minimal build's
# GEMM sums in another order than oneDNN's).
#
#   scripts/check_minimal_digits.sh FULL_BUILD MINIMAL_BUILD [MIN_ACCURACY]
#
# Needs examples/out/ from examples/demo.py (make demo) and FULL_BUILD's Python package.
set -euo pipefail
full=$1 minimal=$2 min_accuracy=${3:-0.97}
root=$(cd "$(dirname "$0")/.." && pwd)
artifacts=$root/examples/out/digits_artifacts
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for build in full minimal; do
  dir=${!build}
  mkdir -p "$out/$build-cpp" "$out/$build-c"
  echo "== $build build ($dir)"
  "$dir/examples/train_digits" "$artifacts" "$root/examples/out/digits.npz" "$out/$build-cpp" "$min_accuracy" \
    | grep 'test accuracy' | sed 's/^/C++: /'
  "$dir/examples/train_digits_c" "$artifacts" "$root/examples/out/digits_raw" "$out/$build-c" "$min_accuracy" \
    | grep 'test accuracy' | sed 's/^/C:   /'
done
PYTHONPATH=$root/$full/python:${PYTHONPATH:-} /usr/bin/python3 - "$out" <<'PY'
import sys
import numpy as np
from onnxtrain.api import CheckpointState

out = sys.argv[1]
for lang in ("cpp", "c"):
    full = CheckpointState.load_checkpoint(f"{out}/full-{lang}/checkpoint").parameters
    minimal = CheckpointState.load_checkpoint(f"{out}/minimal-{lang}/checkpoint").parameters
    worst, identical = 0.0, True
    for name in full.keys():
        a, b = np.asarray(full[name].data), np.asarray(minimal[name].data)
        identical &= np.array_equal(a, b)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30)))
    print(f"{lang}: parameters {'bit-identical' if identical else 'differ'}; "
          f"max |full - minimal| / max |full| over the tensors: {worst:.2e}")
PY
