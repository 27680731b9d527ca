package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "LayerNormalization", 17, 0, newNorm(false, true))
	Register("", "RMSNormalization", 23, 0, newNorm(true, false))
	// onnxruntime registers its contrib SimplifiedLayerNormalization (RMS
	// norm with an optional inv_std_var output) in the default domain.
	Register("", "SimplifiedLayerNormalization", 1, 0, newNorm(true, false))
	Register("com.microsoft", "SimplifiedLayerNormalization", 1, 0, newNorm(true, false))
}

// newNorm builds LayerNormalization (rms=false: subtract the mean, optional
// bias input 2, outputs Y, Mean, InvStdDev) and the RMS variants (rms=true:
// no mean, outputs Y and, for SimplifiedLayerNormalization, InvStdDev as
// output 1). Statistics are accumulated in float64 and applied in float32.
func newNorm(rms, hasBias bool) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", -1)
		if err != nil {
			return nil, err
		}
		eps, err := n.Attrs.Float("epsilon", 1e-5)
		if err != nil {
			return nil, err
		}
		stash, err := n.Attrs.Int("stash_type", 1)
		if err != nil {
			return nil, err
		}
		if stash != 1 {
			return nil, fmt.Errorf("%w: %s stash_type=%d", errs.ErrNotImplemented, n.OpType, stash)
		}
		return KernelFunc(func(ctx *Context) error { return normCompute(ctx, int(axis), eps, rms, hasBias) }), nil
	}
}

func normCompute(ctx *Context, axis int, eps float32, rms, hasBias bool) error {
	x, scale, err := twoInputs(ctx)
	if err != nil {
		return err
	}
	var bias *tensor.Tensor
	if hasBias {
		bias = ctx.Input(2)
	}
	sh := x.Shape()
	ax, err := tensor.NormAxis(axis, len(sh))
	if err != nil {
		return err
	}
	normShape := sh[ax:]
	rows, cols := tensor.Shape(sh[:ax]).Size(), normShape.Size()
	sIdx, err := paramIndex(scale, normShape)
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	sv, err := tensor.AsFloat32(scale)
	if err != nil {
		return err
	}
	var bIdx []int
	var bv []float32
	if bias != nil {
		if bIdx, err = paramIndex(bias, normShape); err != nil {
			return fmt.Errorf("bias: %w", err)
		}
		if bv, err = tensor.AsFloat32(bias); err != nil {
			return err
		}
	}
	y, err := ctx.NewOutputUninit(0, x.DType(), sh)
	if err != nil {
		return err
	}
	statShape := append(tensor.Shape{}, sh[:ax]...)
	for range normShape {
		statShape = append(statShape, 1)
	}
	var meanOut, invOut []float32
	invSlot := 2
	if rms {
		invSlot = 1
	}
	if !rms && ctx.OutputWanted(1) {
		t, err := ctx.NewOutput(1, tensor.Float32, statShape)
		if err != nil {
			return err
		}
		meanOut = t.Float32()
	}
	if ctx.OutputWanted(invSlot) {
		t, err := ctx.NewOutput(invSlot, tensor.Float32, statShape)
		if err != nil {
			return err
		}
		invOut = t.Float32()
	}
	src, err := tensor.AsFloat32(x)
	if err != nil {
		return err
	}
	dst := f32Result(y)
	err = ctx.ParallelFor(rows, 16, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row, out := src[r*cols:(r+1)*cols], dst[r*cols:(r+1)*cols]
			var mean, sq float64
			if !rms {
				for _, v := range row {
					mean += float64(v)
				}
				mean /= float64(cols)
			}
			for _, v := range row {
				d := float64(v) - mean
				sq += d * d
			}
			inv := 1 / math.Sqrt(sq/float64(cols)+float64(eps))
			m32, inv32 := float32(mean), float32(inv)
			switch {
			case sIdx == nil && bv == nil: // the common case: plain scale
				sc := sv[:len(row)]
				for i, v := range row {
					out[i] = (v - m32) * inv32 * sc[i]
				}
			case sIdx == nil && bIdx == nil:
				sc, bb := sv[:len(row)], bv[:len(row)]
				for i, v := range row {
					out[i] = (v-m32)*inv32*sc[i] + bb[i]
				}
			default:
				for i, v := range row {
					o := (v - m32) * inv32 * sv[at(sIdx, i)]
					if bv != nil {
						o += bv[at(bIdx, i)]
					}
					out[i] = o
				}
			}
			if meanOut != nil {
				meanOut[r] = m32
			}
			if invOut != nil {
				invOut[r] = inv32
			}
		}
	})
	if err != nil {
		return err
	}
	return storeF32Result(y, dst)
}

// at is idx[i], or i for the identity mapping (nil idx).
func at(idx []int, i int) int {
	if idx == nil {
		return i
	}
	return idx[i]
}

// paramIndex maps each element of the normalized shape to the element of a
// scale or bias tensor broadcast to it (leading 1 dims of p are ignored).
// It returns nil for the identity mapping (p has the normalized shape).
func paramIndex(p *tensor.Tensor, normShape tensor.Shape) ([]int, error) {
	ps := p.Shape()
	for len(ps) > len(normShape) && ps[0] == 1 {
		ps = ps[1:]
	}
	for len(ps) > 0 && len(ps) < len(normShape) && ps[0] == 1 {
		ps = ps[1:] // a leading 1 broadcasts like a missing dimension
	}
	if ps.Equal(normShape[len(normShape)-len(ps):]) && ps.Size() == normShape.Size() {
		return nil, nil
	}
	idx := make([]int, normShape.Size())
	if err := tensor.BroadcastIndex(ps, normShape, idx); err != nil {
		return nil, err
	}
	return idx, nil
}
