package runtime

import (
	"errors"
	"fmt"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// loopModel: acc starts at x and gains the outer initializer w per
// iteration; the scan output collects each iteration number as float.
func loopModel(withTrips bool) *onnxpb.ModelProto {
	body := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Identity", []string{"cond_in"}, []string{"cond_out"}),
		onnxtest.Node("Add", []string{"acc_in", "w"}, []string{"acc_out"}),
		onnxtest.Node("Cast", []string{"i"}, []string{"i_f"}, onnxtest.AttrInt("to", 1)),
	}, []vi{onnxtest.Info("i", 7), onnxtest.Info("cond_in", 9), onnxtest.Info("acc_in", 1, 2)},
		[]vi{onnxtest.Info("cond_out", 9), onnxtest.Info("acc_out", 1, 2), onnxtest.Info("i_f", 1)})
	trips := "m"
	if !withTrips {
		trips = ""
	}
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Loop", []string{trips, "c", "x"}, []string{"acc", "iters"}, onnxtest.AttrGraph("body", body)),
	}, []vi{onnxtest.Info("m", 7), onnxtest.Info("c", 9), onnxtest.Info("x", 1, 2)},
		[]vi{onnxtest.Info("acc", 1, 2), onnxtest.Info("iters", 1, -1)},
		onnxtest.Floats("w", []int64{2}, []float32{1, 10}))
	return onnxtest.Model(17, g, nil)
}

func TestLoop(t *testing.T) {
	s := session(t, loopModel(true))
	x := f32(t, tensor.Shape{2}, 0.5, 0.5)
	cases := []struct {
		trips     int64
		cond      bool
		acc, iter string
	}{
		{3, true, "[3.5 30.5]", "[0 1 2]"},
		{0, true, "[0.5 0.5]", "[]"},
		{5, false, "[0.5 0.5]", "[]"},
	}
	for _, c := range cases {
		outs, _, err := s.Run(map[string]*tensor.Tensor{"m": tensor.Scalar(c.trips), "c": tensor.Scalar(c.cond), "x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(outs[0].Float32()); got != c.acc {
			t.Errorf("trips %d cond %v: acc %s, want %s", c.trips, c.cond, got, c.acc)
		}
		if got := fmt.Sprint(outs[1].Float32()); got != c.iter || outs[1].Shape()[0] != int(c.trips)*boolInt(c.cond) {
			t.Errorf("trips %d cond %v: iters %s %v, want %s", c.trips, c.cond, got, outs[1].Shape(), c.iter)
		}
	}
	// Without a trip count and a condition that never turns false the loop
	// would not end: it stops at the iteration limit with an error. (Not run
	// here: 2^24 iterations take too long for a unit test.)
	if _, err := NewSessionFromBytes(onnxtest.Bytes(loopModel(false)), Options{}); err != nil {
		t.Fatal(err)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestLoopBadBody(t *testing.T) {
	body := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Identity", []string{"cond_in"}, []string{"cond_out"})},
		[]vi{onnxtest.Info("i", 7), onnxtest.Info("cond_in", 9)}, []vi{onnxtest.Info("cond_out", 9)})
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Loop", []string{"m", "c", "x"}, []string{"y"}, onnxtest.AttrGraph("body", body)),
	}, []vi{onnxtest.Info("m", 7), onnxtest.Info("c", 9), onnxtest.Info("x", 1, 2)}, []vi{onnxtest.Info("y", 1, 2)})
	_, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, g, nil)), Options{})
	if !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("body without the carried output: %v", err)
	}
}
