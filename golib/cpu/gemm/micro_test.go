package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// TestMicroKernels checks every variant's register-tile kernel alone, and
// its edge-panel kernel (microRows) for every height below mr and its
// 16-bit kernels (microHalf, float16 and bfloat16) for every height where
// it has them, against a float64 loop over the packed panels: inner
// dimensions of one, odd and even steps (the unrolled loops' tails), a
// full kcBlock, a C stride wider than the tile (untouched padding), rows
// past the tile's height untouched, alpha != 1, and with a NaN in A and an
// Inf in B (propagated as the float64 loop does).
func TestMicroKernels(t *testing.T) {
	for _, ks := range registry {
		for _, half := range []Half{-1, Float16, BFloat16} {
			if half >= 0 && ks.microHalf == nil {
				continue
			}
			for rows := 1; rows <= ks.mr; rows++ {
				if half < 0 && rows < ks.mr && ks.microRows == nil {
					continue
				}
				for _, kc := range []int{1, 2, 3, 7, 16, 255, kcBlock} {
					for _, nonFinite := range []bool{false, true} {
						t.Run(fmt.Sprintf("%s/half%d/rows%d/kc%d/nonfinite=%v", ks.name, half, rows, kc, nonFinite), func(t *testing.T) {
							checkMicro(t, ks, half, rows, kc, nonFinite)
						})
					}
				}
			}
		}
	}
}

// checkMicro runs one micro kernel case; half >= 0 selects microHalf on
// the B sliver rounded to that encoding (the reference uses the rounded
// values).
func checkMicro(t *testing.T, ks *kernels, half Half, rows, kc int, nonFinite bool) {
	r := rand.New(rand.NewPCG(uint64(kc), uint64(17+rows)))
	mr, nr := ks.mr, ks.nr
	ap, bp := randSlice(r, mr*kc), randSlice(r, nr*kc)
	if nonFinite {
		ap[(kc/2)*mr+rows-1] = float32(math.NaN()) // row rows-1: every column NaN
		bp[(kc-1)*nr+3] = float32(math.Inf(1))     // column 3: +-Inf in the other rows
		bp[(kc/2)*nr+nr-1] = float32(math.Inf(-1)) // last column likewise
	}
	var bh []uint16
	if half >= 0 {
		bh = make([]uint16, len(bp))
		for i, v := range bp {
			bh[i] = codec.F32ToF16(v)
			if half == BFloat16 {
				bh[i] = codec.F32ToBF16(v)
			}
		}
		cvt16Go(half, bp, bh)
	}
	ldc := nr + 5
	c := randSlice(r, mr*ldc)
	want := append([]float32(nil), c...)
	const alpha = -0.75
	for i := range rows {
		for j := range nr {
			var s float64
			for l := range kc {
				s += float64(ap[l*mr+i]) * float64(bp[l*nr+j])
			}
			want[i*ldc+j] = float32(float64(want[i*ldc+j]) + alpha*s)
		}
	}
	switch {
	case half >= 0:
		ks.microHalf(half, rows, kc, ap, bh, alpha, c, ldc)
	case rows == mr:
		ks.micro(kc, ap, bp, alpha, c, ldc)
	default:
		ks.microRows(rows, kc, ap, bp, alpha, c, ldc)
	}
	tol := 1e-5 * math.Sqrt(float64(kc)) * 8
	for i := range mr {
		for j := range ldc {
			g, w := c[i*ldc+j], want[i*ldc+j]
			if j >= nr || i >= rows {
				if g != w && !(math.IsNaN(float64(g)) && math.IsNaN(float64(w))) {
					t.Fatalf("C[%d][%d] outside the %d x %d tile changed", i, j, rows, nr)
				}
				continue
			}
			gf, wf := float64(g), float64(w)
			if math.IsNaN(wf) || math.IsInf(wf, 0) {
				if math.IsNaN(gf) != math.IsNaN(wf) || (math.IsInf(wf, 0) && gf != wf) {
					t.Fatalf("C[%d][%d] = %v, want %v", i, j, g, w)
				}
				continue
			}
			if math.Abs(gf-wf) > tol*(1+math.Abs(wf)) {
				t.Fatalf("C[%d][%d] = %v, want %v", i, j, g, w)
			}
		}
	}
}

// TestPanelKernels checks every variant's decode-step panel kernel (one to
// four rows over one packed sliver) against a float64 loop: it must add
// into out, leave the rows past m alone, and handle every k modulo the
// unrolling (four steps for one row on AVX-512).
func TestPanelKernels(t *testing.T) {
	for _, ks := range registry {
		for m := 1; m <= skinnyRows; m++ {
			for _, k := range []int{1, 2, 3, 4, 5, 6, 7, 9, 64, 255, kcBlock} {
				t.Run(fmt.Sprintf("%s/m%d/k%d", ks.name, m, k), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(m), uint64(k)))
					p := randSlice(r, k*packNR)
					var a [skinnyRows][]float32
					for i := range m {
						a[i] = randSlice(r, k)
					}
					var out, want [skinnyRows][packNR]float32
					for i := range skinnyRows {
						for j := range packNR {
							out[i][j] = float32(r.NormFloat64())
						}
					}
					want = out
					for i := range m {
						for j := range packNR {
							var s float64
							for l := range k {
								s += float64(a[i][l]) * float64(p[l*packNR+j])
							}
							want[i][j] = float32(float64(want[i][j]) + s)
						}
					}
					ks.panel(m, k, &a, p, &out)
					tol := 1e-5 * math.Sqrt(float64(k)) * 8
					for i := range skinnyRows {
						for j := range packNR {
							g, w := out[i][j], want[i][j]
							if i >= m {
								if g != w {
									t.Fatalf("row %d past m changed", i)
								}
								continue
							}
							if math.Abs(float64(g-w)) > tol*(1+math.Abs(float64(w))) {
								t.Fatalf("out[%d][%d] = %v, want %v", i, j, g, w)
							}
						}
					}
				})
			}
		}
	}
}

// TestPanelHalfKernels checks every variant's 16-bit panel kernel, where it
// has one, against the float32 portable panel kernel on the widened sliver:
// both encodings, one to four rows, odd k, rows past m untouched.
func TestPanelHalfKernels(t *testing.T) {
	for _, ks := range registry {
		if ks.panelHalf == nil {
			continue
		}
		for _, kind := range []Half{Float16, BFloat16} {
			for m := 1; m <= skinnyRows; m++ {
				for _, k := range []int{1, 2, 3, 64, 255, kcBlock} {
					t.Run(fmt.Sprintf("%s/kind%d/m%d/k%d", ks.name, kind, m, k), func(t *testing.T) {
						r := rand.New(rand.NewPCG(uint64(m), uint64(k)+99))
						ph := make([]uint16, k*packNR)
						for i := range ph {
							ph[i] = uint16(r.Uint32()&0x3fff) | 0x2000 // finite normal halves, both signs below
							if i%3 == 0 {
								ph[i] |= 0x8000
							}
						}
						p := make([]float32, len(ph))
						cvt16Go(kind, p, ph)
						var a [skinnyRows][]float32
						for i := range m {
							a[i] = randSlice(r, k)
						}
						var out [skinnyRows][packNR]float32
						for i := range skinnyRows {
							for j := range packNR {
								out[i][j] = float32(r.NormFloat64())
							}
						}
						want := out
						panelGo(m, k, &a, p, &want)
						ks.panelHalf(kind, m, k, &a, ph, &out)
						for i := range skinnyRows {
							for j := range packNR {
								g, w := out[i][j], want[i][j]
								if i >= m {
									if g != w {
										t.Fatalf("row %d past m changed", i)
									}
									continue
								}
								if d := math.Abs(float64(g - w)); d > 1e-4*(1+math.Abs(float64(w)))*math.Sqrt(float64(k)) {
									t.Fatalf("out[%d][%d] = %v, want %v", i, j, g, w)
								}
							}
						}
					})
				}
			}
		}
	}
}

// TestPanelNonFinite checks that every variant's panel kernels (float32
// and 16-bit, one to four rows) propagate NaN and Inf as the portable
// kernel does: a NaN or Inf in a row of A, or in the sliver, reaches the
// same outputs, and 0*Inf gives NaN.
func TestPanelNonFinite(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, ks := range registry {
		for m := 1; m <= skinnyRows; m++ {
			for _, k := range []int{1, 3, 17, 40} {
				t.Run(fmt.Sprintf("%s/m%d/k%d", ks.name, m, k), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(m)+7, uint64(k)))
					p := randSlice(r, k*packNR)
					var a [skinnyRows][]float32
					for i := range m {
						a[i] = randSlice(r, k)
					}
					l := k / 2
					a[m-1][l] = nan              // row m-1: every column NaN
					a[0][k-1] = inf              // row 0: sign of p's last row, or NaN where it is 0
					p[l*packNR+packNR-1] = -inf  // column 31 of every row: -Inf*a or NaN
					p[(k-1)*packNR+3] = 0        // row 0 column 3: Inf*0 = NaN
					p[(k-1)*packNR+5] = nan      // column 5 of every row: NaN
					ph := make([]uint16, len(p)) // the same sliver in float16
					for i, v := range p {
						ph[i] = codec.F32ToF16(v)
					}
					wide := make([]float32, len(p))
					cvt16Go(Float16, wide, ph)
					check := func(name string, run func(out *[skinnyRows][packNR]float32), src []float32) {
						var out, want [skinnyRows][packNR]float32
						panelGo(m, k, &a, src, &want)
						run(&out)
						for i := range skinnyRows {
							for j := range packNR {
								g, w := float64(out[i][j]), float64(want[i][j])
								if math.IsNaN(g) != math.IsNaN(w) || (math.IsInf(w, 0) && g != w) {
									t.Fatalf("%s: out[%d][%d] = %v, want %v", name, i, j, g, w)
								}
							}
						}
					}
					check("float32", func(out *[skinnyRows][packNR]float32) { ks.panel(m, k, &a, p, out) }, p)
					if ks.panelHalf != nil {
						check("float16", func(out *[skinnyRows][packNR]float32) { ks.panelHalf(Float16, m, k, &a, ph, out) }, wide)
					}
				})
			}
		}
	}
}

// TestPanelNoAlloc checks that the panel kernels allocate nothing per call.
func TestPanelNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(3, 4))
	const k = 70
	p := randSlice(r, k*packNR)
	ph := make([]uint16, k*packNR)
	var a [skinnyRows][]float32
	for i := range skinnyRows {
		a[i] = randSlice(r, k)
	}
	var out [skinnyRows][packNR]float32
	for _, ks := range registry {
		for m := 1; m <= skinnyRows; m++ {
			n := testing.AllocsPerRun(20, func() {
				ks.panel(m, k, &a, p, &out)
				if ks.panelHalf != nil {
					ks.panelHalf(BFloat16, m, k, &a, ph, &out)
				}
			})
			if n != 0 {
				t.Errorf("%s m%d: %v allocations per call", ks.name, m, n)
			}
		}
	}
}
