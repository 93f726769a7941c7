#!/usr/bin/env bash
# Device side of the Engine check (issue 41): live SGLang 0.5.23 Engines on tiny
# random checkpoints, speculative decoding through --attention-backend verify_attn,
# each mode compared token for token with greedy decoding and with the same setup
# on SGLang's Triton backend; what reached verify_attn is counted
# (engine_check/va_engine_probe.py). Needs .gpu_stage/ carried: the verify_attn
# wheel (tools/gpu_run.sh stage) and .gpu_stage/sglang/ (integration/sglang/stage.sh).
#
#   bash integration/sglang/run_gpu_engine_check.sh [MODE...]    # default: every mode (engine_check/modes.py)
#
# Env: JOBS (Engines at once, default 4), MODE_TIMEOUT (s per mode, default 200),
# DEADLINE (s after start past which no mode starts, default 330: with the
# mode time-box, under 9 minutes in all).
# $OUT gets summary.md, env.log and engine_check_logs.tar.gz (per-mode logs,
# JSON records, probe counts, the JIT warm-up log).
set -uo pipefail
T0=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/integration/sglang/install_site.sh" run_gpu_engine_check || exit 2
X="$ROOT/integration/sglang/engine_check"
S="$ROOT/integration/sglang/tests/stubs"
WORK=/tmp/va_engine_check; MODELS=/tmp/va_tiny_models
rm -rf "$WORK" && mkdir -p "$WORK/runs" "$WORK/probe"

# The probe as a second SGLang plugin: an entry point in a .dist-info on the path.
D="$WORK/probe/va_engine_probe-0.0.0.dist-info"; mkdir -p "$D"
printf 'Metadata-Version: 2.1\nName: va-engine-probe\nVersion: 0.0.0\n' > "$D/METADATA"
printf '[sglang.srt.plugins]\nva_engine_probe = va_engine_probe:register\n' > "$D/entry_points.txt"

# SGLang's JIT links -L$CUDA_HOME/lib64 -lcudart: give it a root whose lib64 holds libcudart.so.
if [[ -z "${CUDA_HOME:-}" ]]; then
  nvcc_root="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
  for c in /usr/local/cuda "$nvcc_root"; do [[ -e "$c/lib64/libcudart.so" ]] && { export CUDA_HOME="$c"; break; }; done
  if [[ -z "${CUDA_HOME:-}" ]]; then
    lib="$(dirname "$(ls "$nvcc_root"/lib/libcudart.so "$nvcc_root"/targets/*/lib/libcudart.so 2>/dev/null | head -1)")"
    mkdir -p "$WORK/cuda_home"
    for d in bin include nvvm; do [[ -e "$nvcc_root/$d" ]] && ln -s "$nvcc_root/$d" "$WORK/cuda_home/$d"; done
    ln -s "$lib" "$WORK/cuda_home/lib64"
    export CUDA_HOME="$WORK/cuda_home"
  fi
fi

# Site first (SGLang, transformers 5.19 ...), the verify_attn wheel inside it; then the
# check's modules and the probe's metadata; the sgl_kernel stand-in last (import only).
export PYTHONPATH="$SITE:$X:$WORK/probe:$S/common:$S/gpu"
export SGLANG_PLUGINS=verify_attn,va_engine_probe
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1   # the stand-in is no sglang-kernel 0.4.x
export SGLANG_FORCE_FUSED_OP_BACKEND=torch      # norms, activations, RoPE in torch (no sgl_kernel op)
export SGLANG_JIT_CACHE_DIR="$WORK/jit" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
cd /tmp
{
  echo "CUDA_HOME=$CUDA_HOME nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | tail -1)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import torch, triton, transformers, sglang, verify_attn, importlib.metadata as m, sys; \
print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, 'sglang', m.version('sglang'), 'verify_attn', verify_attn.__file__); \
print('sglang.srt.plugins:', sorted(e.name + '=' + e.value for e in m.entry_points(group='sglang.srt.plugins')))"
} > "$WORK/env.log" 2>&1
cat "$WORK/env.log"

"$PY" "$X/warm_jit.py" > "$WORK/warm_jit.log" 2>&1 &
warm=$!
"$PY" "$X/tiny_models.py" "$MODELS" > "$WORK/tiny_models.log" 2>&1 || { tail -20 "$WORK/tiny_models.log"; exit 3; }
echo "models in $(( $(date +%s) - T0 )) s"

if (( $# )); then modes=("$@"); else mapfile -t modes < <("$PY" -c "import modes; print('\n'.join(modes.default_order()))"); fi
greedy=(); rest=()
for m in "${modes[@]}"; do [[ $m == *_greedy_* ]] && greedy+=("$m") || rest+=("$m"); done

JOBS="${JOBS:-4}"; MODE_TIMEOUT="${MODE_TIMEOUT:-200}"; DEADLINE="${DEADLINE:-330}"
i=0
run_one() {  # mode port
  timeout -k 10 "$MODE_TIMEOUT" "$PY" "$X/run_mode.py" "$1" "$MODELS" "$WORK/runs" "$2" > "$WORK/runs/$1.log" 2>&1
  echo "[$(( $(date +%s) - T0 )) s] $1 rc=$? $(tail -1 "$WORK/runs/$1.log" | cut -c1-200)"
}
launch() {
  for m in "$@"; do
    while (( $(jobs -rp | wc -l) >= JOBS )); do sleep 1; done
    if (( $(date +%s) - T0 > DEADLINE )); then echo "skipped $m (past ${DEADLINE} s)"; continue; fi
    run_one "$m" $(( 30000 + 10 * i )) & i=$(( i + 1 ))
  done
}
launch "${greedy[@]}"          # the references start with the JIT warm-up
wait "$warm"; cat "$WORK/warm_jit.log" | cut -c1-400
launch "${rest[@]}"
wait
"$PY" "$X/report.py" "$WORK/runs" "${modes[@]}" | tee "$WORK/summary.md.log"
rc=${PIPESTATUS[0]}
mkdir -p "$LOG"
cp "$WORK/runs/summary.md" "$LOG/summary.md" 2>/dev/null
cp "$WORK/env.log" "$LOG/env.log"
tar -czf "$LOG/engine_check_logs.tar.gz" -C "$WORK" runs warm_jit.log tiny_models.log env.log
echo "engine check: $(( $(date +%s) - T0 )) s, rc=$rc"
exit $rc
