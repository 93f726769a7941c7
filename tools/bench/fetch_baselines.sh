#!/usr/bin/env bash
# Stage the third-party kernels the bench compares against (runs HERE, on a
# machine that reaches PyPI; the GPU machine has no network).
#
#   tools/bench/fetch_baselines.sh [DEST]     # default DEST: <repo>/.gpu_stage/baselines
#
# What it does:
#   1. `pip download --no-deps sglang==0.5.23` (by name, pinned; the cp311
#      manylinux wheel, about 39 MB) into a cache folder, and checks its sha256.
#   2. Extracts ONLY SGLang's Triton attention kernels the bench calls, and the
#      modules they import, into DEST/sglang/kernels/ops/attention/:
#        extend_attention.py  (extend_attention_fwd: the tree path, FULL mask)
#        decode_attention.py  (imported by extend_attention: _extract_kv_strides)
#        score_mod.py         (imported by both: unpack_aux_tensors)
#        verify_mla.py        (verify_shared_kv_fwd: the chain-only verify kernel)
#        verify_splitkv.py    (imported by verify_mla)
#      plus SGLang's LICENSE (Apache-2.0) and empty package __init__ files.
#      They are pure Python/Triton, so the cp311 wheel's files run on 3.12.
#   3. Writes DEST/STAGED.txt (version, wheel sha256, files).
# The two SGLang server modules those kernels import (sglang.srt.utils,
# sglang.srt.environ) are our own stand-ins, committed under
# tools/bench/benchlib/baselines/sglang_stubs/; the bench puts them on the path.
# Nothing here is committed: .gpu_stage/ is git-ignored. Run it AFTER
# `tools/gpu_run.sh stage` (which recreates .gpu_stage/), then carry
# .gpu_stage to the GPU machine as usual.
#
# FlashInfer is NOT staged: see tools/bench/benchlib/baselines/flashinfer.py.
#
# FlashMLA (opt-in: VERIFY_ATTN_STAGE_FLASHMLA=1): `pip download --no-deps
# sgl-flash-mla==1.0.0` (by name, pinned; the one published wheel,
# sgl_flash_mla-1.0.0-cp310-abi3-manylinux2014_x86_64.whl, 9,866,492 bytes =
# 9.4 MiB; abi3 + torch's stable C ABI, so it serves CPython 3.12), sha256
# checked, copied as is into DEST/. The bench installs it on the GPU machine
# with `pip install --no-deps --no-index --target` at first use
# (tools/bench/benchlib/baselines/flashmla.py). Opt-in because of its size: the full
# `tools/gpu_run.sh stage` is already ~55 MiB (of a 64 MiB carry), so with the
# wheel the carried .gpu_stage needs the SGLang integration stage
# (.gpu_stage/sglang, ~40 MiB) left out, e.g. for a bench-only run. Without
# the variable a previously staged FlashMLA wheel is removed from DEST.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/.gpu_stage/baselines}"
SGLANG_VERSION=0.5.23
SGLANG_WHEEL=sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
SGLANG_SHA256=00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937
FLASHMLA_VERSION=1.0.0
FLASHMLA_WHEEL=sgl_flash_mla-1.0.0-cp310-abi3-manylinux2014_x86_64.whl
FLASHMLA_SHA256=95d2761376337af4568dbadedc1807b0d90e4d8383c63fa859518a34937392b3
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/verify_attn/baselines"

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$HOME/.cache/verify_attn/venv-3.11/bin/python" ]]; then
    PY="$HOME/.cache/verify_attn/venv-3.11/bin/python"
  else
    PY=python3
  fi
fi

# download_wheel FILE REQUIREMENT PYTHON_VERSION ABI PLATFORM SIZE: into $CACHE
# unless already there (by package name, no dependencies, binary only).
download_wheel() {
  [[ -f "$CACHE/$1" ]] && return 0
  echo "fetch_baselines: pip download $2 (no deps, ~$6)" >&2
  "$PY" -m pip download -q --no-deps --only-binary=:all: \
      --python-version "$3" --implementation cp --abi "$4" --platform "$5" "$2" -d "$CACHE"
}

mkdir -p "$CACHE"
download_wheel "$SGLANG_WHEEL" "sglang==$SGLANG_VERSION" 3.11 cp311 manylinux_2_34_x86_64 "39 MB"

"$PY" - "$CACHE/$SGLANG_WHEEL" "$SGLANG_SHA256" "$DEST" "$SGLANG_VERSION" <<'PYEOF'
import hashlib, os, shutil, sys, zipfile

wheel, want, dest, version = sys.argv[1:5]
h = hashlib.sha256()
with open(wheel, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
if h.hexdigest() != want:
    sys.exit(f"fetch_baselines: sha256 mismatch for {wheel}: {h.hexdigest()} != {want}")

attn = "sglang/kernels/ops/attention/"
files = [attn + n for n in (
    "extend_attention.py", "decode_attention.py", "score_mod.py",
    "verify_mla.py", "verify_splitkv.py")]
lic = f"sglang-{version}.dist-info/licenses/LICENSE"

sg = os.path.join(dest, "sglang")
if os.path.isdir(sg):
    shutil.rmtree(sg)
os.makedirs(os.path.join(dest, attn), exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    missing = [f for f in files if f not in names]
    if missing:
        sys.exit(f"fetch_baselines: not in the wheel: {missing}")
    for f in files:
        with z.open(f) as src, open(os.path.join(dest, f), "wb") as dst:
            shutil.copyfileobj(src, dst)
    if lic in names:
        with z.open(lic) as src, open(os.path.join(dest, "sglang", "LICENSE"), "wb") as dst:
            shutil.copyfileobj(src, dst)
# Empty package markers (our own; SGLang's real __init__ files import the whole
# server). No sglang/__init__.py: the bench builds that package at run time.
for pkg in ("sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention"):
    with open(os.path.join(dest, pkg, "__init__.py"), "w") as f:
        f.write('"""Package marker written by tools/bench/fetch_baselines.sh (not SGLang code)."""\n')
with open(os.path.join(dest, "STAGED.txt"), "w") as f:
    f.write(f"sglang {version}\nwheel {os.path.basename(wheel)}\nsha256 {want}\n")
    for fn in files:
        f.write(f"file {fn}\n")
total = 0
for dp, _, fns in os.walk(dest):
    for fn in fns:
        total += os.path.getsize(os.path.join(dp, fn))
print(f"fetch_baselines: staged {len(files)} SGLang kernel files in {dest} ({total / 1e3:.0f} kB)")
PYEOF

# FlashMLA's wheel (opt-in, see the header).
rm -f "$DEST"/sgl_flash_mla-*.whl
if [[ "${VERIFY_ATTN_STAGE_FLASHMLA:-0}" == 1 ]]; then
  download_wheel "$FLASHMLA_WHEEL" "sgl-flash-mla==$FLASHMLA_VERSION" 3.12 abi3 manylinux2014_x86_64 "9.9 MB"
  got="$(sha256sum "$CACHE/$FLASHMLA_WHEEL" | cut -d' ' -f1)"
  if [[ "$got" != "$FLASHMLA_SHA256" ]]; then
    echo "fetch_baselines: sha256 mismatch for $CACHE/$FLASHMLA_WHEEL: $got != $FLASHMLA_SHA256" >&2
    exit 1
  fi
  cp "$CACHE/$FLASHMLA_WHEEL" "$DEST/"
  chmod u+w "$DEST/$FLASHMLA_WHEEL"
  printf 'sgl-flash-mla %s\nwheel %s\nsha256 %s\n' "$FLASHMLA_VERSION" "$FLASHMLA_WHEEL" "$FLASHMLA_SHA256" \
      >> "$DEST/STAGED.txt"
  echo "fetch_baselines: staged $FLASHMLA_WHEEL ($(stat -c %s "$DEST/$FLASHMLA_WHEEL") bytes) in $DEST"
  stage_dir="$(dirname "$DEST")"
  stage_bytes="$(du -sb "$stage_dir" | cut -f1)"
  echo "fetch_baselines: $stage_dir now holds $((stage_bytes / 1048576)) MiB"
  if ((stage_bytes > 60 * 1048576)); then
    echo "fetch_baselines: WARNING: over 60 MiB (the carry to the GPU machine is 64 MiB in all):" \
         "leave the SGLang integration stage ($stage_dir/sglang) out of the carry" >&2
  fi
else
  echo "fetch_baselines: FlashMLA not staged (VERIFY_ATTN_STAGE_FLASHMLA=1 stages its 9.4 MiB wheel;" \
       "the bench's FlashMLA column then says 'unavailable')"
fi
