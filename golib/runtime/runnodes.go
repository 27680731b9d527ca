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
	// The fields every visit reads come first, in the first two of the
	// three cache lines a runNode spans (TestRunNodeLayout; a large plan's
	// array is page-aligned), the shape cache's last.
	kernel ops.Kernel
	// in and out are PlanNode.in and out, gin PlanNode.gin (views into the
	// plan's slab); wanted is the node's ops.Node.OutputPresent.
	in, out []int32
	wanted  []bool
	// rel are the slots released right after the node (the ActRelease
	// action that follows its ActExecute in Plan.Actions).
	rel      []int32
	node     *PlanNode
	castTo   tensor.DType
	geometry bool // PlanNode.geometry
	keep     bool // PlanNode.keep
	spares   bool // PlanNode.spareOut != nil
	captures bool // len(PlanNode.Captures) > 0

	gin []int32
	// spareOut is PlanNode.spareOut.
	spareOut   []bool
	shapeRead  int32
	dimRead    int32 // PlanNode.dimRead (-1: not a dimension read; its dims: PlanNode.dims)
	viewsSpare bool  // PlanNode.viewsSpare
}

// compileRun builds p.run from p.Nodes (after slots and the shape cache's
// analysis, which set the fields it copies). When p.Actions are the
// release schedule's plain form (an optional release, then each node in
// order, each optionally followed by a release), their release slots go
// into the run nodes (runNode.rel, p.startRel) and p.linear is set: the
// run loop then walks p.run alone.
func (p *Plan) compileRun() {
	rel, startRel, linear := p.linearReleases()
	total := len(startRel)
	for i, n := range p.Nodes {
		total += len(n.in) + len(n.out) + len(n.gin)
		if linear {
			total += len(rel[i])
		}
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
	p.linear, p.startRel = linear, nil
	if linear {
		p.startRel = take(startRel)
	}
	for i, n := range p.Nodes {
		r := &p.run[i]
		*r = runNode{kernel: n.Kernel, in: take(n.in), out: take(n.out), gin: take(n.gin), node: n,
			shapeRead: -1, dimRead: -1, castTo: n.castTo, geometry: n.geometry, keep: n.keep,
			spares: n.spareOut != nil, captures: len(n.Captures) > 0,
			spareOut: n.spareOut, viewsSpare: n.viewsSpare}
		if linear {
			r.rel = take(rel[i])
		}
		if n.geometry { // analyzeGeometry ran (a main plan): shapeRead and dimRead are set
			r.shapeRead, r.dimRead = int32(n.shapeRead), int32(n.dimRead)
		}
		if n.Info != nil {
			r.wanted = n.Info.OutputPresent
		}
		n.in, n.out, n.gin = r.in, r.out, r.gin // one copy of the slot lists
	}
}

// linearReleases returns the release slots of p.Actions by the node they
// follow, and those before the first node, when the actions are in the
// release schedule's plain form (see compileRun); ok is false otherwise.
func (p *Plan) linearReleases() (rel [][]int32, start []int32, ok bool) {
	rel = make([][]int32, len(p.Nodes))
	next := 0 // the node the next ActExecute must run
	for i := range p.Actions {
		a := &p.Actions[i]
		switch {
		case a.Kind == ActExecute && a.Node == next:
			next++
		case a.Kind == ActRelease && next == 0 && start == nil:
			start = a.slots
		case a.Kind == ActRelease && next > 0 && rel[next-1] == nil:
			rel[next-1] = a.slots
		default:
			return nil, nil, false
		}
	}
	return rel, start, next == len(p.Nodes)
}
