package ops

import (
	"errors"
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	// Attention 23 and 24 differ by the nonpad_kv_seqlen input (index 6);
	// the kernel reads it only when the model's opset has it. 25 adds
	// sliding windows (left/right_window_size) and onnxruntime's opset-25
	// kernel scores excluded positions -Inf.
	Register("", "Attention", 23, 24, newAttention)
	Register("", "Attention", 25, 0, newAttention)
}

// Attention inputs and outputs by position.
const (
	attnQ, attnK, attnV, attnMask, attnPastK, attnPastV, attnNonpad = 0, 1, 2, 3, 4, 5, 6
	attnY, attnPresentK, attnPresentV, attnQK                       = 0, 1, 2, 3
)

// newAttention: the standard ONNX Attention op on the tensor path. The math
// (and the exact semantics, including onnxruntime's conventions) lives in
// golib/cpu/mha; this kernel maps tensors and attributes onto it. float16,
// bfloat16 and float64 are computed in float32.
func newAttention(n *Node) (Kernel, error) {
	var a mha.Attrs
	ints := []struct {
		name string
		dst  *int
	}{
		{"q_num_heads", &a.QNumHeads}, {"kv_num_heads", &a.KVNumHeads},
		{"qk_matmul_output_mode", &a.QKMode}, {"softmax_precision", &a.SoftmaxPrecision},
	}
	for _, it := range ints {
		v, err := n.Attrs.Int(it.name, 0)
		if err != nil {
			return nil, err
		}
		*it.dst = int(v)
	}
	causal, err := n.Attrs.Int("is_causal", 0)
	if err != nil {
		return nil, err
	}
	if causal != 0 && causal != 1 {
		return nil, fmt.Errorf("%w: %s: is_causal must be 0 or 1, got %d", errs.ErrInvalidArgument, n.Describe(), causal)
	}
	a.IsCausal = causal == 1
	if a.Softcap, err = n.Attrs.Float("softcap", 0); err != nil {
		return nil, err
	}
	if n.Attrs.Has("scale") {
		if a.Scale, err = n.Attrs.Float("scale", 0); err != nil {
			return nil, err
		}
		a.HasScale = true
	}
	if n.Opset >= 25 {
		left, err := n.Attrs.Int("left_window_size", -1)
		if err != nil {
			return nil, err
		}
		right, err := n.Attrs.Int("right_window_size", -1)
		if err != nil {
			return nil, err
		}
		if left < -1 || right < -1 {
			return nil, fmt.Errorf("%w: %s: window sizes must be -1 or >= 0, got %d and %d", errs.ErrInvalidArgument, n.Describe(), left, right)
		}
		a.SlidingWindow, a.LeftWindow, a.RightWindow = true, int(left), int(right)
		a.InfMasking = true
	}
	if a.QKMode < 0 || a.QKMode > 3 {
		return nil, fmt.Errorf("%w: %s: qk_matmul_output_mode %d not in 0..3", errs.ErrInvalidArgument, n.Describe(), a.QKMode)
	}
	withNonpad := n.Opset >= 24
	return KernelFunc(func(ctx *Context) error {
		err := attentionCompute(ctx, a, withNonpad)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, mha.ErrShape):
			return fmt.Errorf("Attention: %w: %w", errs.ErrShape, err)
		case errors.Is(err, mha.ErrValue):
			return fmt.Errorf("Attention: %w: %w", errs.ErrInvalidArgument, err)
		}
		return fmt.Errorf("Attention: %w", err)
	}), nil
}

func attentionCompute(ctx *Context, a mha.Attrs, withNonpad bool) error {
	q, err := ctx.RequireInput(attnQ)
	if err != nil {
		return err
	}
	k, err := ctx.RequireInput(attnK)
	if err != nil {
		return err
	}
	v, err := ctx.RequireInput(attnV)
	if err != nil {
		return err
	}
	mask, pk, pv := ctx.Input(attnMask), ctx.Input(attnPastK), ctx.Input(attnPastV)
	var nonpad *tensor.Tensor
	if withNonpad {
		nonpad = ctx.Input(attnNonpad)
	}
	for _, t := range []*tensor.Tensor{q, k, v} {
		if !t.DType().IsFloat() {
			return fmt.Errorf("%w: Q, K and V must be floating point, got %v", errs.ErrType, t.DType())
		}
	}
	if k.DType() != q.DType() || (pk != nil && pk.DType() != q.DType()) || (pv != nil && pv.DType() != v.DType()) {
		return fmt.Errorf("%w: K and past_key must have Q's type, past_value V's", errs.ErrType)
	}
	s := mha.Shapes{Q: q.Shape(), K: k.Shape(), V: v.Shape()}
	if mask != nil {
		s.Mask = mask.Shape()
	}
	if pk != nil {
		s.PastKey = pk.Shape()
	}
	if pv != nil {
		s.PastValue = pv.Shape()
	}
	if nonpad != nil {
		if nonpad.DType() != tensor.Int64 {
			return fmt.Errorf("%w: nonpad_kv_seqlen must be int64, got %v", errs.ErrType, nonpad.DType())
		}
		s.NonpadKVSeqlen = nonpad.Shape()
	}
	ar := f32Arenas.Get().(*f32Arena)
	ar.threads, ar.err = ctx.Threads(), nil
	defer f32Arenas.Put(ar)
	defer ar.release()
	g := &ar.geom
	if err := mha.PlanInto(g, a, s); err != nil {
		return err
	}
	g.Threads = attentionThreads(ctx.Threads(), g.Batch*g.QHeads*g.QLen, g.TotalLen, g.HeadDimK+g.HeadDimV)

	var in mha.Inputs
	in.Q, in.K, in.V = ar.f32(q), ar.f32(k), ar.f32(v)
	if pk != nil {
		in.PastKey, in.PastValue = ar.f32(pk), ar.f32(pv)
	}
	if mask != nil {
		if mask.DType() == tensor.Bool {
			in.Mask.Bool = mask.Bool()
		} else {
			in.Mask.Float = ar.f32(mask) // additive
		}
	}
	if ar.err != nil {
		return ar.err
	}
	if nonpad != nil {
		in.NonpadKVSeqlen = nonpad.Int64()
	}
	return attentionOutputs(ctx, ar, g, in, [4]*tensor.Tensor{k, v, pk, pv})
}

// attentionOutputs allocates the wanted outputs and runs the kernel. Y and
// qk_matmul_output of other types than float32 are converted back from
// float32; present_key/present_value of those types are assembled from the
// input bytes (past then new tokens), which is exact and skips a conversion
// of the whole cache.
func attentionOutputs(ctx *Context, ar *f32Arena, g *mha.Geometry, in mha.Inputs, kv [4]*tensor.Tensor) error {
	k, v, pk, pv := kv[0], kv[1], kv[2], kv[3]
	type slot struct {
		idx   int
		dt    tensor.DType
		shape []int
	}
	slots := [...]slot{
		{attnY, k.DType(), g.YShape},
		{attnPresentK, k.DType(), g.PresentKeyShape},
		{attnPresentV, v.DType(), g.PresentValueShape},
		{attnQK, k.DType(), g.QKShape},
	}
	// The kernel's buffers, by slot (apart from slots: a shape handed to
	// NewOutput is kept, and pointers to out next to it would move out to
	// the heap, one allocation per call).
	var out mha.Outputs
	dsts := [len(slots)]*[]float32{&out.Y, &out.PresentKey, &out.PresentValue, &out.QK}
	var tensors [len(slots)]*tensor.Tensor
	for i, sl := range slots {
		present := sl.idx == attnPresentK || sl.idx == attnPresentV
		if sl.idx != attnY && !ctx.OutputWanted(sl.idx) {
			if present && sl.dt != tensor.Float32 {
				*dsts[i] = ar.buffer(prodInts(sl.shape)) // spares the kernel an allocation
			}
			continue
		}
		// The kernel writes every position of the present outputs (past
		// rows, then the new ones): zeroing them first would be a second
		// pass over the largest tensors of a decode step.
		var t *tensor.Tensor
		var err error
		if present {
			t, err = ctx.NewOutputUninit(sl.idx, sl.dt, tensor.Shape(sl.shape))
		} else {
			t, err = ctx.NewOutput(sl.idx, sl.dt, tensor.Shape(sl.shape))
		}
		if err != nil {
			return err
		}
		tensors[i] = t
		if f := t.Float32(); f != nil {
			*dsts[i] = f
		} else {
			*dsts[i] = ar.buffer(t.Len())
		}
	}
	if err := g.Run(in, out); err != nil {
		return err
	}
	for i, sl := range slots {
		t := tensors[i]
		if t == nil || t.DType() == tensor.Float32 {
			continue
		}
		var err error
		switch sl.idx {
		case attnPresentK:
			err = concatPresent(g, t, pk, k, g.HeadDimK)
		case attnPresentV:
			err = concatPresent(g, t, pv, v, g.HeadDimV)
		default:
			if sl.idx == attnQK {
				lowestIn(t.DType(), *dsts[i])
			}
			err = tensor.FromFloat32(t, *dsts[i])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// lowestIn replaces -MaxFloat32, the score of excluded positions, by the
// lowest finite value of dt (float16's -65504, as onnxruntime writes it)
// before the QK output is narrowed to dt: narrowed as it is, it would
// overflow to -inf.
func lowestIn(dt tensor.DType, qk []float32) {
	if dt != tensor.Float16 {
		return // bfloat16 and float64 hold -MaxFloat32's magnitude
	}
	for i, v := range qk {
		if v == -math.MaxFloat32 {
			qk[i] = -65504
		}
	}
}
