// Package codec converts between float32 and the 16-bit storage types of the
// cache (IEEE float16 and bfloat16). Conversions round to nearest even and
// keep NaN and infinities. The scalar functions are the portable reference;
// slice functions may use SIMD paths with identical results.
package codec

import (
	"math"
)

// F32ToBF16 converts one float32 to bfloat16 bits, rounding to nearest even.
// NaN stays a (quiet) NaN.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep sign, force a quiet mantissa bit
		return uint16(b>>16) | 0x0040
	}
	rounding := uint32(0x7fff) + ((b >> 16) & 1)
	return uint16((b + rounding) >> 16)
}

// BF16ToF32 converts bfloat16 bits to float32 (exact).
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToF16 converts one float32 to IEEE 754 half-precision bits, rounding to
// nearest even, with overflow to infinity and gradual underflow.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16((b >> 16) & 0x8000)
	exp := int((b >> 23) & 0xff)
	mant := b & 0x7fffff
	if exp == 0xff { // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f { // overflow
		return sign | 0x7c00
	}
	if e <= 0 { // subnormal half or zero
		if e < -10 {
			return sign
		}
		m := mant | 0x800000 // implicit bit
		shift := uint32(14 - e)
		half := m >> shift
		rem := m & ((1 << shift) - 1)
		mid := uint32(1) << (shift - 1)
		if rem > mid || (rem == mid && half&1 == 1) {
			half++
		}
		return sign | uint16(half)
	}
	half := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && half&1 == 1) {
		half++ // may carry into the exponent, which is the correct result
	}
	return sign | uint16(half)
}

// F16ToF32 converts IEEE half-precision bits to float32 (exact).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: normalize
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// EncodeF16 converts src into dst (len(dst) >= len(src)). This and the
// other slice functions run eight values per step on AVX2+F16C CPUs (builds
// with GOEXPERIMENT=simd on amd64), bit for bit as the scalar functions.
func EncodeF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i := encodeF16Vec(dst, src); i < len(src); i++ {
		dst[i] = F32ToF16(src[i])
	}
}

// DecodeF16 converts src into dst (len(dst) >= len(src)).
func DecodeF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i := decodeF16Vec(dst, src); i < len(src); i++ {
		dst[i] = F16ToF32(src[i])
	}
}

// EncodeBF16 converts src into dst (len(dst) >= len(src)).
func EncodeBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i := encodeBF16Vec(dst, src); i < len(src); i++ {
		dst[i] = F32ToBF16(src[i])
	}
}

// DecodeBF16 converts src into dst (len(dst) >= len(src)).
func DecodeBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i := decodeBF16Vec(dst, src); i < len(src); i++ {
		dst[i] = BF16ToF32(src[i])
	}
}
