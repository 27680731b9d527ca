#!/usr/bin/env bash
# One entry point for a fresh machine: installs what is missing, builds the
# Go extension, then runs the demo, the tests or a benchmark.
#
#   bash scripts/run.sh demo [demo options]   # set up, then a decode demo with figures
#   bash scripts/run.sh test                  # set up, then every Go and Python test
#   bash scripts/run.sh setup                 # only set up
#
# Needs Go (1.26+), gcc and Python 3.10+ with pip; everything else comes from
# PyPI and the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export GOFLAGS=${GOFLAGS:--mod=mod}

setup() {
  command -v go >/dev/null || { echo "error: Go 1.26+ is required (go not on PATH)" >&2; exit 1; }
  command -v gcc >/dev/null || { echo "error: gcc is required for the cgo build" >&2; exit 1; }
  # build + test dependencies (pinned lower bounds; onnxruntime is the comparator; tokenizers and
  # tqdm are the optional 'generate' extra, installed so that its tests run)
  if ! "$PY" -c "import numpy, ml_dtypes, onnx, onnxruntime, pytest, pybindgen, matplotlib, tokenizers, tqdm" 2>/dev/null; then
    echo "== installing Python dependencies"
    "$PY" -m pip install --quiet --disable-pip-version-check \
      "numpy>=1.24" "ml_dtypes>=0.3" "onnx>=1.18" "onnxruntime>=1.22" "pytest>=7" \
      "pybindgen==0.22.1" "matplotlib>=3.7" "setuptools>=77" wheel "tokenizers>=0.15" "tqdm>=4.60"
  fi
  echo "== downloading Go modules"
  go mod download
  # (re)build the extension when it is missing or older than any Go source
  local so
  so=$(ls python/onnx_light_kv/_native/_kvgo*.so 2>/dev/null | head -n1 || true)
  if [ -z "$so" ] || [ -n "$(find golib go.mod -newer "$so" -name '*.go' -o -newer "$so" -name go.mod | head -n1)" ] \
     || ! "$PY" -c "import onnx_light_kv" 2>/dev/null; then
    echo "== building the Go extension (pip install -e .)"
    "$PY" -m pip install --quiet --disable-pip-version-check -e .
  fi
}

go_tests() {
  echo "== gofmt / go vet"
  local unformatted
  unformatted=$(gofmt -l golib)
  if [ -n "$unformatted" ]; then echo "gofmt needed on: $unformatted" >&2; exit 1; fi
  GOEXPERIMENT=simd go vet ./...
  go vet ./...
  echo "== go test -race (SIMD build: archsimd kernels and their Go twins)"
  GOEXPERIMENT=simd go test -race -count=1 ./...
  echo "== go test -race (portable build: pure-Go kernels only)"
  go test -race -count=1 ./...
}

case "${1:-}" in
  setup) setup ;;
  demo) shift; setup; exec "$PY" -m onnx_light_kv demo "$@" ;;
  test)
    shift; setup; go_tests
    echo "== pytest"
    "$PY" -m pytest -q "$@" tests
    ;;
  bench) shift; setup; exec "$PY" "$@" ;;
  *) sed -n '2,11p' "$0"; exit 2 ;;
esac
