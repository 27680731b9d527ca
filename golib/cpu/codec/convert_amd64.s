//go:build goexperiment.simd && amd64

#include "textflag.h"

// The slice conversions eight values per step on AVX2 (F16C for the
// float32 -> float16 rounding). Each gives the bits the scalar functions
// of codec.go give, NaN included. n is the number of 8-value groups, > 0.

// func decodeF16x8(dst *float32, src *uint16, n int)
//
// Exact by integer arithmetic: the half's exponent and mantissa shifted
// to float32 positions, read as a float and multiplied by 2^112, is the
// value of normal and subnormal halves alike; Inf/NaN get an all-ones
// exponent with the mantissa kept (no quieting, unlike VCVTPH2PS).
TEXT ·decodeF16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x77800000, AX // 2^112
	VMOVD AX, X8
	VPBROADCASTD X8, Y8
	MOVL $0x0f7fffff, AX // largest magnitude below the Inf/NaN exponent
	VMOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x7f800000, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10

dh16loop:
	VPMOVZXWD (SI), Y0
	VPSLLD $17, Y0, Y1
	VPSRLD $4, Y1, Y1
	VPSRLD $15, Y0, Y2
	VPSLLD $31, Y2, Y2
	VMULPS Y8, Y1, Y3
	VPCMPGTD Y9, Y1, Y4
	VPOR Y10, Y1, Y5
	VBLENDVPS Y4, Y5, Y3, Y3
	VPOR Y2, Y3, Y3
	VMOVUPS Y3, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  dh16loop
	VZEROUPPER
	RET

// func encodeF16x8(dst *uint16, src *float32, n int)
//
// VCVTPS2PH rounds to nearest even with overflow to Inf and gradual
// underflow, as F32ToF16; a NaN becomes the sign and the quiet NaN 0x7e00
// (F16C keeps payload bits there, which are cleared).
TEXT ·encodeF16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x01ff01ff, AX
	VMOVD AX, X8
	VPBROADCASTD X8, X8

eh16loop:
	VMOVUPS (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VCMPPS $3, Y0, Y0, Y2
	VEXTRACTF128 $1, Y2, X3
	VPACKSSDW X3, X2, X2
	VPAND X8, X2, X2
	VPANDN X1, X2, X1
	VMOVDQU X1, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	DECQ CX
	JNZ  eh16loop
	VZEROUPPER
	RET

// func decodeBF16x8(dst *float32, src *uint16, n int)
TEXT ·decodeBF16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

dbloop:
	VPMOVZXWD (SI), Y0
	VPSLLD $16, Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  dbloop
	VZEROUPPER
	RET

// func encodeBF16x8(dst *uint16, src *float32, n int)
//
// F32ToBF16 in integer lanes: add 0x7fff plus the kept low bit and keep
// the top half; a NaN keeps its top half with the quiet bit set.
TEXT ·encodeBF16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fffffff, AX
	VMOVD AX, X8
	VPBROADCASTD X8, Y8
	MOVL $0x7f800000, AX
	VMOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $1, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x7fff, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x0040, AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12

ebloop:
	VMOVDQU (SI), Y0
	VPAND Y8, Y0, Y1
	VPCMPGTD Y9, Y1, Y1
	VPSRLD $16, Y0, Y2
	VPAND Y10, Y2, Y3
	VPADDD Y3, Y0, Y3
	VPADDD Y11, Y3, Y3
	VPSRLD $16, Y3, Y3
	VPOR Y12, Y2, Y2
	VBLENDVPS Y1, Y2, Y3, Y3
	VEXTRACTI128 $1, Y3, X4
	VPACKUSDW X4, X3, X3
	VMOVDQU X3, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	DECQ CX
	JNZ  ebloop
	VZEROUPPER
	RET
