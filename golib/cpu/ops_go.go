package cpu

import (
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// goOps is the portable pure-Go twin of the SIMD inner loops.
var goOps = kernelOps{
	name:    "go",
	dots:    func(s, q, k []float32, d, _ int) { goDots(s, q, k, d) },
	maxOf:   goMax,
	readSum: goReadSum,
	expSub:  goExpSub,
	tanhCap: goTanhCap,
	scale:   goScale,
	axpy:    func(acc, p, v []float32, alpha float32, _ int) { goAxpy(acc, p, v, alpha) },
	dots4:   func(s, q, k []float32, d, _ int) { goDots4(s, q, k, d) },
	axpy4:   func(acc, p, v []float32, alpha *[4]float32, _ int) { goAxpy4(acc, p, v, alpha) },
	cvtF16:  codec.DecodeF16,
	cvtBF16: codec.DecodeBF16,
	quant:   &goQuantOps,
}

func goDots(s, q, k []float32, d int) {
	q = q[:d]
	for t := range s {
		kr := k[t*d : t*d+d]
		var a0, a1, a2, a3 float32
		i := 0
		for ; i+4 <= d; i += 4 {
			a0 += q[i] * kr[i]
			a1 += q[i+1] * kr[i+1]
			a2 += q[i+2] * kr[i+2]
			a3 += q[i+3] * kr[i+3]
		}
		for ; i < d; i++ {
			a0 += q[i] * kr[i]
		}
		s[t] = (a0 + a1) + (a2 + a3)
	}
}

func goMax(s []float32) float32 {
	m := s[0]
	var z float32 // sum of x*0: NaN as soon as one x is NaN or infinite
	for _, x := range s {
		if x > m {
			m = x
		}
		z += x * 0
	}
	if z != 0 {
		return z
	}
	return m
}

// goReadSum sums s with eight independent accumulators.
func goReadSum(s []float32) float32 {
	var a [8]float32
	i := 0
	for ; i+8 <= len(s); i += 8 {
		c := s[i : i+8 : i+8]
		a[0] += c[0]
		a[1] += c[1]
		a[2] += c[2]
		a[3] += c[3]
		a[4] += c[4]
		a[5] += c[5]
		a[6] += c[6]
		a[7] += c[7]
	}
	for ; i < len(s); i++ {
		a[0] += s[i]
	}
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

func goExpSub(s []float32, m float32) float32 {
	var sum float32
	for i, x := range s {
		e := expf(x - m)
		s[i] = e
		sum += e
	}
	return sum
}

func goTanhCap(s []float32, c float32) {
	for i, x := range s {
		// + x*0: an infinite x (a dot product that overflowed, whatever
		// the sign of the true sum) becomes NaN, so the row is recomputed
		s[i] = c*float32(math.Tanh(float64(x))) + x*0
	}
}

func goAxpy(acc, p, v []float32, alpha float32) {
	d := len(acc)
	if alpha != 1 {
		for i := range acc {
			acc[i] *= alpha
		}
	}
	t := 0
	for ; t+2 <= len(p); t += 2 {
		p0, p1 := p[t], p[t+1]
		v0 := v[t*d : t*d+d]
		v1 := v[t*d+d : t*d+2*d]
		for i := range acc {
			acc[i] += p0*v0[i] + p1*v1[i]
		}
	}
	for ; t < len(p); t++ {
		p0 := p[t]
		v0 := v[t*d : t*d+d]
		for i := range acc {
			acc[i] += p0 * v0[i]
		}
	}
}

// Constants of the float32 exp approximation shared by every variant:
// exp(x) = 2^n * exp(r) with n = round(x*log2(e)) and r = x - n*ln2 split in
// two parts (Cody-Waite), exp(r) by a degree-6 polynomial (Cephes expf
// coefficients). Relative error about 2 ulp down to the smallest normal
// result (x = -87.34); below, results are subnormal, and from x = -87.68
// on they are exactly 0 (n = -127 makes 2^n's bits 0), so a key the
// softmax leaves far behind weighs nothing, not the smallest normal.
const (
	expHi    = 88.0  // keeps n <= 127 so 2^n stays a normal float32
	expLo    = -88.0 // keeps n >= -127, where 2^n's bits are 0 (the exp 0)
	log2e    = 1.44269504088896341
	ln2Hi    = 0.693359375
	ln2Lo    = -2.12194440e-4
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
	roundMag = 12582912.0 // 1.5*2^23: adding it rounds to an integer in the low mantissa bits
)

// expf is the scalar twin of the vector exp: same algorithm, same constants.
func expf(x float32) float32 {
	if x > expHi {
		x = expHi
	}
	if x < expLo {
		if x != x {
			return x
		}
		x = expLo
	}
	t := x*log2e + roundMag
	n := t - roundMag
	r := x - n*ln2Hi
	r = r - n*ln2Lo
	p := float32(expP0)
	p = p*r + expP1
	p = p*r + expP2
	p = p*r + expP3
	p = p*r + expP4
	p = p*r + expP5
	p = p*r*r + r + 1
	pow := math.Float32frombits((math.Float32bits(t) << 23) + 0x3f800000)
	return p * pow
}

// goF16 widens one IEEE half to float32.
func goF16(h uint16) float32 { return codec.F16ToF32(h) }

// bf16f widens one bfloat16 to float32.
func bf16f(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func goDots4(s, q, k []float32, d int) {
	n := len(s) / 4
	for r := 0; r < 4; r++ {
		goDots(s[r*n:(r+1)*n], q[r*d:(r+1)*d], k, d)
	}
}

func goAxpy4(acc, p, v []float32, alpha *[4]float32) {
	d, n := len(acc)/4, len(p)/4
	for r := 0; r < 4; r++ {
		goAxpy(acc[r*d:(r+1)*d], p[r*n:(r+1)*n], v, alpha[r])
	}
}

func goScale(dst, src []float32, f float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = x * f
	}
}
