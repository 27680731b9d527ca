package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

func sqrt64(x float64) float64 { return math.Sqrt(x) }

// ReferenceAttention is the obviously-correct oracle for Attention: for each
// query row it computes every score in float64, applies the softmax and the
// weighted sum of V in two plain passes. It reads K/V through the same
// cache.View segments as the fast kernel, allocates freely and is slow; tests
// and the Python kernel="reference" option use it. Semantics, argument
// checks and errors are those of Attention (see attention.go).
func ReferenceAttention(dst, q []float32, qLen, qHeads int, v cache.View, o Options) error {
	s, err := checkArgs(dst, q, qLen, qHeads, v, o)
	if err != nil {
		return err
	}
	if o.Mask != nil {
		return fmt.Errorf("%w: the reference takes no mask (its rows are the caller's Options.Exact)", cache.ErrInvalidArgument)
	}
	esize := s.elem.Size()
	var read int64
	var segs []cache.Segment
	for b := 0; b < s.batch; b++ {
		L, ws := v.SeqLen(b), v.WindowStart(b)
		for h := 0; h < s.kvHeads; h++ {
			ulo, _ := s.rowRange(L, ws, 0)
			segs = v.AppendSegments(segs[:0], b, h, ulo, L)
			keys, vals, err := loadRows(segs, ulo, L, s.dk, s.dv, s.elem)
			if err != nil {
				return err
			}
			read += segsBytes(segs, s.dk, s.dv, esize)
			for g := 0; g < s.group; g++ {
				qh := h*s.group + g
				for i := 0; i < qLen; i++ {
					row := (b*qHeads+qh)*qLen + i
					lo, hi := s.rowRange(L, ws, i)
					referenceRow(dst[row*s.dv:(row+1)*s.dv], q[row*s.dk:(row+1)*s.dk],
						keys[lo-ulo:hi-ulo], vals[lo-ulo:hi-ulo], &s)
				}
			}
		}
	}
	v.AddBytesRead(read)
	return nil
}

// exactRow computes output row out of query row q (row i of the q_len new
// tokens of sequence b, reading KV head h) with the reference's float64
// math. The streaming kernels fall back to it for a row whose float32
// computation met a non-finite value, so that every path gives the
// reference's result there (package doc, "Non-finite values"). It
// allocates; only such rows pay for it.
func exactRow(out, q []float32, v cache.View, s *shape, b, h, i int) error {
	exactRows.Add(1)
	lo, hi := s.rowRange(v.SeqLen(b), v.WindowStart(b), i)
	keys, vals, err := loadRows(v.AppendSegments(nil, b, h, lo, hi), lo, hi, s.dk, s.dv, s.elem)
	if err != nil {
		return err
	}
	referenceRow(out, q, keys, vals, s)
	return nil
}

// ValuesFinite reports whether every V element view v stores for sequence
// b's KV head kvh (positions from its window start to its length; head dims
// dk and dv, native rows of type elem, quantized ones dequantized) is
// finite. It decodes the rows: a slow path, for rows that met a NaN.
func ValuesFinite(v cache.View, b, kvh, dk, dv int, elem cache.ElemType) (bool, error) {
	lo, hi := v.WindowStart(b), v.SeqLen(b)
	_, vals, err := loadRows(v.AppendSegments(nil, b, kvh, lo, hi), lo, hi, dk, dv, elem)
	if err != nil {
		return false, err
	}
	for _, r := range vals {
		for _, x := range r {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return false, nil
			}
		}
	}
	return true, nil
}

// exactRows counts the rows exactRow computed (tests check that finite
// inputs never take that path).
var exactRows atomic.Int64

// referenceRow computes one query row over its visible keys.
func referenceRow(out, q []float32, keys, vals [][]float32, s *shape) {
	scores := make([]float64, len(keys))
	maxScore := math.Inf(-1)
	for t, k := range keys {
		var dot float64
		for d, x := range q {
			dot += float64(x) * float64(k[d])
		}
		sc := dot * float64(s.scale)
		if s.softcap > 0 {
			c := float64(s.softcap)
			sc = c * math.Tanh(sc/c)
		}
		scores[t] = sc
		maxScore = math.Max(maxScore, sc)
	}
	var sum float64
	for t := range scores {
		scores[t] = math.Exp(scores[t] - maxScore)
		sum += scores[t]
	}
	acc := make([]float64, len(out))
	for t, vr := range vals {
		w := scores[t] / sum
		for d, x := range vr {
			acc[d] += w * float64(x)
		}
	}
	for d := range out {
		out[d] = float32(acc[d])
	}
}

// loadRows decodes the rows of positions [from, to) from segs into float32
// K and V rows, checking that the segments cover the range exactly.
func loadRows(segs []cache.Segment, from, to, dk, dv int, elem cache.ElemType) (keys, vals [][]float32, err error) {
	esize := elem.Size()
	pos := from
	for i := range segs {
		sg := &segs[i]
		if sg.Q.Format != cache.QuantNone && sg.Start == pos {
			if err := checkQuantSegment(sg, dk, dv); err != nil {
				return nil, nil, err
			}
			k, v := make([]float32, sg.Len*dk), make([]float32, sg.Len*dv)
			if err := cache.DequantizeSegment(k, v, *sg, dk, dv); err != nil {
				return nil, nil, err
			}
			for r := 0; r < sg.Len; r++ {
				keys, vals = append(keys, k[r*dk:(r+1)*dk]), append(vals, v[r*dv:(r+1)*dv])
			}
			pos += sg.Len
			continue
		}
		if sg.Start != pos || sg.Len < 0 || len(sg.K) < sg.Len*dk*esize || len(sg.V) < sg.Len*dv*esize {
			return nil, nil, fmt.Errorf("%w: cache view returned a malformed segment (start %d len %d, expected start %d)",
				cache.ErrInvalidArgument, sg.Start, sg.Len, pos)
		}
		for r := 0; r < sg.Len; r++ {
			keys = append(keys, decodeRow(sg.K[r*dk*esize:(r+1)*dk*esize], dk, elem))
			vals = append(vals, decodeRow(sg.V[r*dv*esize:(r+1)*dv*esize], dv, elem))
		}
		pos += sg.Len
	}
	if pos != to {
		return nil, nil, fmt.Errorf("%w: cache view segments cover positions %d..%d, want %d..%d",
			cache.ErrInvalidArgument, from, pos, from, to)
	}
	return keys, vals, nil
}

// decodeRow converts one little-endian stored row to float32.
func decodeRow(b []byte, n int, elem cache.ElemType) []float32 {
	out := make([]float32, n)
	for i := range out {
		switch elem {
		case cache.Float32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case cache.Float16:
			out[i] = codec.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		case cache.BFloat16:
			out[i] = codec.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out
}

// segsBytes is what reading segs costs: native rows, or quantized rows with
// their scales (quantBytes).
func segsBytes(segs []cache.Segment, dk, dv, esize int) int64 {
	var n int64
	for i := range segs {
		if segs[i].Q.Format != cache.QuantNone {
			n += quantBytes(&segs[i], dk, dv)
		} else {
			n += int64(segs[i].Len * (dk + dv) * esize)
		}
	}
	return n
}
