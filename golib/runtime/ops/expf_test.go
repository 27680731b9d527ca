package ops

import (
	"math"
	"testing"
)

func TestExpfAccuracy(t *testing.T) {
	worst, at := 0.0, float32(0)
	for x := float32(-103.9); x < 88.7; x += 0.0137 {
		want := math.Exp(float64(x))
		got := float64(expf(x))
		if want < 1.2e-38 { // subnormal results: compare absolutely
			if math.Abs(got-want) > 1.5e-45*4 {
				t.Fatalf("expf(%v) = %v, want %v", x, got, want)
			}
			continue
		}
		if rel := math.Abs(got-want) / want; rel > worst {
			worst, at = rel, x
		}
	}
	if worst > 3e-7 { // about 2 ulp
		t.Errorf("expf relative error %.3g at %v", worst, at)
	}
	cases := []struct{ x, want float32 }{
		{0, 1}, {float32(math.Inf(-1)), 0}, {float32(math.Inf(1)), float32(math.Inf(1))}, {89, float32(math.Inf(1))}, {-200, 0},
	}
	for _, c := range cases {
		if got := expf(c.x); got != c.want {
			t.Errorf("expf(%v) = %v, want %v", c.x, got, c.want)
		}
	}
	if got := expf(float32(math.NaN())); got == got {
		t.Error("expf(NaN) must be NaN")
	}
}
