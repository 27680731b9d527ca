package gemm

import (
	"errors"
	"fmt"
	"math"
	"sync"
)

// ErrShape reports sizes, leading dimensions or slice lengths that do not
// describe the product asked for.
var ErrShape = errors.New("gemm: bad shape")

// skinnyRows is the largest row count of op(A) served by the streaming
// (GEMV-like) path; above it packing pays for itself.
const skinnyRows = 4

// Sgemm computes C = alpha*op(A)*op(B) + beta*C where op(X) is X or X^T.
// All matrices are row-major: op(A) is m x k, op(B) is k x n, C is m x n.
// lda, ldb and ldc are the distances between consecutive rows of A, B and C
// as stored (A is k x m when transA). When beta is 0, C is not read (NaNs in
// it do not propagate), as in BLAS. The slices must cover the last element
// they are indexed at; nothing is allocated per call beyond pooled buffers.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int) error {
	return SgemmThreads(0, transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// SgemmThreads is Sgemm using at most threads threads (the caller
// included); threads <= 0 means Threads().
func SgemmThreads(threads int, transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int) error {
	if err := check(transA, transB, m, n, k, a, lda, b, ldb, c, ldc); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	ks := active()
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
		a: a, lda: lda, b: b, ldb: ldb, c: c, ldc: ldc, ks: ks, threads: parallelism(threads, m, n, k)}
	p.run()
	putProduct(p)
	return nil
}

// productPool recycles the products of Sgemm calls: the parallel paths'
// closures move a product to the heap, which was one allocation per call
// (a decode step makes dozens of small products). run returns only when
// every task is done, so a product is free again after it.
var productPool = sync.Pool{New: func() any { return new(product) }}

func getProduct() *product { return productPool.Get().(*product) }

// putProduct clears p (it must not keep the caller's matrices alive) and
// returns it to the pool.
func putProduct(p *product) {
	*p = product{}
	productPool.Put(p)
}

func (p *product) run() {
	if p.m <= skinnyRows {
		p.skinny()
		return
	}
	p.blocked()
}

// product is one validated call, shared by the two strategies.
type product struct {
	transA, transB bool
	m, n, k        int
	alpha          float32
	a              []float32
	lda            int
	b              []float32
	ldb            int
	c              []float32
	ldc            int
	ks             *kernels
	threads        int
	// bh replaces b when B is stored as 16-bit floats of encoding half.
	bh   []uint16
	half Half
	// pb replaces b when B is packed (SgemmPacked beyond PackedRows rows):
	// its blocks are already what packB would build.
	pb *PackedB
	// scr is the calling thread's skinnyAxpy scratch.
	scr axpyScratch
}

// at returns op(A)[i][l].
func (p *product) at(i, l int) float32 {
	if p.transA {
		return p.a[l*p.lda+i]
	}
	return p.a[i*p.lda+l]
}

// minWorkPerThread is the number of multiply-adds below which another
// thread costs more (waking it, sharing cache lines) than it saves.
const minWorkPerThread = 1 << 18

// parallelism bounds the threads of one product by its size.
func parallelism(threads, m, n, k int) int {
	t := Threads()
	if threads > 0 {
		t = min(t, threads)
	}
	work := float64(m) * float64(n) * float64(k)
	return max(1, min(t, int(work/minWorkPerThread)))
}

func check(transA, transB bool, m, n, k int, a []float32, lda int,
	b []float32, ldb int, c []float32, ldc int) error {
	return checkLens(transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
}

func checkLens(transA, transB bool, m, n, k int, a, lda, b, ldb, c, ldc int) error {
	if m < 0 || n < 0 || k < 0 {
		return fmt.Errorf("%w: negative size m=%d n=%d k=%d", ErrShape, m, n, k)
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	if err := checkMatrix("A", a, ar, ac, lda); err != nil {
		return err
	}
	if err := checkMatrix("B", b, br, bc, ldb); err != nil {
		return err
	}
	return checkMatrix("C", c, m, n, ldc)
}

func checkMatrix(name string, length, rows, cols, ld int) error {
	if ld < max(cols, 1) {
		return fmt.Errorf("%w: ld%s=%d smaller than its %d columns", ErrShape, name, ld, cols)
	}
	if rows == 0 || cols == 0 {
		return nil
	}
	if rows-1 > (math.MaxInt-cols)/ld {
		return fmt.Errorf("%w: %s of %dx%d with ld %d overflows", ErrShape, name, rows, cols, ld)
	}
	if need := (rows-1)*ld + cols; length < need {
		return fmt.Errorf("%w: %s has %d elements, a %dx%d matrix with ld %d needs %d",
			ErrShape, name, length, rows, cols, ld, need)
	}
	return nil
}

func scaleRow(x []float32, beta float32) {
	if beta == 0 {
		clear(x)
		return
	}
	for i := range x {
		x[i] *= beta
	}
}
