package gemm

// goKernels is the portable variant, used on every platform and as the
// reference the SIMD variants are tested against.
var goKernels = kernels{
	name:  "go",
	mr:    4,
	nr:    4,
	micro: microGo4x4,
	axpy4: axpy4Go,
	axpy:  axpyGo,
	dot:   dotGo,
}

// microGo4x4 keeps the 4x4 tile in 16 scalar accumulators.
func microGo4x4(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	var c20, c21, c22, c23, c30, c31, c32, c33 float32
	ap = ap[:4*kc]
	bp = bp[:4*kc]
	for l := 0; l < 4*kc; l += 4 {
		a := ap[l : l+4 : l+4]
		b := bp[l : l+4 : l+4]
		a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
		b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	addRow4(c[:4], alpha, c00, c01, c02, c03)
	addRow4(c[ldc:ldc+4], alpha, c10, c11, c12, c13)
	addRow4(c[2*ldc:2*ldc+4], alpha, c20, c21, c22, c23)
	addRow4(c[3*ldc:3*ldc+4], alpha, c30, c31, c32, c33)
}

func addRow4(c []float32, alpha, v0, v1, v2, v3 float32) {
	c = c[:4]
	c[0] += alpha * v0
	c[1] += alpha * v1
	c[2] += alpha * v2
	c[3] += alpha * v3
}

func axpy4Go(a0, a1, a2, a3 float32, x0, x1, x2, x3, y []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for i := range y {
		y[i] += a0*x0[i] + a1*x1[i] + a2*x2[i] + a3*x3[i]
	}
}

func axpyGo(a float32, x, y []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// dotGo uses four partial sums so the adds do not form one serial chain.
func dotGo(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}
