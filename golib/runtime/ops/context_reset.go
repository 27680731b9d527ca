package ops

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"

// Reset prepares c for another Compute call of the same node without
// allocating: it takes new inputs, clears the outputs (reusing their slots
// when the count is unchanged) and the Allocated counter, and sets the
// thread count, scope and allocator (nil: fresh Go allocations). The runtime
// keeps one Context per node and state, so the run path allocates none.
func (c *Context) Reset(inputs []*tensor.Tensor, wanted []bool, threads int, scope Scope, alloc Allocator) {
	if threads < 1 {
		threads = 1
	}
	if len(c.outputs) == len(wanted) {
		clear(c.outputs)
	} else {
		c.outputs = perOutput(&c.outBuf, len(wanted))
	}
	c.scratch.reset()
	switch {
	case c.spares == nil: // the usual case: the runtime offers no spares to this node
	case len(c.spares) == len(wanted):
		clear(c.spares)
	default:
		c.spares = nil
	}
	c.inputs, c.wanted, c.threads, c.scope, c.alloc, c.Allocated = inputs, wanted, threads, scope, alloc, 0
}
