package mha

import (
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// unit computes up to rowBlock query rows starting at i0 of query head h in
// batch b: scores = scale * Q K^T, then softcap, masks and softmax per row,
// then Y = P V, capturing qk_matmul_output at the requested stage.
func (g *Geometry) unit(in Inputs, out Outputs, keys, values []float32, b, h, i0 int) error {
	rows := min(rowBlock, g.QLen-i0)
	total, dk, dv := g.TotalLen, g.HeadDimK, g.HeadDimV
	kvh := h / (g.QHeads / g.KVHeads) // GQA: consecutive query heads share a KV head
	kb := keys[(b*g.KVHeads+kvh)*total*dk : (b*g.KVHeads+kvh+1)*total*dk]
	vb := values[(b*g.KVHeads+kvh)*total*dv : (b*g.KVHeads+kvh+1)*total*dv]

	ldq, qOff := dk, ((b*g.QHeads+h)*g.QLen+i0)*dk
	ldy, yOff := dv, ((b*g.QHeads+h)*g.QLen+i0)*dv
	if g.Input3D {
		ldq, qOff = g.QHeads*dk, (b*g.QLen+i0)*g.QHeads*dk+h*dk
		ldy, yOff = g.QHeads*dv, (b*g.QLen+i0)*g.QHeads*dv+h*dv
	}

	// offset aligns the causal frontier to the end of the valid keys.
	offset, valid := g.PastLen, total
	if g.HasNonpad {
		valid = int(in.NonpadKVSeqlen[b])
		offset = valid - g.QLen
	}
	// Keys no row of the block may attend need no score unless
	// qk_matmul_output wants to see them.
	cols := total
	if out.QK == nil {
		if g.IsCausal {
			cols = min(cols, max(0, i0+rows+offset))
		}
		cols = min(cols, valid)
	}

	sp := scratch.Get().(*[]float32)
	defer scratch.Put(sp)
	if cap(*sp) < rows*total {
		*sp = make([]float32, rows*total)
	}
	s := (*sp)[:rows*total]
	if cols > 0 {
		if err := gemm.SgemmThreads(g.Threads, false, true, rows, cols, dk, g.Scale, in.Q[qOff:], ldq, kb, dk, 0, s, total); err != nil {
			return err
		}
	}
	for r := range rows {
		i := i0 + r
		row := s[r*total : r*total+cols]
		var qk []float32
		if out.QK != nil {
			qk = out.QK[((b*g.QHeads+h)*g.QLen+i)*total : ((b*g.QHeads+h)*g.QLen+i+1)*total]
		}
		if g.QKMode == 0 && qk != nil {
			copy(qk, row)
		}
		if g.Softcap > 0 {
			softcap(row, g.Softcap)
		}
		if g.QKMode == 1 && qk != nil {
			copy(qk, row)
		}
		lim := valid
		if g.IsCausal {
			lim = min(lim, max(0, i+offset+1))
		}
		g.mask(row, in.Mask, b, h, i, lim)
		if g.QKMode == 2 && qk != nil {
			copy(qk, row)
		}
		if g.SoftmaxPrecision == PrecisionDouble {
			softmax64(row)
		} else {
			softmax32(row)
		}
		if g.QKMode == 3 && qk != nil {
			copy(qk, row)
		}
	}
	return gemm.SgemmThreads(g.Threads, false, false, rows, dv, cols, 1, s, max(total, 1), vb, dv, 0, out.Y[yOff:], ldy)
}

// mask adds the float mask or applies the bool mask to one score row, then
// excludes the keys at or after lim (causal frontier, nonpad length).
func (g *Geometry) mask(row []float32, m Mask, b, h, i, lim int) {
	if g.HasMask {
		md, ms := g.maskDims, g.maskStrides
		base := b*ms[0] + h*ms[1] + i*ms[2]
		n := min(md[3], len(row))
		if m.Float != nil {
			for j, v := range m.Float[base : base+n] {
				row[j] += v
			}
			for j := n; j < len(row); j++ { // short mask: padded with -inf
				row[j] = float32(math.Inf(-1))
			}
		} else {
			for j, ok := range m.Bool[base : base+n] {
				if !ok {
					row[j] = lowest
				}
			}
			for j := n; j < len(row); j++ {
				row[j] = lowest
			}
		}
	}
	for j := max(lim, 0); j < len(row); j++ {
		row[j] = lowest
	}
}

func softcap(row []float32, c float32) {
	inv := 1 / float64(c)
	for j, v := range row {
		row[j] = c * float32(math.Tanh(float64(v)*inv))
	}
}

// maskedRow reports a row with no attendable key: its best score is -Inf or
// the excluded-position score.
func maskedRow(mx float32) bool { return mx <= lowest }

// softmax32 normalizes row in place with float32 exponentials and a float64
// sum; a fully masked row becomes zeros.
func softmax32(row []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range row {
		if v > mx {
			mx = v
		}
	}
	if maskedRow(mx) {
		clear(row)
		return
	}
	var sum float64
	for j, v := range row {
		e := exp32(v - mx)
		row[j] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for j := range row {
		row[j] *= inv
	}
}

// softmax64 is softmax32 computed in float64 (softmax_precision = double).
func softmax64(row []float32) {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	if maskedRow(float32(mx)) {
		clear(row)
		return
	}
	e := make([]float64, len(row))
	var sum float64
	for j, v := range row {
		e[j] = math.Exp(float64(v) - mx)
		sum += e[j]
	}
	for j := range row {
		row[j] = float32(e[j] / sum)
	}
}
