//go:build goexperiment.simd && amd64

package mha

import (
	"simd/archsimd"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// pickNonFinite follows the gemm package's instruction-set choice, like
// pickExp.
func pickNonFinite() func([]float32) bool {
	switch gemm.Path() {
	case "avx512":
		return nonFiniteAVX512
	case "avx2":
		return nonFiniteAVX2
	}
	return nonFiniteGo
}

// nonFiniteAVX512 is nonFiniteGo with sixteen lanes: sum(0*x), NaN exactly
// when one x is NaN or infinite.
func nonFiniteAVX512(s []float32) bool {
	if len(s) < 16 {
		return nonFiniteGo(s)
	}
	zero := archsimd.BroadcastFloat32x16(0)
	z0, z1 := zero, zero
	i := 0
	for ; i+32 <= len(s); i += 32 {
		z0 = load16(s[i:]).MulAdd(zero, z0)
		z1 = load16(s[i+16:]).MulAdd(zero, z1)
	}
	for ; i+16 <= len(s); i += 16 {
		z0 = load16(s[i:]).MulAdd(zero, z0)
	}
	bad := z0.Add(z1).NotEqual(zero).ToBits() != 0
	archsimd.ClearAVXUpperBits()
	return bad || nonFiniteGo(s[i:])
}

// nonFiniteAVX2 is nonFiniteAVX512 with eight lanes.
func nonFiniteAVX2(s []float32) bool {
	if len(s) < 8 {
		return nonFiniteGo(s)
	}
	zero := archsimd.BroadcastFloat32x8(0)
	z0, z1 := zero, zero
	i := 0
	for ; i+16 <= len(s); i += 16 {
		z0 = load8(s[i:]).MulAdd(zero, z0)
		z1 = load8(s[i+8:]).MulAdd(zero, z1)
	}
	for ; i+8 <= len(s); i += 8 {
		z0 = load8(s[i:]).MulAdd(zero, z0)
	}
	bad := z0.Add(z1).NotEqual(zero).ToBits() != 0
	archsimd.ClearAVXUpperBits()
	return bad || nonFiniteGo(s[i:])
}

// load16 loads s[0:16].
func load16(s []float32) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(s[:16]))
}

// load8 loads s[0:8].
func load8(s []float32) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(s[:8]))
}
