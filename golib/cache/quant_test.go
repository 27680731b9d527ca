package cache

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// quantConfigs are the quantized geometries the lifecycle tests run: both
// formats, both K axes, groups 32 and 64, residual 0 and 128 (and a small
// one that makes windows and seals meet often), head dims that the group
// divides and ones it does not, every native type.
var quantConfigs = []Config{
	{Batch: 2, KVHeads: 2, HeadDimK: 8, Capacity: 300, Elem: Float32, Quant: QuantConfig{Format: QuantInt8, Group: 32, Residual: 0}},
	{Batch: 3, KVHeads: 1, HeadDimK: 64, HeadDimV: 32, Capacity: 400, Elem: Float16, Quant: QuantConfig{Format: QuantInt8, Group: 32, KAxis: KPerToken, Residual: 128}},
	{Batch: 2, KVHeads: 2, HeadDimK: 6, HeadDimV: 10, Capacity: 260, Elem: BFloat16, Quant: QuantConfig{Format: QuantInt4, Group: 64, Residual: 5}},
	{Batch: 2, KVHeads: 3, HeadDimK: 64, Capacity: 350, Elem: Float32, Quant: QuantConfig{Format: QuantInt4, Group: 32, KAxis: KPerToken, Residual: 0}},
	{Batch: 1, KVHeads: 2, HeadDimK: 128, HeadDimV: 64, Capacity: 500, Elem: Float16, Quant: QuantConfig{Format: QuantInt4, Group: 64, Residual: 128}},
	{Batch: 4, KVHeads: 1, HeadDimK: 32, Capacity: 200, Elem: Float32, Quant: QuantConfig{Format: QuantInt8, Group: 64, KAxis: KPerToken, Residual: 7}},
}

// randQKV returns k and v for n tokens with a few large channels (outliers,
// as real K has) so per-channel and per-token scales differ.
func randQKV(r *rand.Rand, cfg Config, n int) (k, v []float32) {
	k, v = randKV(r, cfg, n)
	for i := range k {
		if i%cfg.HeadDimK == 1 {
			k[i] *= 40
		}
		k[i] += float32(r.NormFloat64()) * 0.01
	}
	for i := range v {
		v[i] *= float32(1 + r.IntN(3))
	}
	return k, v
}

// qcheck compares c with the model: lengths, every exported value
// bit-exactly (NaN where the model has NaN), the segments' shape, and the
// sealed/native figures and seal counter.
func (m *qmodel) qcheck(t *testing.T, c *KVCache, label string) {
	t.Helper()
	cfg := m.cfg
	if got := c.Lengths(); !slices.Equal(got, m.lens) {
		t.Fatalf("%s: lengths %v, want %v", label, got, m.lens)
	}
	L := c.MaxLen()
	kb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimK*4)
	vb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimV*4)
	mustOK(t, c.Export(kb, vb, Float32, L))
	k, v := asF32(kb), asF32(vb)
	same := func(a, b float32) bool { return a == b || (a != a && b != b) }
	for b := range cfg.Batch {
		for h := range cfg.KVHeads {
			u := b*cfg.KVHeads + h
			for p := range L {
				for d := range cfg.HeadDimK {
					if got, want := k[(u*L+p)*cfg.HeadDimK+d], m.want(true, b, h, p, d); !same(got, want) {
						t.Fatalf("%s: k[%d,%d,%d,%d]=%v want %v (sealed %d chunks %v len %d)", label, b, h, p, d, got, want,
							m.sealed[b], m.chunks[b], m.lens[b])
					}
				}
				for d := range cfg.HeadDimV {
					if got, want := v[(u*L+p)*cfg.HeadDimV+d], m.want(false, b, h, p, d); !same(got, want) {
						t.Fatalf("%s: v[%d,%d,%d,%d]=%v want %v (sealed %d len %d)", label, b, h, p, d, got, want, m.sealed[b], m.lens[b])
					}
				}
			}
			checkQuantSegments(t, c, m, b, h, label)
		}
	}
	in := c.Info()
	if s, n := m.tokens(); in.SealedTokens != s || in.NativeTokens != n {
		t.Fatalf("%s: sealed/native tokens %d/%d, want %d/%d", label, in.SealedTokens, in.NativeTokens, s, n)
	}
}

// checkQuantSegments checks the view of [win, len) of b, h: position
// order, sealed segments exactly the model's chunks cut to the range (never
// spanning two), native segments after them, and DequantizeSegment equal to
// the model.
func checkQuantSegments(t *testing.T, c *KVCache, m *qmodel, b, h int, label string) {
	t.Helper()
	cfg := m.cfg
	lo, hi := m.win[b], m.lens[b]
	segs := c.AppendSegments(nil, b, h, lo, hi)
	pos := lo
	sEnd := min(m.sealed[b], hi)
	for _, sg := range segs {
		if sg.Start != pos || sg.Len <= 0 {
			t.Fatalf("%s: segment at %d len %d, want start %d", label, sg.Start, sg.Len, pos)
		}
		end := pos + sg.Len
		if pos < sEnd {
			if sg.Q.Format != cfg.Quant.Format {
				t.Fatalf("%s: rows %d..%d are sealed but the segment has format %v", label, pos, end, sg.Q.Format)
			}
			// the chunk holding pos ends at the next chunk start
			ce := sEnd
			for _, st := range m.chunks[b] {
				if st > pos {
					ce = min(ce, st)
					break
				}
			}
			if end != ce {
				t.Fatalf("%s: sealed segment %d..%d, want it to end at the chunk end %d (chunks %v)", label, pos, end, ce, m.chunks[b])
			}
			// the chunk's seal-time bound, carried through every operation (the
			// tests' unbounded values lie in rows every segment of their
			// chunk shows, and in single-head caches)
			if q := &sg.Q; q.Bounded != scalesBounded(q.KScale, q.KZero, q.VScale, q.VZero) {
				t.Fatalf("%s: sealed segment %d..%d Bounded %v, its scales say %v", label, pos, end, q.Bounded, !q.Bounded)
			}
			dk := make([]float32, sg.Len*cfg.HeadDimK)
			dv := make([]float32, sg.Len*cfg.HeadDimV)
			mustOK(t, DequantizeSegment(dk, dv, sg, cfg.HeadDimK, cfg.HeadDimV))
			for r := range sg.Len {
				for d := range cfg.HeadDimK {
					if got, want := dk[r*cfg.HeadDimK+d], m.want(true, b, h, pos+r, d); got != want && !(got != got && want != want) {
						t.Fatalf("%s: dequantized k[%d][%d]=%v want %v", label, pos+r, d, got, want)
					}
				}
			}
		} else if sg.Q.Format != QuantNone {
			t.Fatalf("%s: native rows %d..%d in a %v segment", label, pos, end, sg.Q.Format)
		}
		pos = end
	}
	if pos != hi {
		t.Fatalf("%s: segments cover %d..%d, want %d..%d", label, lo, pos, lo, hi)
	}
}

// TestQuantRandomOperations drives quantized caches and the model through
// the same random operations (ragged appends of up to two chunks, truncate
// into sealed chunks, reorder with repeats, checkpoint/rollback, evict,
// fork with a write into the fork, select, adopt, reset) and compares them
// after every step (one seed per geometry and layout under the race
// detector, three otherwise).
func TestQuantRandomOperations(t *testing.T) {
	seeds := uint64(3)
	if raceEnabled {
		seeds = 1
	}
	for gi, cfg := range quantConfigs {
		for _, l := range []Layout{Contiguous, Paged} {
			cfg.Layout = l
			for seed := range seeds {
				randomQuantOps(t, cfg, rand.New(rand.NewPCG(seed, 100+uint64(gi))), 70, fmt.Sprintf("qcfg %d %v seed %d", gi, l, seed))
			}
		}
	}
}

// randomQuantOps is randomOps for quantized caches, against qmodel.
func randomQuantOps(t *testing.T, cfg Config, r *rand.Rand, steps int, label string) {
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	m := newQModel(c.Config())
	G := m.cfg.Quant.Group
	var ids []uint64
	var mcks []*qmodelCk
	for step := range steps {
		B := m.cfg.Batch
		at := fmt.Sprintf("%s step %d", label, step)
		op := r.IntN(13)
		at += fmt.Sprintf(" op %d", op)
		switch op {
		case 0, 1, 2, 3: // append, sometimes ragged, sometimes long
			n := r.IntN(G)
			if r.IntN(3) == 0 {
				n = r.IntN(3 * G)
			}
			k, v := randQKV(r, m.cfg, n)
			var counts []int
			if r.IntN(3) == 0 {
				counts = make([]int, B)
				for b := range counts {
					counts[b] = r.IntN(n + 1)
				}
			}
			fits := true
			for b := range B {
				cnt := n
				if counts != nil {
					cnt = counts[b]
				}
				fits = fits && m.lens[b]+cnt <= cfg.Capacity
			}
			err := c.Append(asBytes(k), asBytes(v), Float32, n, counts)
			if fits != (err == nil) || (err != nil && !errors.Is(err, ErrCapacity)) {
				t.Fatalf("%s: append %d: err=%v fits=%v", at, n, err, fits)
			}
			if fits {
				m.appendRows(k, v, n, counts)
			}
		case 4: // truncate, often into sealed chunks
			n := make([]int, B)
			for b := range n {
				n[b] = m.win[b] + r.IntN(m.lens[b]-m.win[b]+1)
			}
			mustOK(t, c.Truncate(n))
			copy(m.lens, n)
		case 5: // reorder with repeats
			idx := make([]int, B)
			for i := range idx {
				idx[i] = r.IntN(B)
			}
			mustOK(t, c.Reorder(idx))
			old := m.clone()
			for b, i := range idx {
				s := old.seq(i)
				s.cut()
				m.setSeq(b, s)
			}
			ids, mcks, m.cks = nil, nil, nil
		case 6: // checkpoint
			if len(ids) >= MaxCheckpoints-1 {
				continue
			}
			id, err := c.Checkpoint()
			mustOK(t, err)
			ck := &qmodelCk{lens: slices.Clone(m.lens), win: slices.Clone(m.win), floor: make([]int, B)}
			for b := range ck.floor {
				ck.floor[b] = math.MaxInt
			}
			ids, mcks = append(ids, id), append(mcks, ck)
			m.cks = append(m.cks, ck)
		case 7: // rollback: stale exactly when the model says so
			if len(ids) == 0 {
				continue
			}
			i := r.IntN(len(ids))
			ck := mcks[i]
			valid := true
			for b, l := range ck.lens {
				valid = valid && ck.floor[b] >= l
			}
			err := c.Rollback(ids[i])
			if valid != (err == nil) || (err != nil && !errors.Is(err, ErrStaleCheckpoint)) {
				t.Fatalf("%s: rollback valid=%v err=%v", at, valid, err)
			}
			if valid {
				copy(m.lens, ck.lens)
				copy(m.win, ck.win)
			}
		case 8: // evict
			keep := r.IntN(3 * G)
			mustOK(t, c.Evict(keep))
			for b, l := range m.lens {
				m.win[b] = max(m.win[b], l-keep)
			}
		case 9: // fork, write into the fork, check it, drop it
			f, err := c.Fork()
			mustOK(t, err)
			fm := m.clone()
			fm.cks = nil
			for b := range fm.cfg.Batch {
				s := fm.seq(b)
				s.cut()
				fm.setSeq(b, s)
			}
			n := r.IntN(2 * G)
			if slices.Max(fm.lens)+n <= cfg.Capacity {
				k, v := randQKV(r, fm.cfg, n)
				mustOK(t, f.Append(asBytes(k), asBytes(v), Float32, n, nil))
				fm.appendRows(k, v, n, nil)
			}
			fm.qcheck(t, f, at+" fork")
			f.Close()
		case 10: // select a subset, or adopt a fork's sequences
			if r.IntN(2) == 0 || B >= 6 {
				perm := r.Perm(B)[:1+r.IntN(B)]
				mustOK(t, c.Select(perm))
				old := m.clone()
				m.resize(len(perm))
				for p, i := range perm {
					m.setSeq(p, old.seq(i))
				}
			} else {
				f, err := c.Fork()
				mustOK(t, err)
				mustOK(t, c.Adopt(f))
				old := m.clone()
				m.resize(2 * B)
				for b := range 2 * B {
					s := old.seq(b % B)
					if b >= B {
						s.cut()
					}
					m.setSeq(b, s)
				}
			}
			ids, mcks = nil, nil
		case 12: // regrow into a larger capacity (a growable state's growth)
			if r.IntN(3) != 0 || cfg.Layout == Paged {
				continue
			}
			g, err := c.Regrown(c.cfg.Capacity + G + r.IntN(2*G))
			mustOK(t, err)
			c.Close()
			c = g
			t.Cleanup(c.Close)
			cfg.Capacity = c.cfg.Capacity
			m.grow(cfg.Capacity)
			g.sealCalls = m.seals // a new cache's counters start at zero
			ids, mcks, m.cks = nil, nil, nil
		case 11:
			if r.IntN(4) == 0 {
				mustOK(t, c.Reset())
				m.resize(B)
				ids, mcks = nil, nil
			}
		}
		m.qcheck(t, c, at)
		if got := c.Counters().SealCalls; got != m.seals {
			t.Fatalf("%s: %d chunks sealed, want %d", at, got, m.seals)
		}
	}
	c.Close()
	if st := a.Stats(); st.Allocated != 0 || st.Live != 0 {
		t.Fatalf("%s: after close allocated=%d live=%d", label, st.Allocated, st.Live)
	}
}

// TestQuantScaleFitsTheLargestFloat: a group reaching float32's largest
// finite value reads back finite (fitScale steps the scale down where
// scale*127, or scale*15 + zero, would round up to an infinity), within one
// quantization step of what was stored.
func TestQuantScaleFitsTheLargestFloat(t *testing.T) {
	const big = math.MaxFloat32
	cases := []struct {
		name string
		f    QuantFormat
		x    []float32
	}{
		{"int8 +max", QuantInt8, []float32{big, 1, -3, 0}},
		{"int8 -max", QuantInt8, []float32{-big, 1, 2, 3}},
		{"int4 [1e36, max]", QuantInt4, []float32{1e36, big, 2e36, 5e37}},
		{"int4 [0, max]", QuantInt4, []float32{0, big, 1, big / 2}},
		{"int4 max constant", QuantInt4, []float32{big, big}},
	}
	for _, c := range cases {
		s, z := groupParams(c.f, c.x, 0, 1, len(c.x))
		for i, x := range c.x {
			q := quantValue(c.f, x, s, z)
			got := dequantValue(c.f, q, s, z)
			if math.IsInf(float64(got), 0) || got != got {
				t.Fatalf("%s: element %d (%v) reads back %v (scale %v, zero %v)", c.name, i, x, got, s, z)
			}
			if d := math.Abs(float64(got) - float64(x)); d > float64(s)*1.0001 {
				t.Fatalf("%s: element %d: %v reads back %v, more than a step (%v) away", c.name, i, x, got, s)
			}
		}
	}
}
