package rewrite

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// blockedBelow is the largest additive mask value (or Where fill) read as
// "blocked": exporters use the type's lowest value or -inf; 0 attends.
const blockedBelow = -1e4

// padding reads the step's mask (input 3, as mask_mode says) and returns,
// per sequence, how many of the new tokens are left padding (nil when none
// is). The kernel implements causal attention over the stored tokens, and
// the cache stores no padding, so the mask must be exactly that: for every
// real query row i (position P+i) it attends the positions first_b .. P+i,
// where first_b is the sequence's first attended position; and the
// positions before P it attends must be the tokens the state holds. Rows
// of padding queries are not checked (their outputs are zeros). Anything
// else fails with errs.ErrNotImplemented before the state is touched. The
// verdict is computed once per mask tensor and run.
func (k *cacheAttention) padding(ctx *ops.Context, bind Binding, g geometry, kv *cache.KVCache) ([]int, error) {
	m := ctx.Input(3)
	if k.maskMode == maskNone || m == nil {
		if k.maskMode != maskNone && k.maskMode != maskAttention && k.maskMode != maskPadding {
			return nil, fmt.Errorf("%w: CacheAttention: the mask input is missing", errs.ErrMissingInput)
		}
		return nil, nil
	}
	P := bind.PastLength()
	key := memoKey{data: unsafe.SliceData(m.Bytes()), mode: k.maskMode, causal: k.causal, past: P, s: g.s}
	firsts, ok := bind.Memo()[key].([]int)
	if !ok {
		var err error
		if firsts, err = k.firstAttended(ctx, m, g, P); err != nil {
			return nil, err
		}
		bind.Memo()[key] = firsts
	}
	skip := make([]int, g.b)
	padded := false
	for b, first := range firsts {
		held := kv.SeqLen(b)
		if first < P && P-first != held {
			return nil, fmt.Errorf("%w: the attention mask of sequence %d attends %d past positions, the state holds %d tokens of it",
				errs.ErrInvalidArgument, b, P-first, held)
		}
		if first >= P && held != 0 {
			return nil, fmt.Errorf("%w: the attention mask of sequence %d masks the %d tokens the state holds of it",
				errs.ErrNotImplemented, b, held)
		}
		skip[b] = max(0, min(first, P+g.s)-P)
		padded = padded || skip[b] > 0
	}
	if !padded {
		return nil, nil
	}
	return skip, nil
}

// memoKey identifies one mask verdict within a run.
type memoKey struct {
	data    *byte
	mode    int
	causal  bool
	past, s int
}

// firstAttended checks the mask's structure and returns each sequence's
// first attended position (T when none).
func (k *cacheAttention) firstAttended(ctx *ops.Context, m *tensor.Tensor, g geometry, P int) ([]int, error) {
	T := P + g.s
	at, err := k.maskReader(ctx, m, g, T)
	if err != nil {
		return nil, err
	}
	attends := func(b, i, t int) (bool, error) {
		a, err := at(b, i, t)
		return a && (!k.causal || t <= P+i), err
	}
	firsts := make([]int, g.b)
	for b := 0; b < g.b; b++ {
		first := T
		for t := 0; t < T; t++ {
			a, err := attends(b, g.s-1, t)
			if err != nil {
				return nil, err
			}
			if a {
				first = t
				break
			}
		}
		firsts[b] = first
		for i := 0; i < g.s; i++ {
			if P+i < first {
				continue // a padding query
			}
			for t := 0; t < T; t++ {
				a, err := attends(b, i, t)
				if err != nil {
					return nil, err
				}
				if want := t >= first && t <= P+i; a != want {
					return nil, fmt.Errorf("%w: the attention mask is not causal plus left padding "+
						"(sequence %d, query %d, key %d: attends=%v): the cache path supports those masks only",
						errs.ErrNotImplemented, b, i, t, a)
				}
			}
		}
	}
	return firsts, nil
}

// maskReader returns "query i of sequence b attends key t" for the mask
// tensor m in k's mode, broadcasting it to [batch, 1, S, T]. It reads the
// mask in place (nothing of the context's size is allocated per step).
func (k *cacheAttention) maskReader(ctx *ops.Context, m *tensor.Tensor, g geometry, T int) (func(b, i, t int) (bool, error), error) {
	sh := m.Shape()
	if k.maskMode == maskPadding {
		if len(sh) != 2 || sh[0] != g.b || sh[1] != T {
			return nil, fmt.Errorf("%w: attention_mask has shape %v, want [%d, %d] (batch, past + new)", errs.ErrShape, sh, g.b, T)
		}
		at, err := attendAt(m, false, false)
		if err != nil {
			return nil, err
		}
		return func(b, _, t int) (bool, error) { return at(b*T + t) }, nil
	}
	r := len(sh)
	if r < 2 || r > 4 || sh[r-1] != T || (sh[r-2] != 1 && sh[r-2] != g.s) || (r >= 3 && sh[r-3] != 1) ||
		(r == 4 && sh[0] != 1 && sh[0] != g.b) {
		return nil, fmt.Errorf("%w: the attention mask has shape %v, the cache path reads [batch or 1, 1, %d or 1, %d]",
			errs.ErrNotImplemented, sh, g.s, T)
	}
	rows, batched := sh[r-2], r == 4 && sh[0] == g.b
	var at func(int) (bool, error)
	var err error
	switch k.maskMode {
	case maskAttention:
		at, err = attendAt(m, m.DType() != tensor.Bool, false)
	case maskAdditive:
		at, err = attendAt(m, true, false)
	case maskBlocked, maskAttend:
		if err = checkLow(ctx.Input(4)); err == nil {
			at, err = attendAt(m, false, k.maskMode == maskBlocked)
		}
	default:
		err = fmt.Errorf("%w: mask mode %d", errs.ErrInvalidModel, k.maskMode)
	}
	if err != nil {
		return nil, err
	}
	return func(b, i, t int) (bool, error) {
		if !batched {
			b = 0
		}
		if rows == 1 {
			i = 0
		}
		return at((b*rows+i)*T + t)
	}, nil
}

// attendAt reads element i of a mask as "attends": bool and int values as
// themselves (nonzero attends; negate: true blocks), or additive float
// values (0 attends, <= blockedBelow blocks, anything else is refused).
func attendAt(m *tensor.Tensor, additive, negate bool) (func(int) (bool, error), error) {
	switch dt := m.DType(); {
	case dt == tensor.Bool:
		d := m.Bool()
		return func(i int) (bool, error) { return d[i] != negate, nil }, nil
	case dt == tensor.Int64:
		d := m.Int64()
		return func(i int) (bool, error) { return (d[i] != 0) != negate, nil }, nil
	case dt == tensor.Int32:
		d := m.Int32()
		return func(i int) (bool, error) { return (d[i] != 0) != negate, nil }, nil
	case additive && dt == tensor.Float32:
		d := m.Float32()
		return func(i int) (bool, error) { return additiveAttends(d[i]) }, nil
	case additive && dt == tensor.Float16:
		d := m.Float16()
		return func(i int) (bool, error) { return additiveAttends(codec.F16ToF32(uint16(d[i]))) }, nil
	case additive && dt == tensor.BFloat16:
		d := m.BFloat16()
		return func(i int) (bool, error) { return additiveAttends(math.Float32frombits(uint32(d[i]) << 16)) }, nil
	}
	return nil, fmt.Errorf("%w: attention mask of type %v", errs.ErrType, m.DType())
}

func additiveAttends(v float32) (bool, error) {
	switch {
	case v == 0:
		return true, nil
	case v <= blockedBelow:
		return false, nil
	}
	return false, fmt.Errorf("%w: the additive attention mask holds %v (the cache path reads 0 or values <= %g)",
		errs.ErrNotImplemented, v, blockedBelow)
}

// checkLow checks that the fill of a Where mask blocks.
func checkLow(low *tensor.Tensor) error {
	if low == nil || !low.DType().IsFloat() {
		return fmt.Errorf("%w: the Where mask's fill must be a float value", errs.ErrNotImplemented)
	}
	f, err := tensor.AsFloat32(low)
	if err != nil {
		return err
	}
	for _, v := range f {
		if !(v <= blockedBelow) {
			return fmt.Errorf("%w: the Where mask fills %v, not a blocking value <= %g", errs.ErrNotImplemented, v, blockedBelow)
		}
	}
	return nil
}
