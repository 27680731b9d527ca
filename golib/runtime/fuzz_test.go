package runtime

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// FuzzNewSession builds sessions from arbitrary bytes and runs the ones that
// build with small float32 feeds: loading, planning, kernel factories and
// kernels must return errors, never panic. Run with
//
//	go test ./golib/runtime -run '^$' -fuzz FuzzNewSession -fuzztime 2m
func FuzzNewSession(f *testing.F) {
	ifModel := onnxtest.Model(17, onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("If", []string{"c"}, []string{"y"},
			onnxtest.AttrGraph("then_branch", onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"x"}, []string{"t"})}, nil, []vi{onnxtest.Info("t", 1)})),
			onnxtest.AttrGraph("else_branch", onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Abs", []string{"x"}, []string{"e"})}, nil, []vi{onnxtest.Info("e", 1)})))},
		[]vi{onnxtest.Info("c", 9), onnxtest.Info("x", 1, 2)}, []vi{onnxtest.Info("y", 1, 2)}), nil)
	shapes := onnxtest.Model(17, onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Shape", []string{"x"}, []string{"s"}),
		onnxtest.Node("ConstantOfShape", []string{"s"}, []string{"z"}),
		onnxtest.Node("Reshape", []string{"z", "r"}, []string{"q"}),
		onnxtest.Node("Transpose", []string{"q"}, []string{"t"}, onnxtest.AttrInts("perm", 1, 0)),
		onnxtest.Node("Concat", []string{"t", "t"}, []string{"y"}, onnxtest.AttrInt("axis", 0)),
	}, []vi{onnxtest.Info("x", 1, 2, 2)}, []vi{onnxtest.Info("y", 1, -1, -1)},
		onnxtest.Int64s("r", []int64{2}, []int64{1, 4})), nil)
	for _, m := range []*onnxpb.ModelProto{chain(), ifModel, shapes} {
		f.Add(onnxtest.Bytes(m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := NewSessionFromBytes(b, Options{Threads: 1})
		if err != nil {
			return
		}
		feeds := map[string]*tensor.Tensor{}
		for _, in := range s.Inputs() {
			shape := tensor.Shape{}
			for _, d := range in.Shape {
				v := 2
				if d.Value >= 0 && d.Value <= 4 {
					v = int(d.Value)
				}
				shape = append(shape, v)
			}
			dt := in.DType
			if !dt.Valid() {
				dt = tensor.Float32
			}
			x, err := tensor.New(dt, shape)
			if err != nil {
				return
			}
			feeds[in.Name] = x
		}
		_, _, _ = s.Run(feeds, nil) // an error is fine; a panic is not
	})
}
