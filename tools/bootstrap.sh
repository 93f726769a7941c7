#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian bookworm machine, idempotent
# and quick when everything is already there:
#   * Bazel 4.2.3 and its rules from Debian (bazel-bootstrap, bazel-rules-java,
#     bazel-skylib); the CUDA toolkit and pybind11 come later, inside Bazel,
#     from pinned PyPI wheels (tools/bazel/deps.bzl);
#   * a Python virtualenv with tools/requirements-dev.txt (torch CPU, pytest,
#     absl, ...), used as Bazel's Python through .bazelrc.user.
# Environment: VERIFY_ATTN_VENV (default ~/.cache/verify_attn/venv-<python>),
#              VERIFY_ATTN_PYTHON (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VERIFY_ATTN_PYTHON:-python3}"
PYVER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
VENV="${VERIFY_ATTN_VENV:-$HOME/.cache/verify_attn/venv-$PYVER}"
REQ="$ROOT/tools/requirements-dev.txt"
REQ_NODEPS="$ROOT/tools/requirements-nodeps.txt"

log() { echo "[bootstrap] $*" >&2; }

# clang + libclang-rt-14-dev: the C-ABI fuzzer (kernels/fuzz/run_fuzz.sh:
# libFuzzer, ASan, UBSan); not needed by the Bazel build.
apt_pkgs=(bazel-bootstrap bazel-rules-java bazel-skylib clang libclang-rt-14-dev)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$VENV/.requirements.sha256"
want="$(cat "$REQ" "$REQ_NODEPS" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ_NODEPS"
  echo "$want" > "$stamp"
fi

# Bazel's Python (interpreter + headers) is this venv's, unless overridden.
cat > "$ROOT/.bazelrc.user" <<EOF2
# Written by tools/bootstrap.sh; machine-local, git-ignored.
build --repo_env=PYTHON_BIN_PATH=$VENV/bin/python
EOF2
log "ready: bazel $(bazel --version 2>/dev/null | cut -d' ' -f2), python $VENV/bin/python"
