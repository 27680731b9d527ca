package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// cacheGQA is the CacheGroupQueryAttention kernel: GroupQueryAttention
// (onnxruntime's CPU semantics, as the tensor-path op implements them)
// with the shared past/present buffer replaced by the layer's KVCache.
// The first run of a state is the first prompt (S == total_sequence_length;
// right-padded rows beyond seqlens_k[b]+1 are not stored); later runs need
// seqlens_k[b]+1 == stored tokens + S. Rotary (do_rotary) rotates Q and the
// new K at those positions (or position_ids) before the append.
type cacheGQA struct {
	layer, nh, kvh int
	rotary, inter  bool
	opts           cpu.Options
	// windowBuffer is Layer.WindowBuffer: presents are exported as the
	// window-sized buffer of sliding_window_cache=1 (0: every position).
	windowBuffer int
}

func newCacheGQA(n *ops.Node) (ops.Kernel, error) {
	k := &cacheGQA{}
	var err error
	get := func(name string, def int64) int {
		v, e := n.Attrs.Int(name, def)
		if e != nil && err == nil {
			err = e
		}
		return int(v)
	}
	k.layer, k.nh, k.kvh = get("layer", 0), get("num_heads", 0), get("kv_num_heads", 0)
	k.rotary, k.inter = get("do_rotary", 0) == 1, get("rotary_interleaved", 0) == 1
	if w := get("local_window_size", -1); w > 0 {
		k.opts.Window = w
	}
	k.windowBuffer = get("window_buffer", 0)
	if err != nil {
		return nil, err
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
	if k.nh <= 0 || k.kvh <= 0 || k.nh%k.kvh != 0 {
		return nil, fmt.Errorf("%w: %s: num_heads %d, kv_num_heads %d", errs.ErrInvalidArgument, n.Describe(), k.nh, k.kvh)
	}
	return k, nil
}

// Compute runs one step of one layer.
func (k *cacheGQA) Compute(ctx *ops.Context) error {
	bind, err := bindingOf(ctx)
	if err != nil {
		return err
	}
	q, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	kt, vt := ctx.Input(1), ctx.Input(2)
	qs := q.Shape()
	heads := k.nh
	if kt == nil {
		heads += 2 * k.kvh
	}
	if len(qs) != 3 || qs[2] == 0 || qs[2]%heads != 0 || (kt == nil) != (vt == nil) {
		return fmt.Errorf("%w: CacheGroupQueryAttention: query %v for %d heads", errs.ErrShape, qs, heads)
	}
	if _, ok := ElemOf(q.DType()); !ok {
		return fmt.Errorf("%w: CacheGroupQueryAttention: query type %v", errs.ErrType, q.DType())
	}
	B, S, D := qs[0], qs[1], qs[2]/heads
	g := geometry{b: B, s: S, hq: k.nh, hkv: k.kvh, dk: D, dv: D}
	if B != bind.Batch() {
		return fmt.Errorf("%w: CacheGroupQueryAttention: batch %d, the state holds %d sequences", errs.ErrShape, B, bind.Batch())
	}
	kv, err := bind.Cache(k.layer, S, [3]int{k.kvh, D, D})
	if err != nil {
		return err
	}
	if cfg := kv.Config(); cfg.KVHeads != k.kvh || cfg.HeadDimK != D || cfg.HeadDimV != D {
		return fmt.Errorf("%w: CacheGroupQueryAttention: %d KV heads of %d, the state's cache %d of %d/%d",
			errs.ErrShape, k.kvh, D, cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV)
	}
	counts, offsets, err := k.lengths(ctx, bind.PastLength(), kv, B, S)
	if err != nil {
		return err
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	// Q, K, V as float32 [B, H, S, D]
	nq, nk := B*k.nh*S*D, B*k.kvh*S*D
	sc.q, sc.kf, sc.vf = grow(sc.q, nq), grow(sc.kf, nk), grow(sc.vf, nk)
	if err := k.split(sc, q, kt, vt, g); err != nil {
		return err
	}
	if k.rotary {
		if err := k.rotate(ctx, sc, g, offsets, bind.PastLength() == 0); err != nil {
			return err
		}
	}
	if err := mapCacheErr(kv.Append(f32Bytes(sc.kf), f32Bytes(sc.vf), cache.Float32, S, counts)); err != nil {
		return err
	}
	out, err := ctx.NewOutputUninit(0, q.DType(), tensor.Shape{B, S, k.nh * D})
	if err != nil {
		return err
	}
	sc.o = grow(sc.o, nq)
	view, err := kv.BeginRead()
	if err != nil {
		return err
	}
	var skip []int
	if counts != nil {
		skip = make([]int, B) // right padding: rows counts[b].. are padding
	}
	opts := k.opts
	opts.Threads = ctx.Threads()
	err = runAttention(sc.o, sc.q, view, g, skip, counts, opts, sc)
	kv.EndRead()
	if err != nil {
		return mapCacheErr(err)
	}
	sc.t = grow(sc.t, nq)
	toTokenMajor(sc.t, sc.o, B, k.nh, S, D)
	if err := tensor.FromFloat32(out, sc.t); err != nil {
		return err
	}
	if k.windowBuffer > 0 {
		return windowPresents(ctx, bind, k.layer, kv, q.DType(), g, k.windowBuffer)
	}
	return (&cacheAttention{layer: k.layer}).presents(ctx, bind, kv, q.DType(), g)
}

// windowPresents writes the presents of a layer with window-sized buffers
// of C positions (KVCache.ExportTail) when the caller asked for them, else
// empty ones.
func windowPresents(ctx *ops.Context, bind Binding, layer int, kv *cache.KVCache, dt tensor.DType, g geometry, C int) error {
	L := 0
	if bind.ExportWanted(layer) {
		L = C
	}
	return writePresents(ctx, kv, dt, g, L, true)
}

// lengths checks seqlens_k and total_sequence_length against the state and
// returns the per-sequence counts to store (nil: all S) and each
// sequence's position of its first new token.
func (k *cacheGQA) lengths(ctx *ops.Context, P int, kv *cache.KVCache, B, S int) ([]int, []int, error) {
	sk, tt := ctx.Input(5), ctx.Input(6)
	if sk == nil || tt == nil || sk.DType() != tensor.Int32 || tt.DType() != tensor.Int32 || sk.Len() != B || tt.Len() != 1 {
		return nil, nil, fmt.Errorf("%w: CacheGroupQueryAttention: seqlens_k must be int32 [%d] and total_sequence_length one int32",
			errs.ErrShape, B)
	}
	total := int(tt.Int32()[0])
	if total != P+S {
		return nil, nil, fmt.Errorf("%w: total_sequence_length %d, the state holds %d positions and the step adds %d",
			errs.ErrInvalidArgument, total, P, S)
	}
	offsets := make([]int, B)
	var counts []int
	for b, v := range sk.Int32() {
		T := int(v) + 1
		held := kv.SeqLen(b)
		switch {
		case P == 0 && (T < 1 || T > S):
			return nil, nil, fmt.Errorf("%w: seqlens_k[%d] = %d for a first prompt of %d tokens", errs.ErrInvalidArgument, b, v, S)
		case P == 0 && T < S:
			if counts == nil {
				counts = make([]int, B)
				for i := range counts {
					counts[i] = S
				}
			}
			counts[b] = T
		case P > 0 && T-S != held:
			return nil, nil, fmt.Errorf("%w: seqlens_k[%d] = %d: sequence %d holds %d tokens, the step adds %d",
				errs.ErrInvalidArgument, b, v, b, held, S)
		}
		offsets[b] = held
	}
	return counts, offsets, nil
}

// split converts the query (and key/value, or the packed QKV) to float32
// head-major scratch.
func (k *cacheGQA) split(sc *scratch, q, kt, vt *tensor.Tensor, g geometry) error {
	B, S, D := g.b, g.s, g.dk
	sc.t = grow(sc.t, q.Len())
	if err := tensor.ToFloat32(q, sc.t); err != nil {
		return err
	}
	if kt == nil {
		// packed [B, S, (nh + 2 kvh) D]: q heads, then k, then v
		W := (k.nh + 2*k.kvh) * D
		for b := 0; b < B; b++ {
			for s := 0; s < S; s++ {
				row := sc.t[(b*S+s)*W:]
				for h := 0; h < k.nh; h++ {
					copy(sc.q[((b*k.nh+h)*S+s)*D:][:D], row[h*D:])
				}
				for h := 0; h < k.kvh; h++ {
					copy(sc.kf[((b*k.kvh+h)*S+s)*D:][:D], row[(k.nh+h)*D:])
					copy(sc.vf[((b*k.kvh+h)*S+s)*D:][:D], row[(k.nh+k.kvh+h)*D:])
				}
			}
		}
		return nil
	}
	toHeadMajor(sc.q, sc.t[:B*S*k.nh*D], B, k.nh, S, D)
	for _, p := range []struct {
		t   *tensor.Tensor
		dst []float32
	}{{kt, sc.kf}, {vt, sc.vf}} {
		sc.t = grow(sc.t, p.t.Len())
		if err := tensor.ToFloat32(p.t, sc.t); err != nil {
			return err
		}
		toHeadMajor(p.dst, sc.t, B, k.kvh, S, D)
	}
	return nil
}

// rotate applies rotary embeddings to Q and the new K in scratch.
func (k *cacheGQA) rotate(ctx *ops.Context, sc *scratch, g geometry, offsets []int, first bool) error {
	cosT, sinT, pid := ctx.Input(7), ctx.Input(8), ctx.Input(9)
	if cosT == nil || sinT == nil || cosT.Rank() != 2 || !sinT.Shape().Equal(cosT.Shape()) || 2*cosT.Shape()[1] > g.dk {
		return fmt.Errorf("%w: do_rotary=1 needs cos_cache and sin_cache [max_position, rotary_dim/2]", errs.ErrShape)
	}
	rows, half := cosT.Shape()[0], cosT.Shape()[1]
	var ids []int64
	if pid != nil {
		if pid.DType() != tensor.Int64 || pid.Len() != g.b*g.s {
			return fmt.Errorf("%w: position_ids must be int64 [%d, %d]", errs.ErrShape, g.b, g.s)
		}
		ids = pid.Int64()
	}
	cs, err := tensor.AsFloat32(cosT)
	if err != nil {
		return err
	}
	sn, err := tensor.AsFloat32(sinT)
	if err != nil {
		return err
	}
	for b := 0; b < g.b; b++ {
		for s := 0; s < g.s; s++ {
			p := offsets[b] + s
			switch {
			case ids != nil && first: // onnxruntime reads only the first id then
				p = int(ids[0]) + s
			case ids != nil:
				p = int(ids[b*g.s+s])
			}
			if p < 0 || p >= rows {
				return fmt.Errorf("%w: rotary position %d outside the cos/sin caches of %d rows", errs.ErrInvalidArgument, p, rows)
			}
			c, si := cs[p*half:(p+1)*half], sn[p*half:(p+1)*half]
			for h := 0; h < k.nh; h++ {
				r := sc.q[((b*k.nh+h)*g.s+s)*g.dk:][:g.dk]
				ops.RotateHead(r, r, c, si, k.inter)
			}
			for h := 0; h < k.kvh; h++ {
				r := sc.kf[((b*k.kvh+h)*g.s+s)*g.dk:][:g.dk]
				ops.RotateHead(r, r, c, si, k.inter)
			}
		}
	}
	return nil
}
