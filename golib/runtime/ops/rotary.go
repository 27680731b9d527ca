package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "RotaryEmbedding", 23, 0, newRotary(false))
	Register("com.microsoft", "RotaryEmbedding", 1, 0, newRotary(true))
}

// rotaryAttrs are RotaryEmbedding's attributes.
type rotaryAttrs struct {
	interleaved bool
	rotaryDim   int
	numHeads    int
}

// newRotary builds RotaryEmbedding. The ONNX op (opset 23) takes (X,
// cos_cache, sin_cache, position_ids?); the com.microsoft contrib op takes
// (X, position_ids, cos_cache, sin_cache), where position_ids may also be a
// single offset (positions offset+0..S-1). X is [B, H, S, D] or [B, S, H*D].
func newRotary(contrib bool) Factory {
	return func(n *Node) (Kernel, error) {
		il, err := n.Attrs.Int("interleaved", 0)
		if err != nil {
			return nil, err
		}
		rd, err := n.Attrs.Int("rotary_embedding_dim", 0)
		if err != nil {
			return nil, err
		}
		nh, err := n.Attrs.Int("num_heads", 0)
		if err != nil {
			return nil, err
		}
		if contrib {
			if sc, err := n.Attrs.Float("scale", 1); err != nil || sc != 1 {
				return nil, fmt.Errorf("%w: com.microsoft RotaryEmbedding scale != 1", errs.ErrNotImplemented)
			}
			if pb, _ := n.Attrs.Int("is_packed_batching", 0); pb != 0 {
				return nil, fmt.Errorf("%w: com.microsoft RotaryEmbedding is_packed_batching", errs.ErrNotImplemented)
			}
		}
		a := rotaryAttrs{interleaved: il != 0, rotaryDim: int(rd), numHeads: int(nh)}
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			var cosT, sinT, pos *tensor.Tensor
			if contrib {
				pos, cosT, sinT = ctx.Input(1), ctx.Input(2), ctx.Input(3)
				if pos == nil {
					return fmt.Errorf("%w: position_ids", errs.ErrMissingInput)
				}
			} else {
				cosT, sinT, pos = ctx.Input(1), ctx.Input(2), ctx.Input(3)
			}
			if cosT == nil || sinT == nil {
				return fmt.Errorf("%w: cos_cache and sin_cache are required", errs.ErrMissingInput)
			}
			return rotaryCompute(ctx, x, cosT, sinT, pos, a, contrib)
		}), nil
	}
}

func rotaryCompute(ctx *Context, x, cosT, sinT, pos *tensor.Tensor, a rotaryAttrs, contrib bool) error {
	sh := x.Shape()
	var B, S, H, D int
	fourD := len(sh) == 4
	switch len(sh) {
	case 4:
		B, H, S, D = sh[0], sh[1], sh[2], sh[3]
	case 3:
		B, S = sh[0], sh[1]
		H = a.numHeads
		if H <= 0 && contrib && cosT.Rank() == 2 {
			H = sh[2] / (2 * cosT.Shape()[1]) // contrib default: full rotation
		}
		if H <= 0 || sh[2]%H != 0 {
			return fmt.Errorf("%w: RotaryEmbedding on 3D input needs num_heads dividing %d", errs.ErrInvalidArgument, sh[2])
		}
		D = sh[2] / H
	default:
		return fmt.Errorf("%w: RotaryEmbedding input must be 3D or 4D, got %v", errs.ErrShape, sh)
	}
	rd := a.rotaryDim
	if rd == 0 {
		rd = D
	}
	if rd > D || rd%2 != 0 {
		return fmt.Errorf("%w: rotary_embedding_dim %d for head size %d", errs.ErrInvalidArgument, rd, D)
	}
	half := rd / 2
	cs := cosT.Shape()
	if !cs.Equal(sinT.Shape()) || len(cs) < 2 || cs[len(cs)-1] != half {
		return fmt.Errorf("%w: cos/sin caches %v and %v, want last dimension %d", errs.ErrShape, cs, sinT.Shape(), half)
	}
	// rowOf(b, s) returns the cache row used by token s of sequence b.
	var rowOf func(b, s int) (int, error)
	switch {
	case pos == nil:
		if len(cs) != 3 || cs[0] != B || cs[1] != S {
			return fmt.Errorf("%w: without position_ids the caches must be [%d, %d, %d], got %v", errs.ErrShape, B, S, half, cs)
		}
		rowOf = func(b, s int) (int, error) { return b*S + s, nil }
	default:
		if len(cs) != 2 {
			return fmt.Errorf("%w: with position_ids the caches must be 2D, got %v", errs.ErrShape, cs)
		}
		p, err := tensor.Int64Values(pos)
		if err != nil {
			return err
		}
		maxPos := cs[0]
		single := contrib && pos.Len() == 1
		if !single && (pos.Rank() != 2 || pos.Shape()[0] != B || pos.Shape()[1] != S) {
			return fmt.Errorf("%w: position_ids %v, want [%d, %d]", errs.ErrShape, pos.Shape(), B, S)
		}
		rowOf = func(b, s int) (int, error) {
			var v int64
			if single {
				v = p[0] + int64(s)
			} else {
				v = p[b*S+s]
			}
			if v < 0 || v >= int64(maxPos) {
				return 0, fmt.Errorf("%w: position %d outside the cos/sin cache of %d rows", errs.ErrInvalidArgument, v, maxPos)
			}
			return int(v), nil
		}
	}
	cv, err := ctx.AsFloat32(cosT)
	if err != nil {
		return err
	}
	sv, err := ctx.AsFloat32(sinT)
	if err != nil {
		return err
	}
	src, err := ctx.AsFloat32(x)
	if err != nil {
		return err
	}
	out, err := ctx.NewOutputUninit(0, x.DType(), sh)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	copy(dst, src) // the part past rotary_embedding_dim passes through
	for b := 0; b < B; b++ {
		for s := 0; s < S; s++ {
			r, err := rowOf(b, s)
			if err != nil {
				return err
			}
			c, sn := cv[r*half:(r+1)*half], sv[r*half:(r+1)*half]
			for h := 0; h < H; h++ {
				var off int
				if fourD {
					off = ((b*H+h)*S + s) * D
				} else {
					off = (b*S+s)*H*D + h*D
				}
				rotateHead(dst[off:off+rd], src[off:off+rd], c, sn, a.interleaved)
			}
		}
	}
	return storeF32Result(out, dst)
}

// RotateHead is rotateHead for the cache path's rewritten attention
// (GroupQueryAttention's in-op rotary), so both paths rotate alike.
func RotateHead(o, in, c, sn []float32, interleaved bool) { rotateHead(o, in, c, sn, interleaved) }

// rotateHead writes the rotary embedding of the first 2*len(c) elements of
// one head's row in into o (which may be in itself): pairs (x1, x2) are
// (i, i+half), or (2i, 2i+1) when interleaved, rotated by the angle whose
// cosine and sine are c[i] and sn[i].
func rotateHead(o, in, c, sn []float32, interleaved bool) {
	half := len(c)
	for i := 0; i < half; i++ {
		i1, i2 := i, i+half
		if interleaved {
			i1, i2 = 2*i, 2*i+1
		}
		x1, x2 := in[i1], in[i2]
		o[i1] = c[i]*x1 - sn[i]*x2
		o[i2] = sn[i]*x1 + c[i]*x2
	}
}
