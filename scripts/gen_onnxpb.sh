#!/usr/bin/env bash
# Regenerates golib/runtime/onnxpb/onnx.pb.go from the ONNX protobuf schema.
#
# Reproducible inputs (change them only together with a regenerated file):
#   - schema: onnx.proto shipped in the pip package onnx==1.23.2
#     (pip install onnx==1.23.2), IR version 13 of the schema;
#   - protoc 3.21.12 (Debian bookworm: apt-get install protobuf-compiler);
#   - protoc-gen-go v1.36.12, the version of google.golang.org/protobuf in go.mod.
#
# The generated file is committed, so building and CI never need protoc.
# Usage: scripts/gen_onnxpb.sh   (from anywhere inside the repository)
set -euo pipefail

ROOT="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT="$ROOT/golib/runtime/onnxpb"
PY="${PYTHON:-python3}"
ONNX_VERSION_WANT="1.23.2"
PROTOC_VERSION_WANT="libprotoc 3.21.12"
GEN_VERSION="v1.36.12"
GO_PKG="github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"

onnx_version="$("$PY" -c 'import onnx; print(onnx.__version__)')"
if [ "$onnx_version" != "$ONNX_VERSION_WANT" ]; then
	echo "gen_onnxpb: need onnx==$ONNX_VERSION_WANT, found $onnx_version" >&2
	exit 1
fi
if [ "$(protoc --version)" != "$PROTOC_VERSION_WANT" ]; then
	echo "gen_onnxpb: need $PROTOC_VERSION_WANT, found $(protoc --version)" >&2
	exit 1
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp "$("$PY" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "onnx.proto"))')" "$WORK/onnx.proto"
GOBIN="$WORK/bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$GEN_VERSION"

mkdir -p "$OUT"
protoc --plugin=protoc-gen-go="$WORK/bin/protoc-gen-go" \
	--proto_path="$WORK" \
	--go_out="$OUT" --go_opt=paths=source_relative \
	--go_opt="Monnx.proto=$GO_PKG" \
	"$WORK/onnx.proto"
echo "wrote $OUT/onnx.pb.go"
