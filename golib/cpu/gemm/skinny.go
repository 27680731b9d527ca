package gemm

import "sync"

// Short products: op(A) has at most skinnyRows rows, so every element of
// op(B) is used at most that many times. Packing would double the traffic on
// B (the weights), so B is streamed once, in column chunks that keep the C
// rows in L1, and the work is split over those chunks.

// skinnyChunk is the number of C columns updated per pass over a range of
// B rows. Wide passes read each B row as one long contiguous run, which is
// what keeps the hardware prefetcher streaming (narrow passes measured well
// under the machine's read bandwidth); the C rows then live in L2.
const skinnyChunk = 16384

// skinnyDotRows is the number of op(B) columns (rows of B when transB) one
// task owns.
const skinnyDotRows = 32

var partialPool = sync.Pool{New: func() any { return new([]float32) }}

// skinny streams B once. Without transB the threads split the inner
// dimension, so each one reads a single contiguous block of B rows; all but
// the first accumulate into a private copy of C that is added at the end.
func (p *product) skinny() {
	if p.transB {
		p.skinnyDot()
		return
	}
	axpy := p.skinnyAxpy
	if p.bh != nil {
		axpy = p.skinnyAxpyHalf
	}
	parts := min(p.threads, (p.k+3)/4)
	if parts <= 1 {
		axpy(0, p.k, p.c, p.ldc)
		return
	}
	step := ((p.k+parts-1)/parts + 3) &^ 3
	parts = (p.k + step - 1) / step
	buf := partialPool.Get().(*[]float32)
	defer partialPool.Put(buf)
	size := p.m * p.n
	if cap(*buf) < (parts-1)*size {
		*buf = make([]float32, (parts-1)*size)
	}
	partial := (*buf)[:(parts-1)*size]
	clear(partial)
	ForThreads(parts, parts, func(t int) {
		l0, l1 := t*step, min((t+1)*step, p.k)
		if t == 0 {
			axpy(l0, l1, p.c, p.ldc)
			return
		}
		axpy(l0, l1, partial[(t-1)*size:t*size], p.n)
	})
	for t := range parts - 1 {
		for i := range p.m {
			p.ks.axpy(1, partial[t*size+i*p.n:t*size+(i+1)*p.n], p.c[i*p.ldc:i*p.ldc+p.n])
		}
	}
}

// skinnyAxpy adds alpha * op(A)[:, l0:l1] * B[l0:l1, :] into c (row stride
// ldc), four rows of B at a time so each C element is loaded and stored
// (l1-l0)/4 times.
func (p *product) skinnyAxpy(l0, l1 int, c []float32, ldc int) {
	b, ldb, al := p.b, p.ldb, p.alpha
	for j0 := 0; j0 < p.n; j0 += skinnyChunk {
		j1 := min(j0+skinnyChunk, p.n)
		l := l0
		if p.ks.axpy8 != nil {
			var a [8]float32
			var x [8][]float32
			for ; l+8 <= l1; l += 8 {
				for r := range 8 {
					x[r] = b[(l+r)*ldb+j0 : (l+r)*ldb+j1]
				}
				for i := range p.m {
					for r := range 8 {
						a[r] = al * p.at(i, l+r)
					}
					p.ks.axpy8(&a, &x, c[i*ldc+j0:i*ldc+j1])
				}
			}
		}
		for ; l+4 <= l1; l += 4 {
			x0 := b[l*ldb+j0 : l*ldb+j1]
			x1 := b[(l+1)*ldb+j0 : (l+1)*ldb+j1]
			x2 := b[(l+2)*ldb+j0 : (l+2)*ldb+j1]
			x3 := b[(l+3)*ldb+j0 : (l+3)*ldb+j1]
			for i := range p.m {
				y := c[i*ldc+j0 : i*ldc+j1]
				p.ks.axpy4(al*p.at(i, l), al*p.at(i, l+1), al*p.at(i, l+2), al*p.at(i, l+3), x0, x1, x2, x3, y)
			}
		}
		for ; l < l1; l++ {
			x := b[l*ldb+j0 : l*ldb+j1]
			for i := range p.m {
				p.ks.axpy(al*p.at(i, l), x, c[i*ldc+j0:i*ldc+j1])
			}
		}
	}
}

// skinnyDot handles transB: C[i][j] += alpha * dot(op(A) row i, B row j).
func (p *product) skinnyDot() {
	rows := p.aRows()
	tasks := (p.n + skinnyDotRows - 1) / skinnyDotRows
	ForThreads(p.threads, tasks, func(t int) {
		var buf []float32
		if p.bh != nil {
			b, done := scratch(p.k)
			defer done()
			buf = b
		}
		j1 := min((t+1)*skinnyDotRows, p.n)
		for j := t * skinnyDotRows; j < j1; j++ {
			bj := p.bRow(j, buf)
			for i, ai := range rows {
				p.c[i*p.ldc+j] += p.alpha * p.ks.dot(ai, bj)
			}
		}
	})
}

// aRows returns the rows of op(A) as contiguous slices, gathering them when
// A is transposed (at most skinnyRows*k values).
func (p *product) aRows() [][]float32 {
	rows := make([][]float32, p.m)
	if !p.transA {
		for i := range rows {
			rows[i] = p.a[i*p.lda : i*p.lda+p.k]
		}
		return rows
	}
	buf := make([]float32, p.m*p.k)
	for i := range rows {
		r := buf[i*p.k : (i+1)*p.k]
		for l := range r {
			r[l] = p.a[l*p.lda+i]
		}
		rows[i] = r
	}
	return rows
}
