package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("com.microsoft", "MatMulNBits", 1, 0, newMatMulNBits)
}

// MatMulNBits inputs by position (onnxruntime's contrib schema).
const (
	nbitsA, nbitsB, nbitsScales, nbitsZeroPoints, nbitsGIdx, nbitsBias = 0, 1, 2, 3, 4, 5
	nbitsInputs                                                        = 6
)

// nbitsGeom is MatMulNBits' validated attributes and the packed layout
// they imply.
type nbitsGeom struct {
	k, n      int // the logical weight is n x k (the product is A x W^T)
	bits      int // 2, 4 or 8
	block     int // block_size
	kBlocks   int // blocks per weight row: ceil(k / block)
	blob      int // bytes per block of B: block * bits / 8
	zpPerRow  int // bytes per weight row of uint8 zero points: ceil(kBlocks * bits / 8)
	defaultZP int // 2^(bits-1)
}

// nbitsQuant is a validated set of quantized weight inputs (B, scales,
// optional zero_points). empty marks an omitted projection (B with a 0
// dimension): the product is zero and the other inputs are not read.
type nbitsQuant struct {
	b, scales, zp *tensor.Tensor
	empty         bool
}

// nbitsKernel is one MatMulNBits node. pb is the quantized weight packed
// at session build when B, scales and zero_points are constants (src holds
// those constants, to recognise them at run time); otherwise each run
// dequantizes into scratch.
type nbitsKernel struct {
	g     nbitsGeom
	src   nbitsQuant
	pb    *gemm.PackedB
	built bool // src holds the constant inputs, validated (pb nil: an omitted projection)
}

// newMatMulNBits: com.microsoft MatMulNBits, Y = A x W^T (+ bias), the
// weight W (N x K) quantized block-wise along K as onnxruntime's contrib
// schema describes it (checked against onnxruntime 1.32):
//
//   - A: float32, float16 or bfloat16 [..., K]; Y: A's type [..., N].
//   - B: uint8 [N, k_blocks, blob_size], k_blocks = ceil(K/block_size),
//     blob_size = block_size*bits/8; each block's quantized values packed
//     low bits first (for 4 bits, value 2i in the low nibble of byte i).
//     The last block of a row may be partial (K not a multiple of
//     block_size); its padding is ignored. A B with a 0 dimension (the
//     others as above) is an omitted projection: Y is zero, or the bias.
//   - scales: A's type, [N*k_blocks] or [N, k_blocks].
//   - zero_points (optional): uint8 packed like B, ceil(k_blocks*bits/8)
//     bytes per weight row ([N*that] or [N, that]), or A's type [N*k_blocks]
//     or [N, k_blocks]; the default zero point is 2^(bits-1).
//   - bias (optional): A's type, [N].
//   - W[n][k] = (q[n][k] - zp[n][k/block_size]) * scale[n][k/block_size].
//
// Attributes K, N, bits (2, 4 or 8; default 4), block_size (a power of 2,
// at least 16), accuracy_level. The product is computed in float32 from A
// exactly as given whatever accuracy_level says: onnxruntime's CPU kernel
// quantizes A to int8 blocks for accuracy_level 4 (what the
// onnxruntime-genai builder sets for CPU int4 models) and computes the
// float product for 0, so results equal onnxruntime's at accuracy_level 0
// within float32 rounding and differ from its accuracy_level 4 results by
// that quantization of A.
//
// When B, scales and zero_points are constant initializers (the normal
// case) the weight is packed once, when the session is built, with its
// integers kept (gemm.PackBQuant: a 4-bit pack takes about a sixth of the
// float32 bytes, scales included), and each product dequantizes it a
// sliver at a time into L1 for the float32 kernels. Otherwise each run
// dequantizes the whole weight into scratch. Not
// implemented: g_idx, weight_prepacked layouts, bits 3, 5, 6 and 7.
func newMatMulNBits(n *Node) (Kernel, error) {
	g, err := nbitsAttributes(n)
	if err != nil {
		return nil, err
	}
	switch {
	case n.NumInputs < nbitsScales+1 || !n.InputPresent[nbitsA] || !n.InputPresent[nbitsB] || !n.InputPresent[nbitsScales]:
		return nil, fmt.Errorf("%w: %s needs inputs A, B and scales", errs.ErrInvalidModel, n.Describe())
	case n.NumInputs > nbitsInputs:
		return nil, fmt.Errorf("%w: %s takes at most %d inputs, got %d", errs.ErrInvalidModel, n.Describe(), nbitsInputs, n.NumInputs)
	case n.NumOutputs != 1:
		return nil, fmt.Errorf("%w: %s has one output, got %d", errs.ErrInvalidModel, n.Describe(), n.NumOutputs)
	case n.NumInputs > nbitsGIdx && n.InputPresent[nbitsGIdx]:
		return nil, fmt.Errorf("%w: %s: the g_idx input (reordered quantization groups)", errs.ErrNotImplemented, n.Describe())
	}
	k := &nbitsKernel{g: g}
	consts := func(i int) *tensor.Tensor {
		if i < len(n.Constants) {
			return n.Constants[i]
		}
		return nil
	}
	b, scales := consts(nbitsB), consts(nbitsScales)
	hasZP := n.NumInputs > nbitsZeroPoints && n.InputPresent[nbitsZeroPoints]
	zp := consts(nbitsZeroPoints)
	if b != nil && scales != nil && (!hasZP || zp != nil) {
		q, err := g.check(b, scales, zp)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n.Describe(), err)
		}
		if !q.empty {
			key := packKey{a: b, b: scales, c: zp, kind: "nbits", ints: [4]int{g.k, g.n, g.bits, g.block}}
			size := gemm.PackQuantBytes(g.k, g.n, g.bits, g.block)
			v, err := n.Packs.get(key, size, func() (any, error) {
				qb, err := g.quantB(q)
				if err != nil {
					return nil, err
				}
				pb, err := gemm.PackBQuant(qb)
				if err != nil {
					return nil, fmt.Errorf("packing the quantized weight: %w", err)
				}
				for _, t := range []*tensor.Tensor{b, scales, zp} {
					if t != nil {
						t.Evict() // a mapped file's pages need not stay resident beside the pack
					}
				}
				return pb, nil
			})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", n.Describe(), err)
			}
			k.pb = v.(*gemm.PackedB)
			// compute reads these constants through the pack only
			for _, i := range []int{nbitsB, nbitsScales, nbitsZeroPoints} {
				if consts(i) != nil {
					n.markPacked(i)
				}
			}
		}
		k.src, k.built = q, true
	}
	return KernelFunc(func(ctx *Context) error {
		if err := k.compute(ctx); err != nil {
			return fmt.Errorf("MatMulNBits: %w", err)
		}
		return nil
	}), nil
}

// nbitsAttributes reads and validates the attributes of n.
func nbitsAttributes(n *Node) (nbitsGeom, error) {
	var g nbitsGeom
	for _, name := range []string{"K", "N", "block_size"} {
		if !n.Attrs.Has(name) {
			return g, fmt.Errorf("%w: %s needs the %s attribute", errs.ErrInvalidModel, n.Describe(), name)
		}
	}
	var err error
	get := func(name string, def int64) int64 {
		v, e := n.Attrs.Int(name, def)
		if e != nil && err == nil {
			err = fmt.Errorf("%w: %s: %w", errs.ErrInvalidModel, n.Describe(), e)
		}
		return v
	}
	k, nn, bits, block := get("K", 0), get("N", 0), get("bits", 4), get("block_size", 0)
	_ = get("accuracy_level", 0) // the product is exact float32 at every level (see newMatMulNBits)
	prepacked := get("weight_prepacked", 0)
	if err != nil {
		return g, err
	}
	const maxDim = 1 << 31
	switch {
	case k < 1 || k >= maxDim || nn < 1 || nn >= maxDim:
		return g, fmt.Errorf("%w: %s: K=%d and N=%d must be in [1, 2^31)", errs.ErrInvalidModel, n.Describe(), k, nn)
	case block < 16 || block >= maxDim || block&(block-1) != 0:
		return g, fmt.Errorf("%w: %s: block_size=%d must be a power of 2 and at least 16", errs.ErrInvalidModel, n.Describe(), block)
	case bits == 3 || bits == 5 || bits == 6 || bits == 7:
		return g, fmt.Errorf("%w: %s: bits=%d (2, 4 and 8 are implemented)", errs.ErrNotImplemented, n.Describe(), bits)
	case bits != 2 && bits != 4 && bits != 8:
		return g, fmt.Errorf("%w: %s: bits=%d must be 2, 4 or 8", errs.ErrInvalidModel, n.Describe(), bits)
	case prepacked != 0:
		return g, fmt.Errorf("%w: %s: weight_prepacked=%d (an execution provider's own weight layout)",
			errs.ErrNotImplemented, n.Describe(), prepacked)
	}
	g.k, g.n, g.bits, g.block = int(k), int(nn), int(bits), int(block)
	g.kBlocks = (g.k + g.block - 1) / g.block
	g.blob = g.block * g.bits / 8
	g.zpPerRow = (g.kBlocks*g.bits + 7) / 8
	g.defaultZP = 1 << (g.bits - 1)
	return g, nil
}

// isNBitsFloat reports whether dt is a type MatMulNBits computes with.
func isNBitsFloat(dt tensor.DType) bool { return dt == tensor.Float32 || isHalf(dt) }

// perBlockShape reports whether s is [rows*cols] or [rows, cols].
func perBlockShape(s tensor.Shape, rows, cols int) bool {
	return (len(s) == 1 && s[0] == rows*cols) || (len(s) == 2 && s[0] == rows && s[1] == cols)
}

// check validates B, scales and zero_points (nil: absent) against g.
func (g *nbitsGeom) check(b, scales, zp *tensor.Tensor) (nbitsQuant, error) {
	q := nbitsQuant{b: b, scales: scales, zp: zp}
	if b.DType() != tensor.Uint8 {
		return q, fmt.Errorf("%w: B must be uint8, got %v", errs.ErrInvalidModel, b.DType())
	}
	bs := b.Shape()
	if len(bs) != 3 {
		return q, fmt.Errorf("%w: B must be [N, k_blocks, blob_size] = [%d, %d, %d], got %v",
			errs.ErrInvalidModel, g.n, g.kBlocks, g.blob, bs)
	}
	want := [3]int{g.n, g.kBlocks, g.blob}
	for i, d := range bs {
		if d != want[i] && d != 0 {
			return q, fmt.Errorf("%w: B must be [N, k_blocks, blob_size] = %v (a dimension may be 0 for an omitted projection), got %v",
				errs.ErrInvalidModel, want, bs)
		}
		if d == 0 {
			q.empty = true
		}
	}
	if !isNBitsFloat(scales.DType()) {
		return q, fmt.Errorf("%w: scales must be float32, float16 or bfloat16, got %v", errs.ErrInvalidModel, scales.DType())
	}
	if q.empty {
		return q, nil // the quantization parameters are not used (and may be empty)
	}
	if !perBlockShape(scales.Shape(), g.n, g.kBlocks) {
		return q, fmt.Errorf("%w: scales must be [N*k_blocks] or [N, k_blocks] (N=%d, k_blocks=%d), got %v",
			errs.ErrInvalidModel, g.n, g.kBlocks, scales.Shape())
	}
	if zp == nil {
		return q, nil
	}
	switch zp.DType() {
	case tensor.Uint8:
		if !perBlockShape(zp.Shape(), g.n, g.zpPerRow) {
			return q, fmt.Errorf("%w: uint8 zero_points must be [N*%d] or [N, %d] (N=%d), got %v",
				errs.ErrInvalidModel, g.zpPerRow, g.zpPerRow, g.n, zp.Shape())
		}
	case scales.DType():
		if !perBlockShape(zp.Shape(), g.n, g.kBlocks) {
			return q, fmt.Errorf("%w: zero_points must be [N*k_blocks] or [N, k_blocks] (N=%d, k_blocks=%d), got %v",
				errs.ErrInvalidModel, g.n, g.kBlocks, zp.Shape())
		}
	default:
		return q, fmt.Errorf("%w: zero_points must be uint8 or the scales' type %v, got %v",
			errs.ErrInvalidModel, scales.DType(), zp.DType())
	}
	return q, nil
}

// quantB describes the validated, non-empty q for the gemm package: B's
// bytes as they are, the scales in float32 and one zero per block (the
// packed uint8 zero points unpacked, float ones widened, or the default).
func (g *nbitsGeom) quantB(q nbitsQuant) (gemm.QuantB, error) {
	qb := gemm.QuantB{Bits: g.bits, Block: g.block, K: g.k, N: g.n, Q: q.b.Uint8()}
	var err error
	if qb.Scales, err = tensor.AsFloat32(q.scales); err != nil {
		return qb, err
	}
	switch {
	case q.zp == nil:
		qb.Zeros = make([]float32, g.n*g.kBlocks)
		for i := range qb.Zeros {
			qb.Zeros[i] = float32(g.defaultZP)
		}
	case q.zp.DType() == tensor.Uint8:
		zp, mask := q.zp.Uint8(), uint8(1)<<g.bits-1
		qb.Zeros = make([]float32, g.n*g.kBlocks)
		for r := range g.n {
			for blk := range g.kBlocks {
				pos := blk * g.bits // bit offset within the row's zero-point bytes
				qb.Zeros[r*g.kBlocks+blk] = float32(zp[r*g.zpPerRow+pos/8] >> uint(pos%8) & mask)
			}
		}
	default:
		if qb.Zeros, err = tensor.AsFloat32(q.zp); err != nil {
			return qb, err
		}
	}
	return qb, nil
}

// dequantize writes W (N x K, row-major float32) of the validated,
// non-empty q into w (nil: a fresh slice) and returns it: W[j][l] =
// (float32(v) - zero) * scale, the values gemm.PackBQuant's packs give.
func (g *nbitsGeom) dequantize(w []float32, q nbitsQuant) ([]float32, error) {
	if w == nil {
		if _, err := tensor.ByteSize(tensor.Float32, tensor.Shape{g.n, g.k}); err != nil {
			return nil, err
		}
		w = make([]float32, g.n*g.k)
	}
	qb, err := g.quantB(q)
	if err != nil {
		return nil, err
	}
	if err := qb.Dequantize(w); err != nil {
		return nil, err
	}
	return w, nil
}

// compute runs one call.
func (k *nbitsKernel) compute(ctx *Context) error {
	g := &k.g
	a, err := ctx.RequireInput(nbitsA)
	if err != nil {
		return err
	}
	b, err := ctx.RequireInput(nbitsB)
	if err != nil {
		return err
	}
	scales, err := ctx.RequireInput(nbitsScales)
	if err != nil {
		return err
	}
	zp, bias := ctx.Input(nbitsZeroPoints), ctx.Input(nbitsBias)
	if ctx.Input(nbitsGIdx) != nil {
		return fmt.Errorf("%w: the g_idx input", errs.ErrNotImplemented)
	}
	var pb *gemm.PackedB
	var q nbitsQuant
	if k.built && k.src.same(b, scales, zp) {
		pb, q = k.pb, k.src
	} else if q, err = g.check(b, scales, zp); err != nil {
		return err
	}
	dt := a.DType()
	switch {
	case !isNBitsFloat(dt):
		return fmt.Errorf("%w: A must be float32, float16 or bfloat16, got %v", errs.ErrInvalidModel, dt)
	case scales.DType() != dt:
		return fmt.Errorf("%w: scales (%v) must have A's type %v", errs.ErrInvalidModel, scales.DType(), dt)
	case bias != nil && bias.DType() != dt:
		return fmt.Errorf("%w: bias (%v) must have A's type %v", errs.ErrInvalidModel, bias.DType(), dt)
	case bias != nil && (bias.Rank() != 1 || bias.Shape()[0] != g.n):
		return fmt.Errorf("%w: bias must be [N] = [%d], got %v", errs.ErrShape, g.n, bias.Shape())
	case a.Rank() == 0 || a.Shape()[a.Rank()-1] != g.k:
		return fmt.Errorf("%w: A must be [..., K] with K=%d, got %v", errs.ErrShape, g.k, a.Shape())
	}
	shape := append(ctx.ScratchShape(a.Rank())[:0], a.Shape()...)
	shape[len(shape)-1] = g.n
	out, err := ctx.NewOutputUninit(0, dt, shape)
	if err != nil {
		return err
	}
	m := a.Len() / g.k
	dst := f32Result(ctx, out)
	beta := float32(0)
	if bias != nil {
		bv, err := ctx.AsFloat32(bias)
		if err != nil {
			return err
		}
		for r := range m {
			copy(dst[r*g.n:(r+1)*g.n], bv)
		}
		beta = 1
	} else if q.empty || m == 0 {
		clear(dst)
	}
	if q.empty || m == 0 {
		return storeF32Result(out, dst)
	}
	af, err := ctx.AsFloat32(a)
	if err != nil {
		return err
	}
	threads := ctx.Threads()
	switch {
	case pb != nil:
		err = gemm.SgemmPacked(threads, false, m, 1, af, g.k, pb, beta, dst, g.n)
	default:
		var w []float32
		if w, err = g.dequantize(ctx.Float32s(g.n*g.k), q); err == nil {
			err = gemm.SgemmThreads(threads, false, true, m, g.n, g.k, 1, af, g.k, w, g.k, beta, dst, g.n)
		}
	}
	if err != nil {
		return err
	}
	return storeF32Result(out, dst)
}

// same reports whether b, scales and zp are the tensors q was built from
// (the same type, shape and storage), so the pack made from them applies.
func (q *nbitsQuant) same(b, scales, zp *tensor.Tensor) bool {
	return sameTensor(q.b, b) && sameTensor(q.scales, scales) && sameTensor(q.zp, zp)
}
