package ops

import (
	"errors"
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// gqaCase is one GroupQueryAttention call of the table below.
type gqaCase struct {
	name               string
	b, s, nh, kvh, d   int
	past               int // past buffer positions (0: no past inputs)
	lens               []int
	total              int // 0: max(lens), or s for a prompt
	prompt             bool
	dt                 tensor.DType
	packed             bool
	rotary             int // 0 off, 1 half split, 2 interleaved
	rotaryDim          int
	window             int
	softcap, scale     float32
	smooth, sink, bias bool
	windowCache        bool // sliding_window_cache: past buffers of `past` >= window rows
}

func (c gqaCase) tot() int {
	switch {
	case c.total > 0:
		return c.total
	case c.prompt:
		return c.s
	}
	m := 0
	for _, l := range c.lens {
		m = max(m, l)
	}
	return m
}

// gqaData is a case's random inputs in float64 (rounded to the case's type).
type gqaData struct {
	q, k, v, pk, pv, cos, sin, bias, sink []float64
}

func (c gqaCase) data(rng *rand.Rand) gqaData {
	round := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = roundTo(c.dt, float32(rng.NormFloat64()))
		}
		return x
	}
	var g gqaData
	if c.packed {
		g.q = round(c.b * c.s * (c.nh + 2*c.kvh) * c.d)
	} else {
		g.q, g.k, g.v = round(c.b*c.s*c.nh*c.d), round(c.b*c.s*c.kvh*c.d), round(c.b*c.s*c.kvh*c.d)
	}
	if c.past > 0 {
		g.pk, g.pv = round(c.b*c.kvh*c.past*c.d), round(c.b*c.kvh*c.past*c.d)
	}
	if c.rotary > 0 {
		half := c.rotaryDim / 2
		rows := max(c.past, c.tot()) + 4
		g.cos, g.sin = make([]float64, rows*half), make([]float64, rows*half)
		for i := range g.cos {
			a := rng.Float64() * 2 * math.Pi
			g.cos[i], g.sin[i] = roundTo(c.dt, float32(math.Cos(a))), roundTo(c.dt, float32(math.Sin(a)))
		}
	}
	if c.bias {
		g.bias = round(c.b * c.s * c.tot())
	}
	if c.sink {
		g.sink = round(c.nh)
	}
	return g
}

func roundTo(dt tensor.DType, x float32) float64 {
	switch dt {
	case tensor.Float16:
		return float64(codec.F16ToF32(codec.F32ToF16(x)))
	case tensor.BFloat16:
		return float64(codec.BF16ToF32(codec.F32ToBF16(x)))
	}
	return float64(x)
}

func toTensor(dt tensor.DType, shape tensor.Shape, x []float64) *tensor.Tensor {
	f := make([]float32, len(x))
	for i, v := range x {
		f[i] = float32(v)
	}
	t, _ := tensor.Float32Tensor(shape, f)
	if dt == tensor.Float32 {
		return t
	}
	h, _ := tensor.New(dt, shape)
	_ = tensor.FromFloat32(h, f)
	return h
}

// gqaNaive is the operator's contract written out in float64, one query
// row at a time: present = past rows before the new tokens, the new rows
// (K rotated), zeros; row s of sequence b at position p = offset_b + s
// attends keys max(0, min(p+1, T_b) - window) .. min(p+1, T_b) - 1.
func gqaNaive(c gqaCase, g gqaData) (y, presK, presV []float64) {
	B, S, nh, kvh, D := c.b, c.s, c.nh, c.kvh, c.d
	C := max(c.tot(), c.past)
	if c.windowCache {
		C = c.past
	}
	ld, kOff, vOff := nh*D, 0, 0
	qOf, kOf, vOf := g.q, g.k, g.v
	ldkv := kvh * D
	if c.packed {
		ld = (nh + 2*kvh) * D
		ldkv, kOff, vOff = ld, nh*D, (nh+kvh)*D
		kOf, vOf = g.q, g.q
	}
	half := c.rotaryDim / 2
	rotate := func(x []float64, p int) []float64 {
		o := append([]float64(nil), x...)
		for i := 0; i < half; i++ {
			i1, i2 := i, i+half
			if c.rotary == 2 {
				i1, i2 = 2*i, 2*i+1
			}
			cs, sn := g.cos[p*half+i], g.sin[p*half+i]
			o[i1] = cs*x[i1] - sn*x[i2]
			o[i2] = sn*x[i1] + cs*x[i2]
		}
		return o
	}
	presK, presV = make([]float64, B*kvh*C*D), make([]float64, B*kvh*C*D)
	y = make([]float64, B*S*nh*D)
	scale := float64(c.scale)
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(D))
	}
	for b := 0; b < B; b++ {
		T := c.lens[b]
		off := T - S
		if c.prompt {
			off = 0
		}
		// keys[h] holds positions base .. T-1 (base > 0 only for a window
		// cache, whose past rows are the last L(off) positions)
		base, lp := 0, off
		if c.windowCache {
			lp = residentRows(off, C, c.window)
			base = off - lp
		}
		keys, vals := make([][]float64, kvh), make([][]float64, kvh)
		for h := 0; h < kvh; h++ {
			keys[h] = append([]float64(nil), g.pk[(b*kvh+h)*c.past*D:][:lp*D]...)
			vals[h] = append([]float64(nil), g.pv[(b*kvh+h)*c.past*D:][:lp*D]...)
			for s := 0; s < S; s++ {
				kr := kOf[(b*S+s)*ldkv+kOff+h*D:][:D]
				if c.rotary > 0 {
					kr = rotate(kr, off+s)
				}
				keys[h] = append(keys[h], kr...)
				vals[h] = append(vals[h], vOf[(b*S+s)*ldkv+vOff+h*D:][:D]...)
			}
			head := (b*kvh + h) * C * D
			from, n := 0, off+S // rows of keys[h] that present keeps
			if c.windowCache {
				keep := residentRows(T, C, c.window)
				from, n = T-keep-base, keep
			}
			copy(presK[head:head+n*D], keys[h][from*D:])
			copy(presV[head:head+n*D], vals[h][from*D:])
		}
		for h := 0; h < nh; h++ {
			kh := h / (nh / kvh)
			for s := 0; s < S; s++ {
				qr := qOf[(b*S+s)*ld+h*D:][:D]
				if c.rotary > 0 {
					qr = rotate(qr, off+s)
				}
				end := min(off+s+1, T)
				lo := 0
				if c.window > 0 && end > c.window {
					lo = end - c.window
				}
				sc := make([]float64, end-lo)
				mx := math.Inf(-1)
				for j := lo; j < end; j++ {
					var dot float64
					for d := 0; d < D; d++ {
						dot += qr[d] * keys[kh][(j-base)*D+d]
					}
					x := dot * scale
					if c.softcap > 0 {
						x = float64(c.softcap) * math.Tanh(x/float64(c.softcap))
					}
					if c.bias {
						x += g.bias[(b*S+s)*c.tot()+j]
					}
					sc[j-lo] = x
					mx = math.Max(mx, x)
				}
				var sum, sink float64
				if c.smooth || c.sink {
					if c.sink {
						sink = g.sink[h]
					}
					mx = math.Max(mx, sink)
					sum = math.Exp(sink - mx)
				}
				for j := range sc {
					sc[j] = math.Exp(sc[j] - mx)
					sum += sc[j]
				}
				out := y[(b*S+s)*nh*D+h*D:][:D]
				for j := lo; j < end; j++ {
					w := sc[j-lo] / sum
					for d := 0; d < D; d++ {
						out[d] += w * vals[kh][(j-base)*D+d]
					}
				}
			}
		}
	}
	return y, presK, presV
}

// residentRows is a window cache's L(T): the positions it keeps after T
// tokens in a buffer of c rows with window w.
func residentRows(T, c, w int) int {
	if T <= c {
		return T
	}
	g := c - w + 1
	return T - g*((T-c+g-1)/g)
}

func (c gqaCase) run(g gqaData) ([]*tensor.Tensor, error) {
	return callDomain("com.microsoft", "GroupQueryAttention", 1, c.attrs(), 3, c.inputs(g)...)
}

func (c gqaCase) inputs(g gqaData) []*tensor.Tensor {
	in := make([]*tensor.Tensor, 12)
	if c.packed {
		in[gqaQuery] = toTensor(c.dt, tensor.Shape{c.b, c.s, (c.nh + 2*c.kvh) * c.d}, g.q)
	} else {
		in[gqaQuery] = toTensor(c.dt, tensor.Shape{c.b, c.s, c.nh * c.d}, g.q)
		in[gqaKey] = toTensor(c.dt, tensor.Shape{c.b, c.s, c.kvh * c.d}, g.k)
		in[gqaValue] = toTensor(c.dt, tensor.Shape{c.b, c.s, c.kvh * c.d}, g.v)
	}
	if c.past > 0 {
		in[gqaPastKey] = toTensor(c.dt, tensor.Shape{c.b, c.kvh, c.past, c.d}, g.pk)
		in[gqaPastValue] = toTensor(c.dt, tensor.Shape{c.b, c.kvh, c.past, c.d}, g.pv)
	}
	sk := make([]int32, c.b)
	for i, l := range c.lens {
		sk[i] = int32(l - 1)
	}
	in[gqaSeqlensK], _ = tensor.FromSlice(tensor.Shape{c.b}, sk)
	in[gqaTotalSeqLen], _ = tensor.FromSlice(tensor.Shape{}, []int32{int32(c.tot())})
	if c.rotary > 0 {
		rows := len(g.cos) / (c.rotaryDim / 2)
		in[gqaCos] = toTensor(c.dt, tensor.Shape{rows, c.rotaryDim / 2}, g.cos)
		in[gqaSin] = toTensor(c.dt, tensor.Shape{rows, c.rotaryDim / 2}, g.sin)
	}
	if c.bias {
		in[gqaBias] = toTensor(c.dt, tensor.Shape{c.b, 1, c.s, c.tot()}, g.bias)
	}
	if c.sink {
		in[gqaHeadSink] = toTensor(c.dt, tensor.Shape{c.nh}, g.sink)
	}
	return in
}

func (c gqaCase) attrs() Attributes {
	at := attrs(intA("num_heads", int64(c.nh)), intA("kv_num_heads", int64(c.kvh)), intA("local_window_size", int64(c.window)),
		intA("do_rotary", int64(min(c.rotary, 1))), intA("rotary_interleaved", int64(c.rotary/2)),
		fltA("softcap", c.softcap), fltA("scale", c.scale))
	if c.smooth {
		at["smooth_softmax"] = intA("smooth_softmax", 1)
	}
	if c.windowCache {
		at["sliding_window_cache"] = intA("sliding_window_cache", 1)
	}
	return at
}

func gqaCases() []gqaCase {
	base := gqaCase{b: 2, s: 1, nh: 8, kvh: 2, d: 16, past: 24, lens: []int{5, 17}, dt: tensor.Float32, window: -1}
	var cs []gqaCase
	add := func(name string, f func(c *gqaCase)) {
		c := base
		c.name = name
		c.lens = append([]int(nil), base.lens...)
		f(&c)
		if c.rotary > 0 && c.rotaryDim == 0 {
			c.rotaryDim = c.d
		}
		cs = append(cs, c)
	}
	add("decode", func(c *gqaCase) {})
	add("decode full buffer", func(c *gqaCase) { c.lens = []int{24, 3} })
	add("decode rotary", func(c *gqaCase) { c.rotary = 1 })
	add("decode rotary interleaved partial", func(c *gqaCase) { c.rotary, c.rotaryDim = 2, 8 })
	add("decode window", func(c *gqaCase) { c.window = 4 })
	add("decode softcap scale", func(c *gqaCase) { c.softcap, c.scale = 2, 0.4 })
	add("decode smooth", func(c *gqaCase) { c.smooth = true })
	add("decode sink", func(c *gqaCase) { c.sink = true })
	add("decode sink and smooth", func(c *gqaCase) { c.sink, c.smooth = true, true })
	add("decode bias", func(c *gqaCase) { c.bias = true })
	add("decode packed mqa", func(c *gqaCase) { c.packed, c.kvh = true, 1 })
	add("decode float16", func(c *gqaCase) { c.dt, c.rotary = tensor.Float16, 1 })
	add("decode bfloat16", func(c *gqaCase) { c.dt, c.window = tensor.BFloat16, 6 })
	add("decode mha", func(c *gqaCase) { c.kvh = 8 })
	add("multi-token step", func(c *gqaCase) { c.b, c.s, c.lens, c.rotary = 1, 5, []int{14}, 1 })
	add("multi-token step window smooth", func(c *gqaCase) { c.b, c.s, c.lens, c.window, c.smooth = 1, 3, []int{11}, 3, true })
	add("prompt no past", func(c *gqaCase) { c.b, c.s, c.past, c.lens, c.prompt = 1, 7, 0, []int{7}, true })
	add("prompt padded batch rotary", func(c *gqaCase) { c.s, c.lens, c.prompt, c.rotary = 6, []int{6, 2}, true, 2 })
	add("prompt window softcap packed", func(c *gqaCase) {
		c.s, c.lens, c.prompt, c.window, c.softcap, c.packed = 9, []int{9, 9}, true, 3, 5, true
	})
	add("prompt float16 sink bias", func(c *gqaCase) {
		c.s, c.lens, c.prompt, c.dt, c.sink, c.bias = 4, []int{4, 3}, true, tensor.Float16, true, true
	})
	add("window cache decode evicting", func(c *gqaCase) {
		c.b, c.lens, c.past, c.window, c.windowCache, c.rotary = 3, []int{9, 4, 16}, 6, 4, true, 1
	})
	add("window cache multi-token step bias", func(c *gqaCase) {
		c.b, c.s, c.lens, c.past, c.window, c.windowCache, c.bias = 1, 4, []int{21}, 8, 5, true, true
	})
	add("window cache prompt longer than buffer", func(c *gqaCase) {
		c.b, c.s, c.lens, c.past, c.window, c.windowCache, c.prompt = 1, 11, []int{11}, 5, 3, true, true
	})
	add("window cache float16 smooth", func(c *gqaCase) {
		c.lens, c.past, c.window, c.windowCache, c.smooth, c.dt = []int{12, 7}, 7, 7, true, true, tensor.Float16
	})
	add("growing cache", func(c *gqaCase) { c.past, c.lens, c.total = 16, []int{17, 9}, 17 })
	return cs
}

// TestGroupQueryAttentionAgainstNaive runs every case on both paths
// (streaming decode kernel where it applies, and the mha unit) against the
// float64 contract.
func TestGroupQueryAttentionAgainstNaive(t *testing.T) {
	defer func() { gqaDecodeKernel = true }()
	for ci, c := range gqaCases() {
		g := c.data(rand.New(rand.NewSource(int64(ci))))
		wy, wk, wv := gqaNaive(c, g)
		for _, dec := range []bool{true, false} {
			gqaDecodeKernel = dec
			outs, err := c.run(g)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			tol := 2e-5
			if c.dt != tensor.Float32 {
				tol = 1e-2
			}
			for i, want := range [][]float64{wy, wk, wv} {
				got, _ := tensor.AsFloat32(outs[i])
				if len(got) != len(want) {
					t.Fatalf("%s output %d: %d values, want %d", c.name, i, len(got), len(want))
				}
				for j := range got {
					if i == 0 && c.prompt && !promptRowValid(c, j) {
						continue
					}
					if d := math.Abs(float64(got[j]) - want[j]); !(d <= tol*(1+math.Abs(want[j]))) {
						t.Fatalf("%s (decode kernel %v) output %d[%d] = %v, want %v", c.name, dec, i, j, got[j], want[j])
					}
				}
			}
		}
	}
}

// promptRowValid reports whether flat output element j of a prompt is in a
// valid (not right-padding) row.
func promptRowValid(c gqaCase, j int) bool {
	row := j / (c.nh * c.d)
	return row%c.s < c.lens[row/c.s]
}

func TestGroupQueryAttentionErrors(t *testing.T) {
	base := gqaCases()[0]
	g := base.data(rand.New(rand.NewSource(1)))
	for _, c := range []struct {
		name string
		f    func(c *gqaCase)
		want error
	}{
		{"length above total", func(c *gqaCase) { c.total = 10 }, errs.ErrInvalidArgument},
		{"length past the buffer", func(c *gqaCase) { c.lens = []int{5, 30}; c.total = 30 }, errs.ErrInvalidArgument},
		{"zero length", func(c *gqaCase) { c.lens = []int{0, 5} }, errs.ErrInvalidArgument},
	} {
		cc := base
		cc.lens = append([]int(nil), base.lens...)
		c.f(&cc)
		if _, err := cc.run(g); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	// wrong ranks and types, checked before any data is read
	q := toTensor(tensor.Float32, tensor.Shape{2, 128}, make([]float64, 256))
	sk, _ := tensor.FromSlice(tensor.Shape{2}, []int32{1, 1})
	tot, _ := tensor.FromSlice(tensor.Shape{}, []int32{2})
	at := attrs(intA("num_heads", 8), intA("kv_num_heads", 2))
	if _, err := callDomain("com.microsoft", "GroupQueryAttention", 1, at, 3, q, nil, nil, nil, nil, sk, tot); !errors.Is(err, errs.ErrShape) {
		t.Errorf("2D query: %v", err)
	}
	q3 := toTensor(tensor.Float32, tensor.Shape{2, 1, 192}, make([]float64, 384)) // packed, 8+2*2 heads of 16
	sk64, _ := tensor.FromSlice(tensor.Shape{2}, []int64{1, 1})
	if _, err := callDomain("com.microsoft", "GroupQueryAttention", 1, at, 3, q3, nil, nil, nil, nil, sk64, tot); !errors.Is(err, errs.ErrType) {
		t.Errorf("int64 seqlens_k: %v", err)
	}
	for name, a := range map[string]Attributes{
		"causal 0":             attrs(intA("num_heads", 8), intA("kv_num_heads", 2), intA("causal", 0)),
		"quantized":            attrs(intA("num_heads", 8), intA("kv_num_heads", 2), strA("k_quant_type", "PER_TENSOR")),
		"window cache":         attrs(intA("num_heads", 8), intA("kv_num_heads", 2), intA("sliding_window_cache", 1)),
		"heads not a multiple": attrs(intA("num_heads", 6), intA("kv_num_heads", 4)),
	} {
		_, err := callDomain("com.microsoft", "GroupQueryAttention", 1, a, 3, q3, nil, nil, nil, nil, sk, tot)
		if err == nil || (!errors.Is(err, errs.ErrNotImplemented) && !errors.Is(err, errs.ErrInvalidArgument)) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
