package ops

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// stackRank is the largest rank whose per-dimension temporaries (strides,
// counters) kernels keep in arrays on their stacks.
const stackRank = 8

// bcastRows walks the output of a two-operand numpy broadcast row by row:
// for each run of out's innermost dimension it calls row(o, ia, ib, sa, sb,
// n) with the output offset, the operands' offsets and their inner strides
// (0 when broadcast, 1 otherwise). Same-shape and scalar operands collapse
// to a single row.
func bcastRows(as, bs, out tensor.Shape, row func(o, ia, ib, sa, sb, n int)) error {
	n := out.Size()
	if n == 0 {
		return nil
	}
	na, nb := as.Size(), bs.Size()
	switch {
	case na == n && nb == n && as.Equal(bs):
		row(0, 0, 0, 1, 1, n)
		return nil
	case nb == 1 && na == n:
		row(0, 0, 0, 1, 0, n)
		return nil
	case na == 1 && nb == n:
		row(0, 0, 0, 0, 1, n)
		return nil
	}
	rank := len(out)
	// strides and counters on the stack for the ranks decoders use
	var buf [3 * stackRank]int
	var sta, stb, ctr []int
	if rank <= stackRank {
		sta, stb, ctr = buf[:rank], buf[stackRank:stackRank+rank], buf[2*stackRank:2*stackRank+rank]
	} else {
		sta, stb, ctr = make([]int, rank), make([]int, rank), make([]int, rank)
	}
	if _, err := tensor.BroadcastStridesTo(sta, as, out); err != nil {
		return err
	}
	if _, err := tensor.BroadcastStridesTo(stb, bs, out); err != nil {
		return err
	}
	inner := out[rank-1]
	sa, sb := sta[rank-1], stb[rank-1]
	ia, ib := 0, 0
	for o := 0; o < n; o += inner {
		row(o, ia, ib, sa, sb, inner)
		for d := rank - 2; d >= 0; d-- {
			ctr[d]++
			ia += sta[d]
			ib += stb[d]
			if ctr[d] < out[d] {
				break
			}
			ia -= sta[d] * ctr[d]
			ib -= stb[d] * ctr[d]
			ctr[d] = 0
		}
	}
	return nil
}

// binaryApply computes out[i] = f(a[ia], b[ib]) over a broadcast (the
// operands may differ in type: Pow of a float base and an integer exponent).
func binaryApply[T, U, R any](a []T, as tensor.Shape, b []U, bs tensor.Shape, out []R, os tensor.Shape, f func(x T, y U) R) error {
	return bcastRows(as, bs, os, func(o, ia, ib, sa, sb, n int) {
		dst := out[o : o+n]
		switch {
		case sa == 1 && sb == 1:
			x, y := a[ia:ia+n], b[ib:ib+n]
			for i := range dst {
				dst[i] = f(x[i], y[i])
			}
		case sa == 1:
			x, y := a[ia:ia+n], b[ib]
			for i := range dst {
				dst[i] = f(x[i], y)
			}
		case sb == 1:
			x, y := a[ia], b[ib:ib+n]
			for i := range dst {
				dst[i] = f(x, y[i])
			}
		default:
			v := f(a[ia], b[ib])
			for i := range dst {
				dst[i] = v
			}
		}
	})
}
