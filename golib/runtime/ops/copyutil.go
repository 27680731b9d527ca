package ops

import "unsafe"

// Data-movement ops work on raw element bytes, so one kernel serves every
// element type. These helpers move elements of size es (1, 2, 4 or 8) with
// typed loads instead of a copy call per element.

func words[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// gatherElems sets element i of dst to element idx[i] of src.
func gatherElems(dst, src []byte, idx []int, es int) {
	switch es {
	case 1:
		gatherT(dst, src, idx)
	case 2:
		gatherT(words[uint16](dst), words[uint16](src), idx)
	case 4:
		gatherT(words[uint32](dst), words[uint32](src), idx)
	case 8:
		gatherT(words[uint64](dst), words[uint64](src), idx)
	default:
		for i, j := range idx {
			copy(dst[i*es:(i+1)*es], src[j*es:(j+1)*es])
		}
	}
}

func gatherT[T any](dst, src []T, idx []int) {
	for i, j := range idx {
		dst[i] = src[j]
	}
}

// stridedCopy copies n elements from src[s0 + k*ss] to dst[d0 + k].
func stridedCopy(dst, src []byte, d0, s0, ss, n, es int) {
	if ss == 1 {
		copy(dst[d0*es:(d0+n)*es], src[s0*es:(s0+n)*es])
		return
	}
	switch es {
	case 1:
		stridedT(dst, src, d0, s0, ss, n)
	case 2:
		stridedT(words[uint16](dst), words[uint16](src), d0, s0, ss, n)
	case 4:
		stridedT(words[uint32](dst), words[uint32](src), d0, s0, ss, n)
	case 8:
		stridedT(words[uint64](dst), words[uint64](src), d0, s0, ss, n)
	default:
		for k := 0; k < n; k++ {
			j := s0 + k*ss
			copy(dst[(d0+k)*es:(d0+k+1)*es], src[j*es:(j+1)*es])
		}
	}
}

func stridedT[T any](dst, src []T, d0, s0, ss, n int) {
	for k := 0; k < n; k++ {
		dst[d0+k] = src[s0+k*ss]
	}
}

// walkStrided visits the output of a strided view row by row: out has shape
// dims; in is addressed by base + sum(ctr[d]*strides[d]). row(o, i, s, n)
// copies n elements of the innermost dimension. Dimensions of size 1 are
// skipped and adjacent ones the input addresses as one (strides[d] ==
// strides[d+1]*dims[d+1]) are walked as one, so rows are as long as the
// layout allows (a repeat_kv Expand copies whole [t, d] blocks).
func walkStrided(dims []int, base int, strides []int, row func(o, i, s, n int)) {
	total := 1
	for _, d := range dims {
		total *= d
	}
	if total == 0 {
		return
	}
	var db, sb [stackRank]int
	if len(dims) <= stackRank {
		dims, strides = collapseStrided(dims, strides, db[:0], sb[:0])
	}
	r := len(dims)
	if r == 0 {
		row(0, base, 1, 1)
		return
	}
	inner := dims[r-1]
	var buf [stackRank]int
	var ctr []int
	if r <= stackRank {
		ctr = buf[:r]
	} else {
		ctr = make([]int, r)
	}
	off := base
	for o := 0; o < total; o += inner {
		row(o, off, strides[r-1], inner)
		for d := r - 2; d >= 0; d-- {
			ctr[d]++
			off += strides[d]
			if ctr[d] < dims[d] {
				break
			}
			off -= strides[d] * ctr[d]
			ctr[d] = 0
		}
	}
}

// collapseStrided appends to nd and ns the dimensions and strides of a
// strided walk without its size-1 dimensions, adjacent dimensions merged
// where the strides allow it (see walkStrided).
func collapseStrided(dims, strides, nd, ns []int) ([]int, []int) {
	for j, d := range dims {
		if d == 1 {
			continue
		}
		if k := len(nd) - 1; k >= 0 && ns[k] == strides[j]*d {
			nd[k] *= d
			ns[k] = strides[j]
			continue
		}
		nd = append(nd, d)
		ns = append(ns, strides[j])
	}
	return nd, ns
}
