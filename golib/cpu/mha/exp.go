package mha

import "math"

// exp32 is a float32 e^x accurate to about 2 ulp over the range the softmax
// uses (x <= 0), several times faster than math.Exp: x = n*ln2 + r with
// |r| <= ln2/2, e^r from a degree-6 minimax polynomial, 2^n put into the
// exponent bits. Results below the float32 normal range flush to 0.
func exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	switch {
	case x != x: // NaN
		return x
	case x > 0: // not on the softmax path
		return float32(math.Exp(float64(x)))
	case x < -87.33654:
		return 0
	}
	// Round to nearest by truncation: x <= 0 here, so t - 0.5 < 0 and the
	// conversion truncates toward zero, which is rounding t to nearest.
	n := float32(int32(x*log2e - 0.5))
	r := x - n*ln2hi - n*ln2lo
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	p = p*r*r + r + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// expFunc replaces every x in row by e^(x-mx) and returns their sum.
type expFunc func(row []float32, mx float32) float64

// expSubGo is the portable expFunc.
func expSubGo(row []float32, mx float32) float64 {
	var sum float64
	for j, v := range row {
		e := exp32(v - mx)
		row[j] = e
		sum += float64(e)
	}
	return sum
}

// sigmoidGo is the portable Sigmoid, the formula of the vector loops:
// e = exp32(-|x|), 1/(1+e) for x >= 0, e/(1+e) below, NaN kept.
func sigmoidGo(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		e := exp32(min(x, -x))
		s := 1 / (1 + e)
		switch {
		case x != x:
			dst[i] = x
		case x >= 0:
			dst[i] = s
		default:
			dst[i] = e * s
		}
	}
}
