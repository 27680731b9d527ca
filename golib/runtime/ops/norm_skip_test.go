package ops

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// skipNormNaive is the Skip(Simplified)LayerNormalization formula in
// float64: s = x + skip + bias; y = (s - mean) / sqrt(var + eps) * gamma +
// beta (RMS: mean 0, var = mean of squares).
func skipNormNaive(x, skip, gamma, beta, bias []float64, rows, cols int, eps float64, rms bool) (y, mean, inv, sum []float64) {
	for r := 0; r < rows; r++ {
		s := make([]float64, cols)
		for i := range s {
			s[i] = x[r*cols+i] + skip[(r*cols+i)%len(skip)]
			if bias != nil {
				s[i] += bias[i]
			}
		}
		var m, v float64
		if !rms {
			for _, e := range s {
				m += e
			}
			m /= float64(cols)
		}
		for _, e := range s {
			v += (e - m) * (e - m)
		}
		iv := 1 / math.Sqrt(v/float64(cols)+eps)
		for i, e := range s {
			o := (e - m) * iv * gamma[i]
			if beta != nil {
				o += beta[i]
			}
			y = append(y, o)
		}
		mean, inv, sum = append(mean, m), append(inv, iv), append(sum, s...)
	}
	return
}

func TestSkipNormsAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	randT := func(shape tensor.Shape) (*tensor.Tensor, []float64) {
		v := make([]float32, shape.Size())
		f := make([]float64, len(v))
		for i := range v {
			v[i] = float32(rng.NormFloat64())
			f[i] = float64(v[i])
		}
		return ft(shape, v...), f
	}
	for _, c := range []struct {
		op              string
		x, skip         tensor.Shape
		withBeta, withB bool
	}{
		{"SkipLayerNormalization", tensor.Shape{2, 3, 16}, tensor.Shape{2, 3, 16}, true, true},
		{"SkipLayerNormalization", tensor.Shape{2, 3, 16}, tensor.Shape{1, 3, 16}, false, true},
		{"SkipLayerNormalization", tensor.Shape{4, 8}, tensor.Shape{4, 8}, true, false},
		{"SkipLayerNormalization", tensor.Shape{2, 5, 7}, tensor.Shape{5, 7}, false, false},
		{"SkipSimplifiedLayerNormalization", tensor.Shape{2, 3, 16}, tensor.Shape{2, 3, 16}, false, true},
		{"SkipSimplifiedLayerNormalization", tensor.Shape{1, 1, 64}, tensor.Shape{1, 1, 64}, false, false},
		{"SkipSimplifiedLayerNormalization", tensor.Shape{3, 2, 9}, tensor.Shape{2, 9}, false, true},
	} {
		rms := c.op == "SkipSimplifiedLayerNormalization"
		cols := c.x[len(c.x)-1]
		rows := c.x.Size() / cols
		x, xf := randT(c.x)
		skip, sf := randT(c.skip)
		gamma, gf := randT(tensor.Shape{cols})
		in := []*tensor.Tensor{x, skip, gamma}
		var betaF, biasF []float64
		if !rms {
			var beta *tensor.Tensor
			if c.withBeta {
				beta, betaF = randT(tensor.Shape{cols})
			}
			in = append(in, beta)
		}
		if c.withB {
			var bias *tensor.Tensor
			bias, biasF = randT(tensor.Shape{cols})
			in = append(in, bias)
		}
		outs, err := callDomain("com.microsoft", c.op, 1, attrs(fltA("epsilon", 1e-5)), 4, in...)
		if err != nil {
			t.Fatalf("%s %v: %v", c.op, c.x, err)
		}
		y, mean, inv, sum := skipNormNaive(xf, sf, gf, betaF, biasF, rows, cols, 1e-5, rms)
		for k, want := range [][]float64{y, mean, inv, sum} {
			got, _ := tensor.AsFloat32(outs[k])
			if len(got) != len(want) {
				t.Fatalf("%s %v output %d: %d values, want %d", c.op, c.x, k, len(got), len(want))
			}
			for i := range got {
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4*(1+math.Abs(want[i])) {
					t.Fatalf("%s %v output %d[%d] = %v, want %v", c.op, c.x, k, i, got[i], want[i])
				}
			}
		}
		if want := append(c.x[:len(c.x)-1:len(c.x)-1].Clone(), 1); !outs[1].Shape().Equal(want) || !outs[2].Shape().Equal(want) {
			t.Errorf("%s: statistics shapes %v %v, want %v", c.op, outs[1].Shape(), outs[2].Shape(), want)
		}
	}
}

func TestSkipNormBadShapes(t *testing.T) {
	x := ft(tensor.Shape{2, 3, 4}, make([]float32, 24)...)
	g := ft(tensor.Shape{4}, 1, 1, 1, 1)
	for _, skip := range []*tensor.Tensor{
		ft(tensor.Shape{4}, 0, 0, 0, 0),
		ft(tensor.Shape{2, 4}, make([]float32, 8)...),
		ft(tensor.Shape{2, 2, 3, 4}, make([]float32, 48)...),
	} {
		if _, err := callDomain("com.microsoft", "SkipSimplifiedLayerNormalization", 1, nil, 1, x, skip, g); err == nil {
			t.Errorf("skip %v accepted", skip.Shape())
		}
	}
	if _, err := callDomain("com.microsoft", "SkipLayerNormalization", 1, nil, 1, x, x, ft(tensor.Shape{3}, 1, 1, 1)); err == nil {
		t.Error("gamma of the wrong length accepted")
	}
}
