#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (see /work/.library/device/README.md where this
# workplace has one). On the lent machine, in under 8 minutes: builds the minimal runtime with the
# CUDA backend (no protobuf or oneDNN there; GoogleTest from carried sources), runs the GPU tests
# (every CUDA kernel against its CPU kernel, an MLP training step against CPU training, and
# BERT-, GPT- and ResNet-style models trained 50 steps by a Module on each device, from artifacts
# made here), compute-sanitizer memcheck over them, and the kernel benchmark beside PyTorch's;
# every failure is collected, none stops the rest. Writes a compact report.txt plus the logs to
# $OUT (or ./gpu_check_out), and exits non-zero when anything failed.
#
#   here, once:   scripts/gpu_check.sh --prepare          (GoogleTest's sources and the training
#                                                          artifacts into .gpu_carry/; needs `make build`)
#   device tool:  run(command="scripts/gpu_check.sh", carry=[".gpu_carry"], timeout_s=540)
#   --no-bench:   everything but the kernel benchmarks (a rerun after changes that touch no kernel)
#   --training-bench: also train GPT-2 124M (bf16), BERT-base and ResNet-50 steps on both engines
#                 (bench/cuda_training.cc beside bench/cuda_training_torch.py; a few minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu_carry

if [ "${1:-}" = "--prepare" ]; then
  mkdir -p "$CARRY"
  rm -rf "$CARRY/googletest" && cp -r /usr/src/googletest "$CARRY/googletest"  # .gitignore ignores $CARRY
  # The training test's artifacts and batches, and their op list (the minimal build's ops).
  rm -rf "$CARRY/training" "$CARRY/bench"
  PYTHONPATH=build/python /usr/bin/python3 tests/cuda/make_training_artifacts.py "$CARRY/training" || exit 1
  # The training benchmark's models (GPT-2 124M, BERT-base, ResNet-50), gzipped: about 1 MB.
  PYTHONPATH=build/python /usr/bin/python3 bench/cuda_training_models.py "$CARRY/bench" || exit 1
  du -sh "$CARRY"
  exit 0
fi

BENCH=1
TRAINING_BENCH=0
for arg in "$@"; do
  case $arg in
    --no-bench) BENCH=0 ;;
    --training-bench) TRAINING_BENCH=1 ;;
    *) echo "gpu_check: unknown option $arg" >&2; exit 2 ;;
  esac
done
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
REPORT=$OUT/report.txt
: > "$REPORT"
failures=()
start=$(date +%s)
note() { echo "$*" | tee -a "$REPORT"; }
elapsed() { echo $(( $(date +%s) - start ))s; }
# phase NAME SECONDS LOG COMMAND...: runs under a time limit, logs everything, records a failure.
phase() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  note "$(printf '%-12s rc=%-3s %4ss  (log: %s)' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$log")"
  [ $rc -eq 0 ] || failures+=("$name (rc $rc$([ $rc -eq 124 ] && echo ', timed out'))")
  return $rc
}

{
  date -u; uname -a
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
  command -v nvcc && nvcc --version | tail -2
  cmake --version | head -1; ninja --version; g++ --version | head -1; nproc
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
} > "$OUT/env.txt" 2>&1
note "gpu_check $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

export PATH=/usr/local/cuda/bin:/usr/local/cuda/compute-sanitizer:$PATH
BUILD=build-gpu
GTEST_SRC=$PWD/$CARRY/googletest
[ -d "$GTEST_SRC" ] || GTEST_SRC=/usr/src/googletest
# The minimal runtime (no external libraries) with the ops the GPU tests use; every CUDA kernel.
OPS="MatMul;Gemm;FusedMatMul;Add;Sub;Mul;Div;Relu;Neg;Abs;Exp;Log;Sqrt;Reciprocal;Tanh;Sigmoid;ReluGrad"
OPS="$OPS;ReduceSum;ReduceMean;Softmax;LogSoftmax;SoftmaxGrad;LogSoftmaxGrad;SoftmaxGrad_13;LogSoftmaxGrad_13;If"
OPS="$OPS;LayerNormalization;LayerNormalizationGrad;SoftmaxCrossEntropyLoss;SoftmaxCrossEntropyLossGrad;AdamW;Cos"
OPS="$OPS;Transpose;Reshape;Flatten;Squeeze;Unsqueeze;Identity;Expand;Concat;Slice;SliceGrad;Sum;SumTo"
OPS="$OPS;Gather;GatherGrad;Gelu;GeluGrad;Erf;LinearSoftmaxCrossEntropy"
# The training test's and the training benchmark's models: their ops, and where the test finds them.
TRAINING=$PWD/$CARRY/training
MODELS=$PWD/$CARRY/bench
for f in "$TRAINING/ops.txt" "$MODELS/ops.txt"; do
  [ -f "$f" ] || { note "no $f: run scripts/gpu_check.sh --prepare here first"; failures+=("$f missing"); }
done
OPS_FILE=$OUT/ops.txt
cat "$TRAINING/ops.txt" "$MODELS/ops.txt" 2>/dev/null | sort -u > "$OPS_FILE"
export ONNXTRAIN_GPU_TRAINING=$TRAINING
phase configure 120 configure.log cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DONNXTRAIN_MINIMAL=ON \
  -DONNXTRAIN_CUDA=ON -DONNXTRAIN_BUILD_EXAMPLES=OFF -DONNXTRAIN_GTEST_SOURCE="$GTEST_SRC" "-DONNXTRAIN_OPS=$OPS" \
  "-DONNXTRAIN_OPS_FILE=$OPS_FILE" &&
phase build 300 build.log cmake --build $BUILD -j "$(nproc)" --target onnxtrain_cuda_tests cuda_kernels_bench \
  cuda_training_bench
built=$?

if [ $built -eq 0 ]; then
  phase gpu-tests 120 gpu_tests.log $BUILD/onnxtrain_cuda_tests --gtest_output=xml:"$OUT/gpu_tests.xml"
  # One line per failed or skipped test (parameterized ones: Models/Suite.Test/0, where ...); a
  # skip here means the GPU or the training artifacts were not found: a failure too.
  grep -E '^\[  (FAILED|SKIPPED)  ?\] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+(,|$)' "$OUT/gpu_tests.log" | sort -u | tee -a "$REPORT"
  grep -E '^\[  PASSED  \]' "$OUT/gpu_tests.log" | tee -a "$REPORT"
  if grep -qE '^\[  SKIPPED \] [A-Za-z0-9_/]+\.' "$OUT/gpu_tests.log"; then
    failures+=("gpu-tests skipped: $(grep -m1 -A1 ': Skipped$' "$OUT/gpu_tests.log" | tail -1)")
  fi
  # Memcheck over the GPU tests (the training ones too: their steps reuse the arena across runs).
  if command -v compute-sanitizer > /dev/null; then
    phase memcheck 150 memcheck.log compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
      $BUILD/onnxtrain_cuda_tests
    grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1 | tee -a "$REPORT"
  else
    note "memcheck     not run: compute-sanitizer is not on the PATH"; failures+=("memcheck (no compute-sanitizer)")
  fi
  [ $BENCH -eq 1 ] && phase bench 90 bench.log $BUILD/bench/cuda_kernels_bench
fi
[ $BENCH -eq 1 ] && phase bench-torch 90 bench_torch.log python3 bench/cuda_kernels_torch.py

# The benchmark: ours and PyTorch's, line by line, with the ratio of rates (>1: ours faster).
if [ -s "$OUT/bench.log" ] && [ -s "$OUT/bench_torch.log" ]; then
  note ""
  note "kernel                              ours (rate)   torch (rate)   ours/torch"
  python3 - "$OUT/bench.log" "$OUT/bench_torch.log" <<'PY' | tee -a "$REPORT"
import re, sys
def rows(path):
    out = {}
    for line in open(path):
        m = re.match(r"(.{34}) +([\d.]+) ms +([\d.]+) (\S+)", line)
        if m: out[m.group(1).strip()] = (float(m.group(3)), m.group(4))
    return out
ours, torch = rows(sys.argv[1]), rows(sys.argv[2])
for name, (rate, unit) in ours.items():
    t = torch.get(name)
    torch_rate = t[0] if t else float("nan")
    ratio = rate / torch_rate if torch_rate else float("nan")
    print(f"{name:<34} {rate:8.1f} {unit:<8} {torch_rate:8.1f}   {ratio:6.2f}")
PY
fi

# Whole training steps, ours (Module on the GPU) beside PyTorch's (eager and compiled), same card.
if [ $TRAINING_BENCH -eq 1 ] && [ "${built:-1}" -eq 0 ]; then
  unzipped=$(mktemp -d)
  cp -r "$MODELS"/. "$unzipped" && gunzip -f "$unzipped"/*/*.gz
  phase train-ours 300 training_bench.log $BUILD/bench/cuda_training_bench "$unzipped" 5
  phase train-torch 300 training_torch.log python3 bench/cuda_training_torch.py --steps 5
  note ""
  grep -hE '^(gpt2|bert|resnet50) ' "$OUT/training_bench.log" "$OUT/training_torch.log" | sort -s -k1,1 | tee -a "$REPORT"
fi

note ""
note "elapsed $(elapsed)"
if [ ${#failures[@]} -eq 0 ]; then
  note "RESULT: all passed"
  exit 0
fi
note "RESULT: ${#failures[@]} failed: $(printf "%s; " "${failures[@]}")"
exit 1
