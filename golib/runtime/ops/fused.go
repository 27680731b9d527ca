package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// FusedDomain is the domain of the ops that the session-creation fusions
// (golib/runtime/fuse*.go) put in place of chains of standard nodes. Each
// computes exactly what its chain computes, with the same float32 steps in
// the same order (so the results are bit-identical), in one kernel call and
// without the chain's intermediate tensors. Models do not import this
// domain; the plan builder resolves it at opset 1.
const FusedDomain = "ai.onnx_light_kv.fused"

func init() {
	Register(FusedDomain, "SiLU", 1, 0, newSiLU)
	Register(FusedDomain, "MatMulBias", 1, 0, newMatMulBias)
}

// newSiLU: Y = X * Sigmoid(X), times Gate when the optional second input is
// present (the SwiGLU of Llama-family MLPs: silu(gate_proj(h)) *
// up_proj(h)); float32, Gate of X's shape. The chain it replaces is
// Sigmoid, Mul and Mul; this kernel runs the same vector sigmoid and the
// same products.
func newSiLU(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		gate := ctx.Input(1)
		if x.DType() != tensor.Float32 || (gate != nil && gate.DType() != tensor.Float32) {
			return fmt.Errorf("%w: SiLU takes float32 inputs", errs.ErrType)
		}
		if gate != nil && !gate.Shape().Equal(x.Shape()) {
			return fmt.Errorf("%w: SiLU gate of shape %v for an input of shape %v", errs.ErrShape, gate.Shape(), x.Shape())
		}
		out, err := ctx.NewOutputUninit(0, tensor.Float32, x.Shape())
		if err != nil {
			return err
		}
		src, dst := x.Float32(), out.Float32()
		sigmoidSlice(dst, src)
		if gate == nil {
			for i, v := range src {
				dst[i] = v * dst[i]
			}
			return nil
		}
		g := gate.Float32()
		for i, v := range src {
			dst[i] = v * dst[i] * g[i]
		}
		return nil
	}), nil
}

// newMatMulBias: Y = MatMul(A, B) + Bias, with B a float32 2D constant
// (packed when the session is built, as MatMul's) and Bias a float32
// vector of B's column count added to every row: the chain MatMul, Add of
// a projection with a bias (Qwen2's q/k/v). The product is MatMul's; the
// bias is added to it in place, the rounding Add does.
func newMatMulBias(n *Node) (Kernel, error) {
	pack, err := newConstPack(n, 1, false)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		bias, err := ctx.RequireInput(2)
		if err != nil {
			return err
		}
		b, err := ctx.RequireInput(1)
		if err != nil {
			return err
		}
		if bias.DType() != tensor.Float32 || bias.Rank() != 1 || b.Rank() != 2 || b.Shape()[1] != bias.Len() {
			return fmt.Errorf("%w: MatMulBias needs a 2D B and a float32 bias of its columns, got B %v and bias %v %v",
				errs.ErrShape, b.Shape(), bias.DType(), bias.Shape())
		}
		out, err := matmulCompute(ctx, pack)
		if err != nil {
			return err
		}
		if out.DType() != tensor.Float32 {
			return fmt.Errorf("%w: MatMulBias computes in float32, got %v", errs.ErrType, out.DType())
		}
		y, c := out.Float32(), bias.Float32()
		if len(c) == 0 {
			return nil
		}
		for r := 0; r+len(c) <= len(y); r += len(c) {
			row := y[r : r+len(c)]
			for j, v := range c {
				row[j] += v
			}
		}
		return nil
	}), nil
}
