#!/usr/bin/env bash
# Installs the benchmark peers into bench/node_modules. Idempotent: does nothing when the pinned
# onnxruntime-node is already installed and loads.
#
# onnxruntime-node ships its native CPU binary inside the package, so --ignore-scripts is safe (the
# install script only fetches optional GPU pieces).
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_peers: node and npm are needed for the ONNX Runtime peer (apt-get install nodejs npm)" >&2
  exit 1
fi

want=$(node -p "require('./package.json').dependencies['onnxruntime-node']")
have=$(node -p "try { require('./node_modules/onnxruntime-node/package.json').version } catch (e) { '' }" 2>/dev/null || true)

if [[ "$have" != "$want" ]]; then
  echo "setup_peers: installing onnxruntime-node@$want into bench/node_modules"
  npm install --ignore-scripts --no-audit --no-fund --loglevel=error
fi

# Verify the native binding actually loads (a package without its binary fails here, not mid-run).
node -e "
const ort = require('onnxruntime-node');
if (typeof ort.InferenceSession?.create !== 'function') throw new Error('onnxruntime-node did not load');
console.log('setup_peers: onnxruntime-node ' + require('onnxruntime-node/package.json').version + ' loads');
"
