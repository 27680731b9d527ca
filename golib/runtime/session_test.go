package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

type vi = *onnxpb.ValueInfoProto

func session(t *testing.T, m *onnxpb.ModelProto) *Session {
	t.Helper()
	s, err := NewSessionFromBytes(onnxtest.Bytes(m), Options{Threads: 2, Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func f32(t *testing.T, shape tensor.Shape, v ...float32) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromSlice(shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func chainBytes() []byte { return onnxtest.Bytes(chain()) }

// chain is y = ((x + w) * x) - w, then Identity: several intermediates.
func chain() *onnxpb.ModelProto {
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Add", []string{"x", "w"}, []string{"a"}),
		onnxtest.Node("Mul", []string{"a", "x"}, []string{"b"}),
		onnxtest.Node("Sub", []string{"b", "w"}, []string{"c"}),
		onnxtest.Node("Identity", []string{"c"}, []string{"y"}),
	}, []vi{onnxtest.Info("x", 1, -1, 2)}, []vi{onnxtest.Info("y", 1, -1, 2)},
		onnxtest.Floats("w", []int64{2}, []float32{1, 2}))
	return onnxtest.Model(17, g, nil)
}

func TestRunRepeatedly(t *testing.T) {
	s := session(t, chain())
	for run := 0; run < 3; run++ {
		x := f32(t, tensor.Shape{2, 2}, 1, 2, 3, float32(run))
		outs, stats, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := []float32{1*2 - 1, 4*2 - 2, 4*3 - 1, (float32(run)+2)*float32(run) - 2}
		got := outs[0].Float32()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d: y = %v, want %v", run, got, want)
			}
		}
		if len(stats.Events) != 4 || stats.PeakBytes <= 0 || stats.PeakBytes > stats.AllocatedBytes {
			t.Errorf("stats %+v", stats)
		}
	}
	if len(s.def.ctx.tensors) != 0 {
		t.Errorf("values left in the context after Run: %d", len(s.def.ctx.tensors))
	}
}

func TestReleaseAfterLastUse(t *testing.T) {
	s := session(t, chain())
	acts := s.Plan().Actions
	released := map[string]int{} // value -> action index of its release
	executed := map[string]int{} // op -> action index
	for i, a := range acts {
		switch a.Kind {
		case ActRelease:
			for _, v := range a.Values {
				released[v] = i
			}
		case ActExecute:
			executed[s.Plan().Nodes[a.Node].OpType] = i
		}
	}
	cases := []struct {
		value, lastUser string
	}{{"a", "Mul"}, {"x", "Mul"}, {"b", "Sub"}, {"c", "Identity"}}
	for _, c := range cases {
		r, ok := released[c.value]
		if !ok || r != executed[c.lastUser]+1 {
			t.Errorf("%s released at action %d (ok=%v), want right after %s at %d", c.value, r, ok, c.lastUser, executed[c.lastUser])
		}
	}
	for _, keep := range []string{"y", "w"} {
		if _, ok := released[keep]; ok {
			t.Errorf("%s must never be released", keep)
		}
	}
}

func TestBadGraphs(t *testing.T) {
	in, out := []vi{onnxtest.Info("x", 1, 2)}, []vi{onnxtest.Info("y", 1, 2)}
	cases := []struct {
		name  string
		nodes []*onnxpb.NodeProto
		err   error
		text  string
	}{
		{"cycle", []*onnxpb.NodeProto{
			onnxtest.Node("Add", []string{"x", "b"}, []string{"a"}),
			onnxtest.Node("Neg", []string{"a"}, []string{"b"}),
			onnxtest.Node("Identity", []string{"a"}, []string{"y"}),
		}, errs.ErrCycle, "Add"},
		{"unknown op", []*onnxpb.NodeProto{onnxtest.Node("FrobnicateX", []string{"x"}, []string{"y"})},
			errs.ErrUnsupportedOp, "FrobnicateX (domain ai.onnx, opset 17)"},
		{"dangling input", []*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"nowhere"}, []string{"y"})},
			errs.ErrInvalidModel, "nowhere"},
		{"double producer", []*onnxpb.NodeProto{
			onnxtest.Node("Neg", []string{"x"}, []string{"y"}),
			onnxtest.Node("Abs", []string{"x"}, []string{"y"}),
		}, errs.ErrInvalidModel, "produced twice"},
		{"output never produced", []*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"x"}, []string{"z"})},
			errs.ErrInvalidModel, "never produced"},
	}
	for _, c := range cases {
		m := onnxtest.Model(17, onnxtest.Graph(c.nodes, in, out), nil)
		_, err := NewSessionFromBytes(onnxtest.Bytes(m), Options{})
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: error %v, want %v mentioning %q", c.name, err, c.err, c.text)
		}
	}
}

func TestBadFeeds(t *testing.T) {
	s := session(t, chain())
	good := f32(t, tensor.Shape{1, 2}, 1, 2)
	i64, _ := tensor.FromSlice(tensor.Shape{1, 2}, []int64{1, 2})
	cases := []struct {
		name  string
		feeds map[string]*tensor.Tensor
		outs  []string
		err   error
	}{
		{"missing", map[string]*tensor.Tensor{}, nil, errs.ErrMissingInput},
		{"wrong dtype", map[string]*tensor.Tensor{"x": i64}, nil, errs.ErrType},
		{"wrong rank", map[string]*tensor.Tensor{"x": f32(t, tensor.Shape{2}, 1, 2)}, nil, errs.ErrShape},
		{"wrong dim", map[string]*tensor.Tensor{"x": f32(t, tensor.Shape{1, 3}, 1, 2, 3)}, nil, errs.ErrShape},
		{"unknown feed", map[string]*tensor.Tensor{"x": good, "q": good}, nil, errs.ErrInvalidArgument},
		{"unknown output", map[string]*tensor.Tensor{"x": good}, []string{"nope"}, errs.ErrNotFound},
	}
	for _, c := range cases {
		if _, _, err := s.Run(c.feeds, c.outs); !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Run(map[string]*tensor.Tensor{"x": good}, nil); !errors.Is(err, errs.ErrClosed) {
		t.Errorf("run after close: %v", err)
	}
}

// TestIfCapturesOuterValues: the branches read x and w from the parent
// graph without them being passed as inputs.
func TestIfCapturesOuterValues(t *testing.T) {
	thenG := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Add", []string{"x", "w"}, []string{"t"})}, nil, []vi{onnxtest.Info("t", 1)})
	elseG := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"x"}, []string{"e"})}, nil, []vi{onnxtest.Info("e", 1)})
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Neg", []string{"x0"}, []string{"x"}),
		onnxtest.Node("If", []string{"c"}, []string{"y"}, onnxtest.AttrGraph("then_branch", thenG), onnxtest.AttrGraph("else_branch", elseG)),
	}, []vi{onnxtest.Info("c", 9), onnxtest.Info("x0", 1, 2)}, []vi{onnxtest.Info("y", 1, 2)},
		onnxtest.Floats("w", []int64{2}, []float32{10, 20}))
	s := session(t, onnxtest.Model(17, g, nil))
	var x tensor.Shape = tensor.Shape{2}
	for _, c := range []struct {
		cond bool
		want []float32
	}{{true, []float32{9, 18}}, {false, []float32{1, 2}}} {
		outs, stats, err := s.Run(map[string]*tensor.Tensor{"c": tensor.Scalar(c.cond), "x0": f32(t, x, 1, 2)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if stats.PeakBytes != 16 { // x and the branch output, 8 bytes each
			t.Errorf("cond %v: peak %d bytes, want 16", c.cond, stats.PeakBytes)
		}
		if got := outs[0].Float32(); got[0] != c.want[0] || got[1] != c.want[1] {
			t.Errorf("cond %v: %v, want %v", c.cond, got, c.want)
		}
	}
	// x must stay alive until the If node has run: it is a capture.
	for _, a := range s.Plan().Actions {
		if a.Kind == ActRelease && a.Values[0] == "x" {
			break
		}
		if a.Kind == ActExecute && s.Plan().Nodes[a.Node].OpType == "If" {
			return
		}
	}
	t.Error("x was released before the If node that captures it")
}
