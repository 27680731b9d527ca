package runtime

import (
	"fmt"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Session-creation fusions of the main graph (fusePlan), after folding:
// exporters decompose some ops into chains of small nodes (torch.onnx and
// optimum write an RMSNorm as seven), each a kernel call and an executor
// step per run. A fusion rule matches such a chain exactly, checks every
// side condition (constants, attributes, single consumers, no graph output
// or captured value inside the chain), and replaces the chain by one node
// of an op the runtime implements, placed where the chain's last node was
// (its inputs are all available there). One rule per file (fuse_*.go),
// listed in fusions.

// fusion is one rule: match looks at the chain ending at p.Nodes[i] and
// returns the fused node and the indices of the chain's nodes (i
// included), or ok false; guard, when not nil, is a condition on a run's
// inputs that plan time cannot decide (a dimension, a rank) under which
// the fused op gives the chain's result: the other runs execute the
// chain's own nodes (guardedKernel). A rule whose fused node is not a
// registered op (its kernel holds the chain itself) sets plan instead,
// which returns the planned node.
type fusion struct {
	name  string
	match func(fc *fuseContext, i int) (fused *onnxpb.NodeProto, chain []int, guard func(*ops.Context) bool, ok bool)
	plan  func(fc *fuseContext, i int) (fused *PlanNode, chain []int, ok bool)
}

// fusions are tried in order at every node.
var fusions = []fusion{
	{name: "rmsnorm", match: matchRMSNorm},
	{name: "rmsnorm-half", plan: matchRMSNormHalf},
	{name: "silu", match: matchSiLU},
	{name: "matmul-bias", match: matchMatMulBias},
	{name: "rotary", plan: matchRotary},
	{name: "attention-repeat-kv", plan: matchAttentionRepeatKV},
	{name: "gelu-tanh", plan: matchGeluTanh},
	{name: "matmul-transb", plan: matchMatMulTransB},
}

// fuseContext is what the rules read: the plan, its constants, and who
// produces and reads each value.
type fuseContext struct {
	p        *Plan
	consts   map[string]*tensor.Tensor
	producer map[string]int // value -> index of the node making it
	readers  map[string]int // value -> number of reading nodes (inputs and captures)
	reader   map[string]int // value -> index of the last node reading it as an input
	pinned   map[string]bool
}

func newFuseContext(p *Plan, g *model.Graph) *fuseContext {
	fc := &fuseContext{p: p, consts: map[string]*tensor.Tensor{}, producer: map[string]int{},
		readers: map[string]int{}, reader: map[string]int{}, pinned: map[string]bool{}}
	for name, t := range p.Initializers {
		if !isOverridable(g, name) {
			fc.consts[name] = t
		}
	}
	for i, n := range p.Nodes {
		for _, o := range n.Outputs {
			if o != "" {
				fc.producer[o] = i
			}
		}
		for _, in := range n.Inputs {
			if in != "" {
				fc.readers[in]++
				fc.reader[in] = i
			}
		}
		for _, c := range n.Captures {
			fc.pinned[c] = true
		}
	}
	for _, o := range g.Outputs {
		fc.pinned[o.Name] = true
	}
	return fc
}

// node returns the producer of value v when it is a single-output node of
// the default domain with the given op type.
func (fc *fuseContext) node(v, opType string) (int, *PlanNode, bool) {
	i, ok := fc.producer[v]
	if !ok {
		return 0, nil, false
	}
	n := fc.p.Nodes[i]
	if n.OpType != opType || n.Domain != "" || len(n.Outputs) != 1 {
		return 0, nil, false
	}
	return i, n, true
}

// internal reports whether v may disappear inside a fused node: exactly one
// node reads it and it is neither a graph output nor captured.
func (fc *fuseContext) internal(v string) bool {
	return fc.readers[v] == 1 && !fc.pinned[v]
}

// f32Weight returns the constant when v is a float32 2D constant.
func (fc *fuseContext) f32Weight(v string) (*tensor.Tensor, bool) {
	t, ok := fc.consts[v]
	return t, ok && t.DType() == tensor.Float32 && t.Rank() == 2
}

// projection returns the MatMul making v when its B is a float32 2D
// constant (so v is float32: MatMul's operands share their type).
func (fc *fuseContext) projection(v string) (*PlanNode, *tensor.Tensor, bool) {
	_, mm, ok := fc.node(v, "MatMul")
	if !ok || len(mm.Inputs) != 2 || mm.Inputs[0] == "" {
		return nil, nil, false
	}
	w, ok := fc.f32Weight(mm.Inputs[1])
	return mm, w, ok
}

// scalar returns the value of v when it is a one-element float constant,
// and its rank: an operand of rank k broadcasts a chain's value of a lower
// rank up to k, so a fused node that keeps x's shape gives the chain's
// shape only when x has rank k or more (a rule checks that at run time
// when a constant's rank is above 0).
func (fc *fuseContext) scalar(v string) (float64, int, bool) {
	t, ok := fc.consts[v]
	if !ok || t.Len() != 1 || !t.DType().IsFloat() {
		return 0, 0, false
	}
	f, err := tensor.AsFloat32(t)
	if err != nil {
		return 0, 0, false
	}
	return float64(f[0]), t.Rank(), true
}

// other returns the input of a two-input node that is not v ("" when
// neither or both are v).
func other(n *PlanNode, v string) string {
	if len(n.Inputs) != 2 {
		return ""
	}
	switch {
	case n.Inputs[0] == v && n.Inputs[1] != v:
		return n.Inputs[1]
	case n.Inputs[1] == v && n.Inputs[0] != v:
		return n.Inputs[0]
	}
	return ""
}

// fusePlan applies the fusions to p (a main plan after folding) in place.
func (b *builder) fusePlan(p *Plan, g *model.Graph) error {
	fc := newFuseContext(p, g)
	drop := map[int]bool{}
	replace := map[int]*PlanNode{}
	for i := range p.Nodes {
		if drop[i] {
			continue
		}
		for _, f := range fusions {
			var pn *PlanNode
			var chain []int
			if f.plan != nil {
				var ok bool
				if pn, chain, ok = f.plan(fc, i); !ok || overlaps(chain, drop) {
					continue
				}
			} else {
				np, ch, guard, ok := f.match(fc, i)
				if !ok || overlaps(ch, drop) {
					continue
				}
				var err error
				if pn, err = b.node(g, np, nil); err != nil {
					continue // the fused op refuses (an attribute out of range): keep the chain
				}
				if err := rebuildWithConstants(pn, fc.consts); err != nil {
					continue
				}
				if guard != nil {
					pn.Kernel = &guardedKernel{fused: pn.Kernel, guard: guard, chain: fc.chainRun(ch, pn.Inputs)}
				}
				chain = ch
			}
			for _, k := range chain {
				drop[k] = true
			}
			delete(drop, i)
			replace[i] = pn
			break
		}
	}
	if len(replace) == 0 {
		return nil
	}
	kept := p.Nodes[:0]
	for i, n := range p.Nodes {
		switch {
		case replace[i] != nil:
			kept = append(kept, replace[i])
		case !drop[i]:
			kept = append(kept, n)
		}
	}
	clear(p.Nodes[len(kept):])
	p.Nodes = kept
	return nil
}

func overlaps(chain []int, drop map[int]bool) bool {
	for _, k := range chain {
		if drop[k] {
			return true
		}
	}
	return false
}

// fusedNode builds the description of a fused node (of the default domain).
func fusedNode(opType, name string, inputs, outputs []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: &opType, Name: &name, Input: inputs, Output: outputs, Attribute: attrs}
}

func attrInt(name string, v int64) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_INT
	return &onnxpb.AttributeProto{Name: &name, Type: &t, I: &v}
}

func attrFloat(name string, v float32) *onnxpb.AttributeProto {
	t := onnxpb.AttributeProto_FLOAT
	return &onnxpb.AttributeProto{Name: &name, Type: &t, F: &v}
}

// plannedNode makes the plan node of a fused op whose kernel the rule
// built itself (a fusion's plan function): fused domain, one output, the
// constant inputs recorded.
func (fc *fuseContext) plannedNode(name, opType string, inputs []string, output string, k ops.Kernel) *PlanNode {
	pn := &PlanNode{Name: name, OpType: opType, Domain: ops.FusedDomain, Inputs: inputs, Outputs: []string{output}, Kernel: k}
	pn.Info = &ops.Node{Name: name, OpType: opType, Domain: ops.FusedDomain, Opset: 1,
		NumInputs: len(inputs), NumOutputs: 1, InputPresent: make([]bool, len(inputs)),
		OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, len(inputs))}
	for j, in := range inputs {
		pn.Info.InputPresent[j] = in != ""
		pn.Info.Constants[j] = fc.consts[in]
	}
	return pn
}

// chainRun is the replaced chain of a fused node whose match is only
// partly proven at plan time: the fused kernel runs it, node by node, on
// the runs its own path does not cover, so those compute exactly what the
// unfused graph does.
type chainRun struct {
	nodes  []*PlanNode               // in plan order; the last one makes the output
	inputs []string                  // the fused node's input names (the chain's inputs)
	consts map[string]*tensor.Tensor // the constants the chain's nodes read
	// runs counts the runs that took the chain (tests read it).
	runs atomic.Int64
}

// chainRun returns the chain of nodes at the given indices of the plan,
// reading the fused node's inputs.
func (fc *fuseContext) chainRun(chain []int, inputs []string) *chainRun {
	in := map[int]bool{}
	for _, c := range chain {
		in[c] = true
	}
	cr := &chainRun{inputs: inputs, consts: map[string]*tensor.Tensor{}}
	for j, n := range fc.p.Nodes {
		if in[j] {
			cr.nodes = append(cr.nodes, n)
			for _, name := range n.Inputs {
				if t, ok := fc.consts[name]; ok {
					cr.consts[name] = t
				}
			}
		}
	}
	return cr
}

// guardedKernel is the kernel of a fused node (of a registered op) that
// computes the chain's result only on the runs guard accepts: the other
// runs execute the chain.
type guardedKernel struct {
	fused ops.Kernel
	guard func(ctx *ops.Context) bool
	chain *chainRun
}

// Compute runs the fused kernel when the guard accepts the run's inputs,
// else the chain.
func (k *guardedKernel) Compute(ctx *ops.Context) error {
	if k.guard(ctx) {
		return k.fused.Compute(ctx)
	}
	return k.chain.run(ctx)
}

// run computes the fused node's output 0 with the chain's own kernels.
func (cr *chainRun) run(ctx *ops.Context) error {
	cr.runs.Add(1)
	vals := make(map[string]*tensor.Tensor, len(cr.consts)+len(cr.inputs)+len(cr.nodes))
	for name, t := range cr.consts {
		vals[name] = t
	}
	for j, name := range cr.inputs {
		if name != "" {
			vals[name] = ctx.Input(j)
		}
	}
	var last *tensor.Tensor
	for _, n := range cr.nodes {
		in := make([]*tensor.Tensor, len(n.Inputs))
		for j, name := range n.Inputs {
			if name != "" {
				if in[j] = vals[name]; in[j] == nil {
					return fmt.Errorf("%w: value %q of the fused chain is not available", errs.ErrMissingInput, name)
				}
			}
		}
		c := ops.NewContext(in, n.Info.OutputPresent, ctx.Threads(), ctx.Scope())
		if err := n.Kernel.Compute(c); err != nil {
			return withNode(n, err)
		}
		for j, o := range n.Outputs {
			if o != "" {
				vals[o] = c.Output(j)
			}
		}
		if last = c.Output(0); last == nil {
			return fmt.Errorf("%w: node %q of the fused chain produced no value", errs.ErrInvalidModel, n.Name)
		}
	}
	return ctx.SetOutput(0, last)
}
