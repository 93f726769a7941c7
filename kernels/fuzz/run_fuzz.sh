#!/usr/bin/env bash
# C-ABI fuzzing on CPU: libFuzzer + AddressSanitizer + UBSan over va_params.
#
#   kernels/fuzz/run_fuzz.sh [seconds]      # default 60 (FUZZ_SECONDS)
#
# Builds kernels/fuzz/capi_fuzz.cc with the host sources of the C-ABI
# (capi.cc, capi_attention.cc, plan.cc, status.cc) and launch_stub.cc (every
# kernel launcher aborts) using clang++ -fsanitize=fuzzer,address,undefined,
# against the hermetic CUDA 13.0 headers and static cudart of Bazel's @cuda
# repository (never a CUDA installed on the machine), writes the seed corpus
# (valid structs), runs for the given time without a device
# (CUDA_VISIBLE_DEVICES=""), and prints the execution count. Exit status
# non-zero on a crash, a sanitizer report or a failed property (the
# reproducer is kept under $FUZZ_OUT, default /tmp/verify_attn_fuzz).
# Needs clang and libclang-rt-14-dev (tools/bootstrap.sh installs them).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_TO_RUN="${1:-${FUZZ_SECONDS:-60}}"
WORK="${FUZZ_OUT:-/tmp/verify_attn_fuzz}"
cd "$ROOT"

CXX="${FUZZ_CXX:-}"
if [[ -z "$CXX" ]]; then
  for c in clang++ clang++-14 clang++-15 clang++-16; do
    if command -v "$c" >/dev/null 2>&1; then CXX="$c"; break; fi
  done
fi
[[ -n "$CXX" ]] || { echo "run_fuzz: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }

# The hermetic CUDA toolkit Bazel assembled from pinned wheels.
tools/bazelw build -- @cuda//:cudart_static >/dev/null 2>&1 || tools/bazelw build -- @cuda//:cudart_static
CUDA="$(bazel info output_base 2>/dev/null)/external/cuda/nvidia/cu13"
[[ -f "$CUDA/include/cuda_runtime_api.h" && -f "$CUDA/lib/libcudart_static.a" ]] || {
  echo "run_fuzz: hermetic CUDA not found under $CUDA" >&2; exit 2; }

mkdir -p "$WORK/corpus" "$WORK/artifacts"
BIN="$WORK/capi_fuzz"
SAN="-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "[fuzz] building $BIN with $("$CXX" --version | head -1)"
"$CXX" -std=c++17 -g -O1 $SAN -I"$ROOT" -isystem "$CUDA/include" \
  kernels/fuzz/capi_fuzz.cc kernels/fuzz/launch_stub.cc \
  kernels/capi.cc kernels/capi_attention.cc kernels/plan.cc kernels/status.cc \
  "$CUDA/lib/libcudart_static.a" -ldl -lpthread -lrt -o "$BIN"

export CUDA_VISIBLE_DEVICES=""
# cudart's one-time initialisation keeps allocations for the life of the
# process; they are not per-input leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
"$BIN" -write_seeds="$WORK/corpus" >/dev/null 2>&1
echo "[fuzz] corpus: $(ls "$WORK/corpus" | wc -l) inputs; running ${SECONDS_TO_RUN}s"
set +e
"$BIN" -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 -max_len=1024 \
  -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" >"$WORK/fuzz.log" 2>&1
rc=$?
set -e
grep -E "^(#[0-9]+[[:space:]]+DONE|Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)" "$WORK/fuzz.log" || true
execs="$(grep -oE "^Done [0-9]+ runs" "$WORK/fuzz.log" | grep -oE "[0-9]+" || echo 0)"
if [[ $rc -ne 0 ]]; then
  tail -n 60 "$WORK/fuzz.log"
  echo "[fuzz] FAILED (rc=$rc); reproducer(s): $(ls "$WORK/artifacts" 2>/dev/null | tr '\n' ' ')"
  exit 1
fi
echo "[fuzz] PASS: ${execs} executions in ${SECONDS_TO_RUN}s, no crash, no ASan/UBSan report, no launch"
