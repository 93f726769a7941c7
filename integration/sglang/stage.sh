#!/usr/bin/env bash
# Stage what the H200 needs for the SGLang-integration GPU tests (runs HERE, where
# PyPI is reachable; the GPU machine has no network). Output: .gpu_stage/sglang/
#
#   integration/sglang/stage.sh [DEST]        # default DEST: <repo>/.gpu_stage/sglang
#
#   sglang.zip     SGLang 0.5.23's Python files from the sha256-checked wheel
#                  (tools/fetch_sglang.sh), WITHOUT its Rust extensions (*.so, ~45 MB,
#                  cp311-only and never imported by these tests) and without
#                  sglang/multimodal_gen (diffusion serving, not imported).
#   wheels/*.whl   cp312 manylinux wheels, pinned, --no-deps, of the packages SGLang's
#                  imports need that the H200 image lacks (KINDS.md's package list) or
#                  has at another major version (transformers 5 / huggingface_hub 2).
#   STAGED.txt     what was staged, with sizes.
# The device side is integration/sglang/run_gpu_tests.sh. Run AFTER
# `tools/gpu_run.sh stage` (which recreates .gpu_stage/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/.gpu_stage/sglang}"
PY="${PYTHON311:-python3.11}"
WHEEL="$("$ROOT/tools/fetch_sglang.sh" path)"

# name==version, cp312 manylinux (or pure Python). Versions = the CPU venv's
# (tools/requirements-sglang-cpu.txt), where the same imports were checked.
PKGS=(
  annotated-types==0.8.0 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 dill==0.4.1
  distro==1.9.0 fastapi==0.165.0 gguf==0.19.0 httpcore2==2.16.2 httpx2==2.16.2
  huggingface_hub==2.4.0 ipython==9.18.1 ipython_pygments_lexers==1.1.1 jiter==0.19.0
  loguru==0.7.3 msgspec==0.23.0 openai==2.8.0 opentelemetry-api==1.45.2 orjson==3.13.0
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5
  pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 traitlets==5.16.1
  transformers==5.19.0 truststore==0.10.5 typing-inspection==0.4.5 uvicorn==0.54.0
  # The Engine check (run_gpu_engine_check.sh): what the scheduler, the tokenizer
  # manager's grammar and multimodal imports need beyond the attention tests (~3.3 MiB).
  cffi==2.1.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 pycparser==3.12
  python-multipart==0.0.34 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8
  soundfile==0.14.0 xgrammar==0.2.7
)

rm -rf "$DEST"
mkdir -p "$DEST/wheels"
"$PY" - "$WHEEL" "$DEST/sglang.zip" <<'PYEOF'
import sys, zipfile
src, dst = sys.argv[1:3]
n = 0
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
    for info in zi.infolist():
        name = info.filename
        if name.endswith(".so") or name.startswith("sglang/multimodal_gen/"):
            continue
        if not (name.startswith("sglang/") or ".dist-info/" in name):
            continue
        if name.endswith(".dist-info/RECORD"):
            continue  # lists the dropped files; not needed to import
        zo.writestr(info, zi.read(name))
        n += 1
print(f"stage: sglang.zip with {n} files")
PYEOF
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_24_x86_64 -d "$DEST/wheels" "${PKGS[@]}" 2>&1 | grep -v "is ignored" || true
for p in "${PKGS[@]}"; do
  n="${p%%==*}"; n="${n//-/_}"
  ls "$DEST/wheels" | grep -qi "^${n}-" || { echo "stage: missing wheel for $p" >&2; exit 1; }
done
{
  echo "sglang 0.5.23 from $(basename "$WHEEL") (sha256 $(cut -d' ' -f1 "$WHEEL.sha256"))"
  (cd "$DEST" && ls -l sglang.zip wheels/)
  du -sh "$DEST"
} > "$DEST/STAGED.txt"
cat "$DEST/STAGED.txt"
total=$(du -sm "$DEST" | cut -f1)
if (( total > 48 )); then echo "stage: $DEST is ${total} MiB (> 48)" >&2; exit 1; fi
