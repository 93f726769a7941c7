#!/usr/bin/env bash
# Device side of the SGLang-integration GPU tests (the lent H200: Python 3.12,
# torch 2.11, triton 3.6, no network). Needs .gpu_stage/ carried: the verify_attn
# wheel (tools/gpu_run.sh stage) and .gpu_stage/sglang/ (integration/sglang/stage.sh).
#
#   bash integration/sglang/run_gpu_tests.sh [pytest args...]
#
# Installs SGLang's Python files and the staged wheels with --no-index --no-deps
# into /tmp/va_sglang_site (nothing of the image is changed), puts the verify_attn
# wheel first, the sgl_kernel stand-in last (tests/stubs/gpu), and runs
# integration/sglang/tests/test_backend_gpu.py. Logs to $OUT when set.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/integration/sglang/install_site.sh" run_gpu_tests
S="$ROOT/integration/sglang/tests/stubs"
export PYTHONPATH="$SITE:$ROOT/integration/sglang${PYTHONPATH:+:$PYTHONPATH}"
export VERIFY_ATTN_SGLANG_GPU=1 PYTHONUNBUFFERED=1
export SGLANG_PLUGINS=verify_attn
# What the image lacks beyond the stage shows up here first, not as a test error.
(cd /tmp && "$PY" - <<PYEOF 2>&1 | tee "$LOG/sglang_gpu_imports.log"
import sys
sys.path += ["$S/common", "$S/gpu"]
import torch, triton, verify_attn
import sglang.srt.layers.attention.triton_backend
import sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner
import verify_attn_sglang.backend
print("imports ok: torch", torch.__version__, "triton", triton.__version__,
      "sgl_kernel stand-in:", getattr(sys.modules.get("sgl_kernel"), "__verify_attn_stub__", False))
PYEOF
)
rc=0
(cd /tmp && "$PY" -m pytest -q -rs -s -p no:cacheprovider \
    "$ROOT/integration/sglang/tests/test_backend_gpu.py" "$ROOT/integration/sglang/tests/test_plugin_cpu.py" "$@" \
    2>&1 | tee "$LOG/sglang_gpu_pytest.log") || rc=$?
grep -E "^VA_(WORST|MASK)" "$LOG/sglang_gpu_pytest.log" > "$LOG/sglang_gpu_worst.txt" || true
exit $rc
