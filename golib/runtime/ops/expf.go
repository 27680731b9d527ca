package ops

import "math"

// expf is a float32 exp with a relative error below 3e-7 (about 2 ulp) over the
// float32 range, several times faster than math.Exp through float64. Sigmoid and
// Softmax use it: one exp per element is their whole cost.
//
// Range reduction: x = n*ln2 + r with |r| <= ln2/2, e^x = 2^n * e^r, and
// e^r from a degree-6 Taylor polynomial (its truncation error at
// |r| = 0.347 is ~3e-8 relative).
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	switch {
	case x != x:
		return x
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -103.97208:
		return 0
	}
	n := float32(math.Floor(float64(x*log2e + 0.5)))
	r := x - n*ln2hi - n*ln2lo
	p := 1 + r*(1+r*(0.5+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	k := int32(n)
	if k < -126 { // subnormal result: scale in two steps
		return p * math.Float32frombits(uint32(k+126+127)<<23) * math.Float32frombits(1<<23)
	}
	if k > 127 {
		return p * 2 * math.Float32frombits(uint32(k-1+127)<<23)
	}
	return p * math.Float32frombits(uint32(k+127)<<23)
}

// sigmoidf is 1/(1+e^-x) in float32, stable for large |x|.
func sigmoidf(x float32) float32 {
	if x >= 0 {
		return 1 / (1 + expf(-x))
	}
	e := expf(x)
	return e / (1 + e)
}
