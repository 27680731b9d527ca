package model

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// FuzzLoadBytes feeds arbitrary bytes to the loader: it must return a model
// or an error, never panic, hang or allocate without bound. Run with
//
//	go test ./golib/runtime/model -run '^$' -fuzz FuzzLoadBytes -fuzztime 3m
//
// Plain `go test` only runs the seeds below (and testdata/fuzz).
func FuzzLoadBytes(f *testing.F) {
	seeds := [][]byte{
		onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3}))),
		onnxtest.Bytes(addModel(onnxtest.Raw("w", 1, []int64{3}, f32raw(4, 5, 6)))),
		onnxtest.Bytes(addModel(onnxtest.Int64s("w", []int64{2}, []int64{1, 2}))),
		onnxtest.Bytes(addModel(external("w", "w.bin", 12))),
		onnxtest.Bytes(onnxtest.Model(13, onnxtest.Graph(
			[]*onnxpb.NodeProto{onnxtest.Node("If", []string{"c"}, []string{"y"},
				onnxtest.AttrGraph("then_branch", onnxtest.Graph(nil, nil, []*onnxpb.ValueInfoProto{onnxtest.Info("x", 1)})),
				onnxtest.AttrGraph("else_branch", onnxtest.Graph(nil, nil, []*onnxpb.ValueInfoProto{onnxtest.Info("x", 1)})))},
			[]*onnxpb.ValueInfoProto{onnxtest.Info("c", 9)}, []*onnxpb.ValueInfoProto{onnxtest.Info("y", 1)}), nil)),
		{},
		{0x08},
	}
	for _, s := range seeds {
		f.Add(s)
		if len(s) > 10 {
			f.Add(s[:len(s)/2])
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := LoadBytes(b, Options{MaxExternalBytes: 1 << 20})
		if err == nil && (m.Graph == nil || m.Opsets == nil) {
			t.Fatal("nil graph without an error")
		}
		// The mapped loader's decoding (raw_data cut out, then aliased)
		// agrees with the plain one wherever it takes the bytes.
		mm, ok, merr := loadMapped(b, Options{MaxExternalBytes: 1 << 20})
		if ok {
			sameLoad(t, m, err, mm, merr)
		}
	})
}
