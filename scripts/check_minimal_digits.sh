#!/usr/bin/env bash
# The digits demo's prepared artifacts trained by the same C++ and C programs on the full build and
# on the minimal runtime: both must reach MIN_ACCURACY, and their trained checkpoints must be
# byte-for-byte identical (both builds run the digits CNN's convolutions, pooling and matmuls
# through the same portable kernels, src/backends/cpu/portable.h). Exits 1 otherwise, printing how
# far the parameters are apart.
#
#   scripts/check_minimal_digits.sh FULL_BUILD MINIMAL_BUILD [MIN_ACCURACY] [EPOCHS]
#
# Needs examples/out/ from examples/demo.py (make demo); FULL_BUILD's Python package only to report
# a difference.
set -euo pipefail
full=$(cd "$1" && pwd) minimal=$(cd "$2" && pwd) min_accuracy=${3:-0.97} epochs=${4:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
artifacts=$root/examples/out/digits_artifacts
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for build in full minimal; do
  dir=${!build}
  mkdir -p "$out/$build-cpp" "$out/$build-c"
  echo "== $build build ($dir)"
  "$dir/examples/train_digits" "$artifacts" "$root/examples/out/digits.npz" "$out/$build-cpp" "$min_accuracy" \
    --epochs "$epochs" | grep 'test accuracy' | sed 's/^/C++: /'
  "$dir/examples/train_digits_c" "$artifacts" "$root/examples/out/digits_raw" "$out/$build-c" "$min_accuracy" \
    "$epochs" | grep 'test accuracy' | sed 's/^/C:   /'
done
status=0
for lang in cpp c; do
  if cmp -s "$out/full-$lang/checkpoint" "$out/minimal-$lang/checkpoint"; then
    echo "$lang: checkpoints byte-for-byte identical ($(wc -c < "$out/full-$lang/checkpoint") bytes)"
    continue
  fi
  status=1
  PYTHONPATH=$full/python:${PYTHONPATH:-} /usr/bin/python3 - "$out" "$lang" <<'PY' || echo "$lang: checkpoints differ"
import sys
import numpy as np
from onnxtrain.api import CheckpointState

out, lang = sys.argv[1:]
full = CheckpointState.load_checkpoint(f"{out}/full-{lang}/checkpoint").parameters
minimal = CheckpointState.load_checkpoint(f"{out}/minimal-{lang}/checkpoint").parameters
worst = max(float(np.max(np.abs(np.asarray(full[n].data) - np.asarray(minimal[n].data))) /
                  max(float(np.max(np.abs(np.asarray(full[n].data)))), 1e-30)) for n in full.keys())
print(f"{lang}: checkpoints differ; max |full - minimal| / max |full| over the parameters: {worst:.2e}")
PY
done
exit $status
