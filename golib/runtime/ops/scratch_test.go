package ops

import (
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestScratchReuse: scratch slices are zeroed, carved from one slab that
// later calls reuse after Reset (no allocation in a steady state), and
// large requests get fresh slices.
func TestScratchReuse(t *testing.T) {
	var c Context
	cases := []struct {
		name string
		get  func() unsafe.Pointer
		fill func()
	}{
		{"Ints", func() unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(c.Ints(5))) }, func() {
			for i, v := range c.Ints(5) {
				if v != 0 {
					t.Fatalf("Ints[%d] = %d after Reset, want 0", i, v)
				}
			}
		}},
		{"Int64s", func() unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(c.Int64s(5))) }, func() {
			for i, v := range c.Int64s(5) {
				if v != 0 {
					t.Fatalf("Int64s[%d] = %d after Reset, want 0", i, v)
				}
			}
		}},
		{"Bools", func() unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(c.Bools(5))) }, func() {
			for i, v := range c.Bools(5) {
				if v {
					t.Fatalf("Bools[%d] set after Reset", i)
				}
			}
		}},
	}
	for _, tc := range cases {
		c.Reset(nil, nil, 1, nil, nil)
		first := tc.get()
		c.Reset(nil, nil, 1, nil, nil)
		if again := tc.get(); again != first {
			t.Errorf("%s: a call after Reset got a new slab", tc.name)
		}
		c.Reset(nil, nil, 1, nil, nil)
		tc.fill()
	}
	a, b := c.Ints(3), c.Ints(3)
	a[0], a[1], a[2] = 1, 2, 3
	if b[0] != 0 || len(b) != 3 || cap(a) != 3 {
		t.Errorf("two slices of one call overlap: %v %v (cap %d)", a, b, cap(a))
	}
	if &c.Ints(maxScratch + 1)[0] == &c.Ints(maxScratch + 1)[0] {
		t.Error("large requests share memory")
	}
	sa, sb := tensor.Shape{2, 1, 4}, tensor.Shape{3, 1} // inputs' shapes live in their headers
	allocs := testing.AllocsPerRun(100, func() {
		c.Reset(nil, nil, 1, nil, nil)
		_ = c.Ints(100)
		_ = c.Int64s(7)
		_ = c.Bools(9)
		o, err := c.BroadcastShapes(sa, sb)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.BroadcastStrides(sb, o); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("steady-state scratch use allocates %v times per call", allocs)
	}
	var nilCtx *Context
	if len(nilCtx.Ints(4)) != 4 || len(nilCtx.Int64s(2)) != 2 || len(nilCtx.Bools(1)) != 1 {
		t.Error("a nil Context does not hand out fresh slices")
	}
}

// TestContextRecyclesHeaders: with an allocator, a node's next call reuses
// the header its last call made, unless the runtime pinned it (an output
// that left the run); without one, every call makes a new header.
func TestContextRecyclesHeaders(t *testing.T) {
	wanted := []bool{true}
	for _, tc := range []struct {
		name  string
		alloc Allocator
		pin   bool
		same  bool
	}{
		{"pooled", poisonAlloc{}, false, true},
		{"pooled, pinned", poisonAlloc{}, true, false},
		{"no allocator", nil, false, false},
	} {
		var c Context
		c.Reset(nil, wanted, 1, nil, tc.alloc)
		a, err := c.NewOutput(0, tensor.Float32, tensor.Shape{2, 3})
		if err != nil {
			t.Fatal(err)
		}
		if tc.pin {
			a.Pin()
		}
		c.Reset(nil, wanted, 1, nil, tc.alloc)
		b, err := c.NewOutputUninit(0, tensor.Int64, tensor.Shape{4})
		if err != nil {
			t.Fatal(err)
		}
		if (a == b) != tc.same {
			t.Errorf("%s: header reused = %v, want %v", tc.name, a == b, tc.same)
		}
		if b.DType() != tensor.Int64 || !b.Shape().Equal(tensor.Shape{4}) || b.NumBytes() != 32 {
			t.Errorf("%s: second output is %v with %d bytes", tc.name, b, b.NumBytes())
		}
		if !tc.same && (a.DType() != tensor.Float32 || !a.Shape().Equal(tensor.Shape{2, 3})) {
			t.Errorf("%s: the first output changed to %v", tc.name, a)
		}
		c.Reset(nil, wanted, 1, nil, tc.alloc)
		x := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
		if err := c.SetReshaped(0, x, tensor.Shape{3, 2}); err != nil {
			t.Fatal(err)
		}
		if y := c.Output(0); !y.Shape().Equal(tensor.Shape{3, 2}) || values(y) != values(x) {
			t.Errorf("%s: SetReshaped gave %v %s", tc.name, y, values(y))
		}
		if err := c.SetReshaped(0, x, tensor.Shape{4, 2}); err == nil {
			t.Errorf("%s: SetReshaped to another element count succeeded", tc.name)
		}
	}
}

// TestScratchFloats: Float32s/Float64s are zeroed slices of the scratch,
// AsFloat32 returns a float32 tensor's own elements and converts the other
// float types into scratch, equal to tensor.AsFloat32, without allocating
// in a steady state.
func TestScratchFloats(t *testing.T) {
	var c Context
	f32, _ := tensor.FromSlice(tensor.Shape{3}, []float32{1.5, -2, 3})
	f64, _ := tensor.FromSlice(tensor.Shape{2, 2}, []float64{0.25, -1, 1e-3, 7})
	f16, _ := tensor.New(tensor.Float16, tensor.Shape{5})
	if err := tensor.FromFloat32(f16, []float32{0, 1, -0.5, 65504, 6e-8}); err != nil {
		t.Fatal(err)
	}
	bf, _ := tensor.New(tensor.BFloat16, tensor.Shape{2})
	if err := tensor.FromFloat32(bf, []float32{3.5, -1}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*tensor.Tensor{f32, f64, f16, bf} {
		c.Reset(nil, nil, 1, nil, nil)
		got, err := c.AsFloat32(x)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tensor.AsFloat32(x)
		if len(got) != len(want) {
			t.Fatalf("%v: %d values, want %d", x, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%v: value %d = %v, want %v", x, i, got[i], want[i])
			}
		}
		if x == f32 && &got[0] != &x.Float32()[0] {
			t.Error("AsFloat32 of a float32 tensor copied it")
		}
	}
	allocs := testing.AllocsPerRun(100, func() {
		c.Reset(nil, nil, 1, nil, nil)
		if _, err := c.AsFloat32(f16); err != nil {
			t.Fatal(err)
		}
		for i, v := range c.Float32s(6) {
			if v != 0 {
				t.Fatalf("Float32s[%d] = %v after Reset", i, v)
			}
		}
		for i, v := range c.Float64s(3) {
			if v != 0 {
				t.Fatalf("Float64s[%d] = %v after Reset", i, v)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("steady-state float scratch allocates %v times per call", allocs)
	}
}

// TestContextSpares: without an allocator, an offered spare's header and
// buffer serve NewOutput when they fit (Made and Fresh report it), a view
// reuses the spare's header (Fresh, not Made), a tensor passed through is
// neither, a pinned spare is never reused, and an output too large for
// the spare gets a new buffer with room to grow.
func TestContextSpares(t *testing.T) {
	wanted := []bool{true}
	var c Context
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, nil, false)
	first, err := c.NewOutput(0, tensor.Int64, tensor.Shape{2})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Made(0) || !c.Fresh(0) {
		t.Fatal("a new output is not reported as made")
	}
	first.Int64()[0] = 9
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, first, true)
	again, err := c.NewOutput(0, tensor.Int64, tensor.Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	if again != first || again.Int64()[0] != 0 || !again.Shape().Equal(tensor.Shape{3}) {
		t.Fatalf("the spare was not reused and cleared: %v %v", again, again.Int64())
	}
	src, _ := tensor.FromSlice(tensor.Shape{2, 2}, []float32{1, 2, 3, 4})
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, again, true)
	if err := c.SetReshaped(0, src, tensor.Shape{4}); err != nil {
		t.Fatal(err)
	}
	if v := c.Output(0); v != again || c.Made(0) || !c.Fresh(0) || &v.Float32()[0] != &src.Float32()[0] {
		t.Fatal("a view did not reuse the spare header over its input's bytes")
	}
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, nil, false)
	_ = c.SetOutput(0, src)
	if c.Made(0) || c.Fresh(0) {
		t.Fatal("a tensor passed through is reported as the node's own")
	}
	pinned, _ := tensor.NewCap(tensor.Int64, tensor.Shape{1}, 64)
	pinned.Pin()
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, pinned, true)
	if out, _ := c.NewOutput(0, tensor.Int64, tensor.Shape{1}); out == pinned {
		t.Fatal("a pinned spare was reused")
	}
	small, _ := tensor.NewCap(tensor.Float32, tensor.Shape{20}, 80)
	c.Reset(nil, wanted, 1, nil, nil)
	c.SetSpare(0, small, true)
	big, err := c.NewOutput(0, tensor.Float32, tensor.Shape{30})
	if err != nil {
		t.Fatal(err)
	}
	if big == small || cap(big.Bytes()) < 2*big.NumBytes() {
		t.Fatalf("an output larger than its spare: same %v, capacity %d for %d bytes", big == small, cap(big.Bytes()), big.NumBytes())
	}
}
