#!/usr/bin/env bash
# Sourced by run_gpu_tests.sh and run_gpu_bench.sh: install SGLang's Python
# files and the staged wheels from .gpu_stage/ (--no-index --no-deps, into
# $SITE; nothing of the image is changed). Skipped when $SITE already holds
# this very stage (same files and sizes), so running both scripts installs once.
# Needs: ROOT; sets PY (python3 unless $PYTHON), SITE (/tmp/va_sglang_site), LOG ($OUT,
# else /tmp; created) and STAGE. $1: the caller's name for messages.
PY="${PYTHON:-python3}"
SITE=/tmp/va_sglang_site
LOG="${OUT:-/tmp}"
mkdir -p "$LOG"
STAGE="$ROOT/.gpu_stage"
for need in "$STAGE/sglang/sglang.zip" "$STAGE/sglang/wheels"; do
  [[ -e "$need" ]] || { echo "$1: missing $need (run integration/sglang/stage.sh here, carry .gpu_stage)" >&2; exit 2; }
done
ls "$STAGE"/verify_attn-*.whl >/dev/null 2>&1 || { echo "$1: no verify_attn wheel in $STAGE (tools/gpu_run.sh stage)" >&2; exit 2; }
stamp="$(cd "$STAGE" && ls -l verify_attn-*.whl sglang/sglang.zip sglang/wheels/ | sha256sum | cut -d' ' -f1)"
if [[ -f "$SITE/.stage_stamp" && "$(cat "$SITE/.stage_stamp")" == "$stamp" ]]; then
  echo "$1: $SITE already holds this stage" | tee "$LOG/${1}_install.log"
else
  rm -rf "$SITE" && mkdir -p "$SITE"
  t0=$(date +%s)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
      "$STAGE"/verify_attn-*.whl "$STAGE"/sglang/wheels/*.whl
  "$PY" -m zipfile -e "$STAGE/sglang/sglang.zip" "$SITE"
  echo "$stamp" > "$SITE/.stage_stamp"
  echo "$1: installed in $(( $(date +%s) - t0 )) s" | tee "$LOG/${1}_install.log"
fi
