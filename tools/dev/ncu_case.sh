#!/usr/bin/env bash
# ncu summary of one bench shape on the GPU machine (after tools/gpu_run.sh
# device installed the wheel into /tmp/verify_attn_site): speed of light,
# compute-pipe utilization (the tensor pipe the wgmma path uses), DRAM and L2.
#
#   bash tools/dev/ncu_case.sh [profile_case.py flags]    # default: MLA B1 H16 T64 L32k, page 1
#
# --clock-control none: the clocks stay as the machine runs them (never changed).
# Writes $OUT/ncu_case.log (else /tmp) and the tensor metrics this ncu knows
# ($OUT/ncu_tensor_metrics.txt): their names differ between ncu versions (the
# H200 machine's ncu has sm__pipe_tensor_cycles_active and
# sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active, the wgmma share;
# sm__pipe_tensor_op_gmma_cycles_active is "n/a" there).
# NCU_SOURCE=1: a second, separate profile of the same launch with the
# per-instruction warp-stall samples, exported as $OUT/ncu_source.csv.gz for
# `bazel run //tools/dev:ncu_stalls -- --csv=...` here (about a minute more);
# NCU_SOURCE_ARGS adds ncu flags to it (e.g. --warp-sampling-interval 0 for short kernels).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOG="${OUT:-/tmp}"
PY="${PYTHON:-python3}"
export PYTHONPATH="/tmp/verify_attn_site${PYTHONPATH:+:$PYTHONPATH}"
args=("$@")
((${#args[@]})) || args=(--kind=mla --batch=1 --heads=16 --q_len=64 --prefix=32768 --page_size=1)
ncu --query-metrics 2>/dev/null | grep -iE "pipe_tensor|tensor_op|gmma" > "$LOG/ncu_tensor_metrics.txt" || true
cd /tmp
ncu --clock-control none -k regex:attention_kernel\|gqa_roles\|mla_split_kernel\|mla_cluster_kernel\|mla_wgmma\|mla_seesaw\|flash_fwd_splitkv_mla -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --metrics "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed" \
    "$PY" "$ROOT/tools/dev/profile_case.py" "${args[@]}" 2>&1 | tee "$LOG/ncu_case.log"
if [[ "${NCU_SOURCE:-0}" == 1 ]]; then
  ncu --clock-control none -k regex:attention_kernel\|gqa_roles\|mla_split_kernel\|mla_cluster_kernel\|mla_wgmma\|mla_seesaw\|flash_fwd_splitkv_mla -c 1 \
      --section SourceCounters --section WarpStateStats ${NCU_SOURCE_ARGS:-} -f -o /tmp/ncu_source \
      "$PY" "$ROOT/tools/dev/profile_case.py" "${args[@]}" > "$LOG/ncu_source_profile.log" 2>&1
  ncu -i /tmp/ncu_source.ncu-rep --page source --csv --print-source sass | gzip > "$LOG/ncu_source.csv.gz"
fi
