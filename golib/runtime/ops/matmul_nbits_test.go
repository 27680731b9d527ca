package ops

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// nbitsCase is one MatMulNBits problem: the quantized values q (N x K), the
// per-block scales and zero points as the reference reads them, and the
// tensors the op takes.
type nbitsCase struct {
	k, n, bits, block int
	dt                tensor.DType
	zpKind            string // "none", "uint8" or "float"
	aShape            tensor.Shape
	bias              bool

	q      [][]int     // [N][K] quantized values
	scale  [][]float64 // [N][k_blocks], as the op's type holds them
	zp     [][]float64 // [N][k_blocks]
	a      []float64   // A's values as the op's type holds them
	biasV  []float64
	inputs []*tensor.Tensor // A, B, scales, zero_points, g_idx, bias (nil: omitted)
}

// packBits writes vals (each < 2^bits) into a little-endian bit stream of
// nbytes bytes: value i occupies bits i*bits .. i*bits+bits-1.
func packBits(vals []int, bits, nbytes int) []uint8 {
	out := make([]uint8, nbytes)
	for i, v := range vals {
		for b := range bits {
			if v>>b&1 == 1 {
				pos := i*bits + b
				out[pos/8] |= 1 << (pos % 8)
			}
		}
	}
	return out
}

// halfRound returns v as the float type dt holds it.
func halfRound(t *testing.T, dt tensor.DType, v []float32) []float64 {
	t.Helper()
	x := halfT(t, dt, tensor.Shape{len(v)}, v)
	f, err := tensor.AsFloat32(x)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(f))
	for i, y := range f {
		out[i] = float64(y)
	}
	return out
}

func u8Tensor(t *testing.T, shape tensor.Shape, v []uint8) *tensor.Tensor {
	t.Helper()
	x, err := tensor.FromSlice(shape, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// build draws the case's random values and makes its input tensors.
func (c *nbitsCase) build(t *testing.T, r *rand.Rand) {
	t.Helper()
	kb := (c.k + c.block - 1) / c.block
	blob := c.block * c.bits / 8
	levels := 1 << c.bits
	bData := make([]uint8, 0, c.n*kb*blob)
	c.q = make([][]int, c.n)
	for n := range c.n {
		c.q[n] = make([]int, c.k)
		for k := range c.k {
			c.q[n][k] = r.IntN(levels)
		}
		for blk := range kb {
			vals := make([]int, c.block) // the partial last block's padding stays 0
			copy(vals, c.q[n][blk*c.block:min((blk+1)*c.block, c.k)])
			if blk == kb-1 && c.k%c.block != 0 {
				for j := c.k % c.block; j < c.block; j++ {
					vals[j] = r.IntN(levels) // padding: must be ignored
				}
			}
			bData = append(bData, packBits(vals, c.bits, blob)...)
		}
	}
	sv := make([]float32, c.n*kb)
	for i := range sv {
		sv[i] = float32(0.01 + 0.05*r.Float64())
		if r.IntN(4) == 0 {
			sv[i] = -sv[i]
		}
	}
	scalesFlat := halfRound(t, c.dt, sv)
	c.scale, c.zp = make([][]float64, c.n), make([][]float64, c.n)
	var zpT *tensor.Tensor
	switch c.zpKind {
	case "uint8":
		per := (kb*c.bits + 7) / 8
		zd := make([]uint8, 0, c.n*per)
		for n := range c.n {
			zs := make([]int, kb)
			c.zp[n] = make([]float64, kb)
			for blk := range kb {
				zs[blk] = r.IntN(levels)
				c.zp[n][blk] = float64(zs[blk])
			}
			zd = append(zd, packBits(zs, c.bits, per)...)
		}
		zpT = u8Tensor(t, tensor.Shape{c.n, per}, zd)
		if c.n%2 == 1 {
			zpT = u8Tensor(t, tensor.Shape{c.n * per}, zd) // the 1D form
		}
	case "float":
		zv := make([]float32, c.n*kb)
		for i := range zv {
			zv[i] = float32(r.Float64() * float64(levels-1))
		}
		zr := halfRound(t, c.dt, zv)
		for n := range c.n {
			c.zp[n] = zr[n*kb : (n+1)*kb]
		}
		zpT = halfT(t, c.dt, tensor.Shape{c.n, kb}, zv)
	default:
		for n := range c.n {
			c.zp[n] = slices.Repeat([]float64{float64(levels / 2)}, kb)
		}
	}
	for n := range c.n {
		c.scale[n] = scalesFlat[n*kb : (n+1)*kb]
	}
	av := make([]float32, c.aShape.Size())
	for i := range av {
		av[i] = float32(r.NormFloat64())
	}
	c.a = halfRound(t, c.dt, av)
	scalesShape := tensor.Shape{c.n, kb}
	if c.n%3 == 0 {
		scalesShape = tensor.Shape{c.n * kb} // the 1D form
	}
	c.inputs = []*tensor.Tensor{halfT(t, c.dt, c.aShape, av), u8Tensor(t, tensor.Shape{c.n, kb, blob}, bData),
		halfT(t, c.dt, scalesShape, sv), zpT, nil, nil}
	if c.bias {
		bv := make([]float32, c.n)
		for i := range bv {
			bv[i] = float32(r.NormFloat64())
		}
		c.biasV = halfRound(t, c.dt, bv)
		c.inputs[nbitsBias] = halfT(t, c.dt, tensor.Shape{c.n}, bv)
	}
}

// reference is the naive product in float64: W[n][k] = (q - zp) * scale of
// k's block, Y = A W^T + bias. It also returns each output's magnitude
// bound (sum of |a w| + |bias|) for the tolerance.
func (c *nbitsCase) reference() (want, mag []float64) {
	m := len(c.a) / c.k
	want, mag = make([]float64, m*c.n), make([]float64, m*c.n)
	for r := range m {
		for n := range c.n {
			var s, am float64
			for k := range c.k {
				blk := k / c.block
				w := (float64(c.q[n][k]) - c.zp[n][blk]) * c.scale[n][blk]
				s += c.a[r*c.k+k] * w
				am += math.Abs(c.a[r*c.k+k] * w)
			}
			if c.bias {
				s += c.biasV[n]
				am += math.Abs(c.biasV[n])
			}
			want[r*c.n+n], mag[r*c.n+n] = s, am
		}
	}
	return want, mag
}

func (c *nbitsCase) attrs() Attributes {
	return attrs(intA("K", int64(c.k)), intA("N", int64(c.n)), intA("bits", int64(c.bits)),
		intA("block_size", int64(c.block)), intA("accuracy_level", 4))
}

// runNBits builds a MatMulNBits kernel for inputs (nil: omitted) and runs
// it twice (the second run reuses what the first left); with constant, B,
// scales and zero_points are the node's constants (initializers), the case
// that dequantizes and packs at build.
func runNBits(as Attributes, constant bool, inputs ...*tensor.Tensor) (*tensor.Tensor, error) {
	f, err := Lookup("com.microsoft", "MatMulNBits", 1)
	if err != nil {
		return nil, err
	}
	n := &Node{OpType: "MatMulNBits", Domain: "com.microsoft", Opset: 1, Attrs: as, NumInputs: len(inputs),
		NumOutputs: 1, InputPresent: make([]bool, len(inputs)), OutputPresent: []bool{true},
		Constants: make([]*tensor.Tensor, len(inputs))}
	for i, in := range inputs {
		n.InputPresent[i] = in != nil
		if constant && i >= nbitsB && i <= nbitsZeroPoints {
			n.Constants[i] = in
		}
	}
	k, err := f(n)
	if err != nil {
		return nil, err
	}
	var out *tensor.Tensor
	for range 2 {
		ctx := NewContext(inputs, n.OutputPresent, 2, nil)
		ctx.SetAllocator(poisonAlloc{})
		if err := k.Compute(ctx); err != nil {
			return nil, err
		}
		out = ctx.Output(0)
	}
	return out, nil
}

// check runs the case (constant or not) and compares it with reference.
func (c *nbitsCase) check(t *testing.T, constant bool) {
	t.Helper()
	got, err := runNBits(c.attrs(), constant, c.inputs...)
	if err != nil {
		t.Fatal(err)
	}
	wantShape := append(slices.Clone(c.aShape[:len(c.aShape)-1]), c.n)
	if got.DType() != c.dt || !got.Shape().Equal(wantShape) {
		t.Fatalf("output %v %v, want %v %v", got.DType(), got.Shape(), c.dt, wantShape)
	}
	g, err := tensor.AsFloat32(got)
	if err != nil {
		t.Fatal(err)
	}
	want, mag := c.reference()
	ulp := map[tensor.DType]float64{tensor.Float32: 0, tensor.Float16: 1.0 / 1024, tensor.BFloat16: 1.0 / 128}[c.dt]
	for i, w := range want {
		tol := 1e-5*mag[i] + ulp*math.Abs(w) + 1e-6
		if d := math.Abs(float64(g[i]) - w); !(d <= tol) {
			t.Fatalf("Y[%d] = %v, want %v (diff %.3g > tol %.3g)", i, g[i], w, d, tol)
		}
	}
}

// TestMatMulNBitsLiteral checks one small case worked out by hand, so the
// packing order and the formula do not rest on the reference alone.
func TestMatMulNBitsLiteral(t *testing.T) {
	// K=16, N=2, 4 bits, block 16: one block per row. Row 0 holds q = 0..15
	// (byte i = q[2i] | q[2i+1]<<4), row 1 q = 15 everywhere.
	b := make([]uint8, 32)
	for i := range 8 {
		b[i] = uint8(2*i) | uint8(2*i+1)<<4
		b[16+i] = 0xFF
	}
	a := ft(tensor.Shape{1, 16}, slices.Repeat([]float32{1}, 16)...)
	scales := ft(tensor.Shape{2, 1}, 0.5, 2)
	bq := u8Tensor(t, tensor.Shape{2, 1, 8}, append(b[:8:8], b[16:24]...))
	as := attrs(intA("K", 16), intA("N", 2), intA("bits", 4), intA("block_size", 16))
	for _, constant := range []bool{false, true} {
		// default zero point 8: row 0 sums (0..15 - 8) * 0.5 = (120 - 128) * 0.5 = -4;
		// row 1: 16 * (15 - 8) * 2 = 224
		got, err := runNBits(as, constant, a, bq, scales)
		if err != nil {
			t.Fatal(err)
		}
		if values(got) != "[-4 224]" {
			t.Errorf("constant=%v: got %s, want [-4 224]", constant, values(got))
		}
		// uint8 zero points packed two per byte: row 0 zp 1, row 1 zp 15 (one
		// byte per row, the high nibble unused); bias [1, -1]
		zp := u8Tensor(t, tensor.Shape{2}, []uint8{0xE1, 0x0F})
		got, err = runNBits(as, constant, a, bq, scales, zp, nil, ft(tensor.Shape{2}, 1, -1))
		if err != nil {
			t.Fatal(err)
		}
		// row 0: (120 - 16) * 0.5 + 1 = 53; row 1: 0 - 1
		if values(got) != "[53 -1]" {
			t.Errorf("constant=%v zero points: got %s, want [53 -1]", constant, values(got))
		}
	}
}

// TestMatMulNBitsDequantize checks the op against the naive reference over
// bits, block sizes, K not a multiple of the block size, zero points
// (absent, uint8 packed, float), bias, float16/bfloat16 A and rank-1 to -3
// A, with B constant (dequantized and packed at build) and not (per run).
func TestMatMulNBitsDequantize(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	dts := []tensor.DType{tensor.Float32, tensor.Float16, tensor.BFloat16}
	i := 0
	for _, bits := range []int{2, 4, 8} {
		for _, block := range []int{16, 32, 64, 128} {
			for _, k := range []int{block, 2 * block, 2*block + block/2 + 3, 5} {
				for _, zpKind := range []string{"none", "uint8", "float"} {
					i++
					shapes := []tensor.Shape{{k}, {3, k}, {2, 3, k}, {2, 9, k}}
					c := nbitsCase{k: k, n: 37 + 3*(i%4), bits: bits, block: block, dt: dts[i%3], zpKind: zpKind,
						aShape: shapes[i%4], bias: i%2 == 0}
					name := fmt.Sprintf("bits%d_block%d_k%d_zp%s_%v_a%v_bias%v", bits, block, k, zpKind, c.dt, c.aShape, c.bias)
					t.Run(name, func(t *testing.T) {
						c.build(t, r)
						c.check(t, false)
						c.check(t, true)
					})
				}
			}
		}
	}
}

// TestMatMulNBitsPortableRows runs products longer than gemm.PackedRows on
// each kernel variant: the portable one cannot read the pack in its
// blocked products, so the op feeds it a few rows at a time.
func TestMatMulNBitsPortableRows(t *testing.T) {
	defer gemm.SetPath("auto")
	r := rand.New(rand.NewPCG(5, 6))
	for _, path := range gemm.Paths() {
		t.Run(path, func(t *testing.T) {
			if !gemm.SetPath(path) {
				t.Skip("not available")
			}
			for _, rows := range []int{1, gemm.PackedRows, gemm.PackedRows + 1, 3*gemm.PackedRows + 2, 67} {
				c := nbitsCase{k: 200, n: 70, bits: 4, block: 32, dt: tensor.Float32, zpKind: "uint8",
					aShape: tensor.Shape{rows, 200}, bias: rows%2 == 1}
				c.build(t, r)
				c.check(t, true)
				c.check(t, false)
			}
		})
	}
}

// TestMatMulNBitsEmptyProjection: a B with a 0 dimension is an omitted
// projection; Y is the bias broadcast, or zero.
func TestMatMulNBitsEmptyProjection(t *testing.T) {
	as := attrs(intA("K", 32), intA("N", 3), intA("block_size", 16))
	a := ft(tensor.Shape{2, 32}, make([]float32, 64)...)
	for _, shape := range []tensor.Shape{{0, 2, 8}, {3, 0, 8}, {3, 2, 0}, {0, 0, 0}} {
		b := u8Tensor(t, shape, nil)
		scales := ft(tensor.Shape{0})
		for _, constant := range []bool{false, true} {
			got, err := runNBits(as, constant, a, b, scales, nil, nil, ft(tensor.Shape{3}, 1, 2, 3))
			if err != nil {
				t.Fatalf("B %v: %v", shape, err)
			}
			if !got.Shape().Equal(tensor.Shape{2, 3}) || values(got) != "[1 2 3 1 2 3]" {
				t.Errorf("B %v constant=%v: got %v %s", shape, constant, got.Shape(), values(got))
			}
			got, err = runNBits(as, constant, a, b, scales)
			if err != nil {
				t.Fatal(err)
			}
			if values(got) != "[0 0 0 0 0 0]" {
				t.Errorf("B %v constant=%v without bias: got %s", shape, constant, values(got))
			}
		}
	}
	// the other dimensions must keep their values
	if _, err := runNBits(as, false, a, u8Tensor(t, tensor.Shape{0, 3, 8}, nil), ft(tensor.Shape{0})); !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("B [0 3 8]: got %v, want ErrInvalidModel", err)
	}
}

// TestMatMulNBitsMalformed checks that malformed nodes and inputs are
// refused with the right error class (ValueError or NotImplementedError
// in Python), at build when the weights are constants and at run time
// otherwise, and never panic.
func TestMatMulNBitsMalformed(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	base := nbitsCase{k: 40, n: 5, bits: 4, block: 16, dt: tensor.Float32, zpKind: "uint8", aShape: tensor.Shape{2, 40}, bias: true}
	base.build(t, r)
	in := func(i int, x *tensor.Tensor) []*tensor.Tensor {
		v := slices.Clone(base.inputs)
		if i >= len(v) {
			v = append(v, make([]*tensor.Tensor, i+1-len(v))...)
		}
		v[i] = x
		return v
	}
	with := func(name string, v int64) Attributes {
		as := base.attrs()
		as[name] = intA(name, v)
		return as
	}
	without := func(name string) Attributes {
		as := base.attrs()
		delete(as, name)
		return as
	}
	f16 := func(shape tensor.Shape) *tensor.Tensor {
		return halfT(t, tensor.Float16, shape, make([]float32, shape.Size()))
	}
	cases := []struct {
		name   string
		as     Attributes
		inputs []*tensor.Tensor
		want   error
	}{
		{"no K", without("K"), base.inputs, errs.ErrInvalidModel},
		{"no N", without("N"), base.inputs, errs.ErrInvalidModel},
		{"no block_size", without("block_size"), base.inputs, errs.ErrInvalidModel},
		{"K 0", with("K", 0), base.inputs, errs.ErrInvalidModel},
		{"N -1", with("N", -1), base.inputs, errs.ErrInvalidModel},
		{"block_size 8", with("block_size", 8), base.inputs, errs.ErrInvalidModel},
		{"block_size 24", with("block_size", 24), base.inputs, errs.ErrInvalidModel},
		{"bits 1", with("bits", 1), base.inputs, errs.ErrInvalidModel},
		{"bits 9", with("bits", 9), base.inputs, errs.ErrInvalidModel},
		{"bits 3", with("bits", 3), base.inputs, errs.ErrNotImplemented},
		{"weight_prepacked", with("weight_prepacked", 1), base.inputs, errs.ErrNotImplemented},
		{"K mismatch", with("K", 56), base.inputs, errs.ErrInvalidModel}, // B's shape no longer fits
		{"N mismatch", with("N", 6), base.inputs, errs.ErrInvalidModel},
		{"g_idx", base.attrs(), in(nbitsGIdx, it(tensor.Shape{40}, make([]int64, 40)...)), errs.ErrNotImplemented},
		{"B int8", base.attrs(), in(nbitsB, func() *tensor.Tensor {
			x, _ := tensor.FromSlice(tensor.Shape{5, 3, 8}, make([]int8, 120))
			return x
		}()), errs.ErrInvalidModel},
		{"B rank 2", base.attrs(), in(nbitsB, u8Tensor(t, tensor.Shape{5, 24}, make([]uint8, 120))), errs.ErrInvalidModel},
		{"B blob", base.attrs(), in(nbitsB, u8Tensor(t, tensor.Shape{5, 3, 9}, make([]uint8, 135))), errs.ErrInvalidModel},
		{"scales shape", base.attrs(), in(nbitsScales, ft(tensor.Shape{5, 2}, make([]float32, 10)...)), errs.ErrInvalidModel},
		{"scales 3D", base.attrs(), in(nbitsScales, ft(tensor.Shape{5, 3, 1}, make([]float32, 15)...)), errs.ErrInvalidModel},
		{"scales type", base.attrs(), in(nbitsScales, f16(tensor.Shape{5, 3})), errs.ErrInvalidModel},
		{"scales int", base.attrs(), in(nbitsScales, it(tensor.Shape{5, 3}, make([]int64, 15)...)), errs.ErrInvalidModel},
		{"zp uint8 shape", base.attrs(), in(nbitsZeroPoints, u8Tensor(t, tensor.Shape{5, 3}, make([]uint8, 15))), errs.ErrInvalidModel},
		{"zp float shape", base.attrs(), in(nbitsZeroPoints, ft(tensor.Shape{5, 2}, make([]float32, 10)...)), errs.ErrInvalidModel},
		{"zp type", base.attrs(), in(nbitsZeroPoints, f16(tensor.Shape{5, 3})), errs.ErrInvalidModel},
		{"A K", base.attrs(), in(nbitsA, ft(tensor.Shape{2, 39}, make([]float32, 78)...)), errs.ErrShape},
		{"A scalar", base.attrs(), in(nbitsA, ft(tensor.Shape{}, 1)), errs.ErrShape},
		{"A float64", base.attrs(), in(nbitsA, func() *tensor.Tensor {
			x, _ := tensor.FromSlice(tensor.Shape{2, 40}, make([]float64, 80))
			return x
		}()), errs.ErrInvalidModel},
		{"bias shape", base.attrs(), in(nbitsBias, ft(tensor.Shape{1, 5}, make([]float32, 5)...)), errs.ErrShape},
		{"bias type", base.attrs(), in(nbitsBias, f16(tensor.Shape{5})), errs.ErrInvalidModel},
		{"too many inputs", base.attrs(), append(slices.Clone(base.inputs), nil), errs.ErrInvalidModel},
		{"no scales", base.attrs(), base.inputs[:2], errs.ErrInvalidModel},
	}
	for _, c := range cases {
		for _, constant := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/constant=%v", c.name, constant), func(t *testing.T) {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panic: %v", p)
					}
				}()
				_, err := runNBits(c.as, constant, c.inputs...)
				if !errors.Is(err, c.want) {
					t.Fatalf("got %v, want %v", err, c.want)
				}
			})
		}
	}
	// the base case itself runs
	if _, err := runNBits(base.attrs(), true, base.inputs...); err != nil {
		t.Fatal(err)
	}
}

// TestMatMulNBitsConstantsChanged: a kernel built from constant weights
// that receives other tensors at run time (a rebuilt plan that did not
// rebuild the kernel) computes from what it receives, not from its pack.
func TestMatMulNBitsConstantsChanged(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	c1 := nbitsCase{k: 64, n: 33, bits: 4, block: 32, dt: tensor.Float32, zpKind: "none", aShape: tensor.Shape{3, 64}}
	c2 := c1
	c1.build(t, r)
	c2.build(t, r)
	f, err := Lookup("com.microsoft", "MatMulNBits", 1)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{OpType: "MatMulNBits", Domain: "com.microsoft", Opset: 1, Attrs: c1.attrs(), NumInputs: 3, NumOutputs: 1,
		InputPresent: []bool{true, true, true}, OutputPresent: []bool{true},
		Constants: []*tensor.Tensor{nil, c1.inputs[1], c1.inputs[2]}}
	k, err := f(n)
	if err != nil {
		t.Fatal(err)
	}
	ctx := NewContext(c2.inputs[:3], n.OutputPresent, 1, nil)
	if err := k.Compute(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := tensor.AsFloat32(ctx.Output(0))
	want, mag := c2.reference()
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5*mag[i]+1e-6 {
			t.Fatalf("Y[%d] = %v, want %v", i, got[i], want[i])
		}
	}
}

// TestMatMulNBitsRandomNoPanic feeds random attributes and input shapes
// (mostly near the valid ones) and requires an error or a result, never a
// panic.
func TestMatMulNBitsRandomNoPanic(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	near := func(v int) int { // v, or one off once in 12 draws
		if r.IntN(12) > 0 {
			return v
		}
		return max(0, v+2*r.IntN(2)-1)
	}
	u8 := func(shape tensor.Shape) *tensor.Tensor { return u8Tensor(t, shape, make([]uint8, shape.Size())) }
	f32 := func(shape tensor.Shape) *tensor.Tensor { return ft(shape, make([]float32, shape.Size())...) }
	ran := 0
	for i := range 2000 {
		k, n := 1+r.IntN(70), 1+r.IntN(9)
		bits := []int{2, 4, 8, 4, 0, 3, 9}[r.IntN(7)]
		block := []int{16, 32, 64, 16, 0, 8, 24}[r.IntN(7)]
		as := attrs(intA("K", int64(near(k))), intA("N", int64(near(n))), intA("bits", int64(bits)), intA("block_size", int64(block)))
		kb, blob := 1, 1
		if block > 0 {
			kb, blob = (k+block-1)/block, max(block*bits/8, 0)
		}
		inputs := []*tensor.Tensor{f32(tensor.Shape{near(2), near(k)}), u8(tensor.Shape{near(n), near(kb), near(blob)}),
			f32(tensor.Shape{near(n), near(kb)})}
		switch r.IntN(3) {
		case 1:
			inputs = append(inputs, u8(tensor.Shape{near(n) * near((kb*max(bits, 0)+7)/8)}))
		case 2:
			inputs = append(inputs, f32(tensor.Shape{near(n), near(kb)}))
		}
		if r.IntN(2) == 0 {
			for len(inputs) < nbitsBias {
				inputs = append(inputs, nil)
			}
			inputs = append(inputs, f32(tensor.Shape{near(n)}))
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("case %d (K %v N %v bits %d block %d, inputs %v): panic: %v", i, as["K"].I, as["N"].I, bits, block, inputs, p)
				}
			}()
			if _, err := runNBits(as, i%2 == 0, inputs...); err == nil {
				ran++
			}
		}()
	}
	if ran < 20 {
		t.Errorf("only %d of 2000 random cases were valid: the generator misses the valid region", ran)
	}
	t.Logf("%d of 2000 cases ran", ran)
}
