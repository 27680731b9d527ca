package gemm

import (
	"fmt"
	"math"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// Half is the encoding of a B matrix stored as 16-bit floats.
type Half int

// The 16-bit encodings SgemmHalfB reads.
const (
	Float16  Half = 1 // IEEE 754 binary16
	BFloat16 Half = 2 // bfloat16 (the top half of a float32)
)

// SgemmHalfB is SgemmThreads with B stored as 16-bit floats (float16 or
// bfloat16 bits): each value is widened to float32 exactly as it is read,
// so a decode step streams half the weight bytes and no float32 copy of the
// weights is ever kept. Sizes, strides and semantics are those of Sgemm.
func SgemmHalfB(threads int, kind Half, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []uint16, ldb int, beta float32, c []float32, ldc int) error {
	if kind != Float16 && kind != BFloat16 {
		return fmt.Errorf("%w: unknown 16-bit encoding %d", ErrShape, kind)
	}
	if err := checkLens(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	if beta != 1 {
		for i := range m {
			scaleRow(c[i*ldc:i*ldc+n], beta)
		}
	}
	if k == 0 || alpha == 0 {
		return nil
	}
	p := getProduct()
	*p = product{transA: transA, transB: transB, m: m, n: n, k: k, alpha: alpha,
		a: a, lda: lda, bh: b, half: kind, ldb: ldb, c: c, ldc: ldc, ks: active(),
		threads: parallelism(threads, m, n, k)}
	p.run()
	putProduct(p)
	return nil
}

// widen converts src (of encoding kind) into dst.
func (p *product) widen(dst []float32, src []uint16) { p.ks.cvt16(p.half, dst, src) }

// cvt16Go is the portable conversion, exact for every input (subnormals,
// infinities and NaN included).
func cvt16Go(kind Half, dst []float32, src []uint16) {
	dst = dst[:len(src)]
	if kind == BFloat16 {
		for i, h := range src {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
		return
	}
	for i, h := range src {
		x := uint32(h)
		if em := x & 0x7fff; em-0x400 < 0x7800 { // normal: rebias the exponent
			dst[i] = math.Float32frombits((x&0x8000)<<16 | (em<<13 + (127-15)<<23))
		} else {
			dst[i] = codec.F16ToF32(h)
		}
	}
}

var rowsPool = sync.Pool{New: func() any { return new([]float32) }}

// scratch returns a pooled float32 buffer of n values and its release.
func scratch(n int) ([]float32, func()) {
	p := rowsPool.Get().(*[]float32)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	return (*p)[:n], func() { rowsPool.Put(p) }
}

// skinnyAxpyHalf is skinnyAxpy for a 16-bit B: four rows are widened into
// a scratch block (full width, so B is still read as contiguous rows), then
// added with the float32 kernel.
func (p *product) skinnyAxpyHalf(l0, l1 int, c []float32, ldc int) {
	if p.ks.axpy4Half != nil {
		p.skinnyAxpyFused(l0, l1, c, ldc)
		return
	}
	n, ldb, al := p.n, p.ldb, p.alpha
	buf, done := scratch(4 * n)
	defer done()
	x := [4][]float32{buf[:n], buf[n : 2*n], buf[2*n : 3*n], buf[3*n:]}
	l := l0
	for ; l+4 <= l1; l += 4 {
		for r := range 4 {
			p.widen(x[r], p.bh[(l+r)*ldb:(l+r)*ldb+n])
		}
		for j0 := 0; j0 < n; j0 += halfChunk {
			j1 := min(j0+halfChunk, n)
			for i := range p.m {
				p.ks.axpy4(al*p.at(i, l), al*p.at(i, l+1), al*p.at(i, l+2), al*p.at(i, l+3),
					x[0][j0:j1], x[1][j0:j1], x[2][j0:j1], x[3][j0:j1], c[i*ldc+j0:i*ldc+j1])
			}
		}
	}
	for ; l < l1; l++ {
		p.widen(x[0], p.bh[l*ldb:l*ldb+n])
		for i := range p.m {
			p.ks.axpy(al*p.at(i, l), x[0], c[i*ldc:i*ldc+n])
		}
	}
}

// bRow returns row j of the stored B (k values when transB) as float32,
// widening into buf for a 16-bit B.
func (p *product) bRow(j int, buf []float32) []float32 {
	if p.bh == nil {
		return p.b[j*p.ldb : j*p.ldb+p.k]
	}
	p.widen(buf[:p.k], p.bh[j*p.ldb:j*p.ldb+p.k])
	return buf[:p.k]
}

// skinnyAxpyFused is skinnyAxpyHalf with a kernel that widens in registers:
// the same loop as skinnyAxpy over 16-bit rows.
func (p *product) skinnyAxpyFused(l0, l1 int, c []float32, ldc int) {
	b, ldb, al := p.bh, p.ldb, p.alpha
	for j0 := 0; j0 < p.n; j0 += halfChunk {
		j1 := min(j0+halfChunk, p.n)
		l := l0
		for ; l+4 <= l1; l += 4 {
			x0 := b[l*ldb+j0 : l*ldb+j1]
			x1 := b[(l+1)*ldb+j0 : (l+1)*ldb+j1]
			x2 := b[(l+2)*ldb+j0 : (l+2)*ldb+j1]
			x3 := b[(l+3)*ldb+j0 : (l+3)*ldb+j1]
			for i := range p.m {
				p.ks.axpy4Half(p.half, al*p.at(i, l), al*p.at(i, l+1), al*p.at(i, l+2), al*p.at(i, l+3),
					x0, x1, x2, x3, c[i*ldc+j0:i*ldc+j1])
			}
		}
		if l < l1 {
			var tmp [halfChunk]float32
			for ; l < l1; l++ {
				x := tmp[:j1-j0]
				p.widen(x, b[l*ldb+j0:l*ldb+j1])
				for i := range p.m {
					p.ks.axpy(al*p.at(i, l), x, c[i*ldc+j0:i*ldc+j1])
				}
			}
		}
	}
}
