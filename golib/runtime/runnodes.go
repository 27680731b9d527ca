package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// runNode is the part of a plan node the run loop reads for every node it
// visits, resolved once when the plan is built and laid out in one array
// (Plan.run, by node index) with the nodes' slot lists in one slab, so
// the loop walks memory in order instead of chasing each PlanNode and its
// ops.Node. The PlanNode stays the place of everything else (names for
// errors, captures, the shape cache's spare and dimension analysis).
type runNode struct {
	kernel ops.Kernel
	// in and out are PlanNode.in and out, gin PlanNode.gin (views into the
	// plan's slab); wanted is the node's ops.Node.OutputPresent.
	in, out, gin []int32
	wanted       []bool
	node         *PlanNode
	shapeRead    int32
	castTo       tensor.DType
	geometry     bool // PlanNode.geometry
	keep         bool // PlanNode.keep
	spares       bool // PlanNode.spareOut != nil
	captures     bool // len(PlanNode.Captures) > 0
}

// compileRun builds p.run from p.Nodes (after slots and the shape cache's
// analysis, which set the fields it copies).
func (p *Plan) compileRun() {
	total := 0
	for _, n := range p.Nodes {
		total += len(n.in) + len(n.out) + len(n.gin)
	}
	slab := make([]int32, 0, total)
	take := func(s []int32) []int32 {
		if s == nil {
			return nil
		}
		at := len(slab)
		slab = append(slab, s...)
		return slab[at:len(slab):len(slab)]
	}
	p.run = make([]runNode, len(p.Nodes))
	for i, n := range p.Nodes {
		r := &p.run[i]
		*r = runNode{kernel: n.Kernel, in: take(n.in), out: take(n.out), gin: take(n.gin), node: n,
			shapeRead: -1, castTo: n.castTo, geometry: n.geometry, keep: n.keep,
			spares: n.spareOut != nil, captures: len(n.Captures) > 0}
		if n.geometry { // analyzeGeometry ran (a main plan): shapeRead is set
			r.shapeRead = int32(n.shapeRead)
		}
		if n.Info != nil {
			r.wanted = n.Info.OutputPresent
		}
		n.in, n.out, n.gin = r.in, r.out, r.gin // one copy of the slot lists
	}
}
