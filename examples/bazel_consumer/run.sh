#!/usr/bin/env bash
# Build the wheel in the main repository, then test it from this separate
# Bazel workspace by path and sha256 (no network).
#
#   examples/bazel_consumer/run.sh [extra bazel test args]
#
# Environment: VERIFY_ATTN_WHEEL (skip the build, use this wheel),
# PYTHON_BIN_PATH (the consumer's interpreter; default: the bootstrap venv's,
# which has torch and numpy, the wheel's dependencies).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

if [[ -z "${PYTHON_BIN_PATH:-}" ]]; then
  PYVER="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  PYTHON_BIN_PATH="${VERIFY_ATTN_VENV:-$HOME/.cache/verify_attn/venv-$PYVER}/bin/python"
  [[ -x "$PYTHON_BIN_PATH" ]] || PYTHON_BIN_PATH=python3
fi
if [[ -z "${VERIFY_ATTN_WHEEL:-}" ]]; then
  # The default build: the wheel for Bazel's (= the bootstrap venv's) Python.
  (cd "$ROOT" && tools/bazelw build //python:wheel)
  TAG="$("$PYTHON_BIN_PATH" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  VERIFY_ATTN_WHEEL="$(ls "$ROOT"/bazel-bin/python/verify_attn-*-"$TAG"-"$TAG"-*.whl 2>/dev/null | head -n1)"
  [[ -n "$VERIFY_ATTN_WHEEL" ]] || VERIFY_ATTN_WHEEL="$(ls -t "$ROOT"/bazel-bin/python/verify_attn-*.whl | head -n1)"
fi
WHEEL="$(readlink -f "$VERIFY_ATTN_WHEEL")"
SHA="$(sha256sum "$WHEEL" | cut -d' ' -f1)"
echo "[consumer] wheel $WHEEL"
echo "[consumer] sha256 $SHA; python $PYTHON_BIN_PATH"

cd "$HERE"
status=0
bazel test //... \
  --repo_env=VERIFY_ATTN_WHEEL="$WHEEL" \
  --repo_env=VERIFY_ATTN_WHEEL_SHA256="$SHA" \
  --repo_env=PYTHON_BIN_PATH="$PYTHON_BIN_PATH" \
  "$@" || status=$?
# The consumer has its own Bazel server; do not leave it running (CI memory).
if [[ "${CONSUMER_KEEP_SERVER:-0}" != 1 ]]; then bazel shutdown >/dev/null 2>&1 || true; fi
exit $status
