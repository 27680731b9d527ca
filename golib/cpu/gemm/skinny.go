package gemm

// Short products: op(A) has at most skinnyRows rows, so every element of
// op(B) is used at most that many times. Packing would double the traffic on
// B (the weights), so B is streamed once, in column chunks that keep the C
// rows in L1, and the work is split over those chunks.

// skinnyChunk bounds the number of C columns one task owns: wide enough
// that each row of B is read as a long contiguous run (the hardware
// prefetcher streams it), small enough that the C rows stay in L1.
const (
	skinnyChunkMin = 256
	skinnyChunkMax = 4096
)

// skinnyWidth splits n columns into about one chunk per thread.
func skinnyWidth(n, threads int) int {
	w := (n + threads - 1) / threads
	w = (w + 63) &^ 63
	return min(max(w, skinnyChunkMin), skinnyChunkMax)
}

// skinnyDotRows is the number of op(B) columns (rows of B when transB) one
// task owns.
const skinnyDotRows = 32

func (p *product) skinny() {
	if p.transB {
		p.skinnyDot()
		return
	}
	w := skinnyWidth(p.n, p.threads)
	tasks := (p.n + w - 1) / w
	ForThreads(p.threads, tasks, func(t int) {
		j0 := t * w
		j1 := min(j0+w, p.n)
		p.skinnyAxpy(j0, j1)
	})
}

// skinnyAxpy adds alpha * op(A) * B[:, j0:j1] into C[:, j0:j1], four rows of
// B at a time so each C element is loaded and stored k/4 times.
func (p *product) skinnyAxpy(j0, j1 int) {
	b, ldb, al := p.b, p.ldb, p.alpha
	l := 0
	for ; l+4 <= p.k; l += 4 {
		x0 := b[l*ldb+j0 : l*ldb+j1]
		x1 := b[(l+1)*ldb+j0 : (l+1)*ldb+j1]
		x2 := b[(l+2)*ldb+j0 : (l+2)*ldb+j1]
		x3 := b[(l+3)*ldb+j0 : (l+3)*ldb+j1]
		for i := range p.m {
			y := p.c[i*p.ldc+j0 : i*p.ldc+j1]
			p.ks.axpy4(al*p.at(i, l), al*p.at(i, l+1), al*p.at(i, l+2), al*p.at(i, l+3), x0, x1, x2, x3, y)
		}
	}
	for ; l < p.k; l++ {
		x := b[l*ldb+j0 : l*ldb+j1]
		for i := range p.m {
			p.ks.axpy(al*p.at(i, l), x, p.c[i*p.ldc+j0:i*p.ldc+j1])
		}
	}
}

// skinnyDot handles transB: C[i][j] += alpha * dot(op(A) row i, B row j).
func (p *product) skinnyDot() {
	rows := p.aRows()
	tasks := (p.n + skinnyDotRows - 1) / skinnyDotRows
	ForThreads(p.threads, tasks, func(t int) {
		j1 := min((t+1)*skinnyDotRows, p.n)
		for j := t * skinnyDotRows; j < j1; j++ {
			bj := p.b[j*p.ldb : j*p.ldb+p.k]
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
