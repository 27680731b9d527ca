package gemm

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// randQuant returns a random n x k QuantB and its dequantized W (n x k,
// row-major), computed by the formula of QuantB's doc.
func randQuant(r *rand.Rand, bits, block, k, n int) (QuantB, []float32) {
	w := QuantB{Bits: bits, Block: block, K: k, N: n}
	groups := w.Groups()
	w.Q = make([]byte, n*groups*block*bits/8)
	for i := range w.Q {
		w.Q[i] = byte(r.Uint32())
	}
	w.Scales = make([]float32, n*groups)
	w.Zeros = make([]float32, n*groups)
	for i := range w.Scales {
		w.Scales[i] = float32(r.NormFloat64()) / 8
		w.Zeros[i] = float32(r.IntN(1 << bits))
		if i%7 == 3 {
			w.Zeros[i] += 0.37 // a float zero point
		}
	}
	deq := make([]float32, n*k)
	for j := range n {
		for l := range k {
			i := j*groups + l/block
			deq[j*k+l] = (float32(w.value(j, l, groups)) - w.Zeros[i]) * w.Scales[i]
		}
	}
	return w, deq
}

// TestPackBQuantLayout checks that every sliver a quantized pack widens is,
// bit for bit, the sliver PackB stores for the dequantized weight, on every
// kernel path: the layout, the group runs and the dequant kernels at once.
func TestPackBQuantLayout(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(31, 32))
		cases := []struct{ bits, block, k, n int }{
			{4, 32, 300, 70}, {4, 16, 17, 33}, {4, 512, 600, 40}, {4, 64, 1, 1},
			{8, 32, 260, 530}, {8, 128, 100, 31}, {2, 16, 300, 65}, {2, 64, 513, 9},
		}
		for _, tc := range cases {
			w, deq := randQuant(r, tc.bits, tc.block, tc.k, tc.n)
			qb, err := PackBQuant(w)
			if err != nil {
				t.Fatal(err)
			}
			fb, err := PackB(true, tc.k, tc.n, deq, tc.k)
			if err != nil {
				t.Fatal(err)
			}
			ks := active()
			for jb := 0; jb*ncBlock < tc.n; jb++ {
				width := min(ncBlock, roundUp(tc.n-jb*ncBlock, packNR))
				for l0 := 0; l0 < tc.k; l0 += kcBlock {
					kc := min(kcBlock, tc.k-l0)
					want := fb.slab(jb, l0, kc)
					got := make([]float32, kc*packNR)
					for jr := 0; jr < width; jr += packNR {
						qb.widenQuant(ks, got, jb, l0, kc, jr)
						for i, v := range got {
							if math.Float32bits(v) != math.Float32bits(want[jr*kc+i]) {
								t.Fatalf("%+v slab (%d, %d) sliver %d value %d: %v, want %v", tc, jb, l0, jr, i, v, want[jr*kc+i])
							}
						}
					}
				}
			}
		}
	})
}

// edgeScalesZeros returns a sliver's scales and zeros (zeros below zmax)
// with NaN, infinite and subnormal values among them.
func edgeScalesZeros(r *rand.Rand, zmax int) (s, z [packNR]float32) {
	for i := range s {
		s[i] = float32(r.NormFloat64())
		z[i] = float32(r.IntN(zmax))
	}
	s[3], s[17], s[30] = float32(math.NaN()), float32(math.Inf(1)), 1e-45
	z[5], z[20] = float32(math.Inf(-1)), float32(math.NaN())
	return s, z
}

// TestDequantKernels checks each path's dequant kernel against dequantGo
// bit for bit, with non-finite and subnormal scales and zeros among them.
func TestDequantKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	s, z := edgeScalesZeros(r, 256)
	withPath(t, func(t *testing.T) {
		ks := active()
		for _, nibbles := range []bool{false, true} {
			for _, rows := range []int{0, 1, 2, 5, 33} {
				rb := packNR
				if nibbles {
					rb = packNR / 2
				}
				src := make([]byte, rows*rb)
				for i := range src {
					src[i] = byte(r.Uint32())
				}
				want := make([]float32, rows*packNR)
				got := make([]float32, rows*packNR)
				dequantGo(nibbles, want, src, &s, &z)
				ks.dequant(nibbles, got, src, &s, &z)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(want[i] != want[i] && got[i] != got[i]) {
						t.Fatalf("nibbles %v rows %d value %d: %v, want %v", nibbles, rows, i, got[i], want[i])
					}
				}
			}
		}
	})
}

// TestSgemmPackedQuant checks products with quantized packs against the
// naive loop over the dequantized weight: decode-shaped rows (a sliver at a
// time) and longer products (the blocked algorithm dequantizing each
// k-block), sizes crossing the sliver, column and inner-dimension blocks.
func TestSgemmPackedQuant(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(35, 36))
		sizes := [][3]int{{1, 33, 17}, {1, 600, 700}, {2, 1, 300}, {3, 530, 257}, {4, 64, 1}, {9, 1100, 520}, {70, 40, 300}}
		if testing.Short() || raceEnabled {
			sizes = [][3]int{{1, 33, 17}, {1, 40, 300}, {3, 40, 257}, {9, 40, 300}}
		}
		for _, bits := range []int{2, 4, 8} {
			for _, sz := range sizes {
				m, n, k := sz[0], sz[1], sz[2]
				block := 16 << (m % 3)
				w, deq := randQuant(r, bits, block, k, n)
				pb, err := PackBQuant(w)
				if err != nil {
					t.Fatal(err)
				}
				a := randSlice(r, m*k)
				c := randSlice(r, m*n)
				want := append([]float32(nil), c...)
				naive(false, true, m, n, k, 0.5, a, k, deq, k, 0.25, want, n)
				if err := SgemmPacked(2, false, m, 0.5, a, k, pb, 0.25, c, n); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if d := c[i] - want[i]; d > 1e-4*float32(k) || -d > 1e-4*float32(k) {
						t.Fatalf("bits %d m%d n%d k%d block %d: C[%d] = %v, want %v", bits, m, n, k, block, i, c[i], want[i])
					}
				}
			}
		}
	})
}

// TestPackBQuantBytes: a 4-bit pack with groups of 32 takes 3/16 of the
// float32 pack's bytes (a half byte a value, two float32 per 32 values),
// an 8-bit one 5/16.
func TestPackBQuantBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 38))
	for _, tc := range []struct{ bits, num int }{{4, 3}, {8, 5}} {
		w, deq := randQuant(r, tc.bits, 32, 512, 512)
		q, err := PackBQuant(w)
		if err != nil {
			t.Fatal(err)
		}
		f, err := PackB(true, 512, 512, deq, 512)
		if err != nil {
			t.Fatal(err)
		}
		if q.Bytes()*16 != f.Bytes()*tc.num || f.Bytes() != 4*512*512 {
			t.Fatalf("%d bits: %d bytes against float32 %d, want %d/16", tc.bits, q.Bytes(), f.Bytes(), tc.num)
		}
		if int64(q.Bytes()) != PackQuantBytes(512, 512, tc.bits, 32) || int64(f.Bytes()) != PackBytes(512, 512, 4) {
			t.Fatalf("%d bits: the size functions say %d and %d", tc.bits, PackQuantBytes(512, 512, tc.bits, 32),
				PackBytes(512, 512, 4))
		}
	}
}

func TestPackBQuantErrors(t *testing.T) {
	ok := QuantB{Bits: 4, Block: 16, K: 20, N: 3, Q: make([]byte, 3*2*8), Scales: make([]float32, 6), Zeros: make([]float32, 6)}
	if _, err := PackBQuant(ok); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for name, mod := range map[string]func(w *QuantB){
		"bits 3":        func(w *QuantB) { w.Bits = 3 },
		"block 0":       func(w *QuantB) { w.Block = 0 },
		"block 3 at 2b": func(w *QuantB) { w.Bits, w.Block = 2, 3 },
		"negative K":    func(w *QuantB) { w.K = -1 },
		"short Q":       func(w *QuantB) { w.Q = w.Q[:47] },
		"short scales":  func(w *QuantB) { w.Scales = w.Scales[:5] },
		"short zeros":   func(w *QuantB) { w.Zeros = nil },
	} {
		w := ok
		mod(&w)
		if _, err := PackBQuant(w); !errors.Is(err, ErrShape) {
			t.Errorf("%s: err %v, want ErrShape", name, err)
		}
	}
	empty := QuantB{Bits: 4, Block: 32}
	pb, err := PackBQuant(empty)
	if err != nil || pb.K() != 0 || pb.N() != 0 {
		t.Fatalf("empty: %v %v", pb, err)
	}
}

// BenchmarkDecodeStepQuant is BenchmarkDecodeStepPacked's decode step with
// 4-bit weights (groups of 32) against the float32 pack of the same
// dequantized weights, side by side: ns per step, and MB/s of the
// float32 weight size in both (so the figures compare as speed).
func BenchmarkDecodeStepQuant(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	var qs, fs []*PackedB
	total := 0
	for _, s := range decodeStep {
		w, deq := randQuant(r, 4, 32, s[0], s[1])
		q, err := PackBQuant(w)
		if err != nil {
			b.Fatal(err)
		}
		f, err := PackB(true, s[0], s[1], deq, s[0])
		if err != nil {
			b.Fatal(err)
		}
		qs, fs = append(qs, q), append(fs, f)
		total += 4 * s[0] * s[1]
	}
	a := randSlice(r, 16*2816)
	c := make([]float32, 16*32000)
	for _, m := range []int{1, 4, 16} {
		for _, threads := range []int{1, 2} {
			for _, kind := range []string{"int4", "float32"} {
				b.Run(fmt.Sprintf("m%d/threads%d/%s", m, threads, kind), func(b *testing.B) {
					packs := qs
					if kind == "float32" {
						packs = fs
					}
					b.SetBytes(int64(total))
					for b.Loop() {
						for i, s := range decodeStep {
							if err := SgemmPacked(threads, false, m, 1, a, s[0], packs[i], 0, c, s[1]); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}

// BenchmarkDequant is the dequant kernel alone on one group of 32 rows of
// a sliver (L1-resident), every path.
func BenchmarkDequant(b *testing.B) {
	var s, z [packNR]float32
	for i := range s {
		s[i], z[i] = 0.5, 8
	}
	src := make([]byte, 32*packNR)
	dst := make([]float32, 32*packNR)
	defer SetPath(Path())
	for _, nibbles := range []bool{true, false} {
		for _, path := range Paths() {
			b.Run(fmt.Sprintf("nibbles%v/%s", nibbles, path), func(b *testing.B) {
				SetPath(path)
				ks := active()
				b.SetBytes(int64(len(dst)))
				for b.Loop() {
					ks.dequant(nibbles, dst, src, &s, &z)
				}
			})
		}
	}
}

// TestSgemmPackedQuantNoAllocs: a decode-shaped product (one and four rows,
// one thread) with a quantized pack allocates nothing.
func TestSgemmPackedQuantNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(39, 40))
		w, _ := randQuant(r, 4, 32, 300, 100)
		pb, err := PackBQuant(w)
		if err != nil {
			t.Fatal(err)
		}
		a, c := randSlice(r, 4*300), make([]float32, 4*100)
		for _, m := range []int{1, 4} {
			run := func() {
				if err := SgemmPacked(1, false, m, 1, a, 300, pb, 0, c, 100); err != nil {
					t.Fatal(err)
				}
			}
			run()
			if allocs := testing.AllocsPerRun(20, run); allocs != 0 {
				t.Errorf("m %d: %v allocations per product, want 0", m, allocs)
			}
		}
	})
}
