package runtime

import (
	"bytes"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// The shape cache skips the shape arithmetic of exported graphs (Shape ->
// Gather -> Unsqueeze -> Concat -> Reshape chains, Range/Where mask
// building) on runs where its values repeat, without assuming anything
// about how an op's output shape follows from its inputs.
//
// At plan time every value is classified: a value is data-dependent when
// it is a feed, an overridable initializer, a captured outer value, or the
// output of a node that reads a data-dependent value, is random or has
// subgraphs. Shape and Size read only their input's shape: their outputs are
// geometry values whatever their input is. A node whose inputs are all
// constants or geometry values (a geometry node) computes a deterministic
// function of those inputs.
//
// Per state, the cache keeps each geometry node's outputs from the last run
// and, for each Shape/Size node, the input shape it saw then. In a run, a
// Shape/Size node whose input has the recorded shape, and any other
// geometry node none of whose geometry inputs changed in this run, reuses
// its kept outputs. Otherwise the node is computed, and its outputs are
// compared with the kept ones: only outputs that differ count as changed
// for the nodes that read them. Every geometry node is visited in every
// run, so after a run the kept outputs are those of that run, computed from
// (or equal to what would be computed from) its inputs: reuse is exact. In
// a growing decode, Shape(past) changes at every step, Gather(Shape(past),
// 0) (the batch) does not, so only values really derived from the past
// length are recomputed.
//
// Geometry values feeding a graph output are computed every run and never
// kept: a caller may write into an output it receives. A failed run forgets
// the whole cache, so kept values never mix with those of a run that
// stopped half-way.

// maxCachedBytes bounds the outputs one node may keep in the cache.
const maxCachedBytes = 1 << 20

// geometryInfo is the plan-time summary for the shape cache.
type geometryInfo struct {
	reads int // number of Shape/Size nodes
}

// analyzeGeometry classifies the nodes of p (a main plan) for the shape
// cache.
func (p *Plan) analyzeGeometry() {
	tainted := make([]bool, len(p.base))
	geomVal := make([]bool, len(p.base)) // made by a geometry node
	for _, in := range p.Inputs {
		tainted[p.slots[in.Name]] = true
	}
	for name := range p.defaults {
		if s, ok := p.slots[name]; ok {
			tainted[s] = true
		}
	}
	for _, s := range p.captureSlots {
		tainted[s] = true
	}
	producer := map[int32]*PlanNode{}
	reads := 0
	for _, nd := range p.Nodes {
		nd.shapeRead, nd.gin = -1, nil
		geometry := pure(nd)
		switch {
		case !geometry:
		case nd.Domain == "" && (nd.OpType == "Shape" || nd.OpType == "Size") && len(nd.in) == 1 && nd.in[0] >= 0:
			nd.shapeRead = reads
			reads++
		default:
			for _, s := range nd.in {
				if s < 0 {
					continue
				}
				if tainted[s] {
					geometry = false
					break
				}
				if geomVal[s] {
					nd.gin = append(nd.gin, s)
				}
			}
		}
		nd.geometry, nd.keep = geometry, geometry
		if !geometry {
			nd.gin = nil
		}
		for _, s := range nd.out {
			if s >= 0 {
				tainted[s], geomVal[s] = !geometry, geometry
				producer[s] = nd
			}
		}
	}
	// The geometry nodes above a graph output (through geometry values)
	// are computed every run and never kept.
	var unkeep func(s int32)
	unkeep = func(s int32) {
		nd := producer[s]
		if nd == nil || !nd.geometry || !nd.keep {
			return
		}
		nd.keep = false
		for _, in := range nd.gin {
			unkeep(in)
		}
	}
	for _, s := range p.outSlots {
		unkeep(s)
	}
	p.geom = geometryInfo{reads: reads}
}

// shapeCache is a state's record of geometry values (see above).
type shapeCache struct {
	// outs[i] holds node i's outputs from the last run (nil: none kept).
	outs [][]*tensor.Tensor
	// seen[r] is the input shape shape read r saw in the last run; known[r]
	// whether there is one.
	seen  []tensor.Shape
	known []bool
	// changed marks, by slot, the geometry values that differ in this run
	// from the last one.
	changed []bool
}

func newShapeCache(p *Plan) *shapeCache {
	return &shapeCache{outs: make([][]*tensor.Tensor, len(p.Nodes)), seen: make([]tensor.Shape, p.geom.reads),
		known: make([]bool, p.geom.reads), changed: make([]bool, len(p.base))}
}

// begin starts a run.
func (c *shapeCache) begin() { clear(c.changed) }

// forget drops every record (after a failed run).
func (c *shapeCache) forget() {
	for i := range c.outs {
		c.outs[i] = nil
	}
	clear(c.known)
}

// reusable reports whether geometry node i's kept outputs hold for this run
// (for a shape read, recording the shape its input has now).
func (c *shapeCache) reusable(i int, n *PlanNode, inputs []*tensor.Tensor) bool {
	same := c.outs[i] != nil
	if r := n.shapeRead; r >= 0 {
		s := inputs[0].Shape()
		if !c.known[r] || !equalShape(c.seen[r], s) {
			c.seen[r] = append(c.seen[r][:0], s...)
			c.known[r] = true
			same = false
		}
	}
	for _, s := range n.gin {
		if c.changed[s] {
			same = false
		}
	}
	return same && n.keep
}

// update takes node i's freshly computed outputs: an output equal to the
// kept one is replaced by it (and does not count as changed), the others
// are marked changed and kept, if the node may keep them and they are
// small enough.
func (c *shapeCache) update(i int, n *PlanNode, kctx *ops.Context) {
	old := c.outs[i]
	size := 0
	for k, s := range n.out {
		t := kctx.Output(k)
		if s < 0 || t == nil {
			continue
		}
		size += t.NumBytes()
		if n.keep && old != nil && equalTensor(old[k], t) {
			_ = kctx.SetOutput(k, old[k])
			continue
		}
		c.changed[s] = true
	}
	if !n.keep || size > maxCachedBytes {
		c.outs[i] = nil
		return
	}
	outs := old[:0]
	for k := range kctx.NumOutputs() {
		outs = append(outs, kctx.Output(k))
	}
	c.outs[i] = outs
}

func equalShape(a, b tensor.Shape) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// equalTensor reports whether a and b hold the same element type, shape and
// bytes.
func equalTensor(a, b *tensor.Tensor) bool {
	return a != nil && b != nil && a.DType() == b.DType() && equalShape(a.Shape(), b.Shape()) &&
		bytes.Equal(a.Bytes(), b.Bytes())
}
