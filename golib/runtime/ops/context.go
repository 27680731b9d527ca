package ops

import (
	"fmt"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Scope is the runtime's opaque per-run state (its value stores). Kernels
// pass it to Subgraph.Run unchanged.
type Scope interface{}

// Subgraph is a compiled graph attribute (If branches, Loop bodies). The
// runtime builds it once at session creation.
type Subgraph interface {
	// Run executes the subgraph with the given formal inputs; outer-scope
	// values are read from parent without copies.
	Run(parent Scope, inputs []*tensor.Tensor) ([]*tensor.Tensor, error)
	// NumOutputs returns the number of graph outputs.
	NumOutputs() int
	// OutputType returns graph output i's declared element type (ok false
	// when it declares none) and its shape when every dimension is fixed
	// (nil otherwise).
	OutputType(i int) (dt tensor.DType, shape tensor.Shape, ok bool)
}

// Allocator supplies output buffers for kernel calls; the runtime
// implements it with a per-state pool that recycles buffers across runs.
type Allocator interface {
	// Alloc returns a buffer of n bytes, 8-byte aligned, and whether its
	// bytes are known to be zero (its contents are unspecified otherwise),
	// or an error (wrapping errs.ErrMemory) when the system cannot give
	// the memory.
	Alloc(n int) (b []byte, zeroed bool, err error)
}

// Context carries one node's inputs and outputs for one Compute call. The
// runtime fills it; kernels read inputs and set outputs.
//
// The fields Reset reads and writes for every call come first, so a call
// touches few cache lines of a Context it has not used since the last run.
type Context struct {
	// spares holds, per output, what SetSpare offered for it and what this
	// call made of it (outSpare), nil until the runtime offers a spare.
	spares  []outSpare
	inputs  []*tensor.Tensor
	outputs []*tensor.Tensor
	wanted  []bool
	threads int
	scope   Scope
	alloc   Allocator
	// Allocated counts the bytes of outputs allocated through NewOutput,
	// for profiling and peak-memory accounting.
	Allocated int64
	// scratch holds the call's temporary shapes, strides and index lists
	// (scratch.go), reused by the node's later calls.
	scratch scratch
	// hdrs holds, per output, the tensor header the last call with an
	// allocator made (recycled by the next such call, see tensor.Recycle).
	hdrs []*tensor.Tensor
	// outBuf and hdrBuf back outputs and hdrs for nodes with at most
	// inlineOutputs outputs (nearly all), so a call finds them in the
	// Context's own memory instead of two more small allocations.
	outBuf, hdrBuf [inlineOutputs]*tensor.Tensor
}

// inlineOutputs is the largest output count whose outputs and headers a
// Context keeps in itself.
const inlineOutputs = 2

// perOutput returns a cleared slice of n tensors, in inline when n fits.
func perOutput(inline *[inlineOutputs]*tensor.Tensor, n int) []*tensor.Tensor {
	if n <= inlineOutputs {
		*inline = [inlineOutputs]*tensor.Tensor{}
		return inline[:n:n]
	}
	return make([]*tensor.Tensor, n)
}

// outSpare is a Context's record of one output of a node the runtime offers
// spares (SetSpare): t is a tensor of an earlier call nothing reads any
// more, offered for this call's output, owned whether its buffer is its
// own; made says whether this call allocated the output through NewOutput,
// fresh whether it has a header this call made (NewOutput, SetReshaped).
type outSpare struct {
	t                  *tensor.Tensor
	owned, made, fresh bool
}

// NewContext prepares a context for one Compute call. inputs may contain nil
// for omitted optional inputs; wanted[i] tells whether output i is used.
func NewContext(inputs []*tensor.Tensor, wanted []bool, threads int, scope Scope) *Context {
	if threads < 1 {
		threads = 1
	}
	return &Context{inputs: inputs, outputs: make([]*tensor.Tensor, len(wanted)), wanted: wanted, threads: threads, scope: scope}
}

// NumInputs returns the number of input slots (omitted ones included).
func (c *Context) NumInputs() int { return len(c.inputs) }

// Input returns input i, or nil when it is omitted or i is out of range.
func (c *Context) Input(i int) *tensor.Tensor {
	if i < 0 || i >= len(c.inputs) {
		return nil
	}
	return c.inputs[i]
}

// RequireInput returns input i or an error naming the missing input.
func (c *Context) RequireInput(i int) (*tensor.Tensor, error) {
	if t := c.Input(i); t != nil {
		return t, nil
	}
	return nil, fmt.Errorf("%w: required input %d is missing", errs.ErrMissingInput, i)
}

// NumOutputs returns the number of output slots.
func (c *Context) NumOutputs() int { return len(c.outputs) }

// OutputWanted reports whether output i is consumed (false for an omitted
// optional output, which the kernel may skip computing).
func (c *Context) OutputWanted(i int) bool { return i >= 0 && i < len(c.wanted) && c.wanted[i] }

// SetAllocator makes NewOutput and NewOutputUninit take their buffers from
// a (nil: fresh Go allocations).
func (c *Context) SetAllocator(a Allocator) { c.alloc = a }

// NewOutput allocates a zero-filled output i of the given type and shape and
// stores it in the context.
func (c *Context) NewOutput(i int, dt tensor.DType, shape tensor.Shape) (*tensor.Tensor, error) {
	return c.newOutput(i, dt, shape, true)
}

// NewOutputUninit is NewOutput for kernels that write every element of the
// output: its contents are unspecified (a recycled buffer is not cleared),
// which spares a pass over the memory.
func (c *Context) NewOutputUninit(i int, dt tensor.DType, shape tensor.Shape) (*tensor.Tensor, error) {
	return c.newOutput(i, dt, shape, false)
}

// errOutputIndex is the error of a kernel that writes output i of a node
// declaring n outputs: the model gave the node fewer outputs than its op has.
func errOutputIndex(i, n int) error {
	return fmt.Errorf("%w: the op writes output %d, but the node declares %d output(s)", errs.ErrInvalidModel, i, n)
}

func (c *Context) newOutput(i int, dt tensor.DType, shape tensor.Shape, zero bool) (*tensor.Tensor, error) {
	if i < 0 || i >= len(c.outputs) {
		return nil, errOutputIndex(i, len(c.outputs))
	}
	var t *tensor.Tensor
	if c.alloc == nil {
		var err error
		if t, err = c.spareOutput(i, dt, shape, zero); err != nil {
			return nil, err
		}
	} else {
		nb, err := tensor.ByteSize(dt, shape)
		if err != nil {
			return nil, err
		}
		b, zeroed, err := c.alloc.Alloc(nb)
		if err != nil {
			return nil, fmt.Errorf("output %d, a %v tensor of shape %v: %w", i, dt, shape, err)
		}
		if zero && !zeroed {
			clear(b)
		}
		if t, err = c.header(i, dt, shape, b); err != nil {
			return nil, err
		}
	}
	c.outputs[i] = t
	if len(c.spares) == len(c.outputs) {
		c.spares[i].made, c.spares[i].fresh = true, true
	}
	c.Allocated += int64(t.NumBytes())
	return t, nil
}

// SetSpare offers t, an earlier output i of this node that nothing reads
// or views any more, for output i of the next Compute call (until Reset):
// without an allocator, NewOutput writes into t's header and, when owned
// (t's buffer is its own: it was made by NewOutput), its buffer; SetReshaped
// reuses its header. The shape cache hands back a node's replaced outputs
// this way, so shape arithmetic whose values change at every run (the past
// length) does not allocate.
func (c *Context) SetSpare(i int, t *tensor.Tensor, owned bool) {
	if i < 0 || i >= len(c.outputs) {
		return
	}
	if n := len(c.outputs); len(c.spares) != n {
		c.spares = make([]outSpare, n)
	}
	c.spares[i].t, c.spares[i].owned = t, owned
}

// Made reports whether output i was allocated by NewOutput in this call
// (its buffer is its own, not an input's or a view), as far as SetSpare was
// used on this context; false otherwise.
func (c *Context) Made(i int) bool {
	return i >= 0 && i < len(c.spares) && c.spares[i].made && c.outputs[i] != nil
}

// Fresh reports whether output i's header was made by this call (NewOutput
// or SetReshaped; not an input or a tensor passed through), as far as
// SetSpare was used on this context; false otherwise.
func (c *Context) Fresh(i int) bool {
	return i >= 0 && i < len(c.spares) && c.spares[i].fresh && c.outputs[i] != nil
}

// spareOutput makes output i without an allocator: in the spare's header
// and buffer when one was offered and fits, else, when the runtime tracks
// the output's spares (SetSpare), a new tensor with room to grow (the value
// may change size between runs).
func (c *Context) spareOutput(i int, dt tensor.DType, shape tensor.Shape, zero bool) (*tensor.Tensor, error) {
	if i >= len(c.spares) {
		return tensor.New(dt, shape)
	}
	sp, owned := c.spares[i].t, c.spares[i].owned
	c.spares[i].t = nil
	nb, err := tensor.ByteSize(dt, shape)
	if err != nil {
		return nil, err
	}
	if sp != nil && owned {
		if t := tensor.Reuse(sp, dt, shape, nb); t != nil {
			if zero {
				clear(t.Bytes())
			}
			return t, nil
		}
	}
	return tensor.NewCap(dt, shape, 2*nb)
}

// takeSpare returns output i's spare header (nil: none) and withdraws it.
func (c *Context) takeSpare(i int) *tensor.Tensor {
	if i >= len(c.spares) {
		return nil
	}
	sp := c.spares[i].t
	c.spares[i].t = nil
	return sp
}

// header returns a tensor header for output i over b: with an allocator
// (the runtime's main-plan runs, whose headers do not outlive the run
// unless the runtime pins them), the one the last call made, recycled.
func (c *Context) header(i int, dt tensor.DType, shape tensor.Shape, b []byte) (*tensor.Tensor, error) {
	if c.alloc == nil {
		if sp := c.takeSpare(i); sp != nil {
			return tensor.Recycle(sp, dt, shape, b)
		}
		return tensor.FromBytes(dt, shape, b)
	}
	if len(c.hdrs) != len(c.outputs) {
		c.hdrs = perOutput(&c.hdrBuf, len(c.outputs))
	}
	t, err := tensor.Recycle(c.hdrs[i], dt, shape, b)
	if err == nil {
		c.hdrs[i] = t
	}
	return t, err
}

// SetReshaped sets output i to x viewed in shape (no copy); shape must
// have x's element count.
func (c *Context) SetReshaped(i int, x *tensor.Tensor, shape tensor.Shape) error {
	if i < 0 || i >= len(c.outputs) {
		return errOutputIndex(i, len(c.outputs))
	}
	if n, err := shape.NumElements(); err != nil {
		return err
	} else if n != x.Len() {
		return fmt.Errorf("%w: cannot reshape %v (%d elements) to %v", errs.ErrShape, x.Shape(), x.Len(), shape)
	}
	y, err := c.header(i, x.DType(), shape, x.Bytes())
	if err != nil {
		return err
	}
	c.outputs[i] = y
	if len(c.spares) == len(c.outputs) {
		c.spares[i].made, c.spares[i].fresh = false, true
	}
	return nil
}

// SetOutput stores t as output i (for outputs that alias an input, such as
// Identity or Reshape, or tensors built elsewhere).
func (c *Context) SetOutput(i int, t *tensor.Tensor) error {
	if i < 0 || i >= len(c.outputs) {
		return errOutputIndex(i, len(c.outputs))
	}
	c.outputs[i] = t
	if len(c.spares) == len(c.outputs) {
		c.spares[i].made, c.spares[i].fresh = false, false
	}
	return nil
}

// Output returns output i as set by the kernel (nil if not set).
func (c *Context) Output(i int) *tensor.Tensor {
	if i < 0 || i >= len(c.outputs) {
		return nil
	}
	return c.outputs[i]
}

// Threads returns how many goroutines the kernel may use (at least 1).
func (c *Context) Threads() int { return c.threads }

// Scope returns the runtime's per-run state, for Subgraph.Run.
func (c *Context) Scope() Scope { return c.scope }

// ParallelFor splits [0, n) into at most Threads() contiguous chunks of at
// least grain items and calls fn(lo, hi) for each, concurrently; it returns
// when all are done. fn must only write disjoint data. A panic in fn is
// returned as an error (a panic on a worker goroutine would otherwise end
// the process, past every recover of the bindings).
func (c *Context) ParallelFor(n, grain int, fn func(lo, hi int)) error {
	return ParallelFor(c.threads, n, grain, fn)
}

// Serial reports whether ParallelFor(n, grain, ...) would run as one chunk
// on the caller's goroutine: a kernel can then call its loop directly and
// spare the closure's heap allocation (a panic is then recovered by the
// executor, not by ParallelFor).
func (c *Context) Serial(n, grain int) bool {
	return c.threads <= 1 || n <= max(grain, 1)
}

// ParallelFor is Context.ParallelFor with an explicit thread count. The
// chunks run on the persistent worker pool of package gemm (the one the
// products use), not on goroutines started per call: one pool whose
// helpers are already polling between the ops of a step, instead of a
// second set of goroutines competing with them for the processors.
func ParallelFor(threads, n, grain int, fn func(lo, hi int)) error {
	if n <= 0 {
		return nil
	}
	if grain < 1 {
		grain = 1
	}
	chunks := (n + grain - 1) / grain
	if chunks > threads {
		chunks = threads
	}
	if chunks <= 1 {
		return serialCall(fn, n)
	}
	return parallelChunks(threads, chunks, n, fn)
}

// serialCall runs fn(0, n) on the caller's goroutine, a panic returned as
// an error (kept apart from parallelChunks so the error of the common
// serial call is not moved to the heap).
func serialCall(fn func(lo, hi int), n int) (err error) {
	defer recoverErr(&err)
	fn(0, n)
	return nil
}

// parallelChunks runs fn over [0, n) in chunks on the worker pool.
func parallelChunks(threads, chunks, n int, fn func(lo, hi int)) error {
	step := (n + chunks - 1) / chunks
	chunks = (n + step - 1) / step
	var mu sync.Mutex
	var err error
	gemm.ForThreads(threads, chunks, func(c int) {
		lo := c * step
		hi := min(lo+step, n)
		var e error
		func() {
			// a panic on a pool helper would end the process, past every
			// recover of the bindings
			defer recoverErr(&e)
			fn(lo, hi)
		}()
		if e != nil {
			mu.Lock()
			if err == nil {
				err = e
			}
			mu.Unlock()
		}
	})
	return err
}

func recoverErr(errp *error) {
	if r := recover(); r != nil {
		*errp = fmt.Errorf("ops: internal error in parallel kernel: %v", r)
	}
}
