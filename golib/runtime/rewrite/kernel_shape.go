package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// newCacheShape is Shape (or Size) of a removed past or of a present: it
// reads the state's logical shape [batch, kv_heads, past_length (+ the new
// keys' length, input 0, for a present), head_dim] instead of a tensor, so
// position ids and mask sizes the graph derives from them come out as on
// the tensor path.
func newCacheShape(n *ops.Node) (ops.Kernel, error) {
	layer, err := n.Attrs.Int("layer", 0)
	if err != nil {
		return nil, err
	}
	value, err := n.Attrs.Int("value", 0)
	if err != nil {
		return nil, err
	}
	size, err := n.Attrs.Int("size", 0)
	if err != nil {
		return nil, err
	}
	start, err := n.Attrs.Int("start", 0)
	if err != nil {
		return nil, err
	}
	end, err := n.Attrs.Int("end", 4)
	if err != nil {
		return nil, err
	}
	expanded, err := n.Attrs.Int("expanded", 0)
	if err != nil {
		return nil, err
	}
	return ops.KernelFunc(func(ctx *ops.Context) error {
		b, err := bindingOf(ctx)
		if err != nil {
			return err
		}
		kv, err := b.Cache(int(layer), 0, [3]int{})
		if err != nil {
			return err
		}
		cfg := kv.Config()
		d := cfg.HeadDimK
		if value != 0 {
			d = cfg.HeadDimV
		}
		L := b.PastLength()
		if kn := ctx.Input(0); kn != nil {
			// a present: the past plus the step's new keys
			switch kn.Rank() {
			case 4:
				L += kn.Shape()[2]
			case 3:
				L += kn.Shape()[1]
			default:
				return fmt.Errorf("%w: CacheShape: new keys of rank %d", errs.ErrShape, kn.Rank())
			}
		}
		dims := []int64{int64(b.Batch()), int64(cfg.KVHeads), int64(L), int64(d)}
		if expanded != 0 {
			// K/V expanded to the query heads (repeat_kv): input 1 is Q
			q := ctx.Input(1)
			if q == nil || q.Rank() != 4 {
				return fmt.Errorf("%w: CacheShape: the shape of expanded K/V needs a 4-D Q", errs.ErrShape)
			}
			dims[1] = int64(q.Shape()[1])
		}
		if size != 0 {
			out, err := ctx.NewOutputUninit(0, tensor.Int64, tensor.Shape{})
			if err != nil {
				return err
			}
			out.Int64()[0] = dims[0] * dims[1] * dims[2] * dims[3]
			return nil
		}
		lo, hi := clampAxis(start), clampAxis(end)
		if hi < lo {
			hi = lo
		}
		out, err := ctx.NewOutputUninit(0, tensor.Int64, tensor.Shape{hi - lo})
		if err != nil {
			return err
		}
		copy(out.Int64(), dims[lo:hi])
		return nil
	}), nil
}

// clampAxis maps a Shape start/end (negative from the back) into 0..4.
func clampAxis(a int64) int {
	if a < 0 {
		a += 4
	}
	return int(min(max(a, 0), 4))
}
