package codec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// allHalves is every 16-bit pattern once, plus three so the slice
// functions' vector loop leaves a tail.
func allHalves() []uint16 {
	h := make([]uint16, 1<<16+3)
	for i := range h {
		h[i] = uint16(i)
	}
	return h
}

// probeFloats are float32 inputs for the narrowing functions: every half
// value, the midpoints between neighbouring halves and one ulp either side
// of them (ties, just below and above), NaNs with assorted payloads and
// signs, infinities, float32 subnormals, the overflow threshold, and
// random bit patterns.
func probeFloats() []float32 {
	var f []float32
	for i := range 1 << 16 {
		v := F16ToF32(uint16(i))
		f = append(f, v)
		if i&0x7fff < 0x7c00 {
			next := F16ToF32(uint16(i + 1))
			if i&0x7fff == 0x7bff { // 65504: the next half up is Inf
				next = float32(math.Copysign(65536, float64(v)))
			}
			mid := float32((float64(v) + float64(next)) / 2)
			b := math.Float32bits(mid)
			f = append(f, mid, math.Float32frombits(b-1), math.Float32frombits(b+1))
		}
	}
	for _, b := range []uint32{0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000, 0xffc00000, 0x7fffffff,
		0xffffffff, 0x7fa00000, 0x7f802000, 0x00000001, 0x80000001, 0x007fffff, 0x00400000,
		0x477fefff, 0x477ff000, 0x477ff001, 0x7f7fffff, 0xff7fffff, 0x33000000, 0x33000001, 0xb3000000} {
		f = append(f, math.Float32frombits(b))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 18 {
		f = append(f, math.Float32frombits(r.Uint32()))
	}
	return append(f, 1, 2, 3) // a tail
}

// TestSliceDecodeMatchesScalar: DecodeF16/DecodeBF16 give the scalar
// functions' bits for every 16-bit pattern.
func TestSliceDecodeMatchesScalar(t *testing.T) {
	h := allHalves()
	got := make([]float32, len(h))
	for _, tc := range []struct {
		name   string
		slice  func([]float32, []uint16)
		scalar func(uint16) float32
	}{{"F16", DecodeF16, F16ToF32}, {"BF16", DecodeBF16, BF16ToF32}} {
		tc.slice(got, h)
		for i, x := range h {
			if g, w := math.Float32bits(got[i]), math.Float32bits(tc.scalar(x)); g != w {
				t.Fatalf("Decode%s(%#04x) = %#08x, scalar %#08x", tc.name, x, g, w)
			}
		}
	}
}

// TestSliceEncodeMatchesScalar: EncodeF16/EncodeBF16 give the scalar
// functions' bits (rounding ties, overflow, underflow, NaN).
func TestSliceEncodeMatchesScalar(t *testing.T) {
	f := probeFloats()
	got := make([]uint16, len(f))
	for _, tc := range []struct {
		name   string
		slice  func([]uint16, []float32)
		scalar func(float32) uint16
	}{{"F16", EncodeF16, F32ToF16}, {"BF16", EncodeBF16, F32ToBF16}} {
		tc.slice(got, f)
		for i, x := range f {
			if g, w := got[i], tc.scalar(x); g != w {
				t.Fatalf("Encode%s(%#08x) = %#04x, scalar %#04x", tc.name, math.Float32bits(x), g, w)
			}
		}
	}
}

// TestSliceShortAndExact: lengths 0..17 convert exactly that many values
// and leave dst past them alone.
func TestSliceShortAndExact(t *testing.T) {
	for n := range 18 {
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(i) - 3.25
		}
		dst := make([]uint16, n+1)
		dst[n] = 0xabcd
		EncodeF16(dst, src)
		back := make([]float32, n+1)
		back[n] = 42
		DecodeF16(back, dst[:n])
		if dst[n] != 0xabcd || back[n] != 42 {
			t.Fatalf("n=%d: wrote past the end", n)
		}
		for i := range n {
			if back[i] != src[i] {
				t.Fatalf("n=%d: round trip of %v gave %v", n, src[i], back[i])
			}
		}
	}
}

// BenchmarkSlice converts 4096 values each way (an activation tile of a
// prefill); compare with the build without GOEXPERIMENT=simd.
func BenchmarkSlice(b *testing.B) {
	f := make([]float32, 4096)
	for i := range f {
		f[i] = float32(i)*0.37 - 500
	}
	h := make([]uint16, len(f))
	b.Run("EncodeF16", func(b *testing.B) {
		for b.Loop() {
			EncodeF16(h, f)
		}
	})
	b.Run("DecodeF16", func(b *testing.B) {
		for b.Loop() {
			DecodeF16(f, h)
		}
	})
	b.Run("EncodeBF16", func(b *testing.B) {
		for b.Loop() {
			EncodeBF16(h, f)
		}
	})
	b.Run("DecodeBF16", func(b *testing.B) {
		for b.Loop() {
			DecodeBF16(f, h)
		}
	})
}
