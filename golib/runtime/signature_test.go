package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestSignatureMatchesMapRun runs the same feeds through Run (a map, names
// resolved per call) and RunSignature (names resolved once): identical
// outputs, run after run.
func TestSignatureMatchesMapRun(t *testing.T) {
	s := session(t, chain())
	sg, err := s.Prepare([]string{"x"}, []string{"y"})
	if err != nil {
		t.Fatal(err)
	}
	if sg.Outputs() != 1 || len(sg.FeedNames()) != 1 {
		t.Fatalf("signature of %d outputs, feeds %v", sg.Outputs(), sg.FeedNames())
	}
	for run := range 4 {
		x := f32(t, tensor.Shape{run + 1, 2}, make([]float32, 2*(run+1))...)
		for i := range x.Float32() {
			x.Float32()[i] = float32(i*run) - 1.5
		}
		want, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, []string{"y"})
		if err != nil {
			t.Fatal(err)
		}
		w := append([]float32(nil), want[0].Float32()...)
		got, _, err := s.RunSignature(s.DefaultState(), sg, []*tensor.Tensor{x})
		if err != nil {
			t.Fatal(err)
		}
		if !got[0].Shape().Equal(want[0].Shape()) {
			t.Fatalf("run %d: shape %v, want %v", run, got[0].Shape(), want[0].Shape())
		}
		for i, v := range got[0].Float32() {
			if v != w[i] {
				t.Fatalf("run %d: y = %v, want %v", run, got[0].Float32(), w)
			}
		}
	}
}

// TestSignatureErrors: what depends on the names fails at Prepare, what
// depends on the tensors fails at every run, with the map path's classes.
func TestSignatureErrors(t *testing.T) {
	s := session(t, chain())
	x := f32(t, tensor.Shape{1, 2}, 1, 2)
	prep := []struct {
		name          string
		feeds, outs   []string
		want          error
		wantInMessage string
	}{
		{"missing input", nil, nil, errs.ErrMissingInput, `"x"`},
		{"unknown input", []string{"x", "z"}, nil, errs.ErrInvalidArgument, "unknown input name(s) z"},
		{"misspelt input", []string{"y", "X"}, nil, errs.ErrMissingInput, `"x" is required but was not fed (fed unknown input name(s) X, y)`},
		{"duplicate input", []string{"x", "x"}, nil, errs.ErrInvalidArgument, "fed twice"},
		{"unknown output", []string{"x"}, []string{"nope"}, errs.ErrNotFound, `"nope"`},
		{"cache path without one", []string{"x"}, nil, errs.ErrNotImplemented, "no cache path"},
	}
	for _, c := range prep {
		var err error
		if c.name == "cache path without one" {
			_, err = s.PrepareCache(c.feeds, c.outs)
		} else {
			_, err = s.Prepare(c.feeds, c.outs)
		}
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.wantInMessage) {
			t.Errorf("%s: %v, want %v containing %q", c.name, err, c.want, c.wantInMessage)
		}
	}
	sg, err := s.Prepare([]string{"x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	i64, err := tensor.FromSlice(tensor.Shape{1, 2}, []int64{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	rank3 := f32(t, tensor.Shape{1, 1, 2}, 1, 2)
	wide := f32(t, tensor.Shape{1, 3}, 1, 2, 3)
	other := session(t, chain())
	runs := []struct {
		name  string
		s     *Session
		feeds []*tensor.Tensor
		want  error
	}{
		{"nil tensor", s, []*tensor.Tensor{nil}, errs.ErrInvalidArgument},
		{"too few tensors", s, nil, errs.ErrInvalidArgument},
		{"wrong type", s, []*tensor.Tensor{i64}, errs.ErrType},
		{"wrong rank", s, []*tensor.Tensor{rank3}, errs.ErrShape},
		{"wrong fixed dimension", s, []*tensor.Tensor{wide}, errs.ErrShape},
		{"another session", other, []*tensor.Tensor{x}, errs.ErrInvalidArgument},
	}
	for _, c := range runs {
		for range 2 { // the same error on every run: nothing is remembered
			if _, _, err := c.s.RunSignature(c.s.DefaultState(), sg, c.feeds); !errors.Is(err, c.want) {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		}
	}
	if _, _, err := s.RunSignature(s.DefaultState(), sg, []*tensor.Tensor{x}); err != nil {
		t.Fatalf("a good run after failed ones: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.RunSignature(s.DefaultState(), sg, []*tensor.Tensor{x}); !errors.Is(err, errs.ErrClosed) {
		t.Errorf("run after close: %v", err)
	}
}
