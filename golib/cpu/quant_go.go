package cpu

import "github.com/onnx-light-kv/onnx-light-kv/golib/cache"

// goQuantOps is the portable twin of the quantized-row loops. The SIMD
// variants fall back to it for shapes their assembly does not take.
var goQuantOps = quantOps{
	dots:  func(s, q []float32, k qmat, d, _ int) { goQDots(s, q, k, d) },
	dots4: func(s []float32, ld, n int, q []float32, k qmat, d, _ int) { goQDots4Ld(s, ld, n, q, k, d) },
	axpy:  func(acc, p []float32, v qmat, alpha *[4]float32, _ int) { goQAxpy(acc, p, v, alpha[0]) },
	axpy4: func(acc, p []float32, ld, n int, v qmat, alpha *[4]float32, _ int) {
		goQAxpy4Ld(acc, p, ld, n, v, alpha)
	},
	mul: goMul,
}

func goMul(dst, a, b []float32) {
	b = b[:len(a)]
	for i, x := range a {
		dst[i] = x * b[i]
	}
}

// goQRow dequantizes row t of m into out (len d): the raw integers when m
// carries no scales, else s*q (+ z) per group, as cache.DequantizeSegment.
func goQRow(out []float32, m qmat, t, d int) {
	row := m.b[t*m.rb : (t+1)*m.rb]
	out = out[:d]
	if m.f == cache.QuantInt8 {
		for j := range out {
			out[j] = float32(int8(row[j]))
		}
	} else {
		for j := 0; j+1 < d; j += 2 {
			b := row[j>>1]
			out[j], out[j+1] = float32(b&15), float32(b>>4)
		}
		if d&1 != 0 {
			out[d-1] = float32(row[d>>1] & 15)
		}
	}
	if m.s == nil {
		return
	}
	for gi := 0; gi < m.ng; gi++ {
		sc := m.s[t*m.ng+gi]
		seg := out[gi*m.g : (gi+1)*m.g]
		if m.f == cache.QuantInt4 {
			z := m.z[t*m.ng+gi]
			for j, x := range seg {
				seg[j] = float32(sc*x) + z
			}
		} else {
			for j, x := range seg {
				seg[j] = sc * x
			}
		}
	}
}

// qrowBuf bounds the head dims the twin dequantizes on the stack.
const qrowBuf = 512

func goQDots(s, q []float32, k qmat, d int) {
	var buf [qrowBuf]float32
	x := buf[:min(d, qrowBuf)]
	if d > qrowBuf {
		x = make([]float32, d) // head dims above 512 only
	}
	for t := range s {
		goQRow(x, k, t, d)
		goDots(s[t:t+1], q, x, d)
	}
}

func goQDots4(s, q []float32, k qmat, d int) {
	n := len(s) / 4
	goQDots4Ld(s, n, n, q, k, d)
}

// goQDots4Ld is goQDots4 over n tokens with the rows of s ld apart.
func goQDots4Ld(s []float32, ld, n int, q []float32, k qmat, d int) {
	for r := 0; r < 4; r++ {
		goQDots(s[r*ld:r*ld+n], q[r*d:(r+1)*d], k, d)
	}
}

func goQAxpy(acc, p []float32, v qmat, alpha float32) {
	d := len(acc)
	if alpha != 1 {
		for i := range acc {
			acc[i] *= alpha
		}
	}
	var buf [qrowBuf]float32
	x := buf[:min(d, qrowBuf)]
	if d > qrowBuf {
		x = make([]float32, d) // head dims above 512 only
	}
	for t, pt := range p {
		goQRow(x, v, t, d)
		for i, xi := range x {
			acc[i] += pt * xi
		}
	}
}

func goQAxpy4(acc, p []float32, v qmat, alpha *[4]float32) {
	n := len(p) / 4
	goQAxpy4Ld(acc, p, n, n, v, alpha)
}

// goQAxpy4Ld is goQAxpy4 over n tokens with the rows of p ld apart.
func goQAxpy4Ld(acc, p []float32, ld, n int, v qmat, alpha *[4]float32) {
	d := len(acc) / 4
	for r := 0; r < 4; r++ {
		goQAxpy(acc[r*d:(r+1)*d], p[r*ld:r*ld+n], v, alpha[r])
	}
}
