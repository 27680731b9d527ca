module github.com/onnx-light-kv/onnx-light-kv

go 1.26.8

tool (
	github.com/go-python/gopy
	golang.org/x/tools/cmd/goimports
)

require (
	github.com/go-python/gopy v0.5.0
	github.com/klauspost/cpuid/v2 v2.4.2
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/gonuts/commander v0.1.0 // indirect
	github.com/gonuts/flag v0.1.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	golang.org/x/mod v0.22.0 // indirect
	golang.org/x/sync v0.10.0 // indirect
	golang.org/x/sys v0.41.0 // indirect
	golang.org/x/tools v0.29.0 // indirect
)
