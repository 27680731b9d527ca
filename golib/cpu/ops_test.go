package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// TestOpsConvert checks every path's half/bfloat16 widening against the
// scalar codec on all 65536 bit patterns: bit-identical, except that a
// signalling NaN may come back quieted (VCVTPH2PS sets the quiet bit), which
// is still a NaN of the same sign.
func TestOpsConvert(t *testing.T) {
	src := make([]uint16, 1<<16+5) // +5: odd tail
	for i := range src {
		src[i] = uint16(i)
	}
	dst := make([]float32, len(src))
	for _, k := range kernelVariants {
		for _, c := range []struct {
			name string
			fn   func([]float32, []uint16)
			ref  func(uint16) float32
		}{{"f16", k.cvtF16, codec.F16ToF32}, {"bf16", k.cvtBF16, codec.BF16ToF32}} {
			c.fn(dst, src)
			for i, h := range src {
				want := c.ref(h)
				if want != want && dst[i] != dst[i] && math.Signbit(float64(dst[i])) == math.Signbit(float64(want)) {
					continue
				}
				if math.Float32bits(dst[i]) != math.Float32bits(want) {
					t.Fatalf("%s %s(%#04x) = %#08x, want %#08x", k.name, c.name, h,
						math.Float32bits(dst[i]), math.Float32bits(want))
				}
			}
		}
	}
}

// TestOpsExp checks the polynomial exp (scalar and vector) against math.Exp
// over the range the kernel feeds it (x <= 0) and around the clamps.
func TestOpsExp(t *testing.T) {
	var xs []float32
	for x := -100.0; x <= 1; x += 0.0137 {
		xs = append(xs, float32(x))
	}
	xs = append(xs, 0, -87.3, -87.4, 88, float32(math.Inf(-1)))
	for _, k := range kernelVariants {
		s := append([]float32(nil), xs...)
		sum := k.expSub(s, 0)
		var want float64
		for i, x := range xs {
			w := math.Exp(float64(x))
			want += float64(float32(w))
			if x <= -87.7 { // n = -127: exactly 0, so a far-behind key weighs nothing
				if s[i] != 0 {
					t.Errorf("%s exp(%v) = %v, want 0", k.name, x, s[i])
				}
				continue
			}
			if x < -87.3365 { // a subnormal result, or 0
				if s[i] > 1.2e-38 || s[i] < 0 {
					t.Errorf("%s exp(%v) = %v, want ~0", k.name, x, s[i])
				}
				continue
			}
			if math.Abs(float64(s[i])-w) > 4e-7*w {
				t.Errorf("%s exp(%v) = %v, want %v", k.name, x, s[i], w)
			}
		}
		if math.Abs(float64(sum)-want) > 1e-5*want {
			t.Errorf("%s sum = %v, want %v", k.name, sum, want)
		}
	}
}

// TestOpsBlock checks dots, max, axpy and tanhCap of every path against
// float64 loops for lengths and dims around the vector widths.
func TestOpsBlock(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, d := range []int{1, 7, 8, 9, 16, 17, 33, 64, 96, 100, 128} {
		for _, n := range []int{1, 2, 3, 4, 5, 8, 15, 16, 17, 31, 33} {
			q := randVec(rng, d, 1)
			kv := randVec(rng, n*d, 1)
			p := randVec(rng, n, 1)
			acc0 := randVec(rng, d, 1)
			for _, k := range kernelVariants {
				s := make([]float32, n)
				k.dots(s, q, kv, d, 0)
				var mx float32 = float32(math.Inf(-1))
				for tt := 0; tt < n; tt++ {
					var w float64
					for i := 0; i < d; i++ {
						w += float64(q[i]) * float64(kv[tt*d+i])
					}
					if math.Abs(float64(s[tt])-w) > 1e-5*(1+math.Abs(w)) {
						t.Fatalf("%s d=%d n=%d: dot[%d] = %v, want %v", k.name, d, n, tt, s[tt], w)
					}
					mx = max(mx, s[tt])
				}
				if got := k.maxOf(s); got != mx {
					t.Fatalf("%s n=%d: max = %v, want %v", k.name, n, got, mx)
				}
				acc := append([]float32(nil), acc0...)
				k.axpy(acc, p, kv, 0.5, 0)
				for i := 0; i < d; i++ {
					w := 0.5 * float64(acc0[i])
					for tt := 0; tt < n; tt++ {
						w += float64(p[tt]) * float64(kv[tt*d+i])
					}
					if math.Abs(float64(acc[i])-w) > 1e-5*(1+math.Abs(w)) {
						t.Fatalf("%s d=%d n=%d: axpy[%d] = %v, want %v", k.name, d, n, i, acc[i], w)
					}
				}
				th := append([]float32(nil), p...)
				k.tanhCap(th, 3)
				for i, x := range p {
					w := 3 * math.Tanh(float64(x))
					if math.Abs(float64(th[i])-w) > 2e-6*3 {
						t.Fatalf("%s tanhCap(%v) = %v, want %v", k.name, x, th[i], w)
					}
				}
			}
		}
	}
}

// TestOpsScale checks scale of every path against the plain product over
// lengths that exercise the vector bodies and the scalar tails.
func TestOpsScale(t *testing.T) {
	for _, k := range kernelVariants {
		for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 33, 128, 131} {
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(i%13) - 6.5
			}
			dst := make([]float32, n+3)
			for i := range dst {
				dst[i] = -99
			}
			k.scale(dst, src, 0.37)
			for i, x := range src {
				if dst[i] != x*0.37 {
					t.Fatalf("%s scale n=%d: dst[%d]=%v want %v", k.name, n, i, dst[i], x*0.37)
				}
			}
			for i := n; i < len(dst); i++ {
				if dst[i] != -99 {
					t.Fatalf("%s scale n=%d wrote past len(src)", k.name, n)
				}
			}
		}
	}
}

// TestOpsMaxLong checks maxOf of every path on block-sized lengths (the
// vector loops' four-chain steps, single steps and scalar tails) against
// the scalar maximum, and that a NaN or an infinity anywhere (first
// element, inside a four-chain step, in a single step, in the tail) gives
// NaN.
func TestOpsMaxLong(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	bad := []struct {
		name string
		v    float32
	}{{"NaN", float32(math.NaN())}, {"+Inf", float32(math.Inf(1))}, {"-Inf", float32(math.Inf(-1))}}
	for _, n := range []int{8, 24, 31, 32, 33, 40, 96, 127, 128, 129, 136, 512, 515} {
		s := randVec(rng, n, 5)
		for i := range s {
			s[i] -= 10 // all negative: a zero from masked lanes would show
		}
		want := s[0]
		for _, x := range s {
			want = max(want, x)
		}
		for _, k := range kernelVariants {
			if got := k.maxOf(s); got != want {
				t.Fatalf("%s n=%d: max = %v, want %v", k.name, n, got, want)
			}
			for _, at := range []int{0, 5, n / 2, n &^ 7, n - 1} {
				if at >= n || (at&^7 == n&^7 && at != n-1 && n%8 == 0) {
					continue
				}
				for _, b := range bad {
					c := append([]float32(nil), s...)
					c[at] = b.v
					if got := k.maxOf(c); got == got {
						t.Fatalf("%s n=%d: %s at %d: max = %v, want NaN", k.name, n, b.name, at, got)
					}
				}
			}
		}
	}
}
