package runtime

import (
	"fmt"
	"maps"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/rewrite"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Session-creation folding of the main graph (foldPlan):
//
//   - constant folding: a node whose inputs are all constants (initializers
//     that no feed can replace, or values folded before it) is run once and
//     its outputs become initializers;
//   - Identity nodes and Casts to the element type their input already has
//     are dropped, their readers reading the input instead.
//
// Nodes are never folded when they are random, have subgraphs, or produce a
// graph output (a caller may write into an output it receives, which must
// not be a value later runs read). Kernels of nodes that gain constant
// inputs are rebuilt, so their factories can precompute from them (packed
// weights, fixed reshape targets). Values that depend on the input geometry
// only are handled per run by the shape cache (shapecache.go).

// maxFoldedBytes bounds one folded value: a larger constant (an Expand or
// ConstantOfShape of a weight) is computed per run rather than kept.
const maxFoldedBytes = 64 << 20

// nondeterministic lists the ops whose outputs may differ between two calls
// on the same inputs; they are never folded or cached.
var nondeterministic = map[string]bool{
	"RandomNormal": true, "RandomUniform": true, "RandomNormalLike": true, "RandomUniformLike": true,
	"Multinomial": true, "Bernoulli": true, "Dropout": true,
}

// pure reports whether n's outputs are a function of its inputs' values
// (and attributes) alone. The cache path's ops are not: they read and write
// the generation state (a past's logical shape grows with every step).
func pure(n *PlanNode) bool {
	return !n.subgraphs && len(n.Captures) == 0 && !nondeterministic[n.OpType] && len(n.Outputs) > 0 &&
		n.Domain != rewrite.Domain
}

// foldPlan folds p (the plan of g, in topological order) in place.
func foldPlan(p *Plan, g *model.Graph) error {
	graphOut := map[string]bool{}
	for _, o := range g.Outputs {
		graphOut[o.Name] = true
	}
	captured := map[string]bool{}
	for _, n := range p.Nodes {
		for _, c := range n.Captures {
			captured[c] = true
		}
	}
	consts := map[string]*tensor.Tensor{}
	for name, t := range g.Initializers {
		if !isOverridable(g, name) {
			consts[name] = t
		}
	}
	// types holds the element types known before any run: feeds' declared
	// types, constants, and the outputs of Cast and Shape.
	types := map[string]tensor.DType{}
	for _, in := range p.Inputs {
		if in.Kind == model.KindTensor && in.DType.Valid() {
			types[in.Name] = in.DType
		}
	}
	inits, cloned := p.Initializers, false
	rename := map[string]string{}
	kept := p.Nodes[:0]
	for _, n := range p.Nodes {
		renameInputs(n, rename)
		for _, in := range n.Inputs {
			if t, ok := consts[in]; ok {
				types[in] = t.DType()
			}
		}
		if outs, ok := foldConstant(n, consts, graphOut); ok {
			if !cloned {
				inits, cloned = maps.Clone(inits), true // never write the model's map
			}
			for i, o := range n.Outputs {
				if o != "" {
					consts[o], inits[o] = outs[i], outs[i]
				}
			}
			continue
		}
		if src, ok := passThrough(n, types); ok && !graphOut[n.Outputs[0]] && !captured[n.Outputs[0]] {
			rename[n.Outputs[0]] = src
			continue
		}
		switch {
		case len(n.Outputs) == 0 || n.Outputs[0] == "": // a malformed node: its kernel reports it
		case n.OpType == "Cast":
			if to, err := n.Info.Attrs.Int("to", 0); err == nil && tensor.DType(to).Valid() {
				types[n.Outputs[0]] = tensor.DType(to)
			}
		case n.OpType == "Shape" || n.OpType == "Size":
			types[n.Outputs[0]] = tensor.Int64
		}
		kept = append(kept, n)
	}
	clear(p.Nodes[len(kept):])
	p.Nodes = kept
	p.Initializers = inits
	for _, n := range p.Nodes {
		if err := rebuildWithConstants(n, consts); err != nil {
			return err
		}
	}
	return nil
}

// renameInputs points n's inputs at the sources of dropped pass-through
// nodes. The slice is copied first: it may be the model's.
func renameInputs(n *PlanNode, rename map[string]string) {
	copied := false
	for i, in := range n.Inputs {
		src, ok := rename[in]
		if !ok {
			continue
		}
		if !copied {
			n.Inputs = append([]string(nil), n.Inputs...)
			copied = true
		}
		n.Inputs[i] = src
	}
}

// passThrough reports whether n returns its input unchanged (Identity, a
// Cast to the input's known type) and names that input.
func passThrough(n *PlanNode, types map[string]tensor.DType) (string, bool) {
	if len(n.Inputs) != 1 || n.Inputs[0] == "" || len(n.Outputs) != 1 || n.Outputs[0] == "" || n.Domain != "" {
		return "", false
	}
	switch n.OpType {
	case "Identity":
		return n.Inputs[0], true
	case "Cast":
		to, err := n.Info.Attrs.Int("to", 0)
		dt, known := types[n.Inputs[0]]
		if err == nil && known && tensor.DType(to) == dt {
			return n.Inputs[0], true
		}
	}
	return "", false
}

// foldConstant runs n once when every input it has is a constant, and
// returns its outputs; ok is false when n must run per run instead (or its
// kernel fails now: the run reports the error).
func foldConstant(n *PlanNode, consts map[string]*tensor.Tensor, graphOut map[string]bool) (outs []*tensor.Tensor, ok bool) {
	if !pure(n) {
		return nil, false
	}
	for _, o := range n.Outputs {
		if graphOut[o] {
			return nil, false
		}
	}
	inputs := make([]*tensor.Tensor, len(n.Inputs))
	for i, in := range n.Inputs {
		if in == "" {
			continue
		}
		t, isConst := consts[in]
		if !isConst {
			return nil, false
		}
		inputs[i] = t
	}
	outs, err := computeDetached(n, inputs)
	if err != nil {
		return nil, false
	}
	for i, t := range outs {
		if n.Outputs[i] != "" && (t == nil || t.NumBytes() > maxFoldedBytes) {
			return nil, false
		}
	}
	return outs, true
}

// computeDetached runs n's kernel on inputs with fresh (unpooled) output
// buffers, on one thread, outside any run; a panic becomes an error.
func computeDetached(n *PlanNode, inputs []*tensor.Tensor) (outs []*tensor.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("runtime: internal error in %s: %v", n.OpType, r)
		}
	}()
	kctx := ops.NewContext(inputs, n.Info.OutputPresent, 1, nil)
	kctx.SetAllocator(foldAlloc{}) // an output past the fold limit fails at once, before it is filled
	if err := n.Kernel.Compute(kctx); err != nil {
		return nil, err
	}
	outs = make([]*tensor.Tensor, len(n.Outputs))
	for i := range outs {
		outs[i] = kctx.Output(i)
	}
	return outs, nil
}

// rebuildWithConstants records the constants n now reads in its node
// description and rebuilds its kernel if any are new.
func rebuildWithConstants(n *PlanNode, consts map[string]*tensor.Tensor) error {
	changed := false
	for i, in := range n.Inputs {
		if t, ok := consts[in]; ok && n.Info.Constants[i] != t {
			n.Info.Constants[i] = t
			changed = true
		}
	}
	if !changed {
		return nil
	}
	factory, err := ops.Lookup(n.Domain, n.OpType, n.Info.Opset)
	if err != nil {
		return withNode(n, err)
	}
	n.Info.Packed = nil // the factory says again what it packed
	k, err := factory(n.Info)
	if err != nil {
		return withNode(n, err)
	}
	n.Kernel = k
	return nil
}

// foldAlloc gives folded nodes fresh buffers up to maxFoldedBytes: a node
// whose output would be larger (a ConstantOfShape of 2^29 elements) is left
// to run per run instead of being computed at load for nothing.
type foldAlloc struct{}

// Alloc returns n fresh zero bytes, or an error past maxFoldedBytes.
func (foldAlloc) Alloc(n int) ([]byte, bool, error) {
	if n > maxFoldedBytes {
		return nil, false, fmt.Errorf("%w: %d bytes is past the constant-folding limit", errs.ErrLimit, n)
	}
	b, err := tensor.MakeBytes(n)
	return b, true, err
}
