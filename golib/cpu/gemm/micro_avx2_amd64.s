//go:build goexperiment.simd && amd64

#include "textflag.h"

// The AVX2+FMA kernels in assembly: 16 ymm registers, no embedded
// broadcast, so every A value is broadcast into a register once
// (VBROADCASTSS from memory: a load only) and feeds two or four FMAs.

// func micro6x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)
//
// A 6 x 16 tile of C in Y4-Y15 (row r in Y(4+2r), Y(5+2r)). Per step of
// the inner dimension two B vectors are loaded (Y0, Y1) and the six A
// values of the packed panel are broadcast in turn (Y2, Y3): 8 loads for
// 12 FMAs, so the FMA units set the pace. The step is unrolled twice.
// a is a panel packed column by column (kc steps of 6 values); b points at
// 16 columns of a B sliver whose rows are bstride bytes apart.
// C[r][0:16] += alpha * tile row r; ldc is in elements. kc > 0.
TEXT ·micro6x16asm(SB), NOSPLIT, $0-56
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ bstride+24(FP), R8
	MOVQ c+40(FP), DX
	MOVQ ldc+48(FP), BX
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15

#define STEP6(o0, o1, o2, o3, o4, o5) \
	VMOVUPS 0(DI), Y0; \
	VMOVUPS 32(DI), Y1; \
	VBROADCASTSS o0(SI), Y2; \
	VFMADD231PS Y0, Y2, Y4; \
	VFMADD231PS Y1, Y2, Y5; \
	VBROADCASTSS o1(SI), Y3; \
	VFMADD231PS Y0, Y3, Y6; \
	VFMADD231PS Y1, Y3, Y7; \
	VBROADCASTSS o2(SI), Y2; \
	VFMADD231PS Y0, Y2, Y8; \
	VFMADD231PS Y1, Y2, Y9; \
	VBROADCASTSS o3(SI), Y3; \
	VFMADD231PS Y0, Y3, Y10; \
	VFMADD231PS Y1, Y3, Y11; \
	VBROADCASTSS o4(SI), Y2; \
	VFMADD231PS Y0, Y2, Y12; \
	VFMADD231PS Y1, Y2, Y13; \
	VBROADCASTSS o5(SI), Y3; \
	VFMADD231PS Y0, Y3, Y14; \
	VFMADD231PS Y1, Y3, Y15; \
	ADDQ R8, DI

	SHRQ $1, CX
	JZ   m6tail

m6loop:
	STEP6(0, 4, 8, 12, 16, 20)
	STEP6(24, 28, 32, 36, 40, 44)
	ADDQ $48, SI
	DECQ CX
	JNZ  m6loop

m6tail:
	MOVQ kc+0(FP), CX
	ANDQ $1, CX
	JZ   m6store
	STEP6(0, 4, 8, 12, 16, 20)

m6store:
	VBROADCASTSS alpha+32(FP), Y0
	SHLQ $2, BX

#define ROW6(lo, hi) \
	VMOVUPS 0(DX), Y1; \
	VFMADD231PS lo, Y0, Y1; \
	VMOVUPS Y1, 0(DX); \
	VMOVUPS 32(DX), Y2; \
	VFMADD231PS hi, Y0, Y2; \
	VMOVUPS Y2, 32(DX); \
	ADDQ BX, DX

	ROW6(Y4, Y5)
	ROW6(Y6, Y7)
	ROW6(Y8, Y9)
	ROW6(Y10, Y11)
	ROW6(Y12, Y13)
	ROW6(Y14, Y15)
	VZEROUPPER
	RET

// The decode-step kernels read one packed sliver (k rows of 32 columns,
// 128 bytes a row, one contiguous run; the next sliver of the k-block is
// the next run in memory) and add a_i . sliver into out row i (rows of 32
// floats, 128 bytes apart). They are bound by the bandwidth of reading the
// sliver and leave the prefetching to the hardware: software prefetches
// (PREFETCHT0 of every line 256, 512, 1024 or 2048 bytes ahead) lowered
// the one-thread one-row decode step of BenchmarkDecodeStepPacked from
// about 10 GB/s to 5-8 GB/s on an AMD Zen 4, best of four runs each.

// func panel1asm(k int, a *float32, p *float32, out *float32)
//
// One row: the 32 columns in Y0-Y3 and, for the odd steps, Y4-Y7 (two
// steps in flight so the FMA latency does not bound the stream); B is read
// as the memory operand of the FMAs. k > 0.
TEXT ·panel1asm(SB), NOSPLIT, $0-32
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ p+16(FP), DI
	MOVQ out+24(FP), DX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	SHRQ $1, CX
	JZ   p1tail

p1loop:
	VBROADCASTSS 0(SI), Y8
	VBROADCASTSS 4(SI), Y9
	VFMADD231PS 0(DI), Y8, Y0
	VFMADD231PS 32(DI), Y8, Y1
	VFMADD231PS 64(DI), Y8, Y2
	VFMADD231PS 96(DI), Y8, Y3
	VFMADD231PS 128(DI), Y9, Y4
	VFMADD231PS 160(DI), Y9, Y5
	VFMADD231PS 192(DI), Y9, Y6
	VFMADD231PS 224(DI), Y9, Y7
	ADDQ $8, SI
	ADDQ $256, DI
	DECQ CX
	JNZ  p1loop

p1tail:
	MOVQ k+0(FP), CX
	ANDQ $1, CX
	JZ   p1store
	VBROADCASTSS 0(SI), Y8
	VFMADD231PS 0(DI), Y8, Y0
	VFMADD231PS 32(DI), Y8, Y1
	VFMADD231PS 64(DI), Y8, Y2
	VFMADD231PS 96(DI), Y8, Y3

p1store:
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	VADDPS 0(DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	VADDPS 64(DX), Y2, Y2
	VADDPS 96(DX), Y3, Y3
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func panel2asm(k int, a0 *float32, a1 *float32, p *float32, out *float32)
//
// Two rows: each sliver row is loaded once into Y0-Y3 and feeds both rows'
// accumulators (Y6-Y9 for a0 into out row 0, Y10-Y13 for a1 into out
// row 1). k > 0.
TEXT ·panel2asm(SB), NOSPLIT, $0-40
	MOVQ k+0(FP), CX
	MOVQ a0+8(FP), SI
	MOVQ a1+16(FP), R8
	MOVQ p+24(FP), DI
	MOVQ out+32(FP), DX
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13

p2loop:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VBROADCASTSS 0(SI), Y4
	VBROADCASTSS 0(R8), Y5
	VFMADD231PS Y0, Y4, Y6
	VFMADD231PS Y1, Y4, Y7
	VFMADD231PS Y2, Y4, Y8
	VFMADD231PS Y3, Y4, Y9
	VFMADD231PS Y0, Y5, Y10
	VFMADD231PS Y1, Y5, Y11
	VFMADD231PS Y2, Y5, Y12
	VFMADD231PS Y3, Y5, Y13
	ADDQ $4, SI
	ADDQ $4, R8
	ADDQ $128, DI
	DECQ CX
	JNZ  p2loop

	VADDPS 0(DX), Y6, Y6
	VADDPS 32(DX), Y7, Y7
	VADDPS 64(DX), Y8, Y8
	VADDPS 96(DX), Y9, Y9
	VADDPS 128(DX), Y10, Y10
	VADDPS 160(DX), Y11, Y11
	VADDPS 192(DX), Y12, Y12
	VADDPS 224(DX), Y13, Y13
	VMOVUPS Y6, 0(DX)
	VMOVUPS Y7, 32(DX)
	VMOVUPS Y8, 64(DX)
	VMOVUPS Y9, 96(DX)
	VMOVUPS Y10, 128(DX)
	VMOVUPS Y11, 160(DX)
	VMOVUPS Y12, 192(DX)
	VMOVUPS Y13, 224(DX)
	VZEROUPPER
	RET
