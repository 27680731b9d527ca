package ops

import (
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// call runs one op kernel directly (no session) and returns its outputs.
func call(op string, opset int, attrs Attributes, nOut int, inputs ...*tensor.Tensor) ([]*tensor.Tensor, error) {
	return callDomain("", op, opset, attrs, nOut, inputs...)
}

func callDomain(domain, op string, opset int, attrs Attributes, nOut int, inputs ...*tensor.Tensor) ([]*tensor.Tensor, error) {
	f, err := Lookup(domain, op, opset)
	if err != nil {
		return nil, err
	}
	if attrs == nil {
		attrs = Attributes{}
	}
	n := &Node{OpType: op, Domain: domain, Opset: opset, Attrs: attrs, NumInputs: len(inputs), NumOutputs: nOut,
		InputPresent: make([]bool, len(inputs)), OutputPresent: make([]bool, nOut), Constants: make([]*tensor.Tensor, len(inputs))}
	for i, in := range inputs {
		n.InputPresent[i] = in != nil
	}
	for i := range n.OutputPresent {
		n.OutputPresent[i] = true
	}
	k, err := f(n)
	if err != nil {
		return nil, err
	}
	ctx := NewContext(inputs, n.OutputPresent, 2, nil)
	ctx.SetAllocator(poisonAlloc{})
	if err := k.Compute(ctx); err != nil {
		return nil, err
	}
	outs := make([]*tensor.Tensor, nOut)
	for i := range outs {
		outs[i] = ctx.Output(i)
	}
	return outs, nil
}

func ft(shape tensor.Shape, v ...float32) *tensor.Tensor {
	t, err := tensor.FromSlice(shape, v)
	if err != nil {
		return nil // a fixture with a wrong size; the case then fails
	}
	return t
}

func it(shape tensor.Shape, v ...int64) *tensor.Tensor {
	t, err := tensor.FromSlice(shape, v)
	if err != nil {
		return nil // a fixture with a wrong size; the case then fails
	}
	return t
}

func bt(shape tensor.Shape, v ...bool) *tensor.Tensor {
	t, err := tensor.FromSlice(shape, v)
	if err != nil {
		return nil // a fixture with a wrong size; the case then fails
	}
	return t
}

func ints(name string, v ...int64) *Attribute { return &Attribute{Name: name, Type: AttrInts, Ints: v} }
func intA(name string, v int64) *Attribute    { return &Attribute{Name: name, Type: AttrInt, I: v} }
func fltA(name string, v float32) *Attribute  { return &Attribute{Name: name, Type: AttrFloat, F: v} }
func strA(name, v string) *Attribute          { return &Attribute{Name: name, Type: AttrString, S: v} }

func attrs(as ...*Attribute) Attributes {
	m := Attributes{}
	for _, a := range as {
		m[a.Name] = a
	}
	return m
}

// values renders a tensor's values for comparison (floats to 4 decimals).
func values(t *tensor.Tensor) string {
	if t == nil {
		return "<nil>"
	}
	switch {
	case t.DType().IsFloat():
		f, _ := tensor.AsFloat32(t)
		s := "["
		for i, v := range f {
			if i > 0 {
				s += " "
			}
			if math.Abs(float64(v)) < 5e-5 {
				v = 0
			}
			s += fmt.Sprintf("%.4g", v)
		}
		return s + "]"
	case t.DType() == tensor.Bool:
		return fmt.Sprint(t.Bool())
	default:
		v, _ := tensor.Int64Values(t)
		return fmt.Sprint(v)
	}
}

type opCase struct {
	name   string
	op     string
	opset  int
	attrs  Attributes
	in     []*tensor.Tensor
	shape  tensor.Shape
	want   string
	dtype  tensor.DType // 0: same as the first input
	nOut   int
	outIdx int
}

func runCases(t *testing.T, cases []opCase) {
	t.Helper()
	for _, c := range cases {
		nOut := max(c.nOut, 1)
		outs, err := call(c.op, c.opset, c.attrs, nOut, c.in...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := outs[c.outIdx]
		want := c.dtype
		if want == 0 {
			want = c.in[0].DType()
		}
		if got == nil || !got.Shape().Equal(c.shape) || got.DType() != want || values(got) != c.want {
			t.Errorf("%s: got %v %s, want %v %v %s", c.name, got, values(got), want, c.shape, c.want)
		}
	}
}

// poisonAlloc fills every buffer with 0xFF bytes (NaN floats, -1 integers),
// like a recycled pool buffer holding an older tensor: a kernel that takes
// an output from NewOutputUninit and leaves an element unwritten fails its
// test case instead of passing on a fresh, zeroed allocation.
type poisonAlloc struct{}

func (poisonAlloc) Alloc(n int) ([]byte, bool, error) {
	w := make([]uint64, (n+7)/8)
	for i := range w {
		w[i] = ^uint64(0)
	}
	if n == 0 {
		return []byte{}, false, nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n), false, nil
}
