package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	// Gemm 7-10 require C; 11+ make it optional; 13 adds bfloat16. One
	// kernel serves them all (an absent C is simply zero).
	Register("", "Gemm", 7, 0, newGemm)
}

// gemmTypes are the element types Gemm computes.
var gemmTypes = typeSet{tensor.Float32, tensor.Float16, tensor.BFloat16}

// newGemm: Y = alpha * op(A) * op(B) + beta * C with C broadcast
// (unidirectionally) to [M, N]. float32/float16/bfloat16, computed in
// float32 (a 16-bit B is read in place, see gemmOperand).
func newGemm(n *Node) (Kernel, error) {
	if err := n.checkTypes(gemmTypes, 0, 1, 2); err != nil {
		return nil, err
	}
	ta, err := n.Attrs.Int("transA", 0)
	if err != nil {
		return nil, err
	}
	tb, err := n.Attrs.Int("transB", 0)
	if err != nil {
		return nil, err
	}
	alpha, err := n.Attrs.Float("alpha", 1)
	if err != nil {
		return nil, err
	}
	beta, err := n.Attrs.Float("beta", 1)
	if err != nil {
		return nil, err
	}
	transA, transB := ta != 0, tb != 0
	pack, err := newConstPack(n, 1, transB)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		a, b, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		c := ctx.Input(2)
		dt := a.DType()
		if !gemmTypes.has(dt) {
			return fmt.Errorf("%w: Gemm supports %v, got %v", errs.ErrType, gemmTypes, dt)
		}
		if b.DType() != dt || (c != nil && c.DType() != dt) {
			return fmt.Errorf("%w: Gemm inputs must share one type", errs.ErrType)
		}
		if a.Rank() != 2 || b.Rank() != 2 {
			return fmt.Errorf("%w: Gemm needs 2D A and B, got %v and %v", errs.ErrShape, a.Shape(), b.Shape())
		}
		m, k := a.Shape()[0], a.Shape()[1]
		if transA {
			m, k = k, m
		}
		kb, nn := b.Shape()[0], b.Shape()[1]
		if transB {
			kb, nn = nn, kb
		}
		if k != kb {
			return fmt.Errorf("%w: Gemm inner dimensions differ: A %v (transA=%v), B %v (transB=%v)",
				errs.ErrShape, a.Shape(), transA, b.Shape(), transB)
		}
		mn := ctx.ScratchShape(2) // a literal shape would escape to the heap
		mn[0], mn[1] = m, nn
		out, err := ctx.NewOutput(0, dt, mn)
		if err != nil {
			return err
		}
		af, err := ctx.AsFloat32(a)
		if err != nil {
			return err
		}
		y := f32Result(ctx, out)
		bt := float32(0)
		if c != nil && beta != 0 {
			if err := gemmBroadcastC(ctx, c, mn, y); err != nil {
				return fmt.Errorf("Gemm C: %w", err)
			}
			bt = beta
		}
		prod, pa, pbeta := y, alpha, bt
		if alpha == 0 {
			// BLAS skips A*B when alpha is 0; ONNX's formula does not: a
			// NaN or an infinity in A or B makes 0 * (A*B) NaN. The
			// product goes to scratch and only that reaches y.
			prod, pa, pbeta = ctx.Float32s(len(y)), 1, 0
		}
		if pb := pack.get(b); pb != nil {
			err = gemm.SgemmPacked(ctx.Threads(), transA, m, pa, af, max(a.Shape()[1], 1), pb, pbeta, prod, max(nn, 1))
		} else if bm, berr := gemmB(b); berr != nil {
			err = berr
		} else {
			err = bm.mul(ctx.Threads(), transA, transB, m, nn, k, pa,
				af, max(a.Shape()[1], 1), 0, max(b.Shape()[1], 1), pbeta, prod, max(nn, 1))
		}
		if err != nil {
			return fmt.Errorf("Gemm: %w", err)
		}
		if alpha == 0 { // y holds C (broadcast) or zeros
			for i, v := range prod {
				y[i] = bt*y[i] + 0*v
			}
		}
		return storeF32Result(out, y)
	}), nil
}

// gemmBroadcastC writes t, broadcast to shape (2D), into dst as float32.
func gemmBroadcastC(ctx *Context, t *tensor.Tensor, shape tensor.Shape, dst []float32) error {
	src, err := ctx.AsFloat32(t)
	if err != nil {
		return err
	}
	st, err := tensor.BroadcastStrides(t.Shape(), shape)
	if err != nil {
		return err
	}
	rows, cols := shape[0], shape[1]
	for i := range rows {
		for j := range cols {
			dst[i*cols+j] = src[i*st[0]+j*st[1]]
		}
	}
	return nil
}
