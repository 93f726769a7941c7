#!/usr/bin/env bash
# Alternating two-process A/B of two verify_attn wheels on the GPU machine:
# each wheel in its own process (two builds cannot share one), A B A B ...,
# the same bench arguments every time; then tools/dev/ab_compare.py prints each
# row's median of the per-run medians for A and B, B/A, and each one's ratio
# to FlashMLA's chain timed in the same processes.
#
#   bash tools/dev/ab_bench.sh WHEEL_A WHEEL_B RUNS [bench.py args...]
#   e.g. bash tools/dev/ab_bench.sh main.whl new.whl 2 --page_size=64 --shapes="mla " \
#            --timing_rounds=3 --target_ms=100 --baselines=flashmla --flex=none --measure_ceilings=false
#
# AB_ARGS_A / AB_ARGS_B: extra bench arguments for the A / B processes only (after the common ones).
# AB_ENV_A / AB_ENV_B: extra environment (NAME=value ...) for the A / B processes only.
# With one wheel twice, an A/B of a bench flag, e.g.
#   AB_ARGS_B="--num_splits=4" bash tools/dev/ab_bench.sh new.whl new.whl 2 --page_size=64 ...
#
# The JSON of every run goes to $OUT (or /tmp/va_ab) as ab_<A|B>_<run>.json.
# Why alternate: run-to-run / process-to-process variance on the H200 is a few
# percent (BENCHMARKS.md), more than many changes are worth, and drifts within
# a call; interleaving puts both wheels under the same drift.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
[[ $# -ge 3 ]] || { echo "usage: $0 WHEEL_A WHEEL_B RUNS [bench args...]" >&2; exit 2; }
A="$1" B="$2" RUNS="$3"; shift 3
DEST="${OUT:-/tmp/va_ab}"
mkdir -p "$DEST"
for tag in A B; do
  whl="$A"; [[ $tag == B ]] && whl="$B"
  rm -rf "/tmp/va_ab_site_$tag"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "/tmp/va_ab_site_$tag" "$whl"
done
for ((run = 1; run <= RUNS; run++)); do
  for tag in A B; do
    extra="${AB_ENV_A:-}"; [[ $tag == B ]] && extra="${AB_ENV_B:-}"
    side_args="${AB_ARGS_A:-}"; [[ $tag == B ]] && side_args="${AB_ARGS_B:-}"
    echo "=== ab_bench: run $run, wheel $tag${extra:+ ($extra)}" >&2
    # shellcheck disable=SC2086  # NAME=value words
    (cd /tmp && env $extra PYTHONPATH="/tmp/va_ab_site_$tag${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/tools/bench/bench.py" \
        --progress=false --json_out="$DEST/ab_${tag}_$run.json" --plot_out="/tmp/va_ab_${tag}_$run.png" "$@" $side_args \
        > "/tmp/va_ab_${tag}_$run.log" 2>&1) || { tail -n 30 "/tmp/va_ab_${tag}_$run.log" >&2; exit 1; }
  done
done
"$PY" "$ROOT/tools/dev/ab_compare.py" "$DEST"
