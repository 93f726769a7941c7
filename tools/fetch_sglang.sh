#!/usr/bin/env bash
# SGLang 0.5.23 for the SGLang-integration tests, fetched by package name (no URL).
#
#   tools/fetch_sglang.sh wheel        # pip download --no-deps sglang==0.5.23 (the cp311
#                                      # manylinux wheel) into the cache; sha256 checked. Its
#                                      # Python files are what the GPU staging extracts too
#                                      # (integration/sglang/stage.sh): they run on 3.12.
#   tools/fetch_sglang.sh venv         # + the CPU test venv (idempotent), prints its python
#
# The venv (default ~/.cache/verify_attn/venv-sglang, VERIFY_ATTN_SGLANG_VENV to
# change) is Python 3.11 with: the dev requirements' torch 2.13.0 CPU (pinned:
# nothing may move it), sglang installed with --no-deps, and exactly the packages
# its imports need (tools/requirements-sglang-cpu.txt, pinned). torchvision is
# NOT installed (PyPI's 0.28.0 is built for CUDA torch and breaks `import
# torchvision` on the CPU torch): a stand-in under
# integration/sglang/tests/stubs/cpu/ serves SGLang's module-level imports.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION=0.5.23
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/verify_attn/sglang"
W311=sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
SHA311=00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937
VENV="${VERIFY_ATTN_SGLANG_VENV:-$HOME/.cache/verify_attn/venv-sglang}"
REQ="$ROOT/tools/requirements-sglang-cpu.txt"
PY311="${PYTHON311:-python3.11}"
mode="${1:-venv}"

sha() { "$PY311" -c 'import hashlib,sys;h=hashlib.sha256();f=open(sys.argv[1],"rb");[h.update(c) for c in iter(lambda:f.read(1<<20),b"")];print(h.hexdigest())' "$1"; }

fetch() {  # $1 pyver (311) $2 wheel $3 sha256
  mkdir -p "$CACHE"
  if [[ ! -f "$CACHE/$2" ]]; then
    echo "fetch_sglang: pip download --no-deps sglang==$VERSION (cp$1)" >&2
    "$PY311" -m pip download -q --no-deps --only-binary=:all: --python-version "${1:0:1}.${1:1}" \
        --implementation cp --abi "cp$1" --platform manylinux_2_34_x86_64 \
        "sglang==$VERSION" -d "$CACHE"
  fi
  local got; got="$(sha "$CACHE/$2")"
  if [[ "$got" != "$3" ]]; then
    echo "fetch_sglang: sha256 mismatch for $2: $got != $3" >&2; exit 1
  fi
  echo "$got  $2" > "$CACHE/$2.sha256"
}

case "$mode" in
path)  # the cached wheel's path (fetching it if needed)
  fetch 311 "$W311" "$SHA311" >&2
  echo "$CACHE/$W311"
  ;;
wheel)
  fetch 311 "$W311" "$SHA311"
  ls -la "$CACHE"
  ;;
venv)
  fetch 311 "$W311" "$SHA311"
  stamp="$(cat "$REQ" "$ROOT/tools/requirements-dev.txt" | sha256sum | cut -c1-16)-$VERSION"
  if [[ -x "$VENV/bin/python" && "$(cat "$VENV/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    echo "$VENV/bin/python"; exit 0
  fi
  t0=$(date +%s)
  rm -rf "$VENV"
  "$PY311" -m venv "$VENV"
  pin="$(mktemp)"; grep -E '^torch==' "$ROOT/tools/requirements-dev.txt" > "$pin"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$pin" -r "$ROOT/tools/requirements-dev.txt" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$CACHE/$W311" >&2
  # --no-deps: every package the imports need is listed (pinned) in $REQ; nothing
  # else (in particular not torch or torchvision) may be pulled in.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -c "$pin" -r "$REQ" >&2
  "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__" >&2
  rm -f "$pin"
  echo "$stamp" > "$VENV/.stamp"
  echo "fetch_sglang: venv $VENV ready in $(( $(date +%s) - t0 )) s" >&2
  echo "$VENV/bin/python"
  ;;
*)
  echo "usage: $0 wheel|path|venv" >&2; exit 2 ;;
esac
