package rewrite

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// cacheAttention is the CacheAttention kernel: Attention with the past in
// a KVCache. It appends the new K/V rows (only those: the past is never
// copied), runs the streaming kernel over the cache in place (tiled over
// queries for a prompt), and exports present_key/present_value from the
// cache only when the caller asked for them.
type cacheAttention struct {
	layer          int
	qHeads, kvHead int // for 3-D inputs
	opts           cpu.Options
	maskMode       int
	causal         bool         // the mask is combined with causal attention
	signs          []int64      // run-time scale factors from input 5 on: +1 multiply, -1 divide
	ktReshape      int          // index of the two Reshape targets of a batched K^T (0: none)
	padInput       int          // index of the graph's attention_mask input (0: none)
	outType        tensor.DType // the output's type when the graph widened V (0: Q's)
	maskValue      string       // the mask's value name (keys its verdict within a run)
	// nanZero: the graph set the probabilities' NaNs to 0 (Where(IsNaN(p),
	// 0, p) after its Softmax): a row whose softmax is NaN (a NaN or +Inf
	// score) gets p = 0, so its output is 0 where every V element of its
	// head is finite (0 * Inf is NaN, as the graph's MatMul gives)
	nanZero bool
}

func newCacheAttention(n *ops.Node) (ops.Kernel, error) {
	k := &cacheAttention{}
	var err error
	get := func(name string) int {
		v, e := n.Attrs.Int(name, 0)
		if e != nil && err == nil {
			err = e
		}
		return int(v)
	}
	k.layer, k.qHeads, k.kvHead = get("layer"), get("q_num_heads"), get("kv_num_heads")
	k.maskMode, k.causal = get("mask_mode"), get("causal") != 0
	k.ktReshape = get("kt_reshape")
	k.padInput = get("padding_input")
	k.nanZero = get("nan_zero") != 0
	k.outType = tensor.DType(get("output_type"))
	if k.maskValue, err = n.Attrs.String("mask_value", ""); err != nil {
		return nil, err
	}
	if k.signs, _, err = n.Attrs.Ints("factor_signs"); err != nil {
		return nil, err
	}
	if len(k.signs) > 0 && n.NumInputs < 5+len(k.signs) {
		return nil, fmt.Errorf("%w: %s: %d scale factors need %d inputs, got %d", errs.ErrInvalidModel, n.Describe(),
			len(k.signs), 5+len(k.signs), n.NumInputs)
	}
	if k.opts.Scale, err = n.Attrs.Float("scale", 0); err != nil {
		return nil, err
	}
	if k.opts.Softcap, err = n.Attrs.Float("softcap", 0); err != nil {
		return nil, err
	}
	if k.opts.Softcap < 0 {
		k.opts.Softcap = 0 // onnxruntime applies a softcap only when it is > 0 (the tensor path too)
	}
	if k.opts.Scale < 0 {
		return nil, fmt.Errorf("%w: %s: negative scale", errs.ErrNotImplemented, n.Describe())
	}
	return k, err
}

// geometry is one call's shapes: B sequences, S new tokens.
type geometry struct {
	b, s, hq, hkv, dk, dv int
	rank3                 bool
}

func (k *cacheAttention) geometry(q, kt, vt *tensor.Tensor) (geometry, error) {
	var g geometry
	qs, ks, vs := q.Shape(), kt.Shape(), vt.Shape()
	switch {
	case len(qs) == 4 && len(ks) == 4 && len(vs) == 4:
		g = geometry{b: qs[0], s: qs[2], hq: qs[1], hkv: ks[1], dk: qs[3], dv: vs[3]}
		if ks[0] != g.b || vs[0] != g.b || ks[2] != g.s || vs[2] != g.s || ks[3] != g.dk || vs[1] != g.hkv {
			return g, fmt.Errorf("%w: CacheAttention: Q %v, K %v, V %v do not agree", errs.ErrShape, qs, ks, vs)
		}
	case len(qs) == 3 && len(ks) == 3 && len(vs) == 3:
		if k.qHeads <= 0 || k.kvHead <= 0 || qs[2]%k.qHeads != 0 || ks[2]%k.kvHead != 0 || vs[2]%k.kvHead != 0 {
			return g, fmt.Errorf("%w: CacheAttention: 3-D inputs need q_num_heads/kv_num_heads dividing the hidden sizes (Q %v, K %v, V %v)",
				errs.ErrShape, qs, ks, vs)
		}
		g = geometry{b: qs[0], s: qs[1], hq: k.qHeads, hkv: k.kvHead, dk: qs[2] / k.qHeads, dv: vs[2] / k.kvHead, rank3: true}
		if ks[0] != g.b || vs[0] != g.b || ks[1] != g.s || vs[1] != g.s || ks[2]/k.kvHead != g.dk {
			return g, fmt.Errorf("%w: CacheAttention: Q %v, K %v, V %v do not agree", errs.ErrShape, qs, ks, vs)
		}
	default:
		return g, fmt.Errorf("%w: CacheAttention: Q, K, V must all be 3-D or 4-D (got %v, %v, %v)", errs.ErrShape, qs, ks, vs)
	}
	if g.s < 1 || g.hkv <= 0 || g.hq%g.hkv != 0 {
		return g, fmt.Errorf("%w: CacheAttention: %d new tokens, q heads %d, kv heads %d", errs.ErrShape, g.s, g.hq, g.hkv)
	}
	return g, nil
}

// Compute runs one step of one layer.
func (k *cacheAttention) Compute(ctx *ops.Context) error {
	bind, err := bindingOf(ctx)
	if err != nil {
		return err
	}
	q, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	kt, err := ctx.RequireInput(1)
	if err != nil {
		return err
	}
	vt, err := ctx.RequireInput(2)
	if err != nil {
		return err
	}
	elem, ok := ElemOf(kt.DType())
	if !ok || vt.DType() != kt.DType() || !q.DType().IsFloat() {
		return fmt.Errorf("%w: CacheAttention: Q, K, V must be float32, float16 or bfloat16 with K and V alike (got %v, %v, %v)",
			errs.ErrType, q.DType(), kt.DType(), vt.DType())
	}
	g, err := k.geometry(q, kt, vt)
	if err != nil {
		return err
	}
	if g.b != bind.Batch() {
		return fmt.Errorf("%w: CacheAttention: batch %d, the state holds %d sequences", errs.ErrShape, g.b, bind.Batch())
	}
	kv, err := bind.Cache(k.layer, g.s, [3]int{g.hkv, g.dk, g.dv})
	if err != nil {
		return err
	}
	if cfg := kv.Config(); cfg.KVHeads != g.hkv || cfg.HeadDimK != g.dk || cfg.HeadDimV != g.dv {
		return fmt.Errorf("%w: CacheAttention: new K/V have %d heads of %d/%d, the state's cache %d heads of %d/%d",
			errs.ErrShape, g.hkv, g.dk, g.dv, cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV)
	}
	opts, err := k.options(ctx)
	if err != nil {
		return err
	}
	opts.Threads = ctx.Threads()
	if k.ktReshape > 0 {
		if err := checkBatchedTranspose(ctx, k.ktReshape, g, bind.PastLength()); err != nil {
			return err
		}
	}
	skip, window, err := k.padding(ctx, bind, g, kv)
	if err != nil {
		return err
	}
	if window > 0 {
		opts.Window = window
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	if err := sc.append(kv, kt, vt, elem, g, skip); err != nil {
		return err
	}
	qf, err := sc.query(q, g)
	if err != nil {
		return err
	}
	outType := q.DType()
	if k.outType != 0 {
		if _, ok := ElemOf(k.outType); !ok {
			return fmt.Errorf("%w: CacheAttention: output type %v", errs.ErrType, k.outType)
		}
		outType = k.outType
	}
	if err := k.attend(ctx, sc, kv, qf, outType, g, skip, opts); err != nil {
		return err
	}
	return k.presents(ctx, bind, kv, kt.DType(), g)
}

// attend runs attention over the cache and writes output 0.
func (k *cacheAttention) attend(ctx *ops.Context, sc *scratch, kv *cache.KVCache, qf []float32, dt tensor.DType, g geometry, skip []int, opts cpu.Options) error {
	shape := tensor.Shape{g.b, g.hq, g.s, g.dv}
	if g.rank3 {
		shape = tensor.Shape{g.b, g.s, g.hq * g.dv}
	}
	out, err := ctx.NewOutputUninit(0, dt, shape)
	if err != nil {
		return err
	}
	n := g.b * g.hq * g.s * g.dv
	var dst []float32
	if dt == tensor.Float32 && !g.rank3 {
		dst = out.Float32()
	} else {
		sc.o = grow(sc.o, n)
		dst = sc.o
	}
	view, err := kv.BeginRead()
	if err != nil {
		return err
	}
	err = runAttention(dst, qf, view, g, skip, nil, opts, sc)
	if err == nil && k.nanZero {
		err = zeroNaNRows(dst, view, g, kv.Config().Elem)
	}
	kv.EndRead()
	if err != nil {
		return mapCacheErr(err)
	}
	if g.rank3 {
		sc.t = grow(sc.t, n)
		toTokenMajor(sc.t, dst, g.b, g.hq, g.s, g.dv)
		dst = sc.t
	}
	if dt == tensor.Float32 && !g.rank3 {
		return nil
	}
	return tensor.FromFloat32(out, dst)
}

// zeroNaNRows sets to 0 the rows of dst ([B, q heads, S, dv]) holding a
// NaN whose head's stored V rows (every position of the sequence's KV
// head in view) are all finite: the rows a graph's Where(IsNaN(p), 0, p)
// gives zero probabilities (cacheAttention.nanZero). It reads V only for
// such rows (once per KV head).
func zeroNaNRows(dst []float32, view cache.View, g geometry, elem cache.ElemType) error {
	group := g.hq / g.hkv
	finite := map[[2]int]bool{}
	for b := 0; b < g.b; b++ {
		for h := 0; h < g.hq; h++ {
			for i := 0; i < g.s; i++ {
				row := dst[((b*g.hq+h)*g.s+i)*g.dv:][:g.dv]
				if !hasNaN(row) {
					continue
				}
				key := [2]int{b, h / group}
				ok, seen := finite[key]
				if !seen {
					var err error
					if ok, err = cpu.ValuesFinite(view, b, h/group, g.dk, g.dv, elem); err != nil {
						return err
					}
					finite[key] = ok
				}
				if ok {
					clear(row)
				}
			}
		}
	}
	return nil
}

func hasNaN(x []float32) bool {
	for _, v := range x {
		if v != v {
			return true
		}
	}
	return false
}

// runAttention attends every query row: one call for the whole batch when
// every new token is real (skip nil), else one call per sequence over its
// real rows skip[b] .. skip[b]+n[b]-1 (n nil: to the end; padding rows
// are zero).
func runAttention(dst, q []float32, view cache.View, g geometry, skip, n []int, o cpu.Options, sc *scratch) error {
	if skip == nil {
		return cpu.AttentionPrefill(dst, q, g.s, g.hq, view, o)
	}
	clear(dst)
	for b := 0; b < g.b; b++ {
		real := g.s - skip[b]
		if n != nil {
			real = n[b]
		}
		if real == 0 {
			continue
		}
		sv := &seqView{View: view, b: b}
		sc.qb = grow(sc.qb, g.hq*real*g.dk)
		sc.ob = grow(sc.ob, g.hq*real*g.dv)
		for h := 0; h < g.hq; h++ {
			src := q[((b*g.hq+h)*g.s+skip[b])*g.dk:]
			copy(sc.qb[h*real*g.dk:(h+1)*real*g.dk], src)
		}
		if err := cpu.AttentionPrefill(sc.ob, sc.qb, real, g.hq, sv, o); err != nil {
			return err
		}
		for h := 0; h < g.hq; h++ {
			copy(dst[((b*g.hq+h)*g.s+skip[b])*g.dv:], sc.ob[h*real*g.dv:(h+1)*real*g.dv])
		}
	}
	return nil
}

// presents sets outputs 1 and 2: exported from the cache when the caller
// asked for them, otherwise empty [B, kv_heads, 0, D] placeholders that
// nothing reads (the rule proved no node consumes a present).
func (k *cacheAttention) presents(ctx *ops.Context, bind Binding, kv *cache.KVCache, dt tensor.DType, g geometry) error {
	L := 0
	if bind.ExportWanted(k.layer) {
		L = kv.MaxLen()
	}
	return writePresents(ctx, kv, dt, g, L, false)
}

// writePresents allocates outputs 1 and 2 as [B, kv_heads, L, D] and, when
// L > 0, fills them from the cache: its first L positions (KVCache.Export),
// or with tail its last min(length, L) positions from row 0 (ExportTail,
// the window-sized buffers of GroupQueryAttention).
func writePresents(ctx *ops.Context, kv *cache.KVCache, dt tensor.DType, g geometry, L int, tail bool) error {
	pk, err := ctx.NewOutputUninit(1, dt, tensor.Shape{g.b, g.hkv, L, g.dk})
	if err != nil {
		return err
	}
	pv, err := ctx.NewOutputUninit(2, dt, tensor.Shape{g.b, g.hkv, L, g.dv})
	if err != nil {
		return err
	}
	if L == 0 {
		return nil
	}
	elem, _ := ElemOf(dt)
	if tail {
		return mapCacheErr(kv.ExportTail(pk.Bytes(), pv.Bytes(), elem, L))
	}
	return mapCacheErr(kv.Export(pk.Bytes(), pv.Bytes(), elem, L))
}

// options returns the kernel options of this call: the scale times the
// run-time factors.
func (k *cacheAttention) options(ctx *ops.Context) (cpu.Options, error) {
	o := k.opts
	if len(k.signs) == 0 {
		return o, nil
	}
	if o.Scale == 0 {
		o.Scale = 1
	}
	for i, sign := range k.signs {
		t := ctx.Input(5 + i)
		if t == nil || t.Len() != 1 || !t.DType().IsFloat() {
			return o, fmt.Errorf("%w: CacheAttention: scale factor %d must be one float value", errs.ErrNotImplemented, i)
		}
		v, err := tensor.AsFloat32(t)
		if err != nil {
			return o, err
		}
		if sign > 0 {
			o.Scale *= v[0]
		} else {
			o.Scale /= v[0]
		}
	}
	if !(o.Scale > 0) || math.IsInf(float64(o.Scale), 0) {
		return o, fmt.Errorf("%w: CacheAttention: the scores' scale %v is not a positive number", errs.ErrNotImplemented, o.Scale)
	}
	return o, nil
}

// checkBatchedTranspose checks that the graph's K^T, written as
// Reshape(s1) -> Transpose(0, 2, 1) -> Reshape(s2) over K [B, H, T, D],
// is the transpose the kernel computes: s1 resolves to [B*H, T, D] and
// s2 (on [B*H, D, T]) to [B, H, D, T], with H the query heads.
func checkBatchedTranspose(ctx *ops.Context, at int, g geometry, past int) error {
	T := past + g.s
	in := []int{g.b, g.hq, T, g.dk}
	mid := []int{g.b * g.hq, T, g.dk}
	want := [][]int{mid, {g.b, g.hq, g.dk, T}}
	from := [][]int{in, {g.b * g.hq, g.dk, T}}
	for i := 0; i < 2; i++ {
		st := ctx.Input(at + i)
		if st == nil || st.DType() != tensor.Int64 {
			return fmt.Errorf("%w: CacheAttention: the K^T Reshape target %d is missing or not int64", errs.ErrNotImplemented, i)
		}
		got, ok := resolveReshape(from[i], st.Int64())
		if !ok || len(got) != len(want[i]) {
			return fmt.Errorf("%w: CacheAttention: the K^T Reshape target %v is not %v", errs.ErrNotImplemented, st.Int64(), want[i])
		}
		for j := range got {
			if got[j] != want[i][j] {
				return fmt.Errorf("%w: CacheAttention: the K^T Reshape target %v is not %v", errs.ErrNotImplemented, st.Int64(), want[i])
			}
		}
	}
	return nil
}

// resolveReshape applies ONNX Reshape's rules (0 copies the input dim,
// -1 is inferred; allowzero=0) to a target.
func resolveReshape(in []int, target []int64) ([]int, bool) {
	total := 1
	for _, d := range in {
		total *= d
	}
	out := make([]int, len(target))
	known, infer := 1, -1
	for i, t := range target {
		switch {
		case t == 0 && i < len(in):
			out[i] = in[i]
		case t == -1 && infer < 0:
			infer = i
			continue
		case t > 0:
			out[i] = int(t)
		default:
			return nil, false
		}
		known *= out[i]
	}
	if infer >= 0 {
		if known == 0 || total%known != 0 {
			return nil, false
		}
		out[infer] = total / known
	} else if known != total {
		return nil, false
	}
	return out, true
}

// f32Bytes views float32s as bytes.
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// ElemOf maps a tensor type to the cache storage type (false: a type no
// cache stores).
func ElemOf(dt tensor.DType) (cache.ElemType, bool) {
	switch dt {
	case tensor.Float32:
		return cache.Float32, true
	case tensor.Float16:
		return cache.Float16, true
	case tensor.BFloat16:
		return cache.BFloat16, true
	}
	return 0, false
}

// mapCacheErr gives cache errors the runtime's classes, keeping the cache
// sentinel (and a *cache.BudgetError) reachable for errors.Is/As.
func mapCacheErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, cache.ErrInvalidArgument):
		return fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
	}
	return err
}

// scratch holds one call's temporary buffers, pooled across calls.
type scratch struct {
	q, o, t, qb, ob []float32
	kf, vf          []float32
	kb, vb          []byte
	counts          []int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// query returns Q as float32 [B, Hq, S, Dk]: the tensor's own data when it
// already is, else a converted (and for 3-D inputs transposed) copy.
func (sc *scratch) query(q *tensor.Tensor, g geometry) ([]float32, error) {
	if q.DType() == tensor.Float32 && !g.rank3 {
		return q.Float32(), nil
	}
	n := g.b * g.hq * g.s * g.dk
	sc.t = grow(sc.t, n)
	if err := tensor.ToFloat32(q, sc.t); err != nil {
		return nil, err
	}
	if !g.rank3 {
		return sc.t, nil
	}
	sc.q = grow(sc.q, n)
	toHeadMajor(sc.q, sc.t, g.b, g.hq, g.s, g.dk)
	return sc.q, nil
}

// toHeadMajor sets dst [B, H, S, D] from src [B, S, H*D].
func toHeadMajor[T any](dst, src []T, B, H, S, D int) {
	for b := 0; b < B; b++ {
		for s := 0; s < S; s++ {
			for h := 0; h < H; h++ {
				copy(dst[((b*H+h)*S+s)*D:((b*H+h)*S+s+1)*D], src[((b*S+s)*H+h)*D:])
			}
		}
	}
}

// toTokenMajor sets dst [B, S, H*D] from src [B, H, S, D].
func toTokenMajor[T any](dst, src []T, B, H, S, D int) {
	for b := 0; b < B; b++ {
		for s := 0; s < S; s++ {
			for h := 0; h < H; h++ {
				copy(dst[((b*S+s)*H+h)*D:((b*S+s)*H+h+1)*D], src[((b*H+h)*S+s)*D:])
			}
		}
	}
}

// append writes the new rows to the cache: straight from the K/V tensors
// when they are [B, Hkv, S, D] without padding, else through scratch
// (3-D inputs transposed, left padding dropped and counted out).
func (sc *scratch) append(kv *cache.KVCache, kt, vt *tensor.Tensor, elem cache.ElemType, g geometry, skip []int) error {
	kb, vb := kt.Bytes(), vt.Bytes()
	es := elem.Size()
	if g.rank3 {
		sc.kb = grow(sc.kb, len(kb))
		sc.vb = grow(sc.vb, len(vb))
		toHeadMajor(sc.kb, kb, g.b, g.hkv, g.s, g.dk*es)
		toHeadMajor(sc.vb, vb, g.b, g.hkv, g.s, g.dv*es)
		kb, vb = sc.kb, sc.vb
	}
	var counts []int
	if skip != nil {
		// move each sequence's real rows to the front; Append takes the
		// first counts[b] rows
		if !g.rank3 {
			sc.kb = grow(sc.kb, len(kb))
			sc.vb = grow(sc.vb, len(vb))
			copy(sc.kb, kb)
			copy(sc.vb, vb)
			kb, vb = sc.kb, sc.vb
		}
		sc.counts = grow(sc.counts, g.b)
		counts = sc.counts
		for b := 0; b < g.b; b++ {
			counts[b] = g.s - skip[b]
			if skip[b] == 0 {
				continue
			}
			for h := 0; h < g.hkv; h++ {
				u := (b*g.hkv + h) * g.s
				copy(kb[u*g.dk*es:], kb[(u+skip[b])*g.dk*es:(u+g.s)*g.dk*es])
				copy(vb[u*g.dv*es:], vb[(u+skip[b])*g.dv*es:(u+g.s)*g.dv*es])
			}
		}
	}
	return mapCacheErr(kv.Append(kb, vb, elem, g.s, counts))
}

// seqView presents sequence b of a view as a batch of one.
type seqView struct {
	cache.View
	b int
}

// Batch is 1.
func (s *seqView) Batch() int { return 1 }

// SeqLen is sequence b's length.
func (s *seqView) SeqLen(int) int { return s.View.SeqLen(s.b) }

// WindowStart is sequence b's window start.
func (s *seqView) WindowStart(int) int { return s.View.WindowStart(s.b) }

// AppendSegments returns sequence b's segments.
func (s *seqView) AppendSegments(dst []cache.Segment, _, h, from, to int) []cache.Segment {
	return s.View.AppendSegments(dst, s.b, h, from, to)
}
