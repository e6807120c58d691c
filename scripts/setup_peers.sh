#!/usr/bin/env bash
# Creates the peers: pinned Python virtual environments, outside the repository, holding the
# engines onnxtrain is checked and timed against. Tests and benchmarks run a peer's interpreter in
# a subprocess (bench/peers.py finds it), never two ONNX Runtimes or two torches in one process.
#
#   scripts/setup_peers.sh                 # every peer
#   scripts/setup_peers.sh ort torch2      # only these
#   scripts/setup_peers.sh --list          # name, pins and state of each peer
#
# Each venv is made with `--system-site-packages` on Debian's /usr/bin/python3, so Debian's numpy,
# onnx and torch stay visible where a peer does not bring its own. Idempotent and offline once done:
# a venv whose stamp (.onnxtrain-peer) records the same pins is left alone. A venv without its
# stamp (an install cut off half-way) is deleted and made again, so no half-installed peer is
# ever trusted. The venvs live in $ONNXTRAIN_PEERS_DIR (default ~/.cache/onnxtrain/peers).
set -euo pipefail

PYTHON=${PEERS_PYTHON:-/usr/bin/python3}
PEERS_DIR=${ONNXTRAIN_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxtrain/peers}
ALL_PEERS=(ort ort-training ortmodule torch2 hf113)

# The pip installs of a peer, one pip call per line. Debian's torch calls itself 1.13.0a0, older
# than 1.13.0 to pip: a package that pins torch>=1.13 goes in with --no-deps and its other
# dependencies are named.
peer_installs() {
  case "$1" in
    # The current ONNX Runtime: the inference reference of tests and benchmarks.
    ort) echo "onnxruntime==1.31.1" ;;
    # ONNX Runtime's last training release: the on-device training API, the artifact generator.
    # onnx 1.16 is the newest that writes IR 10, the highest ORT 1.19 reads. PyPI's protobuf (upb)
    # keeps its own descriptor pool: Debian's C++ protobuf, loaded by Debian's torch, holds onnx
    # 1.12's onnx.proto, which breaks onnx 1.16's import when torch comes first.
    ort-training) echo "onnxruntime-training-cpu==1.19.2 onnx==1.16.2 protobuf==4.25.8 numpy<2" ;;
    # The same release's PyTorch front end, ORTModule, on Debian's torch 1.13 (a venv of its own:
    # its C++ extensions, below, take minutes to build and only the ORTModule benchmark needs them).
    ortmodule) echo "onnxruntime-training-cpu==1.19.2 onnx==1.16.2 protobuf==4.25.8 numpy<2" ;;
    # PyTorch 2.x from PyPI (with its CUDA libraries on Linux), for TrainModule where users are, and
    # the Hugging Face stack its users train with (accelerate is what transformers.Trainer needs).
    torch2) printf '%s\n' "torch==2.15.0" "transformers==5.24.0 peft==0.21.2 accelerate==1.15.0" ;;
    # The Hugging Face stack on Debian's torch 1.13: transformers 4.47 is the last release that
    # supports torch 1.13. peft pins torch>=1.13, which Debian's 1.13.0a0 is not to pip; its other
    # dependencies come with transformers and accelerate.
    hf113) printf '%s\n' "transformers==4.47.1 accelerate==1.2.1" "--no-deps peft==0.14.0" ;;
    *) return 1 ;;
  esac
}

# What a peer builds after its pip installs, as arguments of its interpreter. ORTModule's extensions
# (aten_op_executor, torch_interop_utils) compile against the torch the venv sees: Debian's 1.13,
# whose C++ headers are libtorch-dev's (scripts/install_deps.sh).
peer_build() {
  case "$1" in
    ortmodule) echo "-m onnxruntime.training.ortmodule.torch_cpp_extensions.install" ;;
  esac
}

# What proves a peer works, run in its interpreter after the install and by --list.
peer_check() {
  case "$1" in
    ort) echo 'import onnxruntime as o; assert o.__version__.startswith("1.31."), o.__version__; o.InferenceSession; print("onnxruntime", o.__version__)' ;;
    ort-training) echo 'import torch, onnxruntime as o, onnx; from onnxruntime.training import api, artifacts; assert o.__version__ == "1.19.2", o.__version__; print("onnxruntime-training", o.__version__, "onnx", onnx.__version__)' ;;
    # ORTModule's import fails without its extensions; nvtx is a no-op here as in bench/ortmodule_shim.py.
    ortmodule) echo 'import torch; torch.cuda.nvtx.range_push = lambda msg: None; torch.cuda.nvtx.range_pop = lambda: None; from onnxruntime.training.ortmodule import ORTModule; m = ORTModule(torch.nn.Linear(4, 2)); m(torch.ones(3, 4)).sum().backward(); print("ORTModule", torch.__version__)' ;;
    # TrainModule exports with the TorchScript-based exporter (dynamo=False; `training` is its option).
    torch2) echo 'import inspect, torch, transformers, peft, accelerate; assert torch.__version__.startswith("2."), torch.__version__; assert "training" in inspect.signature(torch.onnx.export).parameters, "no TorchScript-based exporter"; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' ;;
    hf113) echo 'import torch, transformers, peft, accelerate; assert torch.__version__.startswith("1.13"), torch.__version__; print("torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)' ;;
  esac
}

stamp_of() {  # the pins and the recipe of a peer, as its stamp records them
  peer_installs "$1"
  peer_build "$1"
  echo "python=$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
}

setup_one() {
  local name=$1 venv="$PEERS_DIR/$1" want
  want=$(stamp_of "$name")
  if [[ -f "$venv/.onnxtrain-peer" && "$(cat "$venv/.onnxtrain-peer")" == "$want" ]]; then
    return 0
  fi
  echo "setup_peers: creating $name in $venv" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv --system-site-packages "$venv"
  local line
  while IFS= read -r line; do
    # shellcheck disable=SC2086  # a line is a list of pip arguments
    "$venv/bin/python" -m pip install --no-input --disable-pip-version-check --progress-bar off -q $line
  done < <(peer_installs "$name")
  local build
  build=$(peer_build "$name")
  # shellcheck disable=SC2086  # the build is a list of interpreter arguments
  [[ -z "$build" ]] || "$venv/bin/python" $build >&2
  "$venv/bin/python" -c "$(peer_check "$name")" >&2
  printf '%s\n' "$want" > "$venv/.onnxtrain-peer"
}

if [[ "${1:-}" == "--list" ]]; then
  for name in "${ALL_PEERS[@]}"; do
    state="missing"
    [[ -f "$PEERS_DIR/$name/.onnxtrain-peer" ]] && state="installed"
    [[ -f "$PEERS_DIR/$name/.onnxtrain-peer" && "$(cat "$PEERS_DIR/$name/.onnxtrain-peer")" != "$(stamp_of "$name")" ]] && state="stale"
    printf '%-13s %-10s %s\n' "$name" "$state" "$(peer_installs "$name" | head -1)"
  done
  exit 0
fi

names=("$@")
((${#names[@]})) || names=("${ALL_PEERS[@]}")
for name in "${names[@]}"; do
  peer_installs "$name" >/dev/null || { echo "setup_peers: unknown peer '$name' (known: ${ALL_PEERS[*]})" >&2; exit 2; }
done
mkdir -p "$PEERS_DIR"
# One installer at a time: tests and benchmarks may ask for the same peer at once.
exec 9>"$PEERS_DIR/.lock"
flock 9
for name in "${names[@]}"; do
  # Not under `if`: bash ignores `set -e` inside a function called from a condition.
  trap 'echo "setup_peers: $name failed to install ($(peer_installs "$name" | head -1)); run scripts/setup_peers.sh $name to retry" >&2' ERR
  setup_one "$name"
done
