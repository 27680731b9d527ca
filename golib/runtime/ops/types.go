package ops

import (
	"fmt"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Session-creation type checks: the planner records in Node.InputTypes
// the element types the graph declares for a node's inputs (graph inputs,
// initializers, value_info, graph outputs), and a factory whose kernel
// computes a fixed set of element types (a typeSet, which its Compute also
// checks at run time) refuses a declared type outside the set with
// Node.checkTypes, so the session fails at creation with
// errs.ErrNotImplemented naming the op and the type instead of every run
// failing with errs.ErrType. Inputs whose types are not declared are
// checked by the kernel at run time only.

// typeSet is the element types a kernel computes for its typed inputs.
type typeSet []tensor.DType

var (
	// floatTypes are the floating-point types.
	floatTypes = typeSet{tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Float64}
	// numericTypes are the floating-point and integer types.
	numericTypes = typeSet{tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Float64,
		tensor.Int64, tensor.Int32, tensor.Int8, tensor.Uint8, tensor.Int16, tensor.Uint16, tensor.Uint32}
)

// has reports whether dt is in s.
func (s typeSet) has(dt tensor.DType) bool {
	for _, t := range s {
		if t == dt {
			return true
		}
	}
	return false
}

// String lists the types: "float32, float16 and bfloat16".
func (s typeSet) String() string {
	names := make([]string, len(s))
	for i, t := range s {
		names[i] = t.String()
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// InputType returns the element type of input i known at session
// creation: a constant's, else the one the graph declares
// (Node.InputTypes); tensor.Undefined when neither is known.
func (n *Node) InputType(i int) tensor.DType {
	if i < 0 {
		return tensor.Undefined
	}
	if i < len(n.Constants) && n.Constants[i] != nil {
		return n.Constants[i].DType()
	}
	if i < len(n.InputTypes) {
		return n.InputTypes[i]
	}
	return tensor.Undefined
}

// checkTypes returns an error wrapping errs.ErrNotImplemented, naming the
// op and the type, when the type of one of the given inputs is known at
// session creation and not in s; unknown types pass (the kernel checks
// them at run time).
func (n *Node) checkTypes(s typeSet, inputs ...int) error {
	for _, i := range inputs {
		if dt := n.InputType(i); dt != tensor.Undefined && !s.has(dt) {
			return fmt.Errorf("%w: %s on %v (input %d); its kernel computes %v", errs.ErrNotImplemented,
				n.OpType, dt, i, s)
		}
	}
	return nil
}
