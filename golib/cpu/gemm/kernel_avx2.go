//go:build goexperiment.simd && amd64

package gemm

import "simd/archsimd"

var avx2Kernels = kernels{
	name:  "avx2",
	mr:    4,
	nr:    16,
	micro: microAVX2,
	axpy4: axpy4AVX2,
	axpy:  axpyAVX2,
	dot:   dotAVX2,
}

type f8 = archsimd.Float32x8

func load8(s []float32) f8 { return archsimd.LoadFloat32x8((*[8]float32)(s[:8])) }

func bcast8(v float32) f8 { return archsimd.BroadcastFloat32x8(v) }

// microAVX2 keeps a 4x16 tile in 8 ymm accumulators (amd64 Go code has 15
// usable vector registers: X15 is reserved as zero).
func microAVX2(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	var c00, c01, c10, c11, c20, c21, c30, c31 f8
	ap = ap[:4*kc]
	bp = bp[:16*kc]
	for l := range kc {
		b := bp[l*16 : l*16+16 : l*16+16]
		b0, b1 := load8(b[:8]), load8(b[8:])
		a := ap[l*4 : l*4+4 : l*4+4]
		a0 := bcast8(a[0])
		c00 = b0.MulAdd(a0, c00)
		c01 = b1.MulAdd(a0, c01)
		a1 := bcast8(a[1])
		c10 = b0.MulAdd(a1, c10)
		c11 = b1.MulAdd(a1, c11)
		a2 := bcast8(a[2])
		c20 = b0.MulAdd(a2, c20)
		c21 = b1.MulAdd(a2, c21)
		a3 := bcast8(a[3])
		c30 = b0.MulAdd(a3, c30)
		c31 = b1.MulAdd(a3, c31)
	}
	al := bcast8(alpha)
	store8x2(c[0*ldc:], al, c00, c01)
	store8x2(c[1*ldc:], al, c10, c11)
	store8x2(c[2*ldc:], al, c20, c21)
	store8x2(c[3*ldc:], al, c30, c31)
}

// store8x2 does c[0:16] += alpha * (v0, v1).
func store8x2(c []float32, al, v0, v1 f8) {
	c = c[:16]
	v0.MulAdd(al, load8(c[:8])).Store((*[8]float32)(c[:8]))
	v1.MulAdd(al, load8(c[8:])).Store((*[8]float32)(c[8:]))
}

func axpy4AVX2(a0, a1, a2, a3 float32, x0, x1, x2, x3, y []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	v0, v1, v2, v3 := bcast8(a0), bcast8(a1), bcast8(a2), bcast8(a3)
	i := 0
	for ; i+8 <= n; i += 8 {
		acc := load8(y[i:])
		acc = load8(x0[i:]).MulAdd(v0, acc)
		acc = load8(x1[i:]).MulAdd(v1, acc)
		acc = load8(x2[i:]).MulAdd(v2, acc)
		acc = load8(x3[i:]).MulAdd(v3, acc)
		acc.Store((*[8]float32)(y[i : i+8]))
	}
	if i < n {
		axpy4Go(a0, a1, a2, a3, x0[i:], x1[i:], x2[i:], x3[i:], y[i:])
	}
}

func axpyAVX2(a float32, x, y []float32) {
	n := len(y)
	x = x[:n]
	v := bcast8(a)
	i := 0
	for ; i+8 <= n; i += 8 {
		load8(x[i:]).MulAdd(v, load8(y[i:])).Store((*[8]float32)(y[i : i+8]))
	}
	if i < n {
		axpyGo(a, x[i:], y[i:])
	}
}

func dotAVX2(x, y []float32) float32 {
	n := len(x)
	y = y[:n]
	var s0, s1, s2, s3 f8
	i := 0
	for ; i+32 <= n; i += 32 {
		s0 = load8(x[i:]).MulAdd(load8(y[i:]), s0)
		s1 = load8(x[i+8:]).MulAdd(load8(y[i+8:]), s1)
		s2 = load8(x[i+16:]).MulAdd(load8(y[i+16:]), s2)
		s3 = load8(x[i+24:]).MulAdd(load8(y[i+24:]), s3)
	}
	for ; i+8 <= n; i += 8 {
		s0 = load8(x[i:]).MulAdd(load8(y[i:]), s0)
	}
	var lanes [8]float32
	s0.Add(s1).Add(s2.Add(s3)).Store(&lanes)
	var s float32
	for _, v := range lanes {
		s += v
	}
	if i < n {
		s += dotGo(x[i:], y[i:])
	}
	return s
}
