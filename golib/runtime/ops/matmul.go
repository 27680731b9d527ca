package ops

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	// MatMul 1, 9 and 13 differ only in the element types they list.
	Register("", "MatMul", 1, 0, newMatMul)
}

// newMatMul: numpy matmul. float32/float16/bfloat16 run on cpu/gemm (a
// 16-bit B, typically the weights, is read in place and widened as it
// streams; A and the result go through float32); float64 and int32/int64
// use a plain loop. A constant float32 or 16-bit 2D B is packed once, when
// the session is built (see constPack), and every product reads the pack:
// decode steps stream its slivers, longer products (prefill) take its
// blocks as the blocked algorithm's B blocks instead of packing B on every
// call.
func newMatMul(n *Node) (Kernel, error) {
	if err := n.checkTypes(matmulTypes, 0, 1); err != nil {
		return nil, err
	}
	pack, err := newConstPack(n, 1, false)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		_, err := matmulCompute(ctx, pack)
		return err
	}), nil
}

// matmulCompute computes output 0 = input 0 x input 1 (pack: the packed
// constant B, or nil) and returns it.
func matmulCompute(ctx *Context, pack *constPack) (*tensor.Tensor, error) {
	a, b, err := twoInputs(ctx)
	if err != nil {
		return nil, err
	}
	if a.DType() != b.DType() {
		return nil, errOperandTypes("MatMul", a, b)
	}
	var g matmulPlan
	if err = g.plan(ctx, a.Shape(), b.Shape()); err != nil {
		return nil, err
	}
	// Every path below writes every output element (the products run with
	// beta 0, which clears C first; the plain loop clears its rows), so the
	// output is not zeroed twice.
	out, err := ctx.NewOutputUninit(0, a.DType(), g.out)
	if err != nil {
		return nil, err
	}
	if out.Len() == 0 && matmulTypes.has(a.DType()) {
		// nothing to compute, though the batch may be huge (2^30 x 2 x 0)
		return out, nil
	}
	switch a.DType() {
	case tensor.Float32, tensor.Float16, tensor.BFloat16:
		if pb := pack.get(b); pb != nil && g.fold {
			return out, g.runPacked(ctx, a, pb, out)
		}
		return out, g.runF32(ctx, a, b, out)
	case tensor.Float64:
		matmulLoop(&g, a.Float64(), b.Float64(), out.Float64())
	case tensor.Int64:
		matmulLoop(&g, a.Int64(), b.Int64(), out.Int64())
	case tensor.Int32:
		matmulLoop(&g, a.Int32(), b.Int32(), out.Int32())
	default:
		return nil, fmt.Errorf("%w: MatMul does not support %v", errs.ErrType, a.DType())
	}
	return out, nil
}

// matmulTypes are the element types MatMul computes (matmulCompute).
var matmulTypes = typeSet{tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Float64, tensor.Int64, tensor.Int32}

// minSplitWork is the multiply-adds per thread below which the batched
// path keeps the products on one thread (waking a second costs more than
// it saves): the bound cpu/gemm applies to the threads of one product.
const minSplitWork = 1 << 18

// attentionThreads bounds the threads of an attention call of rows query
// rows over keys positions with dims multiply-adds per row and position
// (head_dim of K plus V) by the same rule: one thread below
// 2*minSplitWork (a decode step of a small model).
func attentionThreads(threads, rows, keys, dims int) int {
	if float64(rows)*float64(keys)*float64(dims) < 2*minSplitWork {
		return 1
	}
	return threads
}

func isHalf(dt tensor.DType) bool { return dt == tensor.Float16 || dt == tensor.BFloat16 }

// matmulPlan is a MatMul broadcast: batches products of m x k by k x n.
type matmulPlan struct {
	m, k, n  int
	batch    tensor.Shape // broadcast batch dimensions
	aStrides []int        // per batch dimension, in matrices (0: broadcast)
	bStrides []int
	out      tensor.Shape
	fold     bool // B is one matrix: all of A is a single (batch*m) x k product
}

func planMatMul(as, bs tensor.Shape) (*matmulPlan, error) {
	g := &matmulPlan{}
	if err := g.plan(nil, as, bs); err != nil {
		return nil, err
	}
	return g, nil
}

// plan fills g for as x bs, its slices carved from ctx's scratch (nil:
// fresh slices).
func (g *matmulPlan) plan(ctx *Context, as, bs tensor.Shape) error {
	if len(as) == 0 || len(bs) == 0 {
		return fmt.Errorf("%w: MatMul needs inputs of rank >= 1, got %v and %v", errs.ErrShape, as, bs)
	}
	var aBatch, bBatch tensor.Shape
	ka, kb := as[len(as)-1], bs[0]
	g.m = 1
	if len(as) > 1 {
		g.m, aBatch = as[len(as)-2], as[:len(as)-2]
	}
	g.n = 1
	if len(bs) > 1 {
		kb, g.n, bBatch = bs[len(bs)-2], bs[len(bs)-1], bs[:len(bs)-2]
	}
	if ka != kb {
		return fmt.Errorf("%w: MatMul inner dimensions differ: %v x %v", errs.ErrShape, as, bs)
	}
	g.k = ka
	batch, err := ctx.BroadcastShapes(aBatch, bBatch)
	if err != nil {
		return fmt.Errorf("MatMul %v x %v: %w", as, bs, err)
	}
	g.batch = batch
	if g.aStrides, err = ctx.BroadcastStrides(aBatch, batch); err != nil {
		return err
	}
	if g.bStrides, err = ctx.BroadcastStrides(bBatch, batch); err != nil {
		return err
	}
	g.fold = bBatch.Size() == 1 && len(aBatch) == len(batch)
	rank := len(batch)
	if len(as) > 1 {
		rank++
	}
	if len(bs) > 1 {
		rank++
	}
	g.out = append(ctx.ScratchShape(rank)[:0], batch...)
	if len(as) > 1 {
		g.out = append(g.out, g.m)
	}
	if len(bs) > 1 {
		g.out = append(g.out, g.n)
	}
	return nil
}

// offsets returns the matrix index in A and B of output batch i.
func (g *matmulPlan) offsets(i int) (ia, ib int) {
	for d := len(g.batch) - 1; d >= 0; d-- {
		c := i % g.batch[d]
		i /= g.batch[d]
		ia += c * g.aStrides[d]
		ib += c * g.bStrides[d]
	}
	return ia, ib
}

func (g *matmulPlan) runF32(ctx *Context, a, b *tensor.Tensor, out *tensor.Tensor) error {
	threads := ctx.Threads()
	af, err := ctx.AsFloat32(a)
	if err != nil {
		return err
	}
	bm, err := gemmB(b)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	m, k, n := g.m, g.k, g.n
	batches := g.batch.Size()
	switch {
	case g.fold:
		err = bm.mul(threads, false, false, batches*m, n, k, 1, af, max(k, 1), 0, max(n, 1), 0, dst, max(n, 1))
	case batches >= 2*threads && threads > 1 && float64(batches)*float64(m)*float64(n)*float64(k) >= 2*minSplitWork:
		// Many small products (decomposed attention): one thread each,
		// when there is enough work for a second thread to pay.
		errc := make(chan error, 1)
		gp := *g // a copy for the workers: g itself (the caller's) stays on its stack
		gemm.ForThreads(threads, batches, func(i int) {
			if e := gp.one(1, i, af, bm, dst); e != nil {
				select {
				case errc <- e:
				default:
				}
			}
		})
		select {
		case err = <-errc:
		default:
		}
	default:
		for i := 0; i < batches && err == nil; i++ {
			err = g.one(threads, i, af, bm, dst)
		}
	}
	if err != nil {
		return fmt.Errorf("MatMul: %w", err)
	}
	return storeF32Result(out, dst)
}

// runPacked computes a folded product with a packed constant B.
func (g *matmulPlan) runPacked(ctx *Context, a *tensor.Tensor, pb *gemm.PackedB, out *tensor.Tensor) error {
	threads := ctx.Threads()
	af, err := ctx.AsFloat32(a)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	m, k, n := g.batch.Size()*g.m, g.k, g.n
	if err := gemm.SgemmPacked(threads, false, m, 1, af, max(k, 1), pb, 0, dst, max(n, 1)); err != nil {
		return fmt.Errorf("MatMul: %w", err)
	}
	return storeF32Result(out, dst)
}

// MatMulTransB computes output 0 of ctx as MatMul(a, Transpose(bt)) with
// bt's last two axes swapped, reading bt in place (the products take B
// transposed): a fused MatMul of a transposed operand, such as the
// decomposed attention's q x k^T. The result equals the unfused pair's
// within float32 rounding (the transposed product may sum in another
// order). ok is false, and nothing is computed, unless a and bt share a
// float32, float16 or bfloat16 type and bt has rank 2 to 8.
func MatMulTransB(ctx *Context, a, bt *tensor.Tensor) (ok bool, err error) {
	dt, r := a.DType(), bt.Rank()
	if dt != bt.DType() || (dt != tensor.Float32 && !isHalf(dt)) || r < 2 || r > stackRank || a.Rank() == 0 {
		return false, nil
	}
	var bsb [stackRank]int
	bs := bsb[:r]
	copy(bs, bt.Shape())
	bs[r-2], bs[r-1] = bs[r-1], bs[r-2]
	var g matmulPlan
	if err := g.plan(ctx, a.Shape(), tensor.Shape(bs)); err != nil {
		return true, err
	}
	out, err := ctx.NewOutput(0, dt, g.out)
	if err != nil {
		return true, err
	}
	af, err := ctx.AsFloat32(a)
	if err != nil {
		return true, err
	}
	bm, err := gemmB(bt)
	if err != nil {
		return true, err
	}
	dst := f32Result(ctx, out)
	m, k, n := g.m, g.k, g.n
	for i := range g.batch.Size() {
		ia, ib := g.offsets(i)
		if err := bm.mul(ctx.Threads(), false, true, m, n, k, 1, af[ia*m*k:], max(k, 1), ib*k*n, max(k, 1), 0,
			dst[i*m*n:], max(n, 1)); err != nil {
			return true, fmt.Errorf("MatMul: %w", err)
		}
	}
	return true, storeF32Result(out, dst)
}

// constPack is a constant float32, float16 or bfloat16 2D B input packed
// for gemm.SgemmPacked when the session is built, as onnxruntime prepacks
// its weights: the decode steps stream the packed slivers and longer
// products read them as their packed B blocks, so no run packs the weights
// (the pack costs a copy of them in memory; a 16-bit B keeps its encoding
// in the pack and is widened as it is read). A kernel value is shared by
// concurrent runs; the pack is read-only, and shared with the session's
// other plans through Node.Packs.
type constPack struct {
	src *tensor.Tensor
	pb  *gemm.PackedB
}

// newConstPack returns the pack of input i of n when it is a float32,
// float16 or bfloat16 2D constant, nil otherwise (or when packing fails:
// the products then read B as stored). The error is a *cache.BudgetError
// where the machine has no memory for the pack.
func newConstPack(n *Node, i int, transB bool) (*constPack, error) {
	if i >= len(n.Constants) {
		return nil, nil
	}
	t := n.Constants[i]
	if t == nil || (t.DType() != tensor.Float32 && !isHalf(t.DType())) || t.Rank() != 2 {
		return nil, nil
	}
	s := t.Shape()
	k, nn := s[0], s[1]
	if transB {
		k, nn = nn, k
	}
	if k == 0 || nn == 0 {
		return nil, nil
	}
	key := packKey{a: t, kind: "gemm"}
	if transB {
		key.ints[0] = 1
	}
	v, err := n.Packs.get(key, gemm.PackBytes(k, nn, t.DType().Size()), func() (any, error) {
		defer t.Evict() // a mapped file's pages need not stay resident beside the pack
		if isHalf(t.DType()) {
			op, err := gemmB(t)
			if err != nil {
				return nil, err
			}
			return gemm.PackBHalf(op.kind, transB, k, nn, op.bits, max(s[1], 1))
		}
		return gemm.PackB(transB, k, nn, t.Float32(), max(s[1], 1))
	})
	if errors.Is(err, cache.ErrBudget) {
		return nil, fmt.Errorf("%s: %w", n.Describe(), err)
	}
	if err != nil {
		return nil, nil
	}
	n.markPacked(i) // every product with this constant reads the pack (see get)
	return &constPack{src: t, pb: v.(*gemm.PackedB)}, nil
}

// get returns the packed B when b is the constant it was built from (the
// same values in the same shape), nil otherwise.
func (c *constPack) get(b *tensor.Tensor) *gemm.PackedB {
	if c == nil || b.Len() == 0 || !sameTensor(c.src, b) {
		return nil
	}
	return c.pb
}

// sameTensor reports whether x and y are both nil or share type, shape and
// storage (a run's input is the constant a pack was built from).
func sameTensor(x, y *tensor.Tensor) bool {
	if x == nil || y == nil {
		return x == y
	}
	return x.DType() == y.DType() && x.Shape().Equal(y.Shape()) &&
		unsafe.SliceData(x.Bytes()) == unsafe.SliceData(y.Bytes()) && len(x.Bytes()) == len(y.Bytes())
}

// one computes output batch i.
func (g *matmulPlan) one(threads, i int, af []float32, bm gemmOperand, dst []float32) error {
	m, k, n := g.m, g.k, g.n
	ia, ib := g.offsets(i)
	return bm.mul(threads, false, false, m, n, k, 1, af[ia*m*k:], max(k, 1), ib*k*n, max(n, 1), 0, dst[i*m*n:], max(n, 1))
}

// gemmOperand is a B matrix for cpu/gemm: float32 values, or the 16-bit
// bits of a float16/bfloat16 tensor read in place.
type gemmOperand struct {
	f32  []float32
	bits []uint16
	kind gemm.Half
}

func gemmB(t *tensor.Tensor) (gemmOperand, error) {
	switch t.DType() {
	case tensor.Float16:
		x := t.Float16()
		return gemmOperand{bits: unsafe.Slice((*uint16)(unsafe.SliceData(x)), len(x)), kind: gemm.Float16}, nil
	case tensor.BFloat16:
		x := t.BFloat16()
		return gemmOperand{bits: unsafe.Slice((*uint16)(unsafe.SliceData(x)), len(x)), kind: gemm.BFloat16}, nil
	}
	f, err := tensor.AsFloat32(t)
	return gemmOperand{f32: f}, err
}

// mul computes C = alpha*op(A)*op(B[off:]) + beta*C.
func (o gemmOperand) mul(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	off, ldb int, beta float32, c []float32, ldc int) error {
	if o.bits != nil {
		return gemm.SgemmHalfB(threads, o.kind, transA, transB, m, n, k, alpha, a, lda, o.bits[off:], ldb, beta, c, ldc)
	}
	return gemm.SgemmThreads(threads, transA, transB, m, n, k, alpha, a, lda, o.f32[off:], ldb, beta, c, ldc)
}

func matmulLoop[T float64 | int64 | int32](g *matmulPlan, a, b, out []T) {
	m, k, n := g.m, g.k, g.n
	for i := range g.batch.Size() {
		ia, ib := g.offsets(i)
		am, bm, om := a[ia*m*k:], b[ib*k*n:], out[i*m*n:(i+1)*m*n]
		clear(om)
		for r := range m {
			for l := range k {
				av := am[r*k+l]
				for c, bv := range bm[l*n : (l+1)*n] {
					om[r*n+c] += av * bv
				}
			}
		}
	}
}
