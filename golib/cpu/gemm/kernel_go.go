package gemm

// goKernels is the portable variant, used on every platform and as the
// reference the SIMD variants are tested against.
var goKernels = kernels{
	name:    "go",
	mr:      4,
	nr:      4,
	micro:   microGo4x4,
	axpy4:   axpy4Go,
	axpy:    axpyGo,
	dot:     dotGo,
	cvt16:   cvt16Go,
	dequant: dequantGo,
	panel:   panelGo,
}

// microGo4x4 computes the 4x4 tile as two 2x4 halves so each half's eight
// accumulators and six operands fit the scalar float registers (a single
// 4x4 pass spilled).
func microGo4x4(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	ap = ap[:4*kc]
	bp = bp[:4*kc]
	for half := 0; half < 4; half += 2 {
		var c00, c01, c02, c03, c10, c11, c12, c13 float32
		for l := 0; l < 4*kc; l += 4 {
			a := ap[l+half : l+half+2 : l+half+2]
			b := bp[l : l+4 : l+4]
			a0, a1 := a[0], a[1]
			b0, b1, b2, b3 := b[0], b[1], b[2], b[3]
			c00 += a0 * b0
			c01 += a0 * b1
			c02 += a0 * b2
			c03 += a0 * b3
			c10 += a1 * b0
			c11 += a1 * b1
			c12 += a1 * b2
			c13 += a1 * b3
		}
		addRow4(c[half*ldc:half*ldc+4], alpha, c00, c01, c02, c03)
		addRow4(c[(half+1)*ldc:(half+1)*ldc+4], alpha, c10, c11, c12, c13)
	}
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
