package mha

// Tanh for the runtime's Tanh op, on the vector exponential of the softmax
// (exp32 / exp16.of / exp8.of). Below |x| = tanhSplit it is the odd Taylor
// polynomial x + x*s*p(s), s = x^2, to the x^19 term (truncation below 1e-8
// relative there); above it (1-e)/(1+e) with e = e^(-2|x|) and the sign of
// x, which has no cancellation once e <= e^-1.1. The maximum error against
// math.Tanh is 1 ulp over [-10, 10] (TestTanh bounds it by 4); tanh(+-0)
// is +-0, tanh(+-Inf) is +-1 and NaN stays NaN.

const (
	tanhSplit = 0.55
	tanhC3    = -1.0 / 3
	tanhC5    = 2.0 / 15
	tanhC7    = -17.0 / 315
	tanhC9    = 62.0 / 2835
	tanhC11   = -1382.0 / 155925
	tanhC13   = 21844.0 / 6081075
	tanhC15   = -929569.0 / 638512875
	tanhC17   = 6404582.0 / 10854718875
	tanhC19   = -443861162.0 / 1856156927625
)

// tanh32 is the scalar tanh of the vector loops.
func tanh32(x float32) float32 {
	a := max(x, -x)
	if x == 0 { // +-0 (the polynomial's x*s*p + x rounds -0 to +0)
		return x
	}
	if !(a >= tanhSplit) { // small, or NaN (which the polynomial keeps)
		s := x * x
		p := float32(tanhC19)
		p = p*s + tanhC17
		p = p*s + tanhC15
		p = p*s + tanhC13
		p = p*s + tanhC11
		p = p*s + tanhC9
		p = p*s + tanhC7
		p = p*s + tanhC5
		p = p*s + tanhC3
		return s*p*x + x
	}
	e := exp32(-2 * a)
	y := (1 - e) / (1 + e)
	if x < 0 {
		return -y
	}
	return y
}

// tanhGo is the portable Tanh.
func tanhGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = tanh32(x)
	}
}
