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
	// readers lists, by slot, the geometry nodes that read the slot as a
	// geometry input (PlanNode.gin), so a changed value marks them.
	readers [][]int32
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
	p.analyzeDimReads(producer)
	p.analyzeSpares()
	p.geom = geometryInfo{reads: reads, readers: make([][]int32, len(p.base))}
	for i, nd := range p.Nodes {
		for _, s := range nd.gin {
			p.geom.readers[s] = append(p.geom.readers[s], int32(i))
		}
	}
}

// analyzeDimReads marks the Gathers of constant dimensions of a shape
// read (the exporters' Gather(Shape(past), 2) for the past length next to
// Gather(Shape(past), 0) for the batch): such a node's kept output holds
// while the dimensions it reads do, whatever the rest of the shape does.
func (p *Plan) analyzeDimReads(producer map[int32]*PlanNode) {
	for _, nd := range p.Nodes {
		nd.dimRead, nd.dims = -1, nil
		if !nd.geometry || !nd.keep || nd.Domain != "" || nd.OpType != "Gather" || len(nd.in) != 2 || len(nd.gin) != 1 ||
			nd.in[0] < 0 || nd.in[1] < 0 || nd.gin[0] != nd.in[0] {
			continue
		}
		if axis, err := nd.Info.Attrs.Int("axis", 0); err != nil || axis != 0 {
			continue
		}
		sr := producer[nd.in[0]]
		if sr == nil || sr.shapeRead < 0 || sr.OpType != "Shape" || len(sr.Info.Attrs) != 0 {
			continue // a Shape with start/end reads a part of the shape
		}
		idx := p.base[nd.in[1]]
		if idx == nil || idx.Rank() > 1 || isDefault(p, nd.Inputs[1]) {
			continue
		}
		v, err := tensor.Int64Values(idx)
		if err != nil || len(v) == 0 {
			continue
		}
		nd.dimRead, nd.dims = sr.shapeRead, v
	}
}

// isDefault reports whether name is an initializer a feed may replace.
func isDefault(p *Plan, name string) bool {
	_, ok := p.defaults[name]
	return ok
}

// copyingOps are the default-domain ops whose outputs never view an input's
// buffer (they write fresh outputs); viewingOps view input 0 and only read
// the others. A Cast copies when it is a geometry node (its kernel runs); a
// Cast the executor passes through at run time is a view.
var (
	copyingOps = map[string]bool{"Add": true, "Sub": true, "Mul": true, "Div": true, "Mod": true, "Neg": true,
		"Abs": true, "Equal": true, "Less": true, "LessOrEqual": true, "Greater": true, "GreaterOrEqual": true,
		"And": true, "Or": true, "Xor": true, "Not": true, "Where": true, "Range": true, "ConstantOfShape": true,
		"Gather": true, "Concat": true, "Slice": true, "Shape": true, "Size": true, "Expand": true, "Tile": true,
		"MatMul": true}
	viewingOps = map[string]bool{"Reshape": true, "Squeeze": true, "Unsqueeze": true, "Cast": true}
)

// analyzeSpares sets spareOut on the kept geometry nodes' outputs whose
// buffers the shape cache may rewrite in a later run (alias tracking: a
// buffer is rewritten only when no live view can see it). A value
// qualifies when it is no graph output or captured value and each reader
// copies it, reads it only for its values (Reshape's shape, Unsqueeze's
// axes), or is a kept geometry view (Reshape, Squeeze, Unsqueeze of it)
// whose own value qualifies: the view lives only in the cache, and the
// cache replaces it (viewsSpare: never kept as "unchanged") whenever the
// value it views changes, so no kept view refers to a replaced buffer.
func (p *Plan) analyzeSpares() {
	readers := make([][]int32, len(p.base)) // node index << 8 | input index
	for i, nd := range p.Nodes {
		nd.spareOut, nd.viewsSpare = nil, false
		for j, s := range nd.in {
			if s >= 0 && j < 256 {
				readers[s] = append(readers[s], int32(i)<<8|int32(j))
			}
		}
	}
	safe := make([]bool, len(p.base))
	blocked := make([]bool, len(p.base))
	for _, s := range p.outSlots {
		blocked[s] = true
	}
	for _, s := range p.captureSlots {
		blocked[s] = true
	}
	for _, nd := range p.Nodes {
		for _, name := range nd.Captures {
			if s, ok := p.slots[name]; ok {
				blocked[s] = true
			}
		}
	}
	view := func(c *PlanNode) bool {
		return c.OpType != "Cast" && c.geometry && c.keep && len(c.out) == 1 && c.out[0] >= 0 && safe[c.out[0]]
	}
	for i := len(p.Nodes) - 1; i >= 0; i-- {
		nd := p.Nodes[i]
		for _, s := range nd.out {
			if s < 0 || blocked[s] {
				continue
			}
			ok := true
			for _, r := range readers[s] {
				c, j := p.Nodes[r>>8], r&0xff
				switch {
				case c.Domain != "" || c.subgraphs:
					ok = false
				case copyingOps[c.OpType], c.OpType == "Cast" && c.geometry, viewingOps[c.OpType] && j > 0:
				case viewingOps[c.OpType] && view(c):
				default:
					ok = false
				}
			}
			safe[s] = ok
		}
		if !nd.geometry || !nd.keep {
			continue
		}
		for k, s := range nd.out {
			if s >= 0 && safe[s] {
				if nd.spareOut == nil {
					nd.spareOut = make([]bool, len(nd.out))
				}
				nd.spareOut[k] = true
				for _, r := range readers[s] {
					if c, j := p.Nodes[r>>8], r&0xff; j == 0 && c.OpType != "Cast" && viewingOps[c.OpType] {
						c.viewsSpare = true
					}
				}
			}
		}
	}
}

// shapeCache is a state's record of geometry values (see above).
type shapeCache struct {
	// outs[i] holds node i's outputs from the last run (nil: none kept).
	outs [][]*tensor.Tensor
	// seen[r] is the input shape shape read r saw in the last run; known[r]
	// whether there is one; prev[r] (prevKnown[r]) the one before, when
	// the last run changed it (for the dimension reads).
	seen, prev       []tensor.Shape
	known, prevKnown []bool
	// changed marks, by slot, the geometry values that differ in this run
	// from the last one; dirty marks, by node, the geometry nodes that read
	// such a value (readers: geometryInfo.readers).
	changed []bool
	dirty   []bool
	readers [][]int32
	// ready[i] is set (readyRel when the node releases slots after it)
	// while node i, a geometry node other than a shape read, has kept
	// outputs, which are then still in their frame slots (detached values
	// stay there between runs): in a run where no geometry input of the
	// node changed (not dirty), the run loop passes it by without visiting
	// it, which is the reuse reusable and reuse would make.
	ready []uint8
	// spares[i][k] is the spare record of output k of node i (nil for
	// nodes without spare outputs).
	spares [][]spareRec
}

// spareRec is what the shape cache records about one output of a node with
// spare outputs (PlanNode.spareOut), in one record the node's update reads
// together: fresh tells whether the kept output was made by the node itself
// (its header, and its buffer when made, are the node's own); t is a
// replaced output of the node nothing reads any more, offered to the node's
// next computation (ops.Context.SetSpare), spareMade whether its buffer is
// its own.
type spareRec struct {
	t                      *tensor.Tensor
	fresh, made, spareMade bool
}

func newShapeCache(p *Plan) *shapeCache {
	c := &shapeCache{outs: make([][]*tensor.Tensor, len(p.Nodes)), seen: make([]tensor.Shape, p.geom.reads),
		prev: make([]tensor.Shape, p.geom.reads), known: make([]bool, p.geom.reads),
		prevKnown: make([]bool, p.geom.reads), changed: make([]bool, len(p.base)),
		dirty: make([]bool, len(p.Nodes)), readers: p.geom.readers, ready: make([]uint8, len(p.Nodes)),
		spares: make([][]spareRec, len(p.Nodes))}
	for i, nd := range p.Nodes {
		if nd.spareOut != nil {
			c.spares[i] = make([]spareRec, len(nd.out))
		}
	}
	return c
}

// dropSpares forgets node i's spare outputs.
func (c *shapeCache) dropSpares(i int) {
	for k := range c.spares[i] {
		c.spares[i][k].t = nil
	}
}

// offer hands node i's spare outputs to its context before it computes
// (a nil one too: the context then records which outputs it makes).
func (c *shapeCache) offer(i int, n *runNode, kctx *ops.Context) {
	for k := range c.spares[i] {
		if rec := &c.spares[i][k]; n.spareOut[k] {
			kctx.SetSpare(k, rec.t, rec.spareMade)
		}
	}
}

// begin starts a run.
func (c *shapeCache) begin() {
	clear(c.changed)
	clear(c.dirty)
}

// forget drops every record (after a failed run).
func (c *shapeCache) forget() {
	for i := range c.outs {
		c.outs[i] = nil
		c.dropSpares(i)
	}
	clear(c.known)
	clear(c.prevKnown)
	clear(c.ready)
}

// The values of shapeCache.ready.
const (
	readyBare uint8 = 1 // kept outputs, no release after the node
	readyRel  uint8 = 2 // kept outputs, slots to release after the node
)

// reusable reports whether geometry node i's kept outputs hold for this run
// (for a shape read, recording the shape its input has now; other nodes
// need no inputs, which may be nil).
func (c *shapeCache) reusable(i int, n *runNode, inputs []*tensor.Tensor) bool {
	same := c.outs[i] != nil
	if r := n.shapeRead; r >= 0 {
		s := inputs[0].Shape()
		if !c.known[r] || !equalShape(c.seen[r], s) {
			c.prev[r], c.seen[r] = c.seen[r], append(c.prev[r][:0], s...)
			c.prevKnown[r], c.known[r] = c.known[r], true
			same = false
		}
	}
	if !same || !n.keep {
		return false
	}
	for _, s := range n.gin {
		if c.changed[s] && !c.sameDims(n) {
			return false
		}
	}
	return true
}

// sameDims reports whether dimension read n's dimensions are those of the
// shape its shape read saw before this run's (the kept output was computed
// from that shape, or from an earlier one with the same dimensions).
func (c *shapeCache) sameDims(n *runNode) bool {
	r := n.dimRead
	if r < 0 || !c.prevKnown[r] || len(c.prev[r]) != len(c.seen[r]) {
		return false
	}
	rank := int64(len(c.seen[r]))
	for _, d := range n.node.dims {
		if d < 0 {
			d += rank
		}
		if d < 0 || d >= rank || c.prev[r][d] != c.seen[r][d] {
			return false
		}
	}
	return true
}

// update takes node i's freshly computed outputs: an output equal to the
// kept one is replaced by it (and does not count as changed), the others
// are marked changed and kept, if the node may keep them and they are
// small enough.
//
// With spares (PlanNode.spareOut), the tensor an output no longer needs (the
// fresh one when it equals the kept one, else the kept one it replaces)
// becomes the spare the node's next computation writes into, when the node
// made it itself (never an input, a constant or a view it passed through).
func (c *shapeCache) update(i int, n *runNode, kctx *ops.Context) {
	old := c.outs[i]
	size := 0
	for k, s := range n.out {
		t := kctx.Output(k)
		if s < 0 || t == nil {
			continue
		}
		size += t.NumBytes()
		if n.keep && old != nil && !n.viewsSpare && equalTensor(old[k], t) {
			if n.spareOut != nil && n.spareOut[k] && t != old[k] && c.madeHere(i, k, t, kctx) {
				rec := &c.spares[i][k]
				rec.t, rec.spareMade = t, kctx.Made(k)
			}
			_ = kctx.SetOutput(k, old[k])
			continue
		}
		c.changed[s] = true
		for _, j := range c.readers[s] {
			c.dirty[j] = true
		}
	}
	if !n.keep || size > maxCachedBytes {
		c.outs[i], c.ready[i] = nil, 0
		c.dropSpares(i)
		return
	}
	outs := old[:0]
	for k := range kctx.NumOutputs() {
		t := kctx.Output(k)
		if n.spareOut != nil && n.spareOut[k] && (len(old) <= k || t != old[k]) {
			// t replaces the kept output (or there was none)
			rec := &c.spares[i][k]
			sp := rec.t
			fresh := c.madeHere(i, k, t, kctx)
			if len(old) > k && rec.fresh && old[k] != nil && old[k] != t {
				rec.t, rec.spareMade = old[k], rec.made
			} else if sp == t {
				rec.t = nil
			}
			rec.fresh, rec.made = fresh, fresh && kctx.Made(k)
		}
		outs = append(outs, t)
	}
	c.outs[i] = outs
	switch {
	case n.shapeRead >= 0: // visited in every run: its input's shape decides
	case len(n.rel) > 0:
		c.ready[i] = readyRel
	default:
		c.ready[i] = readyBare
	}
}

// madeHere reports whether t, output k of node i's computation, is the
// node's own: a header it made (its buffer too when kctx.Made), new or
// the spare it was offered.
func (c *shapeCache) madeHere(i, k int, t *tensor.Tensor, kctx *ops.Context) bool {
	return kctx.Fresh(k) && t == kctx.Output(k)
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
