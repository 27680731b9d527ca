package mha

import "math"

// GELU for the runtime's Gelu and FastGelu ops, on the vector exponential
// of the softmax (exp32 / exp16.of / exp8.of).
//
// erf32 is the float32 erf of N. Juffa's erff (maximum error about 1 ulp
// against math.Erf, measured over [-6, 6] in steps of 2^-12): below
// |x| = 0.927734375 an odd polynomial x + x*p(x^2), above it
// 1 - e^q(|x|) with the sign of x, where q is a degree-7 polynomial.
// Gelu is 0.5*x*(erf(x/sqrt 2) + 1), computed in float32 in the order
// onnxruntime's CPU kernel uses. GeluTanh is the tanh approximation
// 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715 x^3), written as
// x*sigmoid(2u) (the same value; the sigmoid form has no cancellation
// where tanh(u) is close to -1).

const (
	erfSplit = 0.927734375
	// big |x|: q(t) = ((((((b0 t + b1) t^2 + (b2 t + b3)) t + b4) t + b5) t + b6) t - t
	erfB0 = -1.72853470e-5
	erfB1 = 3.83197126e-4
	erfB2 = -3.88396438e-3
	erfB3 = 2.42546219e-2
	erfB4 = -1.06777877e-1
	erfB5 = -6.34846687e-1
	erfB6 = -1.28717512e-1
	// small |x|: x + x*p(x^2)
	erfS0 = -5.96761703e-4
	erfS1 = 4.99119423e-3
	erfS2 = -2.67681349e-2
	erfS3 = 1.12819925e-1
	erfS4 = -3.76125336e-1
	erfS5 = 1.28379166e-1

	sqrt1_2   = 0.70710678118654752440
	geluTanhK = 1.5957691216057308 // 2*sqrt(2/pi)
	geluTanhC = 0.044715
)

// erf32 is the scalar erf of the vector loops.
func erf32(a float32) float32 {
	t := float32(math.Abs(float64(a)))
	s := a * a
	if t > erfSplit {
		r := erfB0*t + erfB1
		u := erfB2*t + erfB3
		r = r*s + u
		r = r*t + erfB4
		r = r*t + erfB5
		r = r*t + erfB6
		r = r*t - t
		r = 1 - exp32(r)
		if a < 0 {
			return -r
		}
		return r
	}
	r := float32(erfS0)
	r = r*s + erfS1
	r = r*s + erfS2
	r = r*s + erfS3
	r = r*s + erfS4
	r = r*s + erfS5
	return r*a + a
}

// geluGo is the portable Gelu.
func geluGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = 0.5 * x * (erf32(x*sqrt1_2) + 1)
	}
}

// geluTanhGo is the portable GeluTanh.
func geluTanhGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		u := geluTanhK * (x + geluTanhC*x*x*x)
		e := exp32(min(u, -u))
		s := 1 / (1 + e)
		if u < 0 {
			s *= e
		}
		dst[i] = x * s
	}
}

// ExpSub replaces every x in row by e^(x-mx) with the softmax's vector
// exponential (it follows gemm.Path) and returns their sum in float64.
// Values below about -87.3 after the subtraction, and NaN, become 0.
func ExpSub(row []float32, mx float32) float64 { return pickExp()(row, mx) }
