#!/usr/bin/env bash
# The installed package, used as a user would: `cmake --install` into a fresh prefix, then
#  - the C++ example (train_digits) and the C example (train_mlp_c) built out of tree with
#    find_package(onnxtrain CONFIG REQUIRED) against that prefix only;
#  - the C example built again with the C compiler alone, from the installed c_api.h and library;
#  - both C builds train the MLP of tests/models, and train_digits trains its artifacts again on
#    the same problem written as .npz; each exits non-zero when training does not work.
#
#   check_install.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC [COMPILER_LAUNCHER]
set -euo pipefail
if (($# < 6)); then
  echo "usage: $0 CMAKE BUILD_DIR SOURCE_DIR WORK_DIR LIBDIR CC [COMPILER_LAUNCHER]" >&2
  exit 2
fi
cmake=$1 build=$2 source=$3 work=$4 libdir=$5 cc=$6 launcher=${7:-}
prefix=$work/prefix
model=$source/tests/models/mlp_classifier.onnx

# Runs a command with its output in $work/LOG, which is shown when the command fails.
step() {
  local log=$work/$1
  shift
  "$@" >"$log" 2>&1 || { local rc=$?; echo "check_install: $* exited $rc:" >&2; tail -n 40 "$log" >&2; exit 1; }
}

rm -rf "$work"
mkdir -p "$work"
step install.log "$cmake" --install "$build" --prefix "$prefix"

for f in include/onnxtrain/onnxtrain.h include/onnxtrain/c_api.h bin/onnxtrain "$libdir/libonnxtrain.so" \
         "$libdir/cmake/onnxtrain/onnxtrainConfig.cmake" "$libdir/cmake/onnxtrain/onnxtrainConfigVersion.cmake"; do
  [[ -e $prefix/$f ]] || { echo "check_install: $prefix/$f was not installed" >&2; exit 1; }
done
# oneDNN is private to libonnxtrain: a consumer must not need its CMake package or headers.
if grep -il dnnl "$prefix/$libdir/cmake/onnxtrain/"*.cmake; then
  echo "check_install: the installed CMake package mentions oneDNN" >&2
  exit 1
fi
"$prefix/bin/onnxtrain" --help | grep -q "usage: onnxtrain"

launcher_args=()
[[ -n $launcher ]] && launcher_args=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" -DCMAKE_C_COMPILER_LAUNCHER="$launcher")
step configure.log "$cmake" -S "$source/tests/install" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DONNXTRAIN_EXAMPLES_DIR="$source/examples" "${launcher_args[@]}"
step build.log "$cmake" --build "$work/consumer"
if grep -q -- "-I$source/include\|$build/libonnxtrain" "$work/consumer/build.ninja"; then
  echo "check_install: the consumer compiles against onnxtrain's source or build tree" >&2
  exit 1
fi

# C with no CMake at all: the installed header and library.
step cc.log "$cc" -std=c99 -Wall -Wextra -Werror -pedantic -I"$prefix/include" "$source/examples/c/train_mlp.c" \
  -L"$prefix/$libdir" -lonnxtrain -lm -Wl,-rpath,"$prefix/$libdir" -o "$work/train_mlp_plain"
step train_mlp_plain.log "$work/train_mlp_plain" "$model" "$work/mlp_plain" 5

step train_mlp_c.log "$work/consumer/train_mlp_c" "$model" "$work/mlp"
step make_rings.log "$work/consumer/make_rings" "$work/rings.npz"
step train_digits.log "$work/consumer/train_digits" "$work/mlp" "$work/rings.npz" "$work/cpp" 0.9 --epochs 10 --lr 0.01
echo "check_install: installed to $prefix; the C++ and C examples built against it and trained"
