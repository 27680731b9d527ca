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
// copies n elements of the innermost dimension.
func walkStrided(dims []int, base int, strides []int, row func(o, i, s, n int)) {
	total := 1
	for _, d := range dims {
		total *= d
	}
	if total == 0 {
		return
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
