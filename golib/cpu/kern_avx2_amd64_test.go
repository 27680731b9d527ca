//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"math/rand/v2"
	"simd/archsimd"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

func init() {
	flip := func(name string, f func(t *cpuTune)) tuneVariant {
		return tuneVariant{"tune-" + name, func() func() {
			old := cpuT.Load()
			t := *old
			f(&t)
			cpuT.Store(&t)
			return func() { cpuT.Store(old) }
		}}
	}
	simdTuneVariants = append(simdTuneVariants,
		flip("bf16Shuf", func(t *cpuTune) { t.bf16Shuf = !t.bf16Shuf }),
		flip("halfShortPfd", func(t *cpuTune) { t.halfShortPfd = !t.halfShortPfd }),
		flip("v4Rows512", func(t *cpuTune) { t.v4Rows512 = !t.v4Rows512 }),
		flip("vStream", func(t *cpuTune) { t.vStream = !t.vStream }),
		flip("gqaPfRows", func(t *cpuTune) { t.gqaPfRows = 16 - t.gqaPfRows }),
		flip("mhaNoPf", func(t *cpuTune) { t.mhaNoPf = !t.mhaNoPf }))
}

// needAVX2 skips a test where the CPU has no AVX2 path.
func needAVX2(t *testing.T) {
	t.Helper()
	for _, k := range kernelVariants {
		if k == &avx2Ops {
			return
		}
	}
	t.Skip("no AVX2 + FMA + F16C")
}

// closeTo reports |got-want| <= 1e-5*(1+|want|).
func closeTo(got, want float32) bool {
	return math.Abs(float64(got)-float64(want)) <= 1e-5*(1+math.Abs(float64(want)))
}

// TestAVX2Ops checks the AVX2 assembly loops against the portable twin on
// head dims the assembly takes and the ones it leaves to archsimd, and
// token counts around its steps (pairs, triples, quads, odd tails), under
// each CPU tuning (cpuTunings) forced in turn.
func TestAVX2Ops(t *testing.T) {
	needAVX2(t)
	old := cpuT.Load()
	defer cpuT.Store(old)
	for i := range cpuTunings {
		cpuT.Store(&cpuTunings[i])
		t.Run(cpuTunings[i].name, checkAVX2Ops)
	}
}

// checkAVX2Ops is TestAVX2Ops under the active CPU tuning.
func checkAVX2Ops(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	alpha := [4]float32{0.5, 1, 0, 2}
	for _, d := range []int{8, 16, 24, 32, 48, 64, 80, 96, 128, 144, 256} {
		for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 64, 67} {
			q := randVec(rng, 4*d, 1)
			k := randVec(rng, n*d, 1)
			p := randVec(rng, 4*n, 1)
			acc0 := randVec(rng, 4*d, 1)
			for _, pf := range []int{0, 64} {
				want, got := make([]float32, 4*n), make([]float32, 4*n)
				goOps.dots4(want, q, k, d, pf)
				avx2Ops.dots4(got, q, k, d, pf)
				for i := range want {
					if !closeTo(got[i], want[i]) {
						t.Fatalf("dots4 d=%d n=%d: s[%d] = %v, want %v", d, n, i, got[i], want[i])
					}
				}
				goOps.dots(want[:n], q, k, d, pf)
				avx2Ops.dots(got[:n], q, k, d, pf)
				for i := range want[:n] {
					if !closeTo(got[i], want[i]) {
						t.Fatalf("dots d=%d n=%d: s[%d] = %v, want %v", d, n, i, got[i], want[i])
					}
				}
				al := alpha
				if n%2 == 1 {
					al = [4]float32{1, 1, 1, 1} // the first tile too loads without the rescale
				}
				wa, ga := append([]float32(nil), acc0...), append([]float32(nil), acc0...)
				goOps.axpy4(wa, p, k, &al, pf)
				avx2Ops.axpy4(ga, p, k, &al, pf)
				for i := range wa {
					if !closeTo(ga[i], wa[i]) {
						t.Fatalf("axpy4 d=%d n=%d: acc[%d] = %v, want %v", d, n, i, ga[i], wa[i])
					}
				}
				wa, ga = append(wa[:0], acc0[:d]...), append(ga[:0], acc0[:d]...)
				goOps.axpy(wa, p[:n], k, 0.25, pf)
				avx2Ops.axpy(ga, p[:n], k, 0.25, pf)
				for i := range wa {
					if !closeTo(ga[i], wa[i]) {
						t.Fatalf("axpy d=%d n=%d: acc[%d] = %v, want %v", d, n, i, ga[i], wa[i])
					}
				}
			}
		}
	}
}

// TestAVX2HalfOps checks the fp16/bf16 loops that read 16-bit rows in place
// against the portable twin on the widened rows, under each CPU tuning
// (cpuTunings) forced in turn, on the AVX2 path and, where the CPU has it,
// the AVX-512 path.
func TestAVX2HalfOps(t *testing.T) {
	needAVX2(t)
	old := cpuT.Load()
	defer cpuT.Store(old)
	for i := range cpuTunings {
		cpuT.Store(&cpuTunings[i])
		t.Run(cpuTunings[i].name, func(t *testing.T) { checkHalfOps(t, avx2Ops.half) })
		if avx512Ops.half != nil && archsimd.X86.AVX512() {
			t.Run(cpuTunings[i].name+"/avx512", func(t *testing.T) { checkHalfOps(t, avx512Ops.half) })
		}
	}
}

// TestCPUTuningsBitIdentical checks that the CPU tunings change speed
// only: the bf16 4x3 score loop widening by VPSHUFB (dots4bf16avx2) and by
// shift (dots4bf16shavx2) and both prefetch distances give bit-identical
// scores, and both four-row V loops (vStream) the same accumulators (bit
// for bit for 16-bit rows, to rounding for float32 rows, which the
// streaming loop adds in another order), on head dims 64 and 128 and token
// counts with and without a tail.
func TestCPUTuningsBitIdentical(t *testing.T) {
	needAVX2(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, d := range []int{64, 128} {
		for _, n := range []int{1, 3, 4, 5, 96, 517} {
			q := randVec(rng, 4*d, 1)
			kh := make([]uint16, n*d)
			codec.EncodeBF16(kh, randVec(rng, n*d, 1))
			a, b := make([]float32, 4*n), make([]float32, 4*n)
			dots4bf16avx2(&a[0], n*4, &q[0], &kh[0], d*2, n, halfPfd(64, d))
			dots4bf16shavx2(&b[0], n*4, &q[0], &kh[0], d*2, n, 64*d*2)
			for i := range a {
				if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
					t.Fatalf("d=%d n=%d: s[%d] shuf %v, shift %v", d, n, i, a[i], b[i])
				}
			}
			checkVStreamBitIdentical(t, rng, d, n)
		}
	}
}

// checkVStreamBitIdentical checks that the four-row V accumulation gives
// the same bits in the row-streaming loops (vStream) and in the 24-dim
// passes for fp16 and bf16 rows, with and without a rescale: both add the
// tokens to each accumulator in token order, after the same multiply. The
// float32 streaming loop adds tokens t, t+h, t+2h (h = n/3) in turn, so
// there the two agree to rounding (closeTo).
func checkVStreamBitIdentical(t *testing.T, rng *rand.Rand, d, n int) {
	t.Helper()
	old := cpuT.Load()
	defer cpuT.Store(old)
	on, off := *old, *old
	on.vStream, off.vStream = true, false
	p := randVec(rng, 4*n, 1)
	vf := randVec(rng, n*d, 1)
	acc0 := randVec(rng, 4*d, 1)
	for _, alpha := range [][4]float32{{1, 1, 1, 1}, {0.5, 1, 0, 2}} {
		for _, kind := range []string{"float32", "float16", "bfloat16"} {
			bf := kind == "bfloat16"
			var vh []uint16
			if kind != "float32" {
				_, vh = randHalfVec(rng, n*d, bf)
			}
			var got [2][]float32
			for i, tune := range []*cpuTune{&on, &off} {
				cpuT.Store(tune)
				acc := append([]float32(nil), acc0...)
				al := alpha
				if vh == nil {
					avx2Ops.axpy4(acc, p, vf, &al, 64)
				} else {
					avx2Ops.half.axpy4(acc, p, vh, &al, 64, bf)
				}
				got[i] = acc
			}
			for i := range got[0] {
				if vh == nil && closeTo(got[0][i], got[1][i]) {
					continue
				}
				if math.Float32bits(got[0][i]) != math.Float32bits(got[1][i]) {
					t.Fatalf("%s d=%d n=%d alpha=%v: acc[%d] streaming %v, passes %v", kind, d, n, alpha, i, got[0][i], got[1][i])
				}
			}
		}
	}
}

// TestPickCPUTune checks the tuning rule: AMD (and Hygon) CPUs get "zen",
// others the first entry.
func TestPickCPUTune(t *testing.T) {
	for vendor, want := range map[string]string{"AuthenticAMD": "zen", "HygonGenuine": "zen",
		"GenuineIntel": "intel", "": "intel"} {
		if got := pickCPUTune(Features{Vendor: vendor}).name; got != want {
			t.Errorf("pickCPUTune(%q) = %q, want %q", vendor, got, want)
		}
	}
	if cpuT.Load() != pickCPUTune(DetectFeatures()) {
		t.Errorf("active tuning %q is not the one picked for this CPU", cpuT.Load().name)
	}
}

// checkHalfOps checks h's 16-bit loops against the portable twin on the
// widened rows (TestAVX2HalfOps runs it on both SIMD paths).
func checkHalfOps(t *testing.T, h *halfOps) {
	rng := rand.New(rand.NewPCG(13, 14))
	alpha := [4]float32{1, 0.75, 0, 3}
	for _, bf := range []bool{false, true} {
		for _, d := range []int{32, 64, 96, 128, 160, 256} {
			if !h.ok(d, d) {
				if h == avx2Ops.half {
					t.Fatalf("half.ok(%d) = false", d)
				}
				continue
			}
			for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 33, 64, 66} {
				q := randVec(rng, 4*d, 1)
				kf, kh := randHalfVec(rng, n*d, bf)
				p := randVec(rng, 4*n, 1)
				acc0 := randVec(rng, 4*d, 1)
				want, got := make([]float32, 4*n), make([]float32, 4*n)
				goOps.dots4(want, q, kf, d, 0)
				h.dots4(got, q, kh, d, 64, bf)
				for i := range want {
					if !closeTo(got[i], want[i]) {
						t.Fatalf("bf=%v dots4 d=%d n=%d: s[%d] = %v, want %v", bf, d, n, i, got[i], want[i])
					}
				}
				goOps.dots(want[:n], q, kf, d, 0)
				h.dots(got[:n], q, kh, d, 64, bf)
				for i := range want[:n] {
					if !closeTo(got[i], want[i]) {
						t.Fatalf("bf=%v dots d=%d n=%d: s[%d] = %v, want %v", bf, d, n, i, got[i], want[i])
					}
				}
				al := alpha
				if n%2 == 1 {
					al = [4]float32{1, 1, 1, 1} // the first tile too loads without the rescale
				}
				wa, ga := append([]float32(nil), acc0...), append([]float32(nil), acc0...)
				goOps.axpy4(wa, p, kf, &al, 0)
				h.axpy4(ga, p, kh, &al, 64, bf)
				for i := range wa {
					if !closeTo(ga[i], wa[i]) {
						t.Fatalf("bf=%v axpy4 d=%d n=%d: acc[%d] = %v, want %v", bf, d, n, i, ga[i], wa[i])
					}
				}
				wa, ga = append(wa[:0], acc0[:d]...), append(ga[:0], acc0[:d]...)
				goOps.axpy(wa, p[:n], kf, 2, 0)
				h.axpy(ga, p[:n], kh, 2, 64, bf)
				for i := range wa {
					if !closeTo(ga[i], wa[i]) {
						t.Fatalf("bf=%v axpy d=%d n=%d: acc[%d] = %v, want %v", bf, d, n, i, ga[i], wa[i])
					}
				}
			}
		}
	}
	for _, odd := range [][2]int{{80, 80}, {64, 48}, {17, 32}} {
		if h == avx2Ops.half && h.ok(odd[0], odd[1]) {
			t.Errorf("half.ok(%d, %d) = true, want the widened path", odd[0], odd[1])
		}
	}
}

// TestAVX2ExpSub checks the assembly exp against the scalar expf on lengths
// around the vector width and inputs below the clamp.
func TestAVX2ExpSub(t *testing.T) {
	needAVX2(t)
	rng := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{1, 7, 8, 9, 16, 63, 128, 131} {
		a := make([]float32, n)
		for i := range a {
			a[i] = float32(rng.NormFloat64() * 30)
		}
		a[0] = -200
		b := append([]float32(nil), a...)
		sa := goExpSub(a, 3)
		sb := expSubAVX2(b, 3)
		for i := range a {
			if d := math.Abs(float64(a[i] - b[i])); d > 1e-6*math.Abs(float64(a[i])) {
				t.Fatalf("n=%d element %d: asm %v, scalar %v", n, i, b[i], a[i])
			}
		}
		if d := math.Abs(float64(sa - sb)); d > 1e-5*math.Abs(float64(sa)) {
			t.Fatalf("n=%d sum: asm %v, scalar %v", n, sb, sa)
		}
	}
}
