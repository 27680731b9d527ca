package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// The shape cache skips the shape arithmetic of exported graphs (Shape ->
// Gather -> Unsqueeze -> Concat -> Reshape chains, Range/Where mask
// building) on runs whose geometry repeats, without assuming anything about
// how an op's output shape follows from its inputs.
//
// At plan time every value is classified: a value is data-dependent when
// it is a feed, an overridable initializer, a captured outer value, or the
// output of a node that reads a data-dependent value, is random or has
// subgraphs. Shape and Size read only their input's shape: their outputs are
// geometry values whatever their input is. A node whose inputs are all
// constants or geometry values computes a deterministic function of the
// shapes its Shape/Size ancestors read (its "shape reads"), nothing else.
//
// Per state, the cache keeps each such node's outputs from the last run
// that computed them and, for each Shape/Size node, the input shape it saw
// then. A run compares every Shape/Size input against the recorded shape
// when it reaches that node (cheap: a few integers); a geometry node's
// cached outputs are reused only if none of its shape reads differed in
// this run, otherwise it is computed and its record replaced. So the key is
// exactly the shapes that reach each value: values derived from the past
// length are recomputed at every step of a growing decode, those derived
// from the batch size or the new tokens' count are not.
//
// Geometry values feeding a graph output (possibly as aliases) are never
// cached: a caller may write into an output it receives. A failed run
// forgets the whole cache, so a record is never mixed with values of a run
// that stopped half-way.

// maxCachedBytes bounds the outputs one node may keep in the cache.
const maxCachedBytes = 1 << 20

// geometryInfo is the plan-time classification for the shape cache.
type geometryInfo struct {
	// reads is the number of Shape/Size nodes in the plan.
	reads int
	// words is the length of a shape-read bitset.
	words int
}

// analyzeGeometry marks the nodes of p (a main plan) whose outputs the
// shape cache may keep, and their shape-read dependencies.
func (p *Plan) analyzeGeometry() {
	n := len(p.base)
	tainted := make([]bool, n)
	deps := make([][]int, n) // shape reads, as node-local lists first
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
	reads := 0
	for _, nd := range p.Nodes {
		nd.shapeRead = -1
		geometry := pure(nd)
		var d []int
		switch {
		case !geometry:
		case nd.Domain == "" && (nd.OpType == "Shape" || nd.OpType == "Size") && len(nd.in) == 1 && nd.in[0] >= 0:
			nd.shapeRead = reads
			d = []int{reads}
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
				d = append(d, deps[s]...)
			}
		}
		for _, s := range nd.out {
			if s >= 0 {
				tainted[s] = !geometry
				if geometry {
					deps[s] = dedupInts(d)
				}
			}
		}
		nd.geometry = geometry && len(d) > 0
		if nd.geometry {
			nd.deps = dedupInts(d)
		}
	}
	// The cone of geometry nodes above a graph output stays uncached.
	var mark func(s int32)
	producer := map[int32]*PlanNode{}
	for _, nd := range p.Nodes {
		for _, s := range nd.out {
			if s >= 0 {
				producer[s] = nd
			}
		}
	}
	mark = func(s int32) {
		nd := producer[s]
		if nd == nil || !nd.geometry {
			return
		}
		nd.geometry = false
		for _, in := range nd.in {
			if in >= 0 {
				mark(in)
			}
		}
	}
	for _, s := range p.outSlots {
		if nd := producer[s]; nd != nil && !tainted[s] {
			nd.geometry = true // let mark walk it
			mark(s)
		}
	}
	words := (reads + 63) / 64
	for _, nd := range p.Nodes {
		if !nd.geometry {
			nd.deps, nd.depBits = nil, nil
			continue
		}
		nd.depBits = make([]uint64, words)
		for _, r := range nd.deps {
			nd.depBits[r/64] |= 1 << (r % 64)
		}
	}
	p.geom = geometryInfo{reads: reads, words: words}
}

func dedupInts(s []int) []int {
	if len(s) < 2 {
		return s
	}
	seen := map[int]bool{}
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// shapeCache is a state's record of geometry values (see the package
// comment above).
type shapeCache struct {
	// outs[i] holds node i's outputs from the run that last computed them
	// (nil: none kept).
	outs [][]*tensor.Tensor
	// seen[r] is the input shape shape read r saw when last run; known[r]
	// whether there is one.
	seen  []tensor.Shape
	known []bool
	// changed has bit r set when shape read r differs in the current run.
	changed []uint64
}

func newShapeCache(p *Plan) *shapeCache {
	return &shapeCache{outs: make([][]*tensor.Tensor, len(p.Nodes)), seen: make([]tensor.Shape, p.geom.reads),
		known: make([]bool, p.geom.reads), changed: make([]uint64, p.geom.words)}
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

// observe compares shape read r's input shape with the record, updating
// the record and the changed set when it differs.
func (c *shapeCache) observe(r int, s tensor.Shape) {
	if c.known[r] && equalShape(c.seen[r], s) {
		return
	}
	c.seen[r] = append(c.seen[r][:0], s...)
	c.known[r] = true
	c.changed[r/64] |= 1 << (r % 64)
}

// valid reports whether node i's cached outputs hold for this run.
func (c *shapeCache) valid(i int, n *PlanNode) bool {
	if c.outs[i] == nil {
		return false
	}
	for w, b := range n.depBits {
		if b&c.changed[w] != 0 {
			return false
		}
	}
	return true
}

// keep records node i's outputs, unless they are too large to keep.
func (c *shapeCache) keep(i int, kctx *ops.Context) {
	bytes := 0
	for k := range kctx.NumOutputs() {
		if t := kctx.Output(k); t != nil {
			bytes += t.NumBytes()
		}
	}
	if bytes > maxCachedBytes {
		c.outs[i] = nil
		return
	}
	outs := c.outs[i][:0]
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
