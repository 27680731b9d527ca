// Package mha computes the standard ONNX Attention operator (opset 23 and
// 24) on float32 slices with explicit shapes, independent of any tensor type:
// 3D [batch, seq, heads*head_dim] and 4D [batch, heads, seq, head_dim]
// inputs, MHA/GQA/MQA, is_causal, bool or float masks broadcast from rank
// 1-4, past/present concatenation, scale, softcap, the four
// qk_matmul_output modes, nonpad_kv_seqlen and head_dim_v != head_dim_k.
//
// Where the ONNX text leaves room, the package follows what onnxruntime's CPU
// provider computes (checked against ORT 1.32), except where noted:
//   - causal alignment is bottom-right: query row i attends keys
//     j <= i + offset, offset = past length (internal cache), or
//     nonpad_kv_seqlen[b] - q_len (external cache), or 0 (with a past and
//     fewer queries than new keys this is the ONNX reference's rule;
//     onnxruntime aligns to the end of the total length instead, and the
//     two agree whenever the counts are equal);
//   - is_causal and an explicit mask may be combined; both apply;
//   - positions excluded by a bool mask, the causal rule or nonpad_kv_seqlen
//     get the score -MaxFloat32 (visible in qk_matmul_output mode 2); float
//     masks are added after softcap;
//   - a row whose best score is -Inf or -MaxFloat32 (no attendable key) gives
//     zero probabilities and a zero output row, not NaN;
//   - opset 25 adds sliding windows, and onnxruntime's opset-25 kernel scores
//     excluded positions -Inf and zeroes only all -Inf rows (Attrs.InfMasking).
//
// Beyond onnxruntime (which rejects them) and as the ONNX text allows, a mask
// whose last dimension is shorter than total_sequence_length is padded with
// masked positions, and a rank-1 mask broadcasts like numpy.
//
// # Non-finite values
//
// Every path (the streaming engine of package cpu and the general unit, on
// every kernel path)
// returns what exactRow computes in float64, the definition the tests'
// reference applies to every row: IEEE propagation through s = scale*q.k,
// softcap and the masks above (an excluded position's score is replaced, so
// a NaN score there has no effect), the softmax with the row maximum
// subtracted, and the product of the probabilities with every V row of the
// head, as onnxruntime's P*V product computes it. Consequences: a NaN score
// at an attended position or an infinite one (inf - inf in the softmax)
// makes the row NaN; a NaN or an infinity in V reaches its column of every
// row of the head, excluded positions included (0 * NaN is NaN), and an
// infinity with a positive weight gives that infinity; huge finite inputs
// whose float32 products overflow (q = 3e38) give the finite float64
// result.
//
// The float32 units detect every departure cheaply and recompute only the
// rows concerned with exactRow (slow and allocating): the general unit
// checks each row's raw scores for NaN and ±Inf, its output row, and the V
// rows past the block's last scored column (those past a sequence's nonpad
// length once per call and KV head); the streaming engine (cpu.Attention,
// see engine.go) detects a row that met a non-finite value by its own rule
// and hands it to exactRow through cpu.Options.Exact, and every row of its
// (sequence, KV head) is recomputed when V is not finite (causal rows stop
// before the last keys). Finite inputs never take the
// fallback (TestFiniteNoFallback counts exactRows); with scale 0 the
// products are skipped and Q and K themselves are checked.
package mha

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// ErrShape reports inputs whose shapes or attributes do not fit together.
var ErrShape = errors.New("mha: bad shape")

// ErrValue reports an out-of-range attribute or input value.
var ErrValue = errors.New("mha: bad value")

// Softmax precisions accepted by Attrs.SoftmaxPrecision (ONNX TensorProto
// data types); 0 means not set.
const (
	PrecisionFloat    = 1
	PrecisionFloat16  = 10
	PrecisionDouble   = 11
	PrecisionBFloat16 = 16
)

// Attrs are the operator attributes.
type Attrs struct {
	// QNumHeads and KVNumHeads are required with 3D inputs. With 4D inputs
	// they may be left 0; when set they must match the shapes.
	QNumHeads, KVNumHeads int
	// Scale multiplies Q*K^T when HasScale; otherwise 1/sqrt(head_dim_k).
	Scale    float32
	HasScale bool
	// Softcap, when > 0, maps a score s to Softcap*tanh(s/Softcap) before
	// the mask is added.
	Softcap float32
	// IsCausal applies the bottom-right causal rule.
	IsCausal bool
	// QKMode selects what qk_matmul_output holds: 0 scaled Q*K^T, 1 after
	// softcap, 2 after softcap and masks, 3 after softmax.
	QKMode int
	// SoftmaxPrecision is 0 or one of the Precision constants. Double runs
	// the softmax in float64; the others run it in float32 (16-bit softmax
	// precisions are computed more precisely than asked, as onnxruntime does).
	SoftmaxPrecision int
	// SlidingWindow enables LeftWindow/RightWindow (opset 25): query row i
	// at position p = i + offset attends keys p-LeftWindow .. p+RightWindow;
	// a negative size leaves that side unbounded.
	SlidingWindow           bool
	LeftWindow, RightWindow int
	// InfMasking selects onnxruntime's opset-25 conventions: excluded
	// positions score -Inf (not -MaxFloat32) and only rows whose scores are
	// all -Inf are zeroed (a float mask of -MaxFloat32 then gives a uniform
	// row).
	InfMasking bool
	// SmoothSoftmax adds one more logit to every softmax row, a "sink"
	// that takes weight but contributes no value: p_j = e^(s_j-m) /
	// (e^(sink-m) + sum_k e^(s_k-m)) with m = max(sink, max_k s_k). The
	// sink is 0, or Inputs.HeadSink[h] per query head when given
	// (onnxruntime's GroupQueryAttention smooth_softmax and head_sink).
	SmoothSoftmax bool
}

// Shapes are the input shapes; nil marks an omitted optional input.
type Shapes struct {
	Q, K, V            []int
	Mask               []int
	PastKey, PastValue []int
	NonpadKVSeqlen     []int
}

// Geometry is a validated call: dimensions, effective attributes and output
// shapes. Plan builds it; Run executes it on data of those shapes.
type Geometry struct {
	Attrs
	Batch, QHeads, KVHeads         int
	QLen, KVLen, PastLen, TotalLen int // TotalLen = PastLen + KVLen
	HeadDimK, HeadDimV             int
	Input3D                        bool
	HasMask, HasPast, HasNonpad    bool

	// Threads bounds the threads Run may use (0: all of the gemm pool's).
	Threads int

	// Output shapes (present and qk are always 4D). They are views of
	// shapes below: a Geometry is not copied (PlanInto fills one in place).
	YShape, PresentKeyShape, PresentValueShape, QKShape []int

	shapes [4][4]int // the backing arrays of the output shapes

	maskDims    [4]int // right-aligned to (batch, q_heads, q_len, mask_len)
	maskStrides [4]int // 0 on broadcast axes
}

// Plan validates shapes and attributes and derives the geometry.
func Plan(a Attrs, s Shapes) (*Geometry, error) {
	g := new(Geometry)
	if err := PlanInto(g, a, s); err != nil {
		return nil, err
	}
	return g, nil
}

// PlanInto is Plan into a Geometry the caller owns (a pooled one: a decode
// step plans every layer's call, and Plan's allocation was one of a call's
// fixed costs). Every field of g is overwritten.
func PlanInto(g *Geometry, a Attrs, s Shapes) error {
	*g = Geometry{Attrs: a}
	if err := g.planQKV(s); err != nil {
		return err
	}
	if err := g.planPast(s); err != nil {
		return err
	}
	if err := g.planAttrs(); err != nil {
		return err
	}
	if err := g.planMask(s.Mask); err != nil {
		return err
	}
	if s.NonpadKVSeqlen != nil {
		if len(s.NonpadKVSeqlen) != 1 || s.NonpadKVSeqlen[0] != g.Batch {
			return fmt.Errorf("%w: nonpad_kv_seqlen shape %v, want [%d]", ErrShape, slices.Clone(s.NonpadKVSeqlen), g.Batch)
		}
		if g.HasPast {
			return fmt.Errorf("%w: nonpad_kv_seqlen cannot be combined with past_key/past_value", ErrShape)
		}
		g.HasNonpad = true
	}
	sh := &g.shapes
	if g.Input3D {
		sh[0] = [4]int{g.Batch, g.QLen, g.QHeads * g.HeadDimV}
		g.YShape = sh[0][:3]
	} else {
		sh[0] = [4]int{g.Batch, g.QHeads, g.QLen, g.HeadDimV}
		g.YShape = sh[0][:]
	}
	sh[1] = [4]int{g.Batch, g.KVHeads, g.TotalLen, g.HeadDimK}
	sh[2] = [4]int{g.Batch, g.KVHeads, g.TotalLen, g.HeadDimV}
	sh[3] = [4]int{g.Batch, g.QHeads, g.QLen, g.TotalLen}
	g.PresentKeyShape, g.PresentValueShape, g.QKShape = sh[1][:], sh[2][:], sh[3][:]
	// Every buffer size must be representable (Run compares lengths with
	// these products).
	for _, sh := range [...][]int{s.Q, s.K, s.V, s.Mask, s.PastKey, s.PastValue, g.YShape,
		g.PresentKeyShape, g.PresentValueShape, g.QKShape} {
		if _, ok := checkedProd(sh); !ok {
			return fmt.Errorf("%w: %v has too many elements", ErrShape, slices.Clone(sh))
		}
	}
	return nil
}

// checkedProd multiplies non-negative dimensions and reports overflow.
func checkedProd(shape []int) (int, bool) {
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt/d) {
			return 0, false
		}
		n *= d
	}
	return n, true
}

func (g *Geometry) planQKV(s Shapes) error {
	q, k, v := s.Q, s.K, s.V
	if len(q) != len(k) || len(q) != len(v) || (len(q) != 3 && len(q) != 4) {
		return fmt.Errorf("%w: Q, K, V must all be 3D or all 4D, got %v, %v, %v", ErrShape, q, k, v)
	}
	for _, sh := range [][]int{q, k, v} {
		for _, d := range sh {
			if d < 0 {
				return fmt.Errorf("%w: negative dimension in %v", ErrShape, sh)
			}
		}
	}
	g.Batch = q[0]
	if k[0] != g.Batch || v[0] != g.Batch {
		return fmt.Errorf("%w: batch sizes differ: Q %v, K %v, V %v", ErrShape, q, k, v)
	}
	if len(q) == 3 {
		g.Input3D = true
		hq, hkv := g.QNumHeads, g.KVNumHeads
		if hq <= 0 || hkv <= 0 {
			return fmt.Errorf("%w: 3D inputs need q_num_heads and kv_num_heads > 0 (got %d, %d)", ErrShape, hq, hkv)
		}
		if q[2]%hq != 0 || k[2]%hkv != 0 || v[2]%hkv != 0 {
			return fmt.Errorf("%w: hidden sizes Q %d, K %d, V %d not divisible by heads %d/%d", ErrShape, q[2], k[2], v[2], hq, hkv)
		}
		g.QHeads, g.KVHeads = hq, hkv
		g.QLen, g.KVLen = q[1], k[1]
		g.HeadDimK, g.HeadDimV = q[2]/hq, v[2]/hkv
		if k[2]/hkv != g.HeadDimK {
			return fmt.Errorf("%w: Q head size %d != K head size %d", ErrShape, g.HeadDimK, k[2]/hkv)
		}
		if v[1] != g.KVLen {
			return fmt.Errorf("%w: K and V sequence lengths differ: %d vs %d", ErrShape, g.KVLen, v[1])
		}
	} else {
		g.QHeads, g.KVHeads = q[1], k[1]
		g.QLen, g.KVLen = q[2], k[2]
		g.HeadDimK, g.HeadDimV = q[3], v[3]
		if (g.QNumHeads != 0 && g.QNumHeads != g.QHeads) || (g.KVNumHeads != 0 && g.KVNumHeads != g.KVHeads) {
			return fmt.Errorf("%w: q_num_heads/kv_num_heads %d/%d disagree with 4D shapes Q %v, K %v", ErrShape, g.QNumHeads, g.KVNumHeads, q, k)
		}
		if k[3] != g.HeadDimK {
			return fmt.Errorf("%w: Q head size %d != K head size %d", ErrShape, g.HeadDimK, k[3])
		}
		if v[1] != g.KVHeads || v[2] != g.KVLen {
			return fmt.Errorf("%w: V %v does not match K %v in heads and sequence length", ErrShape, v, k)
		}
	}
	if g.KVHeads == 0 || g.QHeads%g.KVHeads != 0 {
		return fmt.Errorf("%w: q heads %d must be a multiple of kv heads %d", ErrShape, g.QHeads, g.KVHeads)
	}
	if g.HeadDimK == 0 || g.HeadDimV == 0 {
		return fmt.Errorf("%w: head sizes must be > 0 (k %d, v %d)", ErrShape, g.HeadDimK, g.HeadDimV)
	}
	return nil
}

func (g *Geometry) planPast(s Shapes) error {
	if (s.PastKey == nil) != (s.PastValue == nil) {
		return fmt.Errorf("%w: past_key and past_value must be given together", ErrShape)
	}
	g.TotalLen = g.KVLen
	if s.PastKey == nil {
		return nil
	}
	pk, pv := s.PastKey, s.PastValue
	if len(pk) != 4 || len(pv) != 4 {
		return fmt.Errorf("%w: past_key %v and past_value %v must be 4D", ErrShape, pk, pv)
	}
	if pk[0] != g.Batch || pk[1] != g.KVHeads || pk[3] != g.HeadDimK || pk[2] < 0 {
		return fmt.Errorf("%w: past_key %v, want [%d, %d, past, %d]", ErrShape, pk, g.Batch, g.KVHeads, g.HeadDimK)
	}
	if pv[0] != g.Batch || pv[1] != g.KVHeads || pv[2] != pk[2] || pv[3] != g.HeadDimV {
		return fmt.Errorf("%w: past_value %v, want [%d, %d, %d, %d]", ErrShape, pv, g.Batch, g.KVHeads, pk[2], g.HeadDimV)
	}
	g.HasPast = true
	g.PastLen = pk[2]
	g.TotalLen = g.PastLen + g.KVLen
	return nil
}

func (g *Geometry) planAttrs() error {
	if g.QKMode < 0 || g.QKMode > 3 {
		return fmt.Errorf("%w: qk_matmul_output_mode %d not in 0..3", ErrValue, g.QKMode)
	}
	switch g.SoftmaxPrecision {
	case 0, PrecisionFloat, PrecisionFloat16, PrecisionDouble, PrecisionBFloat16:
	default:
		return fmt.Errorf("%w: softmax_precision %d is not a floating-point type", ErrValue, g.SoftmaxPrecision)
	}
	if math.IsNaN(float64(g.Softcap)) {
		return fmt.Errorf("%w: softcap %v", ErrValue, g.Softcap)
	}
	if g.Softcap < 0 {
		g.Softcap = 0 // onnxruntime applies a softcap only when it is > 0
	}
	if !g.HasScale {
		g.Scale = float32(1 / math.Sqrt(float64(g.HeadDimK)))
		g.HasScale = true
	}
	return nil
}

func (g *Geometry) planMask(m []int) error {
	if m == nil {
		return nil
	}
	if len(m) < 1 || len(m) > 4 {
		return fmt.Errorf("%w: attn_mask must have rank 1 to 4, got %v", ErrShape, m)
	}
	want := [4]int{g.Batch, g.QHeads, g.QLen, g.TotalLen}
	g.maskDims = [4]int{1, 1, 1, 1}
	copy(g.maskDims[4-len(m):], m)
	for ax := range 3 {
		if d := g.maskDims[ax]; d != 1 && d != want[ax] {
			return fmt.Errorf("%w: attn_mask %v does not broadcast to %v", ErrShape, m, want)
		}
	}
	if last := g.maskDims[3]; last < 1 || last > g.TotalLen {
		if !(last == 0 && g.TotalLen == 0) {
			return fmt.Errorf("%w: attn_mask last dimension %d, want 1..total_sequence_length %d", ErrShape, last, g.TotalLen)
		}
	}
	stride := 1
	for ax := 3; ax >= 0; ax-- {
		if g.maskDims[ax] == 1 && ax < 3 {
			g.maskStrides[ax] = 0
		} else {
			g.maskStrides[ax] = stride
		}
		stride *= g.maskDims[ax]
	}
	g.HasMask = true
	return nil
}
