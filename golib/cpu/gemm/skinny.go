package gemm

import "sync"

// Short products: op(A) has at most skinnyRows rows, so every element of
// op(B) is used at most that many times. Packing would double the traffic on
// B (the weights), so B is streamed once, in column chunks that keep the C
// rows in L1, and the work is split over those chunks.

// skinnyChunk is the number of C columns updated per pass over a range of
// B rows. Wide passes read each B row as one long contiguous run, which is
// what keeps the hardware prefetcher streaming (narrow passes measured well
// under the machine's read bandwidth); the C rows then live in L2. 32768
// covers a 32000-word vocabulary in one pass: on the 1x1024x32000 LM head
// it streamed ~5-25% faster than 16384 (one and two threads, interleaved
// runs), and 8192 was slower still.
const skinnyChunk = 32768

// halfChunk is skinnyChunk for 16-bit B, whose widened rows sit in a stack
// buffer of this many words.
const halfChunk = 16384

// skinnyDotRows is the number of op(B) columns (rows of B when transB) one
// task owns.
const skinnyDotRows = 32

var partialPool = sync.Pool{New: func() any { return new([]float32) }}

// skinnySplit is the number of inner-dimension chunks per thread: more
// chunks than threads let a helper that joins late (a busy machine, or one
// woken from parking) still take an even share, at the cost of one partial
// C per extra chunk to add up.
const skinnySplit = 4

// skinnyMinRows is the least number of B rows per chunk: it keeps the chunks
// long contiguous runs and the partial sums few.
const skinnyMinRows = 32

// skinny streams B once. Without transB the threads split the inner
// dimension into chunks of consecutive B rows, so each chunk is one
// contiguous block of B; the first chunk accumulates into C, every other
// into its own partial C, and the partials are added in chunk order, so the
// result does not depend on which thread ran which chunk.
func (p *product) skinny() {
	if p.transB {
		p.skinnyDot()
		return
	}
	parts := 1
	if p.threads > 1 {
		parts = min(p.threads*skinnySplit, max(1, p.k/skinnyMinRows))
	}
	if parts <= 1 {
		p.skinnyPart(0, p.k, p.c, p.ldc, &p.scr)
		return
	}
	step := ((p.k+parts-1)/parts + 7) &^ 7
	parts = (p.k + step - 1) / step
	buf := partialPool.Get().(*[]float32)
	defer partialPool.Put(buf)
	size := p.m * p.n
	if cap(*buf) < (parts-1)*size {
		*buf = make([]float32, (parts-1)*size)
	}
	partial := (*buf)[:(parts-1)*size]
	ForThreads(p.threads, parts, func(t int) {
		l0, l1 := t*step, min((t+1)*step, p.k)
		if t == 0 {
			p.skinnyPart(l0, l1, p.c, p.ldc, &p.scr)
			return
		}
		part := partial[(t-1)*size : t*size]
		clear(part)
		p.skinnyPart(l0, l1, part, p.n, new(axpyScratch))
	})
	p.reduce(partial, parts-1)
}

// reduceCols is the number of C columns one task of the reduction adds.
const reduceCols = 4096

// reduce adds the parts partial C matrices (m x n each, packed) to C in
// order, in column strips spread over the threads when C is wide.
func (p *product) reduce(partial []float32, parts int) {
	size := p.m * p.n
	strips := (p.n + reduceCols - 1) / reduceCols
	ForThreads(p.threads, p.m*strips, func(u int) {
		i, j0 := u/strips, (u%strips)*reduceCols
		j1 := min(j0+reduceCols, p.n)
		y := p.c[i*p.ldc+j0 : i*p.ldc+j1]
		for t := range parts {
			p.ks.axpy(1, partial[t*size+i*p.n+j0:t*size+i*p.n+j1], y)
		}
	})
}

// axpyScratch holds skinnyAxpy's coefficient and row-view arrays: passed to
// the kernels through function values they would escape, one heap
// allocation each per call, so they live in the product (the calling
// thread's) or in one allocation per helper task.
type axpyScratch struct {
	am [skinnyRows][8]float32
	a  [8]float32
	x  [8][]float32
	y  [skinnyRows][]float32
}

// skinnyPart is skinnyAxpy or, for 16-bit B, skinnyAxpyHalf (called
// directly: a method value would be a heap allocation per call).
func (p *product) skinnyPart(l0, l1 int, c []float32, ldc int, s *axpyScratch) {
	if p.bh != nil {
		p.skinnyAxpyHalf(l0, l1, c, ldc)
		return
	}
	p.skinnyAxpy(l0, l1, c, ldc, s)
}

// skinnyAxpy adds alpha * op(A)[:, l0:l1] * B[l0:l1, :] into c (row stride
// ldc), four rows of B at a time so each C element is loaded and stored
// (l1-l0)/4 times; s is the calling task's scratch.
func (p *product) skinnyAxpy(l0, l1 int, c []float32, ldc int, s *axpyScratch) {
	b, ldb, al := p.b, p.ldb, p.alpha
	for j0 := 0; j0 < p.n; j0 += skinnyChunk {
		j1 := min(j0+skinnyChunk, p.n)
		l := l0
		if p.ks.axpy8m != nil && p.m > 1 {
			a, x, y := &s.am, &s.x, &s.y
			for i := range p.m {
				y[i] = c[i*ldc+j0 : i*ldc+j1]
			}
			for ; l+8 <= l1; l += 8 {
				for r := range 8 {
					x[r] = b[(l+r)*ldb+j0 : (l+r)*ldb+j1]
				}
				for i := range p.m {
					for r := range 8 {
						a[i][r] = al * p.at(i, l+r)
					}
				}
				p.ks.axpy8m(p.m, a, x, y)
			}
		}
		if p.ks.axpy8 != nil {
			a, x := &s.a, &s.x
			for ; l+8 <= l1; l += 8 {
				for r := range 8 {
					x[r] = b[(l+r)*ldb+j0 : (l+r)*ldb+j1]
				}
				for i := range p.m {
					for r := range 8 {
						a[r] = al * p.at(i, l+r)
					}
					p.ks.axpy8(a, x, c[i*ldc+j0:i*ldc+j1])
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
