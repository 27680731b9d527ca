package gemm

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// TestCvt16Exhaustive widens all 65536 bit patterns of both encodings on
// every path and demands the codec's exact bits.
func TestCvt16Exhaustive(t *testing.T) {
	src := make([]uint16, 1<<16+5) // odd length: vector body plus tail
	for i := range src {
		src[i] = uint16(i)
	}
	withPath(t, func(t *testing.T) {
		dst := make([]float32, len(src))
		for _, kind := range []Half{Float16, BFloat16} {
			active().cvt16(kind, dst, src)
			for i, h := range src {
				want := codec.F16ToF32(h)
				if kind == BFloat16 {
					want = codec.BF16ToF32(h)
				}
				if math.Float32bits(dst[i]) != math.Float32bits(want) {
					t.Fatalf("kind %d, %#04x: got %#08x want %#08x", kind, h, math.Float32bits(dst[i]), math.Float32bits(want))
				}
			}
		}
	})
}

// TestSgemmHalfB compares the 16-bit-B product with the float32 one on the
// widened values, for the streaming and the blocked strategies.
func TestSgemmHalfB(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 3))
		shapes := [][3]int{{1, 37, 50}, {3, 300, 129}, {4, 17, 5}, {7, 65, 33}, {130, 70, 260}, {2, 1000, 300}}
		for _, s := range shapes {
			m, n, k := s[0], s[1], s[2]
			for _, kind := range []Half{Float16, BFloat16} {
				for _, transB := range []bool{false, true} {
					for _, threads := range []int{1, 2} {
						br, bc := k, n
						if transB {
							br, bc = n, k
						}
						bh := make([]uint16, br*bc)
						bf := make([]float32, len(bh))
						for i := range bh {
							v := float32(r.NormFloat64())
							if kind == Float16 {
								bh[i] = codec.F32ToF16(v)
								bf[i] = codec.F16ToF32(bh[i])
							} else {
								bh[i] = codec.F32ToBF16(v)
								bf[i] = codec.BF16ToF32(bh[i])
							}
						}
						a, c := randSlice(r, m*k), randSlice(r, m*n)
						want := append([]float32(nil), c...)
						naive(false, transB, m, n, k, 0.5, a, k, bf, bc, 2, want, n)
						if err := SgemmHalfB(threads, kind, false, transB, m, n, k, 0.5, a, k, bh, bc, 2, c, n); err != nil {
							t.Fatal(err)
						}
						for i := range want {
							if math.Abs(float64(c[i]-want[i])) > 1e-4*(1+math.Abs(float64(want[i])))*math.Sqrt(float64(k)) {
								t.Fatalf("m=%d n=%d k=%d kind=%d transB=%v threads=%d: C[%d]=%v want %v",
									m, n, k, kind, transB, threads, i, c[i], want[i])
							}
						}
					}
				}
			}
		}
	})
	if err := SgemmHalfB(1, 7, false, false, 1, 1, 1, 1, []float32{1}, 1, []uint16{1}, 1, 0, []float32{0}, 1); !errors.Is(err, ErrShape) {
		t.Fatalf("unknown encoding: %v", err)
	}
}

// TestSgemmHalfBAllPatterns streams every float16 and bfloat16 bit pattern
// through the streaming kernels (including the fused AVX-512 widening):
// C = 1*row0 + 0*zero rows must reproduce each value (NaN as NaN, zero
// regardless of sign).
func TestSgemmHalfBAllPatterns(t *testing.T) {
	n := 1<<16 + 3
	b := make([]uint16, 4*n) // rows 1..3 stay +0
	for j := range n {
		b[j] = uint16(j)
	}
	withPath(t, func(t *testing.T) {
		for _, kind := range []Half{Float16, BFloat16} {
			c := make([]float32, n)
			if err := SgemmHalfB(1, kind, false, false, 1, n, 4, 1, []float32{1, 0, 0, 0}, 4, b, n, 0, c, n); err != nil {
				t.Fatal(err)
			}
			for j, got := range c {
				want := codec.F16ToF32(uint16(j))
				if kind == BFloat16 {
					want = codec.BF16ToF32(uint16(j))
				}
				if got != want && !(got != got && want != want) {
					t.Fatalf("kind %d, %#04x: got %v want %v", kind, uint16(j), got, want)
				}
			}
		}
	})
}
