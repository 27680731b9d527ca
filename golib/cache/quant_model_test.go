package cache

import (
	"math"
	"slices"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// qmodel is the reference model of a quantized contiguous cache, written
// from the storage's definition rather than from its code: per sequence and
// head, the value a read of each position gives (the native value until the
// position is sealed, then its dequantized value), the lengths, window
// starts, the end of the sealed rows and the chunk starts. A truncate or
// rollback changes only the lengths; the first append below the sealed end
// cuts it there; after every append, chunks of Group tokens are sealed from
// the sealed end while more than Residual+Group-1 native tokens remain.
type qmodel struct {
	cfg    Config
	k, v   [][][]float32 // [b][h][Capacity*d]
	lens   []int
	win    []int
	sealed []int
	chunks [][]int
	seals  int64 // chunks sealed (SealCalls)
	cks    []*qmodelCk
}

// qmodelCk is a checkpoint of the model: the lengths and windows, and the
// lowest position written since.
type qmodelCk struct {
	lens, win, floor []int
}

func newQModel(cfg Config) *qmodel {
	if cfg.HeadDimV == 0 {
		cfg.HeadDimV = cfg.HeadDimK
	}
	if cfg.Quant.Group == 0 {
		cfg.Quant.Group = DefaultQuantGroup
	}
	m := &qmodel{cfg: cfg}
	m.resize(cfg.Batch)
	return m
}

func (m *qmodel) resize(B int) {
	m.cfg.Batch = B
	m.k, m.v = make([][][]float32, B), make([][][]float32, B)
	m.lens, m.win, m.sealed = make([]int, B), make([]int, B), make([]int, B)
	m.chunks = make([][]int, B)
	for b := range B {
		m.k[b], m.v[b] = m.newSeq()
	}
	m.cks = nil
}

func (m *qmodel) newSeq() (k, v [][]float32) {
	cfg := m.cfg
	k, v = make([][]float32, cfg.KVHeads), make([][]float32, cfg.KVHeads)
	for h := range cfg.KVHeads {
		k[h] = make([]float32, cfg.Capacity*cfg.HeadDimK)
		v[h] = make([]float32, cfg.Capacity*cfg.HeadDimV)
	}
	return k, v
}

// seq is one sequence's state, for clones and reorders.
type qseq struct {
	k, v              [][]float32
	lens, win, sealed int
	chunks            []int
}

func (m *qmodel) seq(b int) qseq {
	s := qseq{lens: m.lens[b], win: m.win[b], sealed: m.sealed[b], chunks: slices.Clone(m.chunks[b])}
	for h := range m.cfg.KVHeads {
		s.k = append(s.k, slices.Clone(m.k[b][h]))
		s.v = append(s.v, slices.Clone(m.v[b][h]))
	}
	return s
}

func (m *qmodel) setSeq(b int, s qseq) {
	m.k[b], m.v[b] = s.k, s.v
	m.lens[b], m.win[b], m.sealed[b], m.chunks[b] = s.lens, s.win, s.sealed, s.chunks
}

func (m *qmodel) clone() *qmodel {
	c := &qmodel{cfg: m.cfg, seals: m.seals}
	c.resize(m.cfg.Batch)
	for b := range m.cfg.Batch {
		c.setSeq(b, m.seq(b))
	}
	return c
}

// cut is what a fork or a duplicating reorder does: rows past the length
// are not copied, so the sealed end drops to the length.
func (s *qseq) cut() {
	if s.sealed > s.lens {
		s.sealed = s.lens
		s.chunks = slices.DeleteFunc(s.chunks, func(st int) bool { return st >= s.lens })
	}
}

// roundElem is the value a float32 takes when stored in the cache's type.
func (m *qmodel) roundElem(x float32) float32 {
	switch m.cfg.Elem {
	case Float16:
		return f16RoundTrip(x)
	case BFloat16:
		return bf16RoundTrip(x)
	}
	return x
}

// appendRows mirrors Append (k, v as Append takes them, float32).
func (m *qmodel) appendRows(k, v []float32, n int, counts []int) {
	cfg := m.cfg
	for b := range cfg.Batch {
		cnt := n
		if counts != nil {
			cnt = counts[b]
		}
		if cnt == 0 {
			continue
		}
		pos := m.lens[b]
		for _, ck := range m.cks {
			ck.floor[b] = min(ck.floor[b], pos)
		}
		if pos < m.sealed[b] {
			m.sealed[b] = pos
			m.chunks[b] = slices.DeleteFunc(m.chunks[b], func(st int) bool { return st >= pos })
		}
		for h := range cfg.KVHeads {
			u := b*cfg.KVHeads + h
			for t := range cnt {
				for d := range cfg.HeadDimK {
					m.k[b][h][(pos+t)*cfg.HeadDimK+d] = m.roundElem(k[(u*n+t)*cfg.HeadDimK+d])
				}
				for d := range cfg.HeadDimV {
					m.v[b][h][(pos+t)*cfg.HeadDimV+d] = m.roundElem(v[(u*n+t)*cfg.HeadDimV+d])
				}
			}
		}
		m.lens[b] = pos + cnt
		for m.lens[b]-m.sealed[b] >= cfg.Quant.Residual+cfg.Quant.Group {
			m.seal(b)
		}
	}
}

// seal quantizes the chunk of Group rows at the sealed end of sequence b.
func (m *qmodel) seal(b int) {
	cfg, q := m.cfg, m.cfg.Quant
	s0, G := m.sealed[b], q.Group
	for h := range cfg.KVHeads {
		dk, dv := cfg.HeadDimK, cfg.HeadDimV
		kr := m.k[b][h][s0*dk : (s0+G)*dk]
		if q.KAxis == KPerChannel {
			for ch := range dk {
				col := make([]float32, G)
				for t := range G {
					col[t] = kr[t*dk+ch]
				}
				refQuantGroup(q.Format, col)
				for t := range G {
					kr[t*dk+ch] = col[t]
				}
			}
		} else {
			refQuantRows(q.Format, kr, dk, RowGroup(dk, G))
		}
		refQuantRows(q.Format, m.v[b][h][s0*dv:(s0+G)*dv], dv, RowGroup(dv, G))
	}
	m.chunks[b] = append(m.chunks[b], s0)
	m.sealed[b] = s0 + G
	m.seals++
}

// refQuantRows replaces every group of g elements of rows of d elements
// with its dequantized values.
func refQuantRows(f QuantFormat, x []float32, d, g int) {
	for off := 0; off < len(x); off += g {
		refQuantGroup(f, x[off:off+g])
	}
}

// refQuantGroup replaces the values of one scale group with what a sealed
// group reads back, by the formulas of the format (see quant_codec.go's
// comment): float32 steps, rounding to nearest even.
func refQuantGroup(f QuantFormat, x []float32) {
	for _, a := range x {
		if math.IsNaN(float64(a)) || math.IsInf(float64(a), 0) {
			for i := range x {
				x[i] = float32(math.NaN())
			}
			return
		}
	}
	if f == QuantInt8 {
		var amax float32
		for _, a := range x {
			amax = max(amax, float32(math.Abs(float64(a))))
		}
		scale := amax / 127
		for math.IsInf(float64(float32(scale*127)), 0) {
			scale = math.Nextafter32(scale, 0)
		}
		for i, a := range x {
			var q float64
			if scale != 0 {
				q = math.Max(-127, math.Min(127, math.RoundToEven(float64(a/scale))))
			}
			x[i] = scale * float32(q)
		}
		return
	}
	lo, hi := slices.Min(x), slices.Max(x)
	scale := (hi - lo) / 15
	over := func(s float32) bool {
		t := float32(s * 15)
		return math.IsInf(float64(t), 0) || math.IsInf(float64(t+lo), 0) ||
			math.IsInf(float64(float32(math.FMA(float64(s), 15, float64(lo)))), 0)
	}
	for !math.IsInf(float64(scale), 0) && scale > 0 && over(scale) {
		scale = math.Nextafter32(scale, 0)
	}
	for i, a := range x {
		var q float64
		if scale != 0 {
			d := a - lo
			q = math.Max(0, math.Min(15, math.RoundToEven(float64(d/scale))))
		}
		x[i] = float32(scale*float32(q)) + lo
	}
}

// tokens returns the model's readable sealed and native tokens.
func (m *qmodel) tokens() (sealed, native int64) {
	for b, l := range m.lens {
		se := min(m.sealed[b], l)
		sealed += int64(max(0, se-m.win[b]))
		native += int64(l - max(se, m.win[b]))
	}
	return sealed, native
}

// want returns the exported value of K (isK) or V at b, h, p, d.
func (m *qmodel) want(isK bool, b, h, p, d int) float32 {
	if p < m.win[b] || p >= m.lens[b] {
		return 0
	}
	if isK {
		return m.k[b][h][p*m.cfg.HeadDimK+d]
	}
	return m.v[b][h][p*m.cfg.HeadDimV+d]
}

func f16RoundTrip(x float32) float32 {
	var h [1]uint16
	var out [1]float32
	codec.EncodeF16(h[:], []float32{x})
	codec.DecodeF16(out[:], h[:])
	return out[0]
}

func bf16RoundTrip(x float32) float32 {
	var h [1]uint16
	var out [1]float32
	codec.EncodeBF16(h[:], []float32{x})
	codec.DecodeBF16(out[:], h[:])
	return out[0]
}

// grow gives the model a larger capacity (Regrown): rows past the lengths
// are not copied, so the sealed end drops to the length.
func (m *qmodel) grow(capacity int) {
	old := m.clone()
	m.cfg.Capacity = capacity
	m.resize(old.cfg.Batch)
	for b := range old.cfg.Batch {
		s := old.seq(b)
		s.cut()
		for h := range s.k {
			s.k[h] = append(s.k[h], make([]float32, (capacity-old.cfg.Capacity)*m.cfg.HeadDimK)...)
			s.v[h] = append(s.v[h], make([]float32, (capacity-old.cfg.Capacity)*m.cfg.HeadDimV)...)
		}
		m.setSeq(b, s)
	}
}
