// Package ops holds the op kernels of the runtime and the registry that maps
// (domain, op_type, opset version) to them.
//
// # Adding an op
//
// One file per op or op family (attention.go, matmul.go, gemm.go, ...), with
// its test file beside it. In the file:
//
//	func init() {
//		// Valid for models whose opset import of the domain is 13..max.
//		// Use a second Register call for an older version with other
//		// semantics (for example Softmax 1..12 vs 13+).
//		Register("", "MatMul", 13, 0, newMatMul) // 0 = no upper bound
//	}
//
//	// newMatMul runs once per node when a session is created: read and
//	// validate attributes here (n.Attrs.Int("transA", 0), ...), return a
//	// clear error for a case that is not implemented
//	// (fmt.Errorf("%w: ...", errs.ErrNotImplemented)); never panic.
//	func newMatMul(n *Node) (Kernel, error) {
//		return KernelFunc(func(ctx *Context) error {
//			a, b := ctx.Input(0), ctx.Input(1) // nil = omitted optional input
//			out, err := ctx.NewOutput(0, a.DType(), shape) // zero-filled, counted
//			if err != nil {
//				return err
//			}
//			dst := out.Float32() // typed view, no copy (nil on dtype mismatch)
//			_ = ctx.Threads()    // worker goroutines this node may use (>= 1)
//			// or split work: err = ctx.ParallelFor(rows, grain, func(lo, hi int) {...})
//			return nil
//		}), nil
//	}
//
// At factory time n.Constants[i] holds input i's value when it is an
// initializer (weights), so a kernel may pre-pack it once; it still
// arrives as ctx.Input(i) at run time. n.InputPresent / n.OutputPresent
// tell which optional inputs and outputs the node uses;
// ctx.OutputWanted(i) says the same at run time. n.InputType(i) is input
// i's element type when the graph declares it; a kernel that computes a
// fixed set of types refuses a declared type it lacks with n.checkTypes,
// so the session fails at creation (errs.ErrNotImplemented), not every run.
//
// Rules: the domain is "" for the default ONNX domain ("ai.onnx" is accepted
// as a synonym) and "com.microsoft" for contrib ops. Kernels must not modify
// their inputs (outputs may alias an input only through
// tensor.Tensor.Reshaped, as Reshape does). Check dtypes and shapes and
// return errors wrapping errs.ErrType / errs.ErrShape /
// errs.ErrInvalidArgument; fp16/bf16 compute in fp32 (tensor.AsFloat32 and
// tensor.FromFloat32). A kernel value is shared by every Run of a session,
// which may run concurrently on different contexts: keep per-run state in
// local variables, not in the kernel. Registration conflicts (an overlapping
// version range) are reported by RegistryErrors and fail TestRegistry.
package ops

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Kernel computes one node of a graph.
type Kernel interface {
	Compute(ctx *Context) error
}

// KernelFunc adapts a function to Kernel.
type KernelFunc func(ctx *Context) error

// Compute calls f(ctx).
func (f KernelFunc) Compute(ctx *Context) error { return f(ctx) }

// Factory builds the kernel of one node, once, at session creation.
type Factory func(n *Node) (Kernel, error)

// Node describes the graph node a Factory builds a kernel for.
type Node struct {
	Name       string // node name (may be empty)
	OpType     string
	Domain     string // "" for the default ONNX domain
	Opset      int    // the model's opset version for Domain
	Attrs      Attributes
	NumInputs  int // including omitted optional inputs ("" names)
	NumOutputs int // including omitted optional outputs
	// InputPresent[i] is false for an omitted optional input.
	InputPresent []bool
	// OutputPresent[i] is false for an omitted optional output.
	OutputPresent []bool
	// Constants holds the value of each input that is an initializer or a
	// Constant output known at session creation (nil otherwise), so a
	// factory can precompute from it. Kernels still receive it as input.
	Constants []*tensor.Tensor
	// InputTypes holds the element type the graph declares for each input
	// (a graph input's, an initializer's, value_info's), tensor.Undefined
	// where it declares none; nil when the planner knows none. Read it
	// through InputType, which also takes Constants' types (see types.go).
	InputTypes []tensor.DType
	// Packs, when set, shares the values factories derive from Constants
	// with the other plans of the same session (see Packs).
	Packs *Packs
	// Packed[i] is set by a factory whose kernel reads constant input i
	// only through what it derived from it at build time (a packed
	// weight) and never reads the constant's values again: the session
	// may release a constant all of whose readers say so. Factories leave
	// it nil otherwise; a rebuild starts from nil.
	Packed []bool
}

// markPacked records that the kernel built from n reads constant input i
// only through a value derived from it (see Node.Packed).
func (n *Node) markPacked(i int) {
	if len(n.Packed) < len(n.Constants) {
		n.Packed = append(n.Packed, make([]bool, len(n.Constants)-len(n.Packed))...)
	}
	n.Packed[i] = true
}

// Describe returns "OpType (domain d, opset v)" for error messages.
func (n *Node) Describe() string {
	d := n.Domain
	if d == "" {
		d = "ai.onnx"
	}
	s := fmt.Sprintf("%s (domain %s, opset %d)", n.OpType, d, n.Opset)
	if n.Name != "" {
		s = fmt.Sprintf("node %q: %s", n.Name, s)
	}
	return s
}

type entry struct {
	since, until int // inclusive; until 0 = open
	factory      Factory
}

var (
	regMu     sync.RWMutex
	registry  = map[string][]entry{}
	regErrors []error
)

func regKey(domain, opType string) string { return NormDomain(domain) + "\x00" + opType }

// NormDomain maps "ai.onnx" to "" and leaves other domains unchanged.
func NormDomain(domain string) string {
	if domain == "ai.onnx" {
		return ""
	}
	return domain
}

// Register declares that f implements opType in domain for models whose
// opset import of that domain is in [since, until] (until 0 = no upper
// bound). Call it from an init function. An overlapping range for the same
// op is recorded as an error (see RegistryErrors) and ignored.
func Register(domain, opType string, since, until int, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	if since < 1 || (until != 0 && until < since) || f == nil {
		regErrors = append(regErrors, fmt.Errorf("ops: bad registration of %s/%s [%d, %d]", domain, opType, since, until))
		return
	}
	k := regKey(domain, opType)
	for _, e := range registry[k] {
		if overlaps(e.since, e.until, since, until) {
			regErrors = append(regErrors, fmt.Errorf("ops: %s/%s [%d, %d] overlaps [%d, %d]", domain, opType, since, until, e.since, e.until))
			return
		}
	}
	registry[k] = append(registry[k], entry{since, until, f})
}

func overlaps(a0, a1, b0, b1 int) bool {
	if a1 == 0 {
		a1 = int(^uint(0) >> 1)
	}
	if b1 == 0 {
		b1 = int(^uint(0) >> 1)
	}
	return a0 <= b1 && b0 <= a1
}

// Lookup returns the factory for opType in domain at the model's opset
// version, or an error wrapping errs.ErrUnsupportedOp that names the op, its
// domain and version.
func Lookup(domain, opType string, opset int) (Factory, error) {
	regMu.RLock()
	defer regMu.RUnlock()
	for _, e := range registry[regKey(domain, opType)] {
		if opset >= e.since && (e.until == 0 || opset <= e.until) {
			return e.factory, nil
		}
	}
	d := NormDomain(domain)
	if d == "" {
		d = "ai.onnx"
	}
	return nil, fmt.Errorf("%w: %s (domain %s, opset %d) has no kernel", errs.ErrUnsupportedOp, opType, d, opset)
}

// RegistryErrors returns the registration conflicts recorded so far.
func RegistryErrors() []error {
	regMu.RLock()
	defer regMu.RUnlock()
	return append([]error(nil), regErrors...)
}

// Registered lists "domain/op [since, until]" for every registration, sorted,
// for diagnostics and documentation.
func Registered() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var out []string
	for k, es := range registry {
		name := strings.Replace(k, "\x00", "/", 1)
		for _, e := range es {
			out = append(out, fmt.Sprintf("%s [%d, %d]", name, e.since, e.until))
		}
	}
	sort.Strings(out)
	return out
}

// requireInputs wraps f to refuse a node with fewer than n inputs given
// (inputs the op requires), instead of reading a missing one as omitted.
func requireInputs(n int, f Factory) Factory {
	return func(node *Node) (Kernel, error) {
		for i := 0; i < n; i++ {
			if i >= len(node.InputPresent) || !node.InputPresent[i] {
				return nil, fmt.Errorf("%w: %s (opset %d) requires input %d", errs.ErrInvalidModel, node.OpType, node.Opset, i)
			}
		}
		return f(node)
	}
}
