package gemm

import "fmt"

// Packed B for short products. A decode step multiplies one to a few rows
// by every weight matrix; streamed row by row (skinnyAxpy) each group of B
// rows reads several short runs at once and loads and stores C for every
// group. A constant B is therefore packed once into column panels of
// packNR columns, stored panel after panel, each panel k rows of packNR
// values (the last panel zero-padded): a product reads each panel as one
// contiguous run and keeps its C tile in registers over the whole inner
// dimension, and the threads split the panels, so no partial sums are
// added up.

// packNR is the width of a panel: two AVX-512 vectors, four AVX2 vectors.
const packNR = 32

// PackedB is a k x n matrix op(B) packed for SgemmPacked. It is read-only
// once built and may be shared by concurrent calls.
type PackedB struct {
	k, n int
	p    []float32 // panels of k*packNR values
}

// K returns the inner dimension of the packed matrix.
func (b *PackedB) K() int { return b.k }

// N returns the number of columns of the packed matrix.
func (b *PackedB) N() int { return b.n }

// PackB packs op(B) (k x n; B is n x k when transB), row stride ldb as
// stored, for SgemmPacked.
func PackB(transB bool, k, n int, b []float32, ldb int) (*PackedB, error) {
	if err := checkLens(false, transB, 0, n, k, 0, max(k, 1), len(b), ldb, 0, max(n, 1)); err != nil {
		return nil, err
	}
	panels := (n + packNR - 1) / packNR
	pb := &PackedB{k: k, n: n, p: make([]float32, panels*k*packNR)}
	for q := range panels {
		j0 := q * packNR
		w := min(packNR, n-j0)
		dst := pb.p[q*k*packNR : (q+1)*k*packNR]
		for l := range k {
			row := dst[l*packNR : l*packNR+w]
			if transB {
				for j := range row {
					row[j] = b[(j0+j)*ldb+l]
				}
			} else {
				copy(row, b[l*ldb+j0:l*ldb+j0+w])
			}
		}
	}
	return pb, nil
}

// PackedRows is the largest number of rows of op(A) SgemmPacked accepts.
const PackedRows = skinnyRows

// packedTasksPerThread is the number of panel ranges per thread: with a
// few per thread a helper that joins late still takes a share.
const packedTasksPerThread = 4

// SgemmPacked computes C = alpha*op(A)*B + beta*C for a packed B (k x n)
// and m <= PackedRows rows of op(A) (m x k; A is k x m as stored when
// transA), using at most threads threads (<= 0: Threads()). beta 0 does not
// read C, as in Sgemm.
func SgemmPacked(threads int, transA bool, m int, alpha float32, a []float32, lda int,
	b *PackedB, beta float32, c []float32, ldc int) error {
	if b == nil {
		return fmt.Errorf("%w: nil packed B", ErrShape)
	}
	k, n := b.k, b.n
	if m > PackedRows {
		return fmt.Errorf("%w: packed B serves at most %d rows, got %d", ErrShape, PackedRows, m)
	}
	if err := checkLens(transA, false, m, n, k, len(a), lda, k*n, max(n, 1), len(c), ldc); err != nil {
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
	ks := active()
	var rows [skinnyRows][]float32
	if transA {
		buf := make([]float32, m*k)
		for i := range m {
			r := buf[i*k : (i+1)*k]
			for l := range r {
				r[l] = a[l*lda+i]
			}
			rows[i] = r
		}
	} else {
		for i := range m {
			rows[i] = a[i*lda : i*lda+k]
		}
	}
	panels := (n + packNR - 1) / packNR
	t := parallelism(threads, m, n, k)
	tasks := min(panels, t*packedTasksPerThread)
	if t <= 1 {
		tasks = 1
	}
	per := (panels + tasks - 1) / tasks
	tasks = (panels + per - 1) / per
	ForThreads(t, tasks, func(u int) {
		var out [skinnyRows][packNR]float32
		for q := u * per; q < min((u+1)*per, panels); q++ {
			ks.panel(m, k, &rows, b.p[q*k*packNR:(q+1)*k*packNR], &out)
			j0 := q * packNR
			w := min(packNR, n-j0)
			for i := range m {
				ci := c[i*ldc+j0 : i*ldc+j0+w]
				for j := range ci {
					ci[j] += alpha * out[i][j]
				}
			}
		}
	})
	return nil
}

// panelGo is the portable panel kernel: out[i][j] = sum_l a[i][l] *
// p[l*packNR+j] for i < m.
func panelGo(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	p = p[:k*packNR]
	for i := range m {
		ai := a[i][:k]
		o := &out[i]
		*o = [packNR]float32{}
		for l, av := range ai {
			row := (*[packNR]float32)(p[l*packNR : (l+1)*packNR])
			for j := range o {
				o[j] += av * row[j]
			}
		}
	}
}
