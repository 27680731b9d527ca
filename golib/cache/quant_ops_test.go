package cache

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestQuantSealBoundaries appends one token at a time and checks, after
// each, that exactly the chunks past the residual window are sealed (and
// counted), that no more than Residual+Group-1 tokens stay native, and that
// every value matches the model.
func TestQuantSealBoundaries(t *testing.T) {
	for _, f := range []QuantFormat{QuantInt8, QuantInt4} {
		for _, ax := range []KAxis{KPerChannel, KPerToken} {
			for _, g := range []int{32, 64} {
				for _, res := range []int{0, 128} {
					cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 64, HeadDimV: 32, Capacity: 3*g + res + 5, Elem: Float32,
						Quant: QuantConfig{Format: f, Group: g, KAxis: ax, Residual: res}}
					name := fmt.Sprintf("%v/%v/g%d/r%d", f, ax, g, res)
					t.Run(name, func(t *testing.T) {
						a, _ := NewArena(0)
						defer a.Close()
						c := mustNew(t, a, cfg)
						m := newQModel(c.Config())
						r := rand.New(rand.NewPCG(1, uint64(g+res)))
						for l := 1; l <= cfg.Capacity; l++ {
							k, v := randQKV(r, cfg, 1)
							mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 1, nil))
							m.appendRows(k, v, 1, nil)
							wantSealed := max(0, (l-res)/g) * g
							in := c.Info()
							if in.SealedTokens != int64(wantSealed) || in.Counters.SealCalls != int64(wantSealed/g) {
								t.Fatalf("len %d: %d sealed tokens in %d chunks, want %d", l, in.SealedTokens, in.Counters.SealCalls, wantSealed)
							}
							if in.NativeTokens >= int64(res+g) {
								t.Fatalf("len %d: %d native tokens, want < %d", l, in.NativeTokens, res+g)
							}
							if l%7 == 0 || l%g == 0 || l%g == 1 {
								m.qcheck(t, c, fmt.Sprintf("len %d", l))
							}
						}
					})
				}
			}
		}
	}
}

// TestQuantTruncateIntoChunk truncates into a sealed chunk and appends:
// the kept rows of the chunk keep their values, the new rows are native,
// and the next seal starts at the cut, not at a Group multiple.
func TestQuantTruncateIntoChunk(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 1, HeadDimK: 32, Capacity: 256, Elem: Float16,
		Quant: QuantConfig{Format: QuantInt4, Group: 32, Residual: 0}}
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	m := newQModel(c.Config())
	r := rand.New(rand.NewPCG(7, 7))
	app := func(n int) {
		k, v := randQKV(r, cfg, n)
		mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, n, nil))
		m.appendRows(k, v, n, nil)
	}
	app(100) // chunks [0,32) [32,64) [64,96), 4 native
	bk, bv := exportF32(t, c)
	mustOK(t, c.Truncate([]int{40}))
	m.lens[0] = 40
	app(10)
	ak, av := exportF32(t, c)
	for i := 0; i < 40*32; i++ {
		if bk[i] != ak[i] || bv[i] != av[i] {
			t.Fatalf("element %d changed by truncate+append: %v -> %v", i, bk[i], ak[i])
		}
	}
	segs := c.AppendSegments(nil, 0, 0, 0, 50)
	if len(segs) != 3 || segs[1].Start != 32 || segs[1].Len != 8 || segs[1].Q.Format != QuantInt4 || segs[2].Q.Format != QuantNone || segs[2].Len != 10 {
		t.Fatalf("segments after the cut: %+v", segLens(segs))
	}
	app(22) // 32 native rows from 40: one chunk [40, 72)
	segs = c.AppendSegments(nil, 0, 0, 0, 72)
	if got := segLens(segs); fmt.Sprint(got) != "[[0 32 int4] [32 8 int4] [40 32 int4]]" {
		t.Fatalf("segments %v", got)
	}
	m.qcheck(t, c, "after reseal")
}

// TestQuantChunkScalesInBudget: truncating into a sealed chunk and
// appending again, over and over, makes one more (shorter) chunk each time;
// the per-channel scale table that grows with them is arena memory under
// the budget. Every step either succeeds or fails with a *BudgetError that
// leaves the rows as they were, the arena never holds more than its
// budget, the cache's committed bytes are the arena's (and its chunk
// tables'), and fork, reorder
// (with a copied sequence) and regrow carry the grown tables bit for bit.
func TestQuantChunkScalesInBudget(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 32, Capacity: 512, Elem: Float16,
		Quant: QuantConfig{Format: QuantInt4, Group: 32, Residual: 0}}
	probe, _ := NewArena(0)
	need := mustNew(t, probe, cfg).Info().CommittedBytes
	probe.Close()
	budget := need + need/2
	a, _ := NewArena(budget)
	defer a.Close()
	c := mustNew(t, a, cfg)
	// the committed bytes beyond the arena's: the chunk tables (Go heap)
	tables := func() int64 {
		n := int64(0)
		for _, sq := range c.seqs {
			n += int64(8*cap(sq.q.chunks) + cap(sq.q.flags))
		}
		return n
	}
	if got := a.Stats().Allocated; got != c.Info().CommittedBytes-tables() {
		t.Fatalf("arena allocated %d, cache committed %d", got, c.Info().CommittedBytes)
	}
	r := rand.New(rand.NewPCG(3, 9))
	k, v := randQKV(r, cfg, 32)
	refused := false
	for i := 1; i < 400 && !refused; i++ {
		before, beforeV := exportF32(t, c)
		err := c.Append(asBytes(k), asBytes(v), Float32, 32, nil)
		switch {
		case errors.Is(err, ErrBudget):
			refused = true
			after, afterV := exportF32(t, c)
			if fmt.Sprint(after) != fmt.Sprint(before) || fmt.Sprint(afterV) != fmt.Sprint(beforeV) {
				t.Fatalf("step %d: a refused append changed the rows", i)
			}
		case err != nil:
			t.Fatal(err)
		default:
			mustOK(t, c.Truncate([]int{i, i})) // into the chunk just sealed
		}
		if st := a.Stats(); st.Allocated > budget || st.Allocated != c.Info().CommittedBytes-tables() {
			t.Fatalf("step %d: arena allocated %d (budget %d), cache committed %d", i, st.Allocated, budget, c.Info().CommittedBytes)
		}
	}
	if !refused {
		t.Fatal("the chunk scales never reached the budget")
	}
	if n := len(c.AppendSegments(nil, 0, 0, 0, c.Lengths()[0])); n <= c.qg.maxChunks {
		t.Fatalf("%d segments: the table did not grow past %d chunks", n, c.qg.maxChunks)
	}
	mustOK(t, a.SetBudget(0))
	wantK, wantV := exportF32(t, c)
	f, err := c.Fork()
	mustOK(t, err)
	g, err := c.Regrown(2 * cfg.Capacity)
	mustOK(t, err)
	for _, x := range []*KVCache{f, g} {
		gotK, gotV := exportF32(t, x)
		if fmt.Sprint(gotK) != fmt.Sprint(wantK) || fmt.Sprint(gotV) != fmt.Sprint(wantV) {
			t.Fatal("fork or regrow changed the rows")
		}
	}
	mustOK(t, c.Reorder([]int{1, 1})) // sequence 0 becomes a copy of sequence 1
	gotK, gotV := exportF32(t, c)
	h := len(wantK) / 2
	for _, w := range [][2][]float32{{gotK[:h], wantK[h:]}, {gotK[h:], wantK[h:]}, {gotV[:h], wantV[h:]}, {gotV[h:], wantV[h:]}} {
		if fmt.Sprint(w[0]) != fmt.Sprint(w[1]) {
			t.Fatal("reorder did not copy sequence 1 bit for bit")
		}
	}
	for _, x := range []*KVCache{f, g, c} {
		x.Close()
	}
	if st := a.Stats(); st.Allocated != 0 {
		t.Fatalf("%d bytes still allocated after close", st.Allocated)
	}
}

func segLens(segs []Segment) [][3]any {
	var out [][3]any
	for _, s := range segs {
		out = append(out, [3]any{s.Start, s.Len, s.Q.Format})
	}
	return out
}

// TestQuantNonFinite: a scale group holding a NaN or an infinity reads back
// as NaN (never as a finite value); the other groups are unaffected.
func TestQuantNonFinite(t *testing.T) {
	for _, f := range []QuantFormat{QuantInt8, QuantInt4} {
		for _, ax := range []KAxis{KPerChannel, KPerToken} {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				t.Run(fmt.Sprintf("%v/%v/%v", f, ax, bad), func(t *testing.T) {
					cfg := Config{Batch: 1, KVHeads: 1, HeadDimK: 64, Capacity: 64, Elem: Float32,
						Quant: QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 0}}
					a, _ := NewArena(0)
					defer a.Close()
					c := mustNew(t, a, cfg)
					m := newQModel(c.Config())
					k, v := randQKV(rand.New(rand.NewPCG(3, 3)), cfg, 32)
					k[5*64+3] = bad // token 5, channel 3
					v[9*64+40] = bad
					mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 32, nil))
					m.appendRows(k, v, 32, nil)
					m.qcheck(t, c, "non-finite")
					if segs := c.AppendSegments(nil, 0, 0, 0, 32); len(segs) != 1 || segs[0].Q.Bounded {
						t.Fatalf("a chunk with a non-finite value: segments %v, want one not Bounded", segLens(segs))
					}
					gk, gv := exportF32(t, c)
					nanK, nanV := 0, 0
					for i := range gk {
						if gk[i] != gk[i] {
							nanK++
						}
						if gv[i] != gv[i] {
							nanV++
						}
					}
					wantK := 32 // channel 3 of the chunk
					if ax == KPerToken {
						wantK = 32 // the first 32-element group of token 5
					}
					if nanK != wantK || nanV != 32 {
						t.Fatalf("%d NaN K values and %d NaN V values, want %d and 32", nanK, nanV, wantK)
					}
					if gk[5*64+3] == gk[5*64+3] || gv[9*64+40] == gv[9*64+40] {
						t.Fatal("a non-finite input read back finite")
					}
				})
			}
		}
	}
}

// TestQuantCodecValues checks the formats on hand-computed groups.
func TestQuantCodecValues(t *testing.T) {
	cases := []struct {
		f    QuantFormat
		in   []float32
		want []float32
	}{
		{QuantInt8, []float32{127, -63.5, 0, 1}, []float32{127, -64, 0, 1}}, // scale 1: -63.5 rounds to even
		{QuantInt8, []float32{0, 0}, []float32{0, 0}},
		{QuantInt8, []float32{-2.54, 1.26, 1.27}, []float32{-2.54, 1.26, 1.28}}, // 1.27/0.02 = 63.5 -> 64
		{QuantInt4, []float32{0, 15, 7.5, 3}, []float32{0, 15, 8, 3}},           // scale 1 zero 0: 7.5 rounds to 8
		{QuantInt4, []float32{2, 2, 2}, []float32{2, 2, 2}},                     // constant: exact
		{QuantInt4, []float32{-1, 2}, []float32{-1, 2}},
	}
	for i, tc := range cases {
		x := append([]float32(nil), tc.in...)
		s, z := groupParams(tc.f, x, 0, 1, len(x))
		for j, a := range x {
			got := dequantValue(tc.f, quantValue(tc.f, a, s, z), s, z)
			if math.Abs(float64(got-tc.want[j])) > 1e-6 {
				t.Errorf("case %d element %d: %v -> %v, want %v", i, j, a, got, tc.want[j])
			}
		}
		ref := append([]float32(nil), tc.in...)
		refQuantGroup(tc.f, ref)
		for j := range ref {
			if got := dequantValue(tc.f, quantValue(tc.f, x[j], s, z), s, z); got != ref[j] {
				t.Errorf("case %d element %d: codec %v, model %v", i, j, got, ref[j])
			}
		}
	}
	row := make([]byte, 2)
	for i, q := range []uint8{1, 15, 0, 9} {
		putQuant(QuantInt4, row, i, q)
	}
	if row[0] != 0xf1 || row[1] != 0x90 {
		t.Fatalf("int4 packing %x, want f1 90 (element 2i low nibble)", row)
	}
}

// TestQuantValidation checks the options New refuses.
func TestQuantValidation(t *testing.T) {
	base := Config{Batch: 1, KVHeads: 1, HeadDimK: 64, Capacity: 64, Elem: Float32}
	cases := []struct {
		q      QuantConfig
		edit   func(*Config)
		target error
	}{
		{QuantConfig{Format: QuantInt8, Group: 16}, nil, ErrInvalidArgument},
		{QuantConfig{Format: QuantInt8, Group: 32, Residual: -1}, nil, ErrInvalidArgument},
		{QuantConfig{Format: QuantInt8, Group: 32, KAxis: 5}, nil, ErrInvalidArgument},
		{QuantConfig{Format: 9, Group: 32}, nil, ErrInvalidArgument},
		{QuantConfig{Format: QuantInt4, Group: 32}, func(c *Config) { c.HeadDimK = 63 }, ErrInvalidArgument},
		{QuantConfig{Format: QuantInt4, Group: 32}, func(c *Config) { c.HeadDimV = 7 }, ErrInvalidArgument},
		{QuantConfig{Format: QuantInt8, Group: 32}, func(c *Config) { c.Layout, c.BlockSize = Paged, 64 }, ErrInvalidArgument},
	}
	a, _ := NewArena(0)
	defer a.Close()
	for i, tc := range cases {
		cfg := base
		cfg.Quant = tc.q
		if tc.edit != nil {
			tc.edit(&cfg)
		}
		if _, err := New(a, cfg); !errors.Is(err, tc.target) {
			t.Errorf("case %d (%+v): err %v, want %v", i, tc.q, err, tc.target)
		}
	}
	// Group 0 takes the default
	c, err := New(a, Config{Batch: 1, KVHeads: 1, HeadDimK: 64, Capacity: 64, Elem: Float32, Quant: QuantConfig{Format: QuantInt8}})
	mustOK(t, err)
	if g := c.Config().Quant.Group; g != DefaultQuantGroup {
		t.Fatalf("default group %d", g)
	}
	c.Close()
	if st := a.Stats(); st.Allocated != 0 {
		t.Fatalf("refused caches left %d bytes allocated", st.Allocated)
	}
}

// TestQuantMemory checks the memory figures: bytes per token as the format
// says, the native ring sized by the window (not the capacity), and a
// budget refusal that leaves nothing allocated.
func TestQuantMemory(t *testing.T) {
	const H, D, C = 8, 128, 4096
	cases := []struct {
		q        QuantConfig
		perToken int64
	}{
		// rows 2*128, V scales 4 per row, K per-channel scales 128 per 32 tokens
		{QuantConfig{Format: QuantInt8, Group: 32, Residual: 128}, H * (2*D + 4*4 + 4*D/32)},
		// rows 2*64, 4 V scales + 4 zeros, 2*128 K floats per 32 tokens
		{QuantConfig{Format: QuantInt4, Group: 32, Residual: 128}, H * (D + 8*4 + 8*D/32)},
		// per-token K: 2 scales per row (group 64) for K and V
		{QuantConfig{Format: QuantInt8, Group: 64, KAxis: KPerToken}, H * (2*D + 4*4)},
	}
	a, _ := NewArena(0)
	defer a.Close()
	for _, tc := range cases {
		cfg := Config{Batch: 1, KVHeads: H, HeadDimK: D, Capacity: C, Elem: Float16, Quant: tc.q}
		c := mustNew(t, a, cfg)
		in := c.Info()
		if in.BytesPerToken != tc.perToken {
			t.Errorf("%+v: %d bytes per token, want %d", tc.q, in.BytesPerToken, tc.perToken)
		}
		if in.NativeBytesPerToken != H*2*D*2 {
			t.Errorf("native bytes per token %d", in.NativeBytesPerToken)
		}
		ring := int64(H * (tc.q.Residual + tc.q.Group) * 2 * D * 2)
		if max, min := int64(C)*tc.perToken+ring+1<<16, int64(C)*tc.perToken; in.CommittedBytes > max || in.CommittedBytes < min {
			t.Errorf("%+v: %d committed bytes, want %d..%d (fp16 would be %d)", tc.q, in.CommittedBytes, min, max, C*in.NativeBytesPerToken)
		}
		c.Close()
	}
	b, _ := NewArena(1 << 20)
	defer b.Close()
	_, err := New(b, Config{Batch: 2, KVHeads: H, HeadDimK: D, Capacity: C, Elem: Float16, Quant: cases[0].q})
	var be *BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("budget: err %v", err)
	}
	if st := b.Stats(); st.Allocated != 0 {
		t.Fatalf("refused cache left %d bytes", st.Allocated)
	}
}

// TestQuantHotPathAllocs: a one-token append (sealing included, once per
// Group tokens) and the view's segments allocate nothing.
func TestQuantHotPathAllocs(t *testing.T) {
	if asanEnabled {
		t.Skip("the address sanitizer's instrumentation allocates")
	}
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 64, Capacity: 4096, Elem: Float16,
		Quant: QuantConfig{Format: QuantInt4, Group: 32, Residual: 16}}
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	k, v := randQKV(rand.New(rand.NewPCG(1, 2)), cfg, 1)
	segs := make([]Segment, 0, 256)
	allocs := testing.AllocsPerRun(2000, func() {
		_ = c.Append(asBytes(k), asBytes(v), Float32, 1, nil)
		segs = c.AppendSegments(segs[:0], 1, 1, 0, c.lens[1])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per decode append + view", allocs)
	}
	if n := c.Counters().SealCalls; n < 2*2000/32-2 {
		t.Fatalf("only %d seals", n)
	}
}

// TestQuantAppendCost: the bytes an append writes are its own rows; the
// bytes sealing writes are the quantized rows and scales of the chunks.
func TestQuantAppendCost(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 64, Capacity: 1024, Elem: Float32,
		Quant: QuantConfig{Format: QuantInt8, Group: 32, Residual: 32}}
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	k, v := randQKV(rand.New(rand.NewPCG(5, 5)), cfg, 96)
	mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 96, nil))
	ct := c.Counters()
	// 64 sealed tokens (2 chunks) and 32 native ones of 2 heads
	if in := c.Info(); in.LiveBytes != 64*in.BytesPerToken+32*2*2*64*4 {
		t.Fatalf("live bytes %d", in.LiveBytes)
	}
	if ct.AppendBytes != 96*2*2*64*4 {
		t.Fatalf("append bytes %d", ct.AppendBytes)
	}
	// two chunks, two heads: K rows 32*64 + 64 scales, V rows 32*64 + 2*32 scales
	if want := int64(2 * 2 * (32*64 + 64*4 + 32*64 + 64*4)); ct.SealCalls != 2 || ct.SealBytes != want {
		t.Fatalf("seal calls %d bytes %d, want 2 and %d", ct.SealCalls, ct.SealBytes, want)
	}
}

// TestQuantPagedBlocks: the paged layout's blocks are the sealed chunks:
// taken as chunks are sealed (nothing proportional to the capacity is
// reserved), shared by fork and reorder without a copy, given back by a
// window and by close; a budget refusal mid-append changes nothing.
func TestQuantPagedBlocks(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 64, Capacity: 1 << 20, Elem: Float16, Layout: Paged,
		Quant: QuantConfig{Format: QuantInt8, Group: 32, Residual: 32}}
	a, _ := NewArena(0)
	defer a.Close()
	big := mustNew(t, a, cfg)
	if n := big.Info().CommittedBytes; n > 1<<20 {
		t.Fatalf("an empty paged cache of capacity 1M commits %d bytes", n)
	}
	big.Close()
	cfg.Capacity = 1024 // the model holds every position
	c := mustNew(t, a, cfg)
	if bs := c.Config().BlockSize; bs != 32 {
		t.Fatalf("default block size %d, want the group", bs)
	}
	empty := c.Info().CommittedBytes
	m := newQModel(c.Config())
	r := rand.New(rand.NewPCG(4, 4))
	k, v := randQKV(r, cfg, 200)
	mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 200, nil))
	m.appendRows(k, v, 200, nil)
	in := c.Info()
	if in.BlocksUsed != 2*5 || in.BlocksShared != 0 { // (200-32)/32 = 5 chunks per sequence
		t.Fatalf("blocks used %d shared %d", in.BlocksUsed, in.BlocksShared)
	}
	chunk := int64(c.qg.chunkBytes(c.cfg))
	if in.CommittedBytes != empty+10*chunk {
		t.Fatalf("committed %d, want %d + 10 chunks of %d", in.CommittedBytes, empty, chunk)
	}
	a0 := a.Stats().Allocated
	f, err := c.Fork()
	mustOK(t, err)
	if fi := f.Info(); fi.BlocksShared != 10 || fi.Counters.CopyBytes != 0 {
		t.Fatalf("fork shares %d blocks", fi.BlocksShared)
	}
	// what the fork takes from the arena is what it reports committed (no
	// per-channel scale table: the blocks hold their scales)
	if got, fi := a.Stats().Allocated-a0, f.Info(); got != fi.CommittedBytes-10*chunk {
		t.Fatalf("fork allocated %d bytes, its own committed %d", got, fi.CommittedBytes-10*chunk)
	}
	a1 := a.Stats().Allocated
	// the two rings (64 rows of K and V per head) and the page-table entries only
	if cb := c.Info().Counters.CopyBytes; cb != 2*2*64*(64+64)*2+16*10 {
		t.Fatalf("fork copied %d bytes", cb)
	}
	mustOK(t, c.Reorder([]int{1, 1}))
	m.setSeq(0, m.seq(1))
	m.qcheck(t, c, "after reorder")
	if got := a.Stats().Allocated; got > a1 {
		t.Fatalf("a beam reorder took %d bytes from the arena", got-a1)
	}
	mustOK(t, c.Evict(64)) // chunks below position 136 go: 4 of 5, shared by both beams
	for b := range m.win {
		m.win[b] = m.lens[b] - 64
	}
	m.qcheck(t, c, "after evict")
	if in := c.Info(); in.BlocksUsed != 1 {
		t.Fatalf("after evict %d blocks", in.BlocksUsed)
	}
	f.Close()
	// a budget that holds the rings but not the next chunk: the append
	// fails whole
	b, _ := NewArena(int64(2*c.qg.seqBytes) + 4*chunk)
	defer b.Close()
	c2 := mustNew(t, b, cfg)
	k2, v2 := randQKV(r, cfg, 64+32)
	mustOK(t, c2.Append(asBytes(k2), asBytes(v2), Float32, 64+32, nil)) // 2 chunks (two per sequence)
	m2 := newQModel(c2.Config())
	m2.appendRows(k2, v2, 64+32, nil)
	k3, v3 := randQKV(r, cfg, 40)
	err = c2.Append(asBytes(k3), asBytes(v3), Float32, 40, nil)
	var be *BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("append past the budget: %v", err)
	}
	m2.qcheck(t, c2, "after refused append")
	c.Close()
	c2.Close()
	if st := a.Stats(); st.Allocated != 0 {
		t.Fatalf("%d bytes still allocated after close", st.Allocated)
	}
}

// TestQuantPagedViewAllocs: the paged layout's view allocates nothing
// either (its append takes one arena block per sealed chunk, so it
// allocates once per Group tokens, not per token).
func TestQuantPagedViewAllocs(t *testing.T) {
	if asanEnabled {
		t.Skip("the address sanitizer's instrumentation allocates")
	}
	cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 64, Capacity: 4096, Elem: Float16, Layout: Paged,
		Quant: QuantConfig{Format: QuantInt8, Group: 32, Residual: 16}}
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	k, v := randQKV(rand.New(rand.NewPCG(1, 3)), cfg, 1000)
	mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 1000, nil))
	segs := make([]Segment, 0, 64)
	if allocs := testing.AllocsPerRun(100, func() { segs = c.AppendSegments(segs[:0], 0, 1, 0, 1000) }); allocs != 0 {
		t.Fatalf("%v allocations per view", allocs)
	}
	if len(segs) < 30 {
		t.Fatalf("%d segments for 30 chunks and the ring", len(segs))
	}
	k1, v1 := asBytes(k[:2*64]), asBytes(v[:2*64]) // one token, two heads
	allocs := testing.AllocsPerRun(320, func() { mustOK(t, c.Append(k1, v1, Float32, 1, nil)) })
	if allocs > 0.2 {
		t.Fatalf("%v allocations per one-token append", allocs)
	}
}

// TestQuantScaleBound checks QuantSegment.Bounded: a chunk whose largest
// value in one head puts a scale above ScaleBound is not Bounded in any
// head, the chunks around it are, and the flags follow the chunks through
// fork and truncation into the unbounded one.
func TestQuantScaleBound(t *testing.T) {
	for _, f := range []QuantFormat{QuantInt8, QuantInt4} {
		for _, ax := range []KAxis{KPerChannel, KPerToken} {
			t.Run(fmt.Sprintf("%v/%v", f, ax), func(t *testing.T) {
				cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 64, Capacity: 128, Elem: Float32,
					Quant: QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 0}}
				a, _ := NewArena(0)
				defer a.Close()
				c := mustNew(t, a, cfg)
				k, v := randQKV(rand.New(rand.NewPCG(5, 7)), cfg, 96)
				// head 1 of chunk 1 (tokens 32..63): a V value whose scale is
				// 2^57 (int8: x/127; int4: (max-min)/15 with min 0 or below)
				big := float32(0x1p57 * 127)
				if f == QuantInt4 {
					big = 0x1p57 * 15
				}
				v[(96+40)*64+7] = big
				mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 96, nil))
				checkChunkFlag(t, c, "Bounded", func(q *QuantSegment) bool { return q.Bounded }, []bool{true, false, true})
			})
		}
	}
}

// TestQuantKUneven checks QuantSegment.KUneven: a chunk in which one K
// channel of one head has a large offset (its per-channel scale far above
// the others') is KUneven in every head, the chunks around it are not, per
// token K never is, and the flags follow the chunks through fork and
// truncation; both layouts.
func TestQuantKUneven(t *testing.T) {
	for _, f := range []QuantFormat{QuantInt8, QuantInt4} {
		for _, ax := range []KAxis{KPerChannel, KPerToken} {
			for _, layout := range []Layout{Contiguous, Paged} {
				t.Run(fmt.Sprintf("%v/%v/%v", f, ax, layout), func(t *testing.T) {
					cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 64, Capacity: 128, Elem: Float32, Layout: layout,
						Quant: QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 0}}
					if layout == Paged {
						cfg.BlockSize = 32
					}
					a, _ := NewArena(0)
					defer a.Close()
					c := mustNew(t, a, cfg)
					k, v := randQKV(rand.New(rand.NewPCG(5, 9)), cfg, 96)
					// head 1, tokens 32..63, channel 7: offset 30000 (int8: scale 30000/127
					// against at most 8/127, 320/127 for the x40 channel; int4 scales widen with a multiplicative
					// outlier, the offset falls into the zero)
					for tok := 32; tok < 64; tok++ {
						if f == QuantInt4 {
							k[(96+tok)*64+7] *= 3000
						} else {
							k[(96+tok)*64+7] += 30000
						}
					}
					mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, 96, nil))
					checkChunkFlag(t, c, "KUneven", func(q *QuantSegment) bool { return q.KUneven },
						[]bool{false, ax == KPerChannel, false})
				})
			}
		}
	}
}

// checkChunkFlag checks a per-chunk flag of the segments of a two-head cache
// of 96 sealed tokens (three chunks of 32) against want, in every head: as
// sealed, in a fork, and after a truncation into chunk 1.
func checkChunkFlag(t *testing.T, c *KVCache, name string, flag func(*QuantSegment) bool, want []bool) {
	t.Helper()
	check := func(c *KVCache, label string, n int) {
		t.Helper()
		for h := range 2 {
			for i, sg := range c.AppendSegments(nil, 0, h, 0, n) {
				if got := flag(&sg.Q); got != want[i] {
					t.Fatalf("%s: head %d chunk %d %s %v, want %v", label, h, i, name, got, want[i])
				}
			}
		}
	}
	check(c, "sealed", 96)
	fk, err := c.Fork()
	mustOK(t, err)
	defer fk.Close()
	check(fk, "fork", 96)
	mustOK(t, c.Truncate([]int{40}))
	check(c, "truncated into chunk 1", 40)
}
