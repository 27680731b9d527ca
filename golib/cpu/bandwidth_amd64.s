//go:build goexperiment.simd && amd64

#include "textflag.h"

// The bandwidth probe's read loops: plain loads (no non-temporal hint, no
// software prefetch) summed into eight independent accumulators, so neither
// the add latency nor the loop overhead limits the stream; 256 bytes per
// iteration with ymm registers, 512 with zmm.

// func readSumAVX2(p *float32, n int) float32
//
// Returns the sum of the n float32 at p (n a multiple of 64), in an
// unspecified order.
TEXT ·readSumAVX2(SB), NOSPLIT, $0-20
	MOVQ   p+0(FP), SI
	MOVQ   n+8(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	SHRQ   $6, CX
	JZ     rs2done

rs2loop:
	VADDPS (SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	VADDPS 128(SI), Y4, Y4
	VADDPS 160(SI), Y5, Y5
	VADDPS 192(SI), Y6, Y6
	VADDPS 224(SI), Y7, Y7
	ADDQ   $256, SI
	DECQ   CX
	JNZ    rs2loop

rs2done:
	VADDPS       Y1, Y0, Y0
	VADDPS       Y3, Y2, Y2
	VADDPS       Y5, Y4, Y4
	VADDPS       Y7, Y6, Y6
	VADDPS       Y2, Y0, Y0
	VADDPS       Y6, Y4, Y4
	VADDPS       Y4, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VHADDPS      X0, X0, X0
	VHADDPS      X0, X0, X0
	MOVSS        X0, ret+16(FP)
	VZEROUPPER
	RET

// func readSumAVX512(p *float32, n int) float32
//
// readSumAVX2 with zmm registers, n a multiple of 128.
TEXT ·readSumAVX512(SB), NOSPLIT, $0-20
	MOVQ   p+0(FP), SI
	MOVQ   n+8(FP), CX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	VXORPS Z4, Z4, Z4
	VXORPS Z5, Z5, Z5
	VXORPS Z6, Z6, Z6
	VXORPS Z7, Z7, Z7
	SHRQ   $7, CX
	JZ     rs5done

rs5loop:
	VADDPS (SI), Z0, Z0
	VADDPS 64(SI), Z1, Z1
	VADDPS 128(SI), Z2, Z2
	VADDPS 192(SI), Z3, Z3
	VADDPS 256(SI), Z4, Z4
	VADDPS 320(SI), Z5, Z5
	VADDPS 384(SI), Z6, Z6
	VADDPS 448(SI), Z7, Z7
	ADDQ   $512, SI
	DECQ   CX
	JNZ    rs5loop

rs5done:
	VADDPS        Z1, Z0, Z0
	VADDPS        Z3, Z2, Z2
	VADDPS        Z5, Z4, Z4
	VADDPS        Z7, Z6, Z6
	VADDPS        Z2, Z0, Z0
	VADDPS        Z6, Z4, Z4
	VADDPS        Z4, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VADDPS        X1, X0, X0
	VHADDPS       X0, X0, X0
	VHADDPS       X0, X0, X0
	MOVSS         X0, ret+16(FP)
	VZEROUPPER
	RET
