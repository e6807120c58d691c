#!/usr/bin/env bash
# Runs the libFuzzer targets of build-fuzz (docs/ROBUSTNESS.md, "Fuzzing"): `make fuzz`.
#   tests/fuzz/run.sh FUZZ_DIR SECONDS [TARGET...]     (default: every target)
# Each target runs SECONDS on its corpus, ~/.cache/onnxtrain/fuzz/<target>/corpus (kept outside
# the repository, grown by every run), after its seeds (.../seeds, from make_seeds.py), with its
# dictionary (dicts/<target>.dict) when there is one. FUZZ_SMOKE=1 runs on the seeds only (a fresh,
# empty corpus): the short pass of `make test`. A crash, sanitizer report, leak, timeout or
# out-of-memory input is minimized into tests/fuzz/regressions/<target>/ (the normal build's
# ctest replays it) and the script exits non-zero; an input slower than 1 s is kept under
# ~/.cache/onnxtrain/fuzz/<target>/slow and reported. A summary line per target goes to stdout.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
fuzz_dir="$1"; seconds="$2"; shift 2
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=($(sed -n 's/^set(FUZZ_TARGETS \(.*\))$/\1/p' "$here/CMakeLists.txt"))
fi
cache="${ONNXTRAIN_FUZZ_CACHE:-$HOME/.cache/onnxtrain/fuzz}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
for t in "${targets[@]}"; do
  exe="$fuzz_dir/fuzz/fuzz_$t"
  [ -x "$exe" ] || { echo "fuzz: $exe is missing (make fuzz builds it)"; failed=1; continue; }
  seeds="$cache/$t/seeds"
  mkdir -p "$seeds"
  if [ -n "${FUZZ_SMOKE:-}" ]; then
    # The first 20 seeds only: libFuzzer runs every corpus input before it mutates any, and the
    # model targets have a thousand.
    corpus="$(mktemp -d)"
    find "$seeds" -type f | sort | head -20 | xargs -r cp -t "$corpus"
    seeds="$(mktemp -d)"
  else
    corpus="$cache/$t/corpus"
    mkdir -p "$corpus"
  fi
  artifacts="$(mktemp -d)"
  dict=()
  [ -f "$here/dicts/$t.dict" ] && dict=(-dict="$here/dicts/$t.dict")
  log="$cache/$t/last_run.log"
  # -timeout and -rss_limit_mb are the per-input caps; fuzz_util.h keeps tensor memory and Loop
  # iterations far below them, so that hitting one is a bug.
  "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -report_slow_units=1 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
    "$corpus" "$seeds" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  slow=$(sed -n 's/^stat::slowest_unit_time_sec: *//p' "$log")
  found=0
  for a in "$artifacts"/*; do
    [ -e "$a" ] || continue
    kind="$(basename "$a" | cut -d- -f1)"
    if [ "$kind" = slow ]; then
      # An input over 1 s (-report_slow_units): on this shared machine usually an fsync or a
      # scheduling stall, so it is kept for a look (replay it: "$exe" FILE), not failed on.
      mkdir -p "$cache/$t/slow"
      cp "$a" "$cache/$t/slow/"
      echo "fuzz: $t: an input took over 1 s once; kept as $cache/$t/slow/$(basename "$a")"
      continue
    fi
    found=1
    mkdir -p "$here/regressions/$t"
    kept="$here/regressions/$t/$(basename "$a")"
    # Minimize crashes (a smaller input that still fails the same way); timeouts and leaks as found.
    if [ "$kind" = crash ]; then
      "$exe" -minimize_crash=1 -max_total_time=60 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
        -exact_artifact_path="$kept" "$a" > "$cache/$t/minimize.log" 2>&1 || true
    fi
    [ -s "$kept" ] || cp "$a" "$kept"
    echo "fuzz: $t: $kind input kept as ${kept#$here/../../}; its report: $log"
  done
  ((found || (rc != 0))) && failed=1
  printf 'fuzz: %-15s %s execs %s exec/s cov %s corpus %s peak RSS %s MB slowest %ss rc %d\n' \
    "$t" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${corp:-?}" "${rss:-?}" "${slow:-?}" "$rc"
  rm -rf "$artifacts"
  [ -n "${FUZZ_SMOKE:-}" ] && rm -rf "$corpus" "$seeds"
done
exit $failed
