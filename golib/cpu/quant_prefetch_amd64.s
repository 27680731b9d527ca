//go:build goexperiment.simd && amd64

#include "textflag.h"

// func qprefetch(p *float32, n int)
// PREFETCHT1 of every 64-byte line of the n float32 at p (n > 0).
TEXT ·qprefetch(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	LEAQ -1(SI)(CX*4), CX
	ANDQ $-64, CX
	ANDQ $-64, SI
loop:
	PREFETCHT1 (SI)
	ADDQ $64, SI
	CMPQ SI, CX
	JLS loop
	RET
