//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"math/rand/v2"
	"simd/archsimd"
	"slices"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// randQmat draws n quantized rows of d elements with per-token scales over
// groups of g (scaled) or raw integers.
func randQmat(rng *rand.Rand, f cache.QuantFormat, n, d, g int, scaled bool) qmat {
	m := qmat{f: f, rb: f.RowBytes(d), b: make([]byte, n*f.RowBytes(d))}
	for i := range m.b {
		m.b[i] = byte(rng.Uint32())
	}
	if scaled {
		m.g, m.ng = g, d/g
		m.s = randVec(rng, n*m.ng, 0.05)
		if f == cache.QuantInt4 {
			m.z = randVec(rng, n*m.ng, 0.5)
		}
	}
	return m
}

// TestQuantAsmOps checks every assembly loop over quantized rows against
// the portable twin (the same dequantization, float32 sums in another
// order) on head dims, groups and token counts around their steps, and
// that the shapes the assembly claims do run in assembly.
func TestQuantAsmOps(t *testing.T) {
	type isa struct {
		name string
		a    *quantAsm
	}
	var isas []isa
	for _, k := range kernelVariants {
		switch k {
		case &avx512Ops:
			isas = append(isas, isa{"avx512", &quantAsm512})
		case &avx2Ops:
			isas = append(isas, isa{"avx2", &quantAsmAVX2})
		}
	}
	if len(isas) == 0 {
		t.Skip("no SIMD path on this CPU")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	alpha := [4]float32{0.5, 1, 0, 2}
	for _, is := range isas {
		for _, f := range quantFormats {
			// (48 and 80: the AVX2 one-row loop's 16-column blocks; the others its
			// 32-column ones)
			for _, d := range []int{32, 48, 64, 80, 96, 128, 192, 256} {
				for _, g := range []int{32, 64, d} {
					if d%g != 0 {
						continue
					}
					for _, n := range []int{1, 2, 5, 33} {
						for _, scaled := range []bool{false, true} {
							k := randQmat(rng, f, n, d, g, scaled)
							q := randVec(rng, 4*d, 1)
							for _, rows := range []int{1, 4} {
								want, got := make([]float32, rows*n), make([]float32, rows*n)
								if rows == 4 {
									goQDots4(want, q, k, d)
								} else {
									goQDots(want, q, k, d)
								}
								if ok := is.a.dots(rows, got, q, k, d, 64); ok != (d%32 == 0 && g%32 == 0) {
									t.Fatalf("%s dots%d %s d=%d g=%d: taken by the assembly %v", is.name, rows, f, d, g, ok)
								} else if !ok {
									continue
								}
								mag := qdotMags(q, k, d, rows, n)
								for i := range want {
									if !closeToMag(got[i], want[i], mag[i]) {
										t.Fatalf("%s dots%d %s d=%d g=%d n=%d scaled=%v: s[%d] = %v, want %v",
											is.name, rows, f, d, g, n, scaled, i, got[i], want[i])
									}
								}
							}
						}
						v := randQmat(rng, f, n, d, g, true)
						p := randVec(rng, 4*n, 1)
						acc0 := randVec(rng, 4*d, 1)
						for _, rows := range []int{1, 4} {
							wa := append([]float32(nil), acc0[:rows*d]...)
							ga := append([]float32(nil), acc0[:rows*d]...)
							if rows == 4 {
								goQAxpy4(wa, p, v, &alpha)
							} else {
								goQAxpy(wa, p[:n], v, alpha[0])
							}
							ok := is.a.axpy(rows, ga, p[:rows*n], v, &alpha, 64)
							if want := d%is.a.cb == 0 && g%is.a.vg == 0; ok != want {
								t.Fatalf("%s axpy%d %s d=%d g=%d: assembly taken %v, want %v", is.name, rows, f, d, g, ok, want)
							}
							if !ok {
								continue
							}
							for i := range wa {
								if !closeToMag(ga[i], wa[i], float64(n)*40) {
									t.Fatalf("%s axpy%d %s d=%d g=%d n=%d: acc[%d] = %v, want %v",
										is.name, rows, f, d, g, n, i, ga[i], wa[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// closeToMag is closeTo with an absolute slack for sums whose terms are
// much larger than the result: 1e-6 of mag, the sum of the terms' magnitudes.
func closeToMag(got, want float32, mag float64) bool {
	return math.Abs(float64(got)-float64(want)) <= 1e-5*(1+math.Abs(float64(want)))+1e-6*mag
}

// qdotMags returns sum_j |q_rj * x_tj| for every score of a dots call.
func qdotMags(q []float32, k qmat, d, rows, n int) []float64 {
	out := make([]float64, rows*n)
	x := make([]float32, d)
	for t := 0; t < n; t++ {
		goQRow(x, k, t, d)
		for r := 0; r < rows; r++ {
			for j, xj := range x {
				out[r*n+t] += math.Abs(float64(q[r*d+j]) * float64(xj))
			}
		}
	}
	return out
}

// intISA is one instruction set's integer loops, installed in ops.
type intISA struct {
	name string
	ops  *quantOps
	l    *intLoops
}

// intISAs returns the instruction sets whose integer loops this CPU runs.
func intISAs(t testing.TB) []intISA {
	var out []intISA
	if quant512Ops.intDots4 != nil {
		out = append(out, intISA{"vnni", &quant512Ops, &intVNNI})
	}
	if quantAVX2Ops.intDots4 != nil {
		out = append(out, intISA{"avx2", &quantAVX2Ops, &intMaddw})
	}
	if len(out) == 0 {
		t.Skip("no integer loops on this CPU")
	}
	return out
}

// TestQuantIntDotsOps checks the integer score loops (int8 K, int4 K in
// qi16Order) of every instruction set against the same integer dots in
// scalar Go: intPrep's rounding is the only difference from float32.
func TestQuantIntDotsOps(t *testing.T) {
	for _, is := range intISAs(t) {
		testQuantIntDotsOps(t, is)
	}
}

func testQuantIntDotsOps(t *testing.T, is intISA) {
	rng := rand.New(rand.NewPCG(8, 9))
	for _, f := range quantFormats {
		for _, d := range []int{64, 128, 256} {
			if f == cache.QuantInt4 && d%128 != 0 {
				continue
			}
			for _, n := range []int{1, 2, 3, 7, 8, 9, 33} {
				k := randQmat(rng, f, n, d, d, false)
				q := randVec(rng, 4*d, 1)
				ks := randVec(rng, d, 0.02)
				qi := make([]int16, 4*d)
				var isc, ioff, sums [4]float32
				if !is.l.intPrep(qi, q, ks, f, isc[:], sums[:]) {
					t.Fatal("intPrep failed on finite input")
				}
				for r := 0; r < 4; r++ {
					sc, sum := isc[r], sums[r]
					if f == cache.QuantInt4 {
						ioff[r] = float32(r) - 1.5 // a zero term
					}
					var s32 int32
					for j := 0; j < d; j++ {
						e := j
						if f == cache.QuantInt4 {
							e = qi16Elem(j)
						}
						want := math.RoundToEven(float64(q[r*d+e] * ks[e] * (32767 / (sc * 32767))))
						if x := qi[r*d+j]; math.Abs(float64(x)-want) > 1 {
							t.Fatalf("%s d=%d row %d: qi[%d] = %d, want about %v", f, d, r, j, x, want)
						}
						s32 += int32(qi[r*d+j])
					}
					if float32(s32) != sum {
						t.Fatalf("%s d=%d row %d: sum %v, want %d", f, d, r, sum, s32)
					}
				}
				qb := quantBlock{ops: is.ops}
				p := quantPart{qi: qi, isc: isc[:], ioff: ioff[:], intOn: true}
				got := make([]float32, 4*n)
				qb.intScores(&p, got, n, 0, 4, k, n, d, 0)
				got1 := make([]float32, 4*n)
				want := make([]float32, 4*n)
				for r := 0; r < 4; r++ {
					qb.intScores(&p, got1[r*n:(r+1)*n], n, r, 1, k, n, d, 0)
					scalarIntScores(&p, want[r*n:(r+1)*n], r, k, n, d)
				}
				for i := range want {
					tol := float64(d) * 32767 * 127 * float64(isc[i/n])
					if !closeToMag(got[i], want[i], tol) || !closeToMag(got1[i], want[i], tol) {
						t.Fatalf("%s %s d=%d n=%d: s[%d] = %v (four rows), %v (one row), want %v",
							is.name, f, d, n, i, got[i], got1[i], want[i])
					}
				}
			}
		}
	}
}

// scalarIntScores is the integer score loop of row r in scalar Go: the
// dots of its int16 query row (int4: in qi16Order) with n K rows, s =
// float32(acc)*scale + offset.
func scalarIntScores(p *quantPart, s []float32, r int, k qmat, n, dk int) {
	qi := p.qi[r*dk : (r+1)*dk]
	for t := 0; t < n; t++ {
		row := k.b[t*k.rb : (t+1)*k.rb]
		var acc int32
		for j, x := range qi {
			if k.f == cache.QuantInt4 {
				e := qi16Elem(j)
				acc += int32(x) * int32(row[e/2]>>(4*(e&1))&15)
			} else {
				acc += int32(x) * int32(int8(row[j]))
			}
		}
		s[t] = float32(acc)*p.isc[r] + p.ioff[r]
	}
}

// TestQi16Order: qi16Elem is a permutation of each block of 64.
func TestQi16Order(t *testing.T) {
	seen := make([]bool, 256)
	for j := range seen {
		e := qi16Elem(j)
		if e < 0 || e >= 256 || seen[e] || e/64 != j/64 {
			t.Fatalf("position %d maps to element %d", j, e)
		}
		seen[e] = true
	}
}

// TestQuantIntAxpyOps checks the VNNI accumulation loop (vaxpy4) against
// the portable twin in float32: the weights' rounding to int16 steps of
// max_t,g p_rt*s_tg / vwMax per row is the only difference, an error of
// at most half a step times sum_t |q_tc| per element.
func TestQuantIntAxpyOps(t *testing.T) {
	for _, is := range intISAs(t) {
		testQuantIntAxpyOps(t, is.name, is.ops)
	}
}

func testQuantIntAxpyOps(t *testing.T, name string, ops *quantOps) {
	rng := rand.New(rand.NewPCG(10, 11))
	for _, f := range quantFormats {
		var ws vScratch
		if ops.vaxpy4(make([]float32, 4*64), make([]float32, 4), 1, 1, randQmat(rng, f, 1, 64, 16, true), &[4]float32{}, 0, &ws) {
			t.Errorf("%s %s: groups of 16 taken", name, f)
		}
		for _, dg := range [][2]int{{128, 32}, {128, 64}, {256, 64}, {256, 128}, {512, 128}} {
			d, g := dg[0], dg[1]
			for _, n := range []int{1, 2, 3, 7, 32, 33, 64, 200} {
				for _, ld := range []int{n, n + 5} {
					v := randQmat(rng, f, n, d, g, true)
					for i := range v.s {
						v.s[i] = 0.02 + float32(math.Abs(float64(v.s[i]))) // groups within vSpreadMax
					}
					p := make([]float32, 3*ld+n)
					for i := range p {
						p[i] = rng.Float32()
					}
					p[rng.IntN(n)] = 0 // a zero weight
					alpha := [4]float32{0.5, 1, 0, 2}
					acc0 := randVec(rng, 4*d, 1)
					got, want := slices.Clone(acc0), slices.Clone(acc0)
					if !ops.vaxpy4(got, p, ld, n, v, &alpha, 0, &ws) {
						t.Fatalf("%s %s d=%d g=%d: shape refused", name, f, d, g)
					}
					goQAxpy4Ld(want, p, ld, n, v, &alpha)
					// the rows dequantized and their integers, once per case
					x, qv := make([]float32, n*d), make([]float64, n*d)
					for tk := 0; tk < n; tk++ {
						goQRow(x[tk*d:(tk+1)*d], v, tk, d)
						for c := 0; c < d; c++ {
							if f == cache.QuantInt4 {
								qv[tk*d+c] = float64(v.b[tk*v.rb+c/2] >> (4 * (c & 1)) & 15)
							} else {
								qv[tk*d+c] = float64(int8(v.b[tk*v.rb+c]))
							}
						}
					}
					for r := 0; r < 4; r++ {
						var mx float64
						for tk := 0; tk < n; tk++ {
							for gi := 0; gi < v.ng; gi++ {
								mx = max(mx, float64(p[r*ld+tk])*float64(v.s[tk*v.ng+gi]))
							}
						}
						for c := 0; c < d; c++ {
							var sq, mag float64
							for tk := 0; tk < n; tk++ {
								sq += math.Abs(qv[tk*d+c])
								mag += math.Abs(float64(p[r*ld+tk]) * float64(x[tk*d+c]))
							}
							bound := 0.5*mx/vwMax*sq*1.001 + 1e-5*(1+math.Abs(float64(want[r*d+c]))) + 1e-6*(mag+math.Abs(float64(acc0[r*d+c])))
							if e := math.Abs(float64(got[r*d+c]) - float64(want[r*d+c])); !(e <= bound) {
								t.Fatalf("%s %s d=%d g=%d n=%d ld=%d: acc[%d][%d] = %v, want %v (bound %.3g)", name, f, d, g, n, ld, r, c, got[r*d+c], want[r*d+c], bound)
							}
						}
					}
				}
			}
		}
	}
}

// TestQuantIntPrepRows: intPrep over a row count that is not a multiple of
// four (the four-row and one-row loops) gives every row what it gives
// alone.
func TestQuantIntPrepRows(t *testing.T) {
	for _, is := range intISAs(t) {
		testQuantIntPrepRows(t, is)
	}
}

func testQuantIntPrepRows(t *testing.T, is intISA) {
	intPrep := is.l.intPrep
	rng := rand.New(rand.NewPCG(12, 13))
	for _, f := range quantFormats {
		const d, rows = 128, 7
		q := randVec(rng, rows*d, 1)
		ks := randVec(rng, d, 0.02)
		qi := make([]int16, rows*d)
		sc, sum := make([]float32, rows), make([]float32, rows)
		if !intPrep(qi, q, ks, f, sc, sum) {
			t.Fatal("intPrep failed on finite input")
		}
		for r := 0; r < rows; r++ {
			qi1 := make([]int16, d)
			var sc1, sum1 [1]float32
			if !intPrep(qi1, q[r*d:(r+1)*d], ks, f, sc1[:], sum1[:]) {
				t.Fatal("intPrep failed on finite input")
			}
			if sc1[0] != sc[r] || sum1[0] != sum[r] || !slices.Equal(qi1, qi[r*d:(r+1)*d]) {
				t.Fatalf("%s %s row %d of %d differs from the row alone", is.name, f, r, rows)
			}
		}
	}
}

// TestQuantSumSq2 checks scalesSafe's sums of squares (AVX-512, AVX2)
// against a float64 reference over run lengths around the 16- and 8-lane
// steps (empty runs and tails included), and that a non-finite or huge
// (2^64 or more) value anywhere makes the sum non-finite.
func TestQuantSumSq2(t *testing.T) {
	type impl struct {
		name string
		fn   func(a, b []float32) float32
	}
	var impls []impl
	if archsimd.X86.AVX512() {
		impls = append(impls, impl{"avx512", sumsq2avx512})
	}
	if archsimd.X86.AVX2() && archsimd.X86.FMA() {
		impls = append(impls, impl{"avx2", sumsq2avx2})
	}
	if len(impls) == 0 {
		t.Skip("no AVX2 or AVX-512")
	}
	rng := rand.New(rand.NewPCG(14, 15))
	for _, im := range impls {
		for _, tc := range []struct{ na, nb int }{
			{0, 0}, {0, 5}, {1, 0}, {7, 9}, {15, 16}, {16, 17}, {31, 33}, {128, 128}, {128, 20}, {200, 3},
		} {
			a, b := randVec(rng, tc.na, 2), randVec(rng, tc.nb, 2)
			var want float64
			for _, x := range slices.Concat(a, b) {
				want += float64(x) * float64(x)
			}
			got := im.fn(a, b)
			if math.Abs(float64(got)-want) > 1e-5*want+1e-30 {
				t.Errorf("%s na %d nb %d: got %g, want %g", im.name, tc.na, tc.nb, got, want)
			}
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1)), 1 << 64} {
				for i := range tc.na + tc.nb {
					x := slices.Concat(a, b)
					x[i] = bad
					if s := im.fn(x[:tc.na], x[tc.na:]); s-s == 0 {
						t.Fatalf("%s na %d nb %d: %g at %d: sum %g is finite", im.name, tc.na, tc.nb, bad, i, s)
					}
				}
			}
		}
	}
}

// TestQuantIntPrepFails: intPrep refuses a row whose products are not
// finite or whose scale leaves float32's normal range, and takes a row of
// zeros (scale 0, every integer 0).
func TestQuantIntPrepFails(t *testing.T) {
	for _, is := range intISAs(t) {
		testQuantIntPrepFails(t, is)
	}
}

func testQuantIntPrepFails(t *testing.T, is intISA) {
	const d = 128
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, f := range quantFormats {
		for _, rows := range []int{2, 5} { // the one-row loop, the four-row one
			for _, tc := range []struct {
				name string
				x    float32 // q[1][5] (the second of two rows)
				ok   bool
			}{
				{"finite", 0.5, true},
				{"NaN", nan, false},
				{"Inf", inf, false},
				{"product overflows", 3e38, false},
				{"denormal", 1e-44, false},
				{"inverse overflows", 1e-38, false},
				{"zeros", 0, true},
			} {
				q := make([]float32, rows*d)
				ks := make([]float32, d)
				for i := range ks {
					ks[i] = 1
					q[i] = float32(i%7) - 3
				}
				ks[5] = 10
				q[d+5] = tc.x
				qi := make([]int16, rows*d)
				sc, sum := make([]float32, rows), make([]float32, rows)
				if got := is.l.intPrep(qi, q, ks, f, sc, sum); got != tc.ok {
					t.Fatalf("%s %s %s rows %d: intPrep = %v, want %v", is.name, f, tc.name, rows, got, tc.ok)
				}
				if !tc.ok {
					continue
				}
				row0 := float32(20) / 32767 // |q[5]*ks[5]| = 2*10
				var wantSc float32
				if tc.name == "finite" {
					wantSc = 5 / float32(32767) // |0.5*10| = 5 of the second row
				}
				if sc[1] != wantSc || sc[0] != row0 {
					t.Fatalf("%s %s: scales %v, want [%v %v]", f, tc.name, sc, row0, wantSc)
				}
				if tc.name == "zeros" && (sum[1] != 0 || slices.ContainsFunc(qi[d:2*d], func(x int16) bool { return x != 0 })) {
					t.Fatalf("%s: a row of zeros gave sum %v, integers %v", f, sum[1], qi[d:2*d])
				}
			}
		}
	}
}

// intExtremes fills the K or V bytes b of format f with one of the
// patterns that push the integer loops' int16 steps to their limits: the
// largest and smallest int8 values (-128 included, though the cache never
// stores it), zeros, int4 nibbles of 15, or random bytes (pattern 0).
func intExtremes(rng *rand.Rand, b []byte, f cache.QuantFormat, pattern int) {
	for i := range b {
		switch pattern {
		case 0:
			b[i] = byte(rng.Uint32())
		case 1:
			b[i] = 0x7f // int8 127; int4 15, 7
		case 2:
			b[i] = 0x80 // int8 -128; int4 0, 8
		case 3:
			b[i] = 0xff // int8 -1; int4 15, 15
		case 4:
			b[i] = 0
		case 5: // +-127 (int8), 15 and 0 (int4) at random
			if f == cache.QuantInt4 {
				b[i] = []byte{0xff, 0x0f, 0xf0, 0x00}[rng.IntN(4)]
			} else {
				b[i] = []byte{0x7f, 0x81}[rng.IntN(2)]
			}
		}
	}
}

// TestQuantIntBitIdentical checks that every instruction set's integer
// loops give bit for bit what the first one (VNNI where present) gives:
// intPrep's integers, scales and sums, the scores of intDots4 (and their
// integers exactly, against scalar Go, with scale 1 and offset 0: no int16
// saturation), and vaxpy4's accumulators, over int8/int4, head dims 64-512,
// the one-row loops (intDots1, vaxpy1) against the four-row ones' rows,
// V groups of two and four a row, token counts around the two-token and
// four-token steps, padded score rows and extreme values (+-127, -128, 0,
// 15 and query rows whose every element rounds to +-32767).
func TestQuantIntBitIdentical(t *testing.T) {
	isas := intISAs(t)
	rng := rand.New(rand.NewPCG(16, 17))
	same := func(a, b []float32) int {
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
				return i
			}
		}
		return -1
	}
	for _, f := range quantFormats {
		for _, d := range []int{64, 128, 256} {
			if f == cache.QuantInt4 && d%128 != 0 {
				continue
			}
			for pat := 0; pat < 6; pat++ {
				for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33} {
					k := randQmat(rng, f, n, d, d, false)
					intExtremes(rng, k.b, f, pat)
					q := randVec(rng, 4*d, 1)
					if pat >= 4 { // every q*ks of a row the same magnitude: all +-32767
						for i := range q {
							q[i] = float32(1 - 2*rng.IntN(2))
						}
					}
					ks := randVec(rng, d, 0.02)
					if pat >= 4 {
						for i := range ks {
							ks[i] = 0.02
						}
					}
					ld := n + pat%2*3
					var ref []float32
					var refQi []int16
					var refSc, refSum [4]float32
					for ii, is := range isas {
						qi := make([]int16, 4*d)
						var isc, ioff, sums [4]float32
						if !is.l.intPrep(qi, q, ks, f, isc[:], sums[:]) {
							t.Fatalf("%s: intPrep failed on finite input", is.name)
						}
						if ii == 0 {
							refQi, refSc, refSum = qi, isc, sums
						} else if !slices.Equal(qi, refQi) || isc != refSc || sums != refSum {
							t.Fatalf("%s %s d=%d pattern %d: intPrep differs from %s", is.name, f, d, pat, isas[0].name)
						}
						if f == cache.QuantInt4 {
							for r := range ioff {
								ioff[r] = float32(r) - 1.5
							}
						}
						qb := quantBlock{ops: is.ops}
						p := quantPart{qi: qi, isc: isc[:], ioff: ioff[:], intOn: true}
						got := make([]float32, 3*ld+n)
						qb.intScores(&p, got, ld, 0, 4, k, n, d, 0)
						if ii == 0 {
							ref = slices.Clone(got)
						} else if i := same(got, ref); i >= 0 {
							t.Fatalf("%s %s d=%d n=%d pattern %d: s[%d] = %v, %s %v", is.name, f, d, n, pat, i, got[i], isas[0].name, ref[i])
						}
						// one row at a time (intDots1): the same bits
						for r := 0; r < 4; r++ {
							one := make([]float32, n)
							qb.intScores(&p, one, ld, r, 1, k, n, d, 0)
							if i := same(one, got[r*ld:r*ld+n]); i >= 0 {
								t.Fatalf("%s %s d=%d n=%d pattern %d: row %d one-row s[%d] = %v, four-row %v",
									is.name, f, d, n, pat, r, i, one[i], got[r*ld+i])
							}
						}
						// the integers themselves: scale 1, offset 0
						p.isc, p.ioff = []float32{1, 1, 1, 1}, make([]float32, 4)
						qb.intScores(&p, got, ld, 0, 4, k, n, d, 0)
						for r := 0; r < 4; r++ {
							one := make([]float32, n)
							qb.intScores(&p, one, ld, r, 1, k, n, d, 0)
							if i := same(one, got[r*ld:r*ld+n]); i >= 0 {
								t.Fatalf("%s %s d=%d n=%d pattern %d: row %d one-row integer %v, four-row %v",
									is.name, f, d, n, pat, r, one[i], got[r*ld+i])
							}
						}
						for r := 0; r < 4; r++ {
							for tk := 0; tk < n; tk++ {
								var want int
								for j := 0; j < d; j++ {
									x := int(qi[r*d+j])
									if f == cache.QuantInt4 {
										e := qi16Elem(j)
										want += x * int(k.b[tk*k.rb+e/2]>>(4*(e&1))&15)
									} else {
										want += x * int(int8(k.b[tk*k.rb+j]))
									}
								}
								if got[r*ld+tk] != float32(want) {
									t.Fatalf("%s %s d=%d n=%d pattern %d: row %d token %d integer %v, want %d",
										is.name, f, d, n, pat, r, tk, got[r*ld+tk], want)
								}
							}
						}
					}
				}
			}
		}
		for _, dg := range [][2]int{{128, 32}, {128, 64}, {256, 64}, {256, 128}, {512, 128}} {
			d, g := dg[0], dg[1]
			for pat := 0; pat < 6; pat++ {
				for _, n := range []int{1, 2, 3, 5, 6, 7, 32, 33, 64} {
					ld := n + pat%2*5
					v := randQmat(rng, f, n, d, g, true)
					intExtremes(rng, v.b, f, pat)
					for i := range v.s {
						v.s[i] = 0.02 + float32(math.Abs(float64(v.s[i]))) // groups within vSpreadMax
					}
					p := make([]float32, 3*ld+n)
					for i := range p {
						p[i] = rng.Float32()
					}
					p[rng.IntN(n)] = 0
					p[rng.IntN(n)] = 1
					alpha := [4]float32{0.5, 1, 0, 2}
					acc0 := randVec(rng, 4*d, 1)
					var ref []float32
					for ii, is := range isas {
						var ws vScratch
						got := slices.Clone(acc0)
						if !is.ops.vaxpy4(got, p, ld, n, v, &alpha, 0, &ws) {
							t.Fatalf("%s %s d=%d g=%d: shape refused", is.name, f, d, g)
						}
						if ii == 0 {
							ref = slices.Clone(got)
						} else if i := same(got, ref); i >= 0 {
							t.Fatalf("%s %s d=%d g=%d n=%d pattern %d: acc[%d] = %v, %s %v", is.name, f, d, g, n, pat, i, got[i], isas[0].name, ref[i])
						}
						// one row at a time (vaxpy1, int4 only): row r's bits of vaxpy4
						for r := 0; r < 4; r++ {
							one := slices.Clone(acc0[r*d : (r+1)*d])
							a1 := [4]float32{alpha[r]}
							ok := is.ops.vaxpy1(one, p[r*ld:r*ld+n], n, v, &a1, 0, &ws)
							if ok != (f == cache.QuantInt4) {
								t.Fatalf("%s %s d=%d g=%d: vaxpy1 took the shape: %v", is.name, f, d, g, ok)
							}
							if ok {
								if i := same(one, got[r*d:(r+1)*d]); i >= 0 {
									t.Fatalf("%s %s d=%d g=%d n=%d pattern %d: row %d one-row acc[%d] = %v, four-row %v",
										is.name, f, d, g, n, pat, r, i, one[i], got[r*d+i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkQuantIntLoops times each instruction set's integer loops on
// one chunk in L1 (32 tokens, head dim 128, four query rows, V groups of
// 32): intPrep, intDots4 and vaxpy4, ns/tok per token of the chunk.
func BenchmarkQuantIntLoops(b *testing.B) {
	const d, n = 128, 32
	rng := rand.New(rand.NewPCG(1, 2))
	for _, is := range intISAs(b) {
		for _, f := range quantFormats {
			k := randQmat(rng, f, n, d, d, false)
			q, ks := randVec(rng, 4*d, 1), randVec(rng, d, 0.02)
			qi := make([]int16, 4*d)
			var isc, sums [4]float32
			var aff [24]float32
			s := make([]float32, 4*n)
			v := randQmat(rng, f, n, d, 32, true)
			p := make([]float32, 4*n)
			for i := range p {
				p[i] = rng.Float32()
			}
			acc := make([]float32, 4*d)
			var ws vScratch
			alpha := [4]float32{1, 1, 1, 1}
			for _, loop := range []struct {
				name string
				fn   func()
			}{
				{"prep", func() { is.l.intPrep(qi, q, ks, f, isc[:], sums[:]) }},
				{"dots", func() { is.l.intDots4(s, n, n, qi, k, d, &aff, 0) }},
				{"vaxpy", func() { is.l.vaxpy4(acc, p, n, n, v, &alpha, 0, &ws) }},
			} {
				b.Run(is.name+"/"+f.String()+"/"+loop.name, func(b *testing.B) {
					for b.Loop() {
						loop.fn()
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/tok")
				})
			}
		}
	}
}

// TestQuantMax4 checks max4 (both instruction sets) against maxOf's
// contract row by row: the largest score, exactly, or NaN when a score of
// the row is NaN or infinite, on lengths around the vector widths, with
// the non-finite score at every position of one row and rows ld apart.
func TestQuantMax4(t *testing.T) {
	type impl struct {
		name string
		fn   func(s []float32, ld, n int, m *[4]float32)
	}
	var impls []impl
	if archsimd.X86.AVX512() {
		impls = append(impls, impl{"avx512", max4avx512})
	}
	if archsimd.X86.AVX2() && archsimd.X86.FMA() {
		impls = append(impls, impl{"avx2", max4avx2})
	}
	if len(impls) == 0 {
		t.Skip("no AVX2 or AVX-512")
	}
	rng := rand.New(rand.NewPCG(16, 17))
	want := func(row []float32) float32 {
		m := row[0]
		for _, x := range row {
			if x-x != 0 {
				return float32(math.NaN())
			}
			m = max(m, x)
		}
		return m
	}
	for _, im := range impls {
		for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 100, 512} {
			for _, pad := range []int{0, 3} {
				ld := n + pad
				s := randVec(rng, 4*ld, 8)
				for i := range s {
					s[i] -= 20 // every score negative: no accidental 0 maximum
					if i%ld >= n {
						s[i] = 1000 // between the rows: never read
					}
				}
				check := func(what string) {
					t.Helper()
					var m [4]float32
					im.fn(s, ld, n, &m)
					for r := 0; r < 4; r++ {
						w := want(s[r*ld : r*ld+n])
						if g := m[r]; !(g == w || (g != g && w != w)) {
							t.Fatalf("%s n %d ld %d %s: row %d got %g, want %g", im.name, n, ld, what, r, g, w)
						}
					}
				}
				check("finite")
				for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
					r := rng.IntN(4)
					for i := 0; i < n; i++ {
						old := s[r*ld+i]
						s[r*ld+i] = bad
						check("non-finite")
						s[r*ld+i] = old
					}
				}
			}
		}
	}
}

// TestQuantIntPrepAff checks intPrepAff (AVX-512 VNNI) against intPrep and
// quantPart's Go steps it replaces: the same integers, scales and offsets
// bit for bit (int8: 0; int4: the float query rows dotted with
// the channel zeros as the AVX-512 ops.dots does), and the argument blocks
// laid out as intScores builds them; rows 4 to 12, head dims 64 to 256
// (int4: 128), and refusal where a row fails.
func TestQuantIntPrepAff(t *testing.T) {
	if quant512Ops.intPrepAff == nil {
		t.Skip("no AVX-512 VNNI")
	}
	rng := rand.New(rand.NewPCG(18, 19))
	for _, f := range quantFormats {
		for _, d := range []int{64, 128, 256} {
			if f == cache.QuantInt4 && d != 128 {
				continue
			}
			for _, rows := range []int{4, 8, 12} {
				q, ks, kz := randVec(rng, rows*d, 1), randVec(rng, d, 0.05), randVec(rng, d, 0.5)
				qi, qi2 := make([]int16, rows*d), make([]int16, rows*d)
				sc, sc2, off, sum := make([]float32, rows), make([]float32, rows), make([]float32, rows), make([]float32, rows)
				aff := make([]float32, rows/4*24)
				if !quant512Ops.intPrepAff(qi, q, ks, kz, f, sc, off, aff) || !quant512Ops.intPrep(qi2, q, ks, f, sc2, sum) {
					t.Fatalf("%s d=%d rows %d: prep failed on finite input", f, d, rows)
				}
				if !slices.Equal(qi, qi2) || !slices.Equal(sc, sc2) {
					t.Fatalf("%s d=%d rows %d: integers or scales differ from intPrep", f, d, rows)
				}
				for r := 0; r < rows; r++ {
					if f == cache.QuantInt8 {
						if off[r] != 0 {
							t.Fatalf("%s d=%d rows %d: row %d offset %v, want 0", f, d, rows, r, off[r])
						}
						continue
					}
					// ops.dots's sums over the rows, as quantPart calls it, bit for bit
					want := make([]float32, rows)
					avx512Ops.dots(want, kz, q, d, 0)
					if off[r] != want[r] {
						t.Fatalf("%s d=%d rows %d: row %d offset %v, want %v", f, d, rows, r, off[r], want[r])
					}
				}
				for j := 0; j < rows; j += 4 {
					c, o := sc[j:j+4], off[j:j+4]
					want := []float32{c[0], c[0], c[1], c[1], c[2], c[2], c[3], c[3], o[0], o[0], o[1], o[1], o[2], o[2], o[3], o[3],
						c[0], c[1], c[2], c[3], o[0], o[1], o[2], o[3]}
					if got := aff[j/4*24 : j/4*24+24]; !slices.Equal(got, want) {
						t.Fatalf("%s d=%d rows %d: argument block %d = %v, want %v", f, d, rows, j/4, got, want)
					}
				}
				q[(rows-1)*d+3] = float32(math.Inf(1))
				if quant512Ops.intPrepAff(qi, q, ks, kz, f, sc, off, aff) {
					t.Fatalf("%s d=%d rows %d: an infinite query element was taken", f, d, rows)
				}
			}
		}
	}
}

// TestVGroupsEven checks the group-spread rule of the integer accumulation
// loop: the ratio of the groups' largest |scale| against vSpreadMax, zero
// groups aside, NaN refused, over row counts with and without an 8-lane
// tail.
func TestVGroupsEven(t *testing.T) {
	nan := float32(math.NaN())
	for _, ng := range []int{2, 4} {
		for _, n := range []int{1, 2, 3, 5, 32, 33} {
			for _, tc := range []struct {
				name string
				set  func(vs []float32)
				want bool
			}{
				{"equal", func([]float32) {}, true},
				{"x31", func(vs []float32) { vs[(n-1)*ng] *= 31 }, true},
				{"x33", func(vs []float32) { vs[(n-1)*ng+1] *= 33 }, false},
				{"negative x33", func(vs []float32) { vs[ng-1] *= -33 }, false},
				{"zero group", func(vs []float32) {
					for t := 0; t < n; t++ {
						vs[t*ng+1] = 0
					}
				}, true},
				{"tiny group", func(vs []float32) {
					for t := 0; t < n; t++ {
						vs[t*ng] = 1e-30
					}
				}, false},
				{"NaN", func(vs []float32) { vs[n*ng-1] = nan }, false},
			} {
				vs := make([]float32, n*ng)
				for i := range vs {
					vs[i] = 1
				}
				tc.set(vs)
				if got := vGroupsEven(vs, ng); got != tc.want {
					t.Errorf("ng %d n %d %s: vGroupsEven = %v, want %v", ng, n, tc.name, got, tc.want)
				}
			}
		}
	}
}

// TestQuantIntAxpyRefuses: vaxpy4 (every instruction set) refuses, leaving
// acc as it was, V whose groups' scales lie too far apart and weights times
// scales so small that the int16 steps would not be normal floats; the
// float loop then takes the part.
func TestQuantIntAxpyRefuses(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 21))
	const d, n = 128, 33
	for _, is := range intISAs(t) {
		for _, f := range quantFormats {
			for _, tc := range []struct {
				name string
				set  func(v *qmat)
				ok   bool
			}{
				{"ordinary", func(*qmat) {}, true},
				{"group 0 x100", func(v *qmat) {
					for t := 0; t < n; t++ {
						v.s[t*v.ng] *= 100
					}
				}, false},
				{"tiny scales", func(v *qmat) {
					for i := range v.s {
						v.s[i] *= 1e-36
					}
				}, false},
			} {
				v := randQmat(rng, f, n, d, 32, true)
				for i := range v.s {
					v.s[i] = 0.01 + float32(math.Abs(float64(v.s[i])))
				}
				tc.set(&v)
				p := make([]float32, 3*n+n)
				for i := range p {
					p[i] = rng.Float32()
				}
				acc := randVec(rng, 4*d, 1)
				acc0 := slices.Clone(acc)
				alpha := [4]float32{0.5, 1, 2, 1}
				var ws vScratch
				got := is.ops.vaxpy4(acc, p, n, n, v, &alpha, 0, &ws)
				if got != tc.ok {
					t.Fatalf("%s %s %s: vaxpy4 = %v, want %v", is.name, f, tc.name, got, tc.ok)
				}
				if !got && !slices.Equal(acc, acc0) {
					t.Fatalf("%s %s %s: a refused call changed acc", is.name, f, tc.name)
				}
			}
		}
	}
}
