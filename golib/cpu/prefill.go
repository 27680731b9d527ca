package cpu

import (
	"fmt"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// AttentionPrefill is Attention for any number of new query tokens (a
// prompt of hundreds or thousands of tokens, or a ragged batch step), with
// the same semantics: causal alignment to the end of the cache, so query
// row i of sequence b sits at position SeqLen(b) - qLen + i.
//
// Up to MaxQLen rows it is exactly one Attention call. Beyond, it runs the
// streaming kernel on tiles of MaxQLen query rows: the tile that ends at
// row c1 sees the cache cut after position SeqLen(b) - qLen + c1 - 1 (a
// prefix of the same storage, nothing copied), so the kernel's own
// end-aligned causal rule gives each row its causal range, and every K/V
// block loaded serves all the rows of a tile and of the GQA group. Only the
// tile's query and output rows are gathered into scratch.
func AttentionPrefill(dst, q []float32, qLen, qHeads int, v cache.View, o Options) error {
	if qLen >= 1 && qLen <= maxQLen {
		return Attention(dst, q, qLen, qHeads, v, o)
	}
	if v == nil {
		return fmt.Errorf("%w: nil cache view", cache.ErrInvalidArgument)
	}
	if qLen < 1 {
		return fmt.Errorf("%w: q_len %d must be positive", cache.ErrInvalidArgument, qLen)
	}
	batch, dk, dv := v.Batch(), v.HeadDimK(), v.HeadDimV()
	units := batch * qHeads
	if qHeads <= 0 || len(q) != units*qLen*dk || len(dst) != units*qLen*dv {
		return fmt.Errorf("%w: q has %d and dst %d elements for batch %d, q_heads %d, q_len %d, head dims %d/%d",
			cache.ErrInvalidArgument, len(q), len(dst), batch, qHeads, qLen, dk, dv)
	}
	for b := 0; b < batch; b++ {
		if l := v.SeqLen(b); l < qLen {
			return fmt.Errorf("%w: sequence %d holds %d tokens, fewer than q_len %d",
				cache.ErrInvalidArgument, b, l, qLen)
		}
	}
	sc := tileScratch.Get().(*prefillTile)
	defer tileScratch.Put(sc)
	sc.q = grow(sc.q, units*maxQLen*dk)
	sc.o = grow(sc.o, units*maxQLen*dv)
	sc.view = prefixView{View: v}
	if o.Exact != nil { // its rows are numbered among all q_len tokens
		if sc.exactFn == nil {
			sc.exactFn = sc.exact
		}
		sc.user, o.Exact = o.Exact, sc.exactFn
		defer func() { sc.user = nil }()
	}
	mask := o.Mask
	if mask != nil {
		o.Mask = &sc.mask
		defer func() { sc.mask = Mask{} }()
	}
	for c0 := 0; c0 < qLen; c0 += maxQLen {
		sc.c0 = c0
		if mask != nil { // the tile's rows start c0 rows into the mask
			sc.mask = *mask
			if off := c0 * mask.StrideI; mask.Float != nil {
				sc.mask.Float = mask.Float[min(off, len(mask.Float)):]
			} else {
				sc.mask.Bool = mask.Bool[min(off, len(mask.Bool)):]
			}
		}
		n := min(maxQLen, qLen-c0)
		tq, to := sc.q[:units*n*dk], sc.o[:units*n*dv]
		for u := 0; u < units; u++ {
			copy(tq[u*n*dk:(u+1)*n*dk], q[(u*qLen+c0)*dk:(u*qLen+c0+n)*dk])
		}
		sc.view.cut = qLen - (c0 + n)
		if o.NonCausal {
			sc.view.cut = 0 // every row sees every position
		}
		if err := Attention(to, tq, n, qHeads, &sc.view, o); err != nil {
			return err
		}
		for u := 0; u < units; u++ {
			copy(dst[(u*qLen+c0)*dv:(u*qLen+c0+n)*dv], to[u*n*dv:(u+1)*n*dv])
		}
	}
	return nil
}

// MaxQLen is the largest q_len one Attention call takes; AttentionPrefill
// takes any.
const MaxQLen = maxQLen

// prefillTile is the scratch of one AttentionPrefill call.
type prefillTile struct {
	q, o []float32
	view prefixView

	mask    Mask                                   // the tile's rows of Options.Mask
	c0      int                                    // first query row of the tile
	user    func(out []float32, b, h, i int) error // the caller's Options.Exact
	exactFn func(out []float32, b, h, i int) error // sc.exact, bound once
}

// exact is the tile calls' Options.Exact: the caller's, with the row
// numbered among all query tokens.
func (sc *prefillTile) exact(out []float32, b, h, i int) error { return sc.user(out, b, h, sc.c0+i) }

var tileScratch = sync.Pool{New: func() any { return new(prefillTile) }}

// prefixView presents the first SeqLen(b) - cut positions of every
// sequence of a view: the storage is the view's own.
type prefixView struct {
	cache.View
	cut int
}

// SeqLen is the underlying length minus the cut.
func (p *prefixView) SeqLen(b int) int { return p.View.SeqLen(b) - p.cut }
