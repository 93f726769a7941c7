#!/usr/bin/env bash
# Device side of the SGLang-backend bench rows (the lent H200: Python 3.12,
# torch 2.11, triton 3.6, no network). Needs .gpu_stage/ carried: the verify_attn
# wheel (tools/gpu_run.sh stage), .gpu_stage/baselines/ (tools/bench/fetch_baselines.sh,
# for the sglang_extend / sglang_chain columns) and .gpu_stage/sglang/
# (integration/sglang/stage.sh).
#
#   bash integration/sglang/run_gpu_bench.sh [extra tools/bench/bench.py flags...]
#   run(command="bash integration/sglang/run_gpu_bench.sh", carry=[".gpu_stage"])
#
# Installs like run_gpu_tests.sh (SGLang's Python files and the staged wheels,
# --no-index --no-deps, into /tmp/va_sglang_site; nothing of the image is
# changed), exports VERIFY_ATTN_SGLANG_SITE, and runs tools/bench/bench.py on a few MLA
# and GQA shapes with our kernels, SGLang's bare Triton kernels and SGLang's
# attention backends (ours and TritonAttnBackend, forward_extend in target
# verify). Env: BENCH_SHAPES (the --shapes filter), BENCH_ARGS. Output in $OUT
# (else /tmp): bench_sglang_backend.json/.png/.log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/integration/sglang/install_site.sh" run_gpu_bench
# The site first (verify_attn wheel, SGLang, transformers 5, ...); the bench appends
# integration/sglang and the sgl_kernel stand-in (tests/stubs) itself.
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export VERIFY_ATTN_SGLANG_SITE="$SITE"
export SGLANG_PLUGINS=verify_attn PYTHONUNBUFFERED=1
# MLA (DESIGN.md rows, a tree and a chain, a large DDTree budget) and GQA (tree, chain,
# batch 64): names as `tools/bench/bench.py --list` prints them.
SHAPES="${BENCH_SHAPES:-mla B1 H16 T16 L4k ,mla B1 H16 T64 L32k ddtree,mla B16 H16 T64 L32k ddtree,mla B32 H16 T16 L4k ddtree,mla B1 H16 T1024 L8k,gqa B1 H32/4 D128 T16 L8k,gqa B16 H32/4 D128 T16 L8k,gqa B64 H32/4 D128 T4 L1k,gqa B4 H32/4 D128 T64 L64k}"
rc=0
(cd /tmp && "$PY" "$ROOT/tools/bench/bench.py" --baselines=sglang_extend,sglang_chain,sglang_backend --flex=none \
    --shapes="$SHAPES" --sglang_site="$SITE" --json_out="$LOG/bench_sglang_backend.json" --noprogress \
    ${BENCH_ARGS:-} "$@" 2>&1 | tee "$LOG/bench_sglang_backend.log") || rc=$?
exit $rc
