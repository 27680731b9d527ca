package ops

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"

// A kernel call needs small temporaries: broadcast shapes and strides, the
// values of a shape or axes input, index counters. Allocated fresh they
// were most of the Go allocations of a decode step (a few per node, for
// hundreds of nodes). The runtime keeps one Context per node and state, so
// a Context keeps slabs that its calls carve those temporaries from; Reset
// rewinds them. A slab that runs out is replaced by one twice as large (the
// slices already handed out keep the old one), so after the first calls of
// a shape a node's calls allocate nothing.
//
// Scratch slices are valid until the next Reset of the Context: a kernel
// must not keep them in an output or anywhere else beyond its call (output
// shapes are copied into the tensor header, so passing one to NewOutput is
// fine).

// minScratch is the first slab's length, in elements; requests above
// maxScratch elements (index lists of a large prefill) are fresh slices, so
// a node does not keep a large slab for the rest of the state's life.
const (
	minScratch = 64
	maxScratch = 1 << 14
)

// scratch is a Context's pair of bump allocators.
//
// The offsets come first, side by side: Context.Reset writes them for every
// node call, and they share a cache line with the Context fields it writes.
type scratch struct {
	intsOff, i64Off, boolOff, f32Off, f64Off int

	ints  []int
	i64   []int64
	bools []bool
	f32   []float32
	f64   []float64
}

func (s *scratch) reset() { s.intsOff, s.i64Off, s.boolOff, s.f32Off, s.f64Off = 0, 0, 0, 0, 0 }

// carve returns n elements of *slab from *off on, zeroed, replacing the slab
// when it is too short.
func carve[T int | int64 | bool | float32 | float64](slab *[]T, off *int, n int) []T {
	if n > maxScratch {
		return make([]T, n)
	}
	if *off+n > len(*slab) {
		*slab = make([]T, max(2*len(*slab), n, minScratch))
		*off = 0
	}
	out := (*slab)[*off : *off+n : *off+n]
	*off += n
	clear(out)
	return out
}

// Ints returns a zeroed []int of length n that lives until the next Reset
// (a nil Context returns a fresh slice).
func (c *Context) Ints(n int) []int {
	if c == nil {
		return make([]int, n)
	}
	return carve(&c.scratch.ints, &c.scratch.intsOff, n)
}

// Int64s returns a zeroed []int64 of length n that lives until the next
// Reset (a nil Context returns a fresh slice).
func (c *Context) Int64s(n int) []int64 {
	if c == nil {
		return make([]int64, n)
	}
	return carve(&c.scratch.i64, &c.scratch.i64Off, n)
}

// Bools returns a []bool of length n, all false, that lives until the next
// Reset (a nil Context returns a fresh slice).
func (c *Context) Bools(n int) []bool {
	if c == nil {
		return make([]bool, n)
	}
	return carve(&c.scratch.bools, &c.scratch.boolOff, n)
}

// Float32s returns a zeroed []float32 of length n that lives until the next
// Reset (a nil Context returns a fresh slice).
func (c *Context) Float32s(n int) []float32 {
	if c == nil {
		return make([]float32, n)
	}
	return carve(&c.scratch.f32, &c.scratch.f32Off, n)
}

// AsFloat32 is tensor.AsFloat32 into scratch: t's own elements when it is
// float32 (read only), else its values converted into a slice that lives
// until the next Reset (a nil Context converts into a fresh slice).
func (c *Context) AsFloat32(t *tensor.Tensor) ([]float32, error) {
	if v := t.Float32(); v != nil || t.Len() == 0 {
		return v, nil
	}
	dst := c.Float32s(t.Len())
	if err := tensor.ToFloat32(t, dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// Float64s returns a zeroed []float64 of length n that lives until the next
// Reset (a nil Context returns a fresh slice).
func (c *Context) Float64s(n int) []float64 {
	if c == nil {
		return make([]float64, n)
	}
	return carve(&c.scratch.f64, &c.scratch.f64Off, n)
}

// ScratchShape returns a zeroed shape of rank n from the scratch slabs.
func (c *Context) ScratchShape(n int) tensor.Shape { return tensor.Shape(c.Ints(n)) }

// BroadcastShapes is tensor.BroadcastShapes into scratch.
func (c *Context) BroadcastShapes(shapes ...tensor.Shape) (tensor.Shape, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	return tensor.BroadcastShapesTo(c.ScratchShape(rank), shapes...)
}

// BroadcastStrides is tensor.BroadcastStrides into scratch.
func (c *Context) BroadcastStrides(src, dst tensor.Shape) ([]int, error) {
	return tensor.BroadcastStridesTo(c.Ints(len(dst)), src, dst)
}

// Int64Values is tensor.Int64Values into scratch: t's values widened to
// int64, in a slice the caller may modify.
func (c *Context) Int64Values(t *tensor.Tensor) ([]int64, error) {
	return tensor.Int64ValuesTo(c.Int64s(t.Len()), t)
}
