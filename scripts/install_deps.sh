#!/usr/bin/env bash
# Installs the Debian packages onnxtrain needs (DESIGN.md, "Dependencies").
# Idempotent: packages already present are skipped, and apt is not touched when nothing is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libprotobuf-dev protobuf-compiler libonnx-dev   # ONNX protobuf messages
  libdnnl-dev                                     # GEMM and convolution
  zlib1g-dev                                      # deflate, for np.savez_compressed data
  libgtest-dev                                    # C++ tests
  pybind11-dev python3-dev python3-numpy          # Python bindings
  libdlpack-dev                                   # zero-copy tensor exchange with torch (TrainModule)
  python3-setuptools python3-wheel python3-build python3-venv  # pip install ., wheels (setup.py)
  python3-pytest python3-hypothesis               # Python tests
  python3-torch python3-onnx                      # oracles: autograd, ONNX node-test generators
  libtorch-dev                                    # torch's C++ headers: ORTModule's extensions (the ortmodule peer)
  python3-sklearn python3-tqdm python3-matplotlib # examples and demo
  libopenblas0-pthread                            # an optimised BLAS for numpy/torch, the benchmark peers
  libopenmpi-dev openmpi-bin python3-mpi4py       # data-parallel training (src/distributed)
  g++-aarch64-linux-gnu qemu-user                 # the minimal runtime for aarch64 (make cross-aarch64)
  libxnnpack-dev libpthreadpool-dev               # XNNPACK, measured against our GEMM (bench/gemm_backends.cc)
  emscripten                                      # the WebAssembly build (make web; node runs its tests)
  chromium chromium-driver python3-selenium python3-pil  # the demo page's headless browser test
  node-typescript                                 # tsc checks web/onnxtrain.d.ts (make test-web)
  clang-14 libclang-rt-14-dev libomp-14-dev      # libFuzzer targets with ASan + UBSan (make fuzz, tests/fuzz)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all packages present"
fi
