//go:build goexperiment.simd && amd64

#include "textflag.h"

// func qprefetch4(ks *float32, nks int, kz *float32, nkz int, vs *float32, nvs int, vz *float32, nvz int)
// PREFETCHT1 of every 64-byte line of the four runs of float32 (a run of
// length 0 is skipped): one chunk's K scales, K zeros, V scales, V zeros.
TEXT ·qprefetch4(SB), NOSPLIT, $0-64
	LEAQ ks+0(FP), DI
	MOVQ $4, DX
run:
	MOVQ 0(DI), SI
	MOVQ 8(DI), CX
	TESTQ CX, CX
	JZ next
	LEAQ -1(SI)(CX*4), CX
	ANDQ $-64, CX
	ANDQ $-64, SI
line:
	PREFETCHT1 (SI)
	ADDQ $64, SI
	CMPQ SI, CX
	JLS line
next:
	ADDQ $16, DI
	DECQ DX
	JNZ run
	RET
