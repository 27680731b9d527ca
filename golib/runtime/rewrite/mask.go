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
// is), and the sliding window the mask applies (0: none). The kernel
// implements causal attention over the stored tokens, optionally within a
// window, and the cache stores no padding, so the mask must be exactly
// that: for every real query row i (position P+i) it attends the positions
// max(pad_b, P+i-window+1) .. P+i, where pad_b is the sequence's first
// real position (from the attention_mask input when the graph has one,
// else from the tokens the state holds, else the first position a row that
// attends some but not all keys attends); and the positions before P it
// attends must be the tokens the state holds. Rows of padding queries are
// not checked (their outputs are zeros), except that where the mask alone
// placed the padding they must attend nothing or everything, as padding rows
// do: a chunked or windowed mask's earlier rows are not padding. Anything else fails with errs.ErrNotImplemented before the
// state is touched. The verdict is computed once per mask tensor and run.
func (k *cacheAttention) padding(ctx *ops.Context, bind Binding, g geometry, kv *cache.KVCache) ([]int, int, error) {
	m := ctx.Input(3)
	if k.maskMode == maskNone || m == nil {
		if k.maskMode != maskNone && k.maskMode != maskAttention && k.maskMode != maskPadding {
			return nil, 0, fmt.Errorf("%w: CacheAttention: the mask input is missing", errs.ErrMissingInput)
		}
		return nil, 0, nil
	}
	P := bind.PastLength()
	key := memoKey{value: k.maskValue, data: unsafe.SliceData(m.Bytes()), mode: k.maskMode, causal: k.causal, past: P, s: g.s}
	v, ok := bind.Memo()[key].(verdict)
	if !ok {
		held := make([]int, g.b)
		for b := range held {
			held[b] = kv.SeqLen(b)
		}
		var err error
		if v, err = k.verdict(ctx, m, g, P, held); err != nil {
			return nil, 0, err
		}
		bind.Memo()[key] = v
	}
	skip := make([]int, g.b)
	padded := false
	for b, first := range v.firsts {
		held := kv.SeqLen(b)
		if first < P && P-first != held {
			return nil, 0, fmt.Errorf("%w: the attention mask of sequence %d attends %d past positions, the state holds %d tokens of it",
				errs.ErrInvalidArgument, b, P-first, held)
		}
		if first >= P && held != 0 {
			return nil, 0, fmt.Errorf("%w: the attention mask of sequence %d masks the %d tokens the state holds of it",
				errs.ErrNotImplemented, b, held)
		}
		skip[b] = max(0, min(first, P+g.s)-P)
		padded = padded || skip[b] > 0
	}
	if !padded {
		skip = nil
	}
	return skip, v.window, nil
}

// verdict is a mask's structure: each sequence's first real position and
// the sliding window (0: none).
type verdict struct {
	firsts []int
	window int
}

// memoKey identifies one mask verdict within a run.
type memoKey struct {
	value   string // the mask's value name: buffers are reused within a run
	data    *byte
	mode    int
	causal  bool
	past, s int
}

// verdict checks the mask's structure (see padding).
func (k *cacheAttention) verdict(ctx *ops.Context, m *tensor.Tensor, g geometry, P int, held []int) (verdict, error) {
	T := P + g.s
	at, err := k.maskReader(ctx, m, g, T)
	if err != nil {
		return verdict{}, err
	}
	attends := func(b, i, t int) (bool, error) {
		a, err := at(b, i, t)
		return a && (!k.causal || t <= P+i), err
	}
	pads, err := k.padStarts(ctx, g, T, P, held)
	if err != nil {
		return verdict{}, err
	}
	refuse := func(b, i, t int, a bool) error {
		return fmt.Errorf("%w: the attention mask is not causal plus left padding (and a sliding window) "+
			"(sequence %d, query %d, key %d: attends=%v): the cache path supports those masks only",
			errs.ErrNotImplemented, b, i, t, a)
	}
	// rowSpan returns the first key query i of sequence b attends (-1: none)
	// and how many it attends.
	rowSpan := func(b, i int) (first, n int, err error) {
		first = -1
		for t := 0; t < T; t++ {
			a, err := attends(b, i, t)
			if err != nil {
				return 0, 0, err
			}
			if a {
				if first < 0 {
					first = t
				}
				n++
			}
		}
		return first, n, nil
	}
	v := verdict{firsts: make([]int, g.b)}
	span := 0         // the longest range a row attends from its sequence's start
	var rows [][2]int // a sequence's rows' (first key, keys attended), where pad is guessed
	for b := 0; b < g.b; b++ {
		pad := pads[b]
		guessed := pad < 0
		// a padding row attends no key, or every key while keys after it exist (no real row
		// of a causal mask does either; masks of left-padded batches leave padding rows empty
		// or, as transformers' SDPA masks, full)
		paddingRow := func(i int) bool { return rows[i][1] == 0 || (rows[i][1] == T && P+i < T-1) }
		if guessed {
			// from the rows: the first key any row that is not a padding row attends (the
			// last row's alone would take the rows before a sliding window, or the chunks
			// before a chunked mask's last one, for padding)
			rows, pad = rows[:0], T
			for i := 0; i < g.s; i++ {
				first, n, err := rowSpan(b, i)
				if err != nil {
					return verdict{}, err
				}
				rows = append(rows, [2]int{first, n})
				if !paddingRow(i) {
					pad = min(pad, first)
				}
			}
		}
		v.firsts[b] = pad
		for i := 0; i < g.s; i++ {
			p := P + i
			if p < pad {
				if guessed && !paddingRow(i) { // no attention_mask or held tokens say it is padding
					return verdict{}, fmt.Errorf("%w: the attention mask is not causal plus left padding (and a "+
						"sliding window): query %d of sequence %d lies before the first key the other rows attend "+
						"(%d) but attends some keys and not others, which padding rows do not; the cache path "+
						"supports those masks only", errs.ErrNotImplemented, i, b, pad)
				}
				continue // a padding query
			}
			lo := -1
			for t := 0; t <= p; t++ {
				a, err := attends(b, i, t)
				if err != nil {
					return verdict{}, err
				}
				if a {
					lo = t
					break
				}
			}
			if lo < pad {
				return verdict{}, refuse(b, i, max(lo, 0), lo >= 0)
			}
			for t := lo; t < T; t++ {
				a, err := attends(b, i, t)
				if err != nil {
					return verdict{}, err
				}
				if a != (t <= p) {
					return verdict{}, refuse(b, i, t, a)
				}
			}
			if lo > pad {
				w := p - lo + 1
				if v.window != 0 && v.window != w {
					return verdict{}, refuse(b, i, lo, true)
				}
				v.window = w
			} else {
				span = max(span, p-pad+1)
			}
		}
	}
	if v.window != 0 && span > v.window {
		return verdict{}, fmt.Errorf("%w: the attention mask's rows span %d positions beyond a sliding window of %d",
			errs.ErrNotImplemented, span, v.window)
	}
	return v, nil
}

// padStarts returns each sequence's first real position: from the
// attention_mask input when the node has one (a row must be zeros then
// ones), else P - stored tokens for a sequence the state holds tokens of,
// else -1 (taken from the mask's rows, see verdict).
func (k *cacheAttention) padStarts(ctx *ops.Context, g geometry, T, P int, held []int) ([]int, error) {
	pads := make([]int, g.b)
	var am *tensor.Tensor
	if k.padInput > 0 {
		am = ctx.Input(k.padInput)
	}
	if am != nil {
		if am.Rank() != 2 || am.Shape()[0] != g.b || am.Shape()[1] != T {
			return nil, fmt.Errorf("%w: attention_mask has shape %v, want [%d, %d]", errs.ErrShape, am.Shape(), g.b, T)
		}
		at, err := attendAt(am, false, false)
		if err != nil {
			return nil, err
		}
		for b := range pads {
			pads[b] = T
			for t := 0; t < T; t++ {
				a, _ := at(b*T + t)
				if a && pads[b] == T {
					pads[b] = t
				}
				if !a && pads[b] < T {
					return nil, fmt.Errorf("%w: attention_mask row %d has a zero at position %d after its first one: "+
						"the cache path supports left padding only", errs.ErrNotImplemented, b, t)
				}
			}
		}
		return pads, nil
	}
	for b := range pads {
		pads[b] = -1
		if held[b] > 0 {
			pads[b] = P - held[b]
		}
	}
	return pads, nil
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
