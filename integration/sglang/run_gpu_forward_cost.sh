#!/usr/bin/env bash
# Device side of the eager-forward cost (tools/dev/sglang_forward_cost.py): an
# eager target-verify forward of many layers through the SGLang plugin, its
# wall time against the device time of its kernels. Installs like
# run_gpu_tests.sh (SGLang's Python files and the staged wheels into
# /tmp/va_sglang_site). Needs .gpu_stage/ carried (the verify_attn wheel and
# .gpu_stage/sglang/). Output in $OUT (else /tmp): sglang_forward_cost.json/.log.
#
#   bash integration/sglang/run_gpu_forward_cost.sh [tool flags...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/integration/sglang/install_site.sh" run_gpu_forward_cost
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export VERIFY_ATTN_SGLANG_SITE="$SITE" SGLANG_PLUGINS=verify_attn PYTHONUNBUFFERED=1
(cd /tmp && "$PY" "$ROOT/tools/dev/sglang_forward_cost.py" --json_out="$LOG/sglang_forward_cost.json" "$@" \
    2>&1 | tee "$LOG/sglang_forward_cost.log")
