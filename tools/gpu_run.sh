#!/usr/bin/env bash
# One script for the lent GPU machine (bare: Python 3.12 + torch, no Bazel).
#
#   tools/gpu_run.sh stage     # here: build the cp312 wheel, stage it in .gpu_stage/
#   tools/gpu_run.sh device    # there: install the staged wheel, run the GPU tests,
#                              # compute-sanitizer on a subset, and the bench
#
# The device tool call is then:
#   run(command="bash tools/gpu_run.sh device", carry=[".gpu_stage"])
# .gpu_stage/ is git-ignored and stays far under the 64 MiB carry limit.
# Environment (device): SKIP_SGLANG=1, PYTEST_ARGS (extra pytest args), PYTEST_TARGETS
# (test paths, default python/tests, tools/bench/tests, tools/dev/tests), SKIP_BENCH=1,
# SKIP_SANITIZER=1, SKIP_SOAK=1 (SOAK_LAUNCHES, default 10000),
# SKIP_CHECK_COST=1, SANITIZERS (the compute-sanitizer tools to run, default
# "memcheck racecheck initcheck synccheck"). Logs go to $OUT when set, packed into $OUT/logs.tar.gz at the end
# (the device tool returns only a few files; bench.json/.png stay unpacked).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGE="$ROOT/.gpu_stage"
mode="${1:-}"

case "$mode" in
stage)
  cd "$ROOT"
  tools/bootstrap.sh
  bazel build --config=py312 //python:wheel
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  cp bazel-bin/python/verify_attn-*-cp312-cp312-linux_x86_64.whl "$STAGE/"
  chmod u+w "$STAGE"/*.whl
  # The bench's mma.sync ceiling (tools/bench/ceilings/mma_peak.cu, 1 MB):
  # bench.py runs .gpu_stage/mma_peak when it is there.
  bazel build //tools/bench/ceilings:mma_peak
  cp bazel-bin/tools/bench/ceilings/mma_peak "$STAGE/mma_peak" && chmod u+wx "$STAGE/mma_peak"
  # Baseline kernels for the bench (SGLang's Triton kernels, downloaded by
  # package name, never committed): into .gpu_stage/baselines/.
  tools/bench/fetch_baselines.sh
  # Real draft trees on real activations (CPU, about 40 s), for the GPU test
  # and `bench --workload=real`.
  # Two of the three captured layers keep the carried folder under 64 MiB
  # beside the SGLang staging (about 40 MiB).
  bazel run //tools:capture -- --out="$STAGE/real_trees.safetensors" --layers=2,28
  # SGLang and the packages its imports need, for the integration GPU test.
  integration/sglang/stage.sh
  du -sh "$STAGE"
  ls -la "$STAGE"
  # VERIFY_ATTN_STAGE_FLASHMLA=1 (tools/bench/fetch_baselines.sh) adds FlashMLA's 9.4 MiB wheel:
  # then the whole stage no longer fits the carry.
  stage_bytes="$(du -sb "$STAGE" | cut -f1)"
  if ((stage_bytes > 64 * 1048576)); then
    echo "gpu_run stage: WARNING: $STAGE is $((stage_bytes / 1048576)) MiB, over the 64 MiB carry;" \
         "carry it without $STAGE/sglang (the SGLang integration stage) or without the FlashMLA wheel" >&2
  fi
  ;;
device)
  cd "$ROOT"
  LOG="${OUT:-/tmp}"
  PY="${PYTHON:-python3}"
  SITE=/tmp/verify_attn_site
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$STAGE"/verify_attn-*.whl
  # A wheel staged from an older checkout would test old code against new
  # tests: refuse it when its Python sources differ from this checkout's.
  stale=""
  for f in "$ROOT"/python/verify_attn/*.py; do
    b="$(basename "$f")"
    [[ "$b" == _version.py ]] && continue
    if [[ ! -f "$SITE/verify_attn/$b" ]] || ! cmp -s "$f" "$SITE/verify_attn/$b"; then stale="$stale $b"; fi
  done
  if [[ -n "$stale" ]]; then
    echo "gpu_run device: the staged wheel is not this checkout's (python/verify_attn differs:$stale);" \
         "run 'tools/gpu_run.sh stage' here and carry .gpu_stage again" >&2
    exit 2
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1 VERIFY_ATTN_REQUIRE_GPU=1
  export VERIFY_ATTN_WHEEL="$(ls "$STAGE"/verify_attn-*.whl)"
  [[ -f "$STAGE/real_trees.safetensors" ]] && export VERIFY_ATTN_REAL_FIXTURE="$STAGE/real_trees.safetensors"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$LOG/gpu.txt"
  (cd /tmp && "$PY" -c "import verify_attn, torch; print(verify_attn.__file__, verify_attn.runtime_info(), torch.__version__)")
  status=0
  # Every test file (python/tests and the tools' tests): CPU tests run too (the no-device one skips itself).
  # test_lossless needs the SmolLM2 model package (a CPU test, run by CI).
  (cd /tmp && "$PY" -m pytest -q -rs -p no:cacheprovider --ignore="$ROOT/python/tests/test_lossless.py" \
      ${PYTEST_ARGS:-} ${PYTEST_TARGETS:-"$ROOT/python/tests" "$ROOT/tools/bench/tests" "$ROOT/tools/dev/tests"} \
      2>&1 | tee "$LOG/pytest.log") || status=1
  (cd /tmp && "$PY" "$ROOT/examples/demo_paged_mla.py" 2>&1 | tee "$LOG/demo.log") || status=1
  if [[ "${SKIP_SANITIZER:-0}" != 1 && -f "$ROOT/tools/checks/sanitize_cases.py" ]]; then
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so
    # memcheck sees a read past a tensor (the KV pool of the bad-index cases)
    # instead of a read inside the caching allocator's larger segment.
    # racecheck runs every case on the one-tile mma.sync kernels: it does not
    # model an mbarrier-ordered hand-off (the sm_90a MLA kernels' P stores
    # against the producer's refill, the warp-role kernels' cp.async stages)
    # and reports those as hazards (docs/gpu_workflow.md).
    # initcheck runs the TMA kernel with its unsplit output stored from
    # registers (--o_tma=off): initcheck does not see the copy engine's
    # stores, so every later read of a TMA-stored output row is reported as
    # uninitialized (docs/gpu_workflow.md); memcheck / synccheck run
    # the TMA stores.
    for tool in ${SANITIZERS:-memcheck racecheck initcheck synccheck}; do
      force=""; o_tma=on
      [[ "$tool" == racecheck ]] && force="mla_m32n32_s1,gqa_d64_m64n64_s2,gqa_d128_m64n64_s2,gqa_d256_m64n32_s2"
      [[ "$tool" == initcheck ]] && o_tma=off
      (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
          compute-sanitizer --tool "$tool" --error-exitcode 3 \
          "$PY" "$ROOT/tools/checks/sanitize_cases.py" --config="$force" --o_tma="$o_tma" \
          > "$LOG/sanitizer_$tool.full.log" 2>&1; rc=$?; \
          grep -E "^(ok|FAIL|seed)" "$LOG/sanitizer_$tool.full.log"; \
          tail -n 5 "$LOG/sanitizer_$tool.full.log" | tee "$LOG/sanitizer_$tool.log"; exit $rc) || status=1
    done
    # memcheck over the bad-index GPU tests themselves (graph capture and
    # torch.compile excluded: no cudaMalloc is allowed during capture).
    (cd /tmp && PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 \
        "$PY" -m pytest -q -p no:cacheprovider "$ROOT/python/tests/test_errors_gpu.py" -k "not graph and not compile" \
        2>&1 | tail -n 8 | tee "$LOG/sanitizer_memcheck_errors_gpu.log") || status=1
  fi
  if [[ "${SKIP_SOAK:-0}" != 1 && -f "$ROOT/tools/checks/soak.py" ]]; then
    # 10,000 launches (SOAK_LAUNCHES), random shapes/trees/page layouts, CUDA-graph
    # replays, sampled reference checks, memory before/after. About 2-4 minutes.
    (cd /tmp && "$PY" "$ROOT/tools/checks/soak.py" --launches "${SOAK_LAUNCHES:-10000}" --json "$LOG/soak.json" \
        2>&1 | tee "$LOG/soak.log") || status=1
  fi
  if [[ "${SKIP_CHECK_COST:-0}" != 1 && -f "$ROOT/tools/dev/check_cost.py" ]]; then
    # Cost of the device-side error word: paged kernel with error_word vs NULL.
    (cd /tmp && "$PY" "$ROOT/tools/dev/check_cost.py" --json "$LOG/check_cost.json" \
        2>&1 | tee "$LOG/check_cost.log") || status=1
  fi
  if [[ "${SKIP_BENCH:-0}" != 1 && -f "$ROOT/tools/bench/bench.py" ]]; then
    (cd /tmp && "$PY" "$ROOT/tools/bench/bench.py" ${BENCH_ARGS:-} 2>&1 | tee "$LOG/bench.log") || status=1
    if [[ -n "${VERIFY_ATTN_REAL_FIXTURE:-}" && "${SKIP_REAL_BENCH:-0}" != 1 ]]; then
      (cd /tmp && "$PY" "$ROOT/tools/bench/bench.py" --workload=real --json_out="$LOG/bench_real.json" \
          --flex=none 2>&1 | tee "$LOG/bench_real.log") || status=1
    fi
  fi
  if [[ "${SKIP_SGLANG:-0}" != 1 && -d "$STAGE/sglang" ]]; then
    # SGLang's attention test kit against our plugin backend and Triton's,
    # then (with the bench) forward_extend timings of both backends.
    bash "$ROOT/integration/sglang/run_gpu_tests.sh" || status=1
    if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
      bash "$ROOT/integration/sglang/run_gpu_bench.sh" || status=1
    fi
  fi
  if [[ -n "${OUT:-}" ]]; then
    # The device tool brings back only a handful of files from $OUT: pack the
    # logs into one archive (the bench JSON and plot stay beside it).
    (cd "$OUT" && ls | grep -vE '^(bench\.json|bench\.png|logs\.tar\.gz)$' > /tmp/va_logs.lst || true
     if [[ -s /tmp/va_logs.lst ]]; then
       tar czf logs.tar.gz -T /tmp/va_logs.lst && xargs rm -rf < /tmp/va_logs.lst
     fi) || true
  fi
  exit $status
  ;;
*)
  echo "usage: $0 stage|device" >&2
  exit 2
  ;;
esac
