//go:build goexperiment.simd && amd64

#include "textflag.h"

// func qcalls(c *qcall, n int)
//
// qcalls runs the n entries of a call list (quant_run_amd64.go): each
// entry is a routine number and up to 14 argument words. Routines 0-8
// are ABI0 assembly functions whose arguments are the words, copied to
// the outgoing argument area before the CALL; 9 (qcInvScale) and 10
// (qcVPart) are done here. The frame keeps the list pointer (112), the
// count (120), the current entry (128), the column (136) and the head
// dim over four (144): every routine may clobber every register.
TEXT ·qcalls(SB), NOSPLIT, $160-16
	MOVQ c+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ SI, 112(SP)
	MOVQ CX, 120(SP)
qcloop:
	MOVQ 120(SP), CX
	TESTQ CX, CX
	JEQ qcdone
	DECQ CX
	MOVQ CX, 120(SP)
	MOVQ 112(SP), SI
	MOVQ SI, 128(SP)
	LEAQ 120(SI), DI
	MOVQ DI, 112(SP)
	MOVQ 0(SI), AX
	CMPQ AX, $10
	JEQ qcvpart
	MOVQ 8(SI), DX
	MOVQ DX, 0(SP)
	MOVQ 16(SI), DX
	MOVQ DX, 8(SP)
	MOVQ 24(SI), DX
	MOVQ DX, 16(SP)
	MOVQ 32(SI), DX
	MOVQ DX, 24(SP)
	MOVQ 40(SI), DX
	MOVQ DX, 32(SP)
	MOVQ 48(SI), DX
	MOVQ DX, 40(SP)
	MOVQ 56(SI), DX
	MOVQ DX, 48(SP)
	MOVQ 64(SI), DX
	MOVQ DX, 56(SP)
	MOVQ 72(SI), DX
	MOVQ DX, 64(SP)
	MOVQ 80(SI), DX
	MOVQ DX, 72(SP)
	MOVQ 88(SI), DX
	MOVQ DX, 80(SP)
	MOVQ 96(SI), DX
	MOVQ DX, 88(SP)
	MOVQ 104(SI), DX
	MOVQ DX, 96(SP)
	MOVQ 112(SI), DX
	MOVQ DX, 104(SP)
	CMPQ AX, $0
	JEQ qc0
	CMPQ AX, $1
	JEQ qc1
	CMPQ AX, $2
	JEQ qc2
	CMPQ AX, $3
	JEQ qc3
	CMPQ AX, $4
	JEQ qc4
	CMPQ AX, $5
	JEQ qc5
	CMPQ AX, $6
	JEQ qc6
	CMPQ AX, $7
	JEQ qc7
	CMPQ AX, $8
	JEQ qc8
	CMPQ AX, $9
	JEQ qc9
	JMP qcloop
qc0:
	CALL ·qdots4i8vnni(SB)
	JMP qcloop
qc1:
	CALL ·qdots4i4vnni(SB)
	JMP qcloop
qc2:
	CALL ·qvwmax(SB)
	JMP qcloop
qc3:
	CALL ·qvwmax2(SB)
	JMP qcloop
qc4:
	CALL ·qvwquant(SB)
	JMP qcloop
qc5:
	CALL ·qvwquant2(SB)
	JMP qcloop
qc6:
	CALL ·qvaxpy4i8vnni(SB)
	JMP qcloop
qc7:
	CALL ·qvaxpy4i4vnni(SB)
	JMP qcloop
qc8:
	CALL ·qprefetch(SB)
	JMP qcloop
qc9:
	MOVQ 0(SP), DI
	MOVQ 8(SP), R8
	MOVQ 16(SP), R9
	CALL qcinvscale<>(SB)
	JMP qcloop
qcvpart:
	MOVQ 8(SI), DX
	MOVQ DX, 0(SP)
	MOVQ 16(SI), DX
	MOVQ DX, 8(SP)
	MOVQ 24(SI), DX
	MOVQ DX, 16(SP)
	MOVQ 32(SI), DX
	MOVQ DX, 24(SP)
	MOVQ 112(SI), DX
	LEAQ 24(DX), DX
	MOVQ DX, 32(SP)
	CMPQ 96(SI), $2
	JEQ qcvmax2
	CALL ·qvwmax(SB)
	JMP qcvinv
qcvmax2:
	CALL ·qvwmax2(SB)
qcvinv:
	MOVQ 128(SP), SI
	MOVQ 112(SI), DX
	LEAQ 24(DX), DI
	LEAQ 40(DX), R8
	LEAQ 56(DX), R9
	CALL qcinvscale<>(SB)
	MOVQ 128(SP), SI
	MOVQ 112(SI), DX
	MOVQ 0(DX), AX
	MOVQ AX, 0(SP)
	MOVQ 8(SI), AX
	MOVQ AX, 8(SP)
	MOVQ 16(SI), AX
	MOVQ AX, 16(SP)
	MOVQ 24(SI), AX
	MOVQ AX, 24(SP)
	MOVQ 32(SI), AX
	MOVQ AX, 32(SP)
	LEAQ 40(DX), AX
	MOVQ AX, 40(SP)
	MOVQ 40(SI), AX
	MOVQ AX, 48(SP)
	LEAQ 72(DX), AX
	MOVQ AX, 56(SP)
	CMPQ 96(SI), $2
	JEQ qcvquant2
	CALL ·qvwquant(SB)
	JMP qcvcols
qcvquant2:
	CALL ·qvwquant2(SB)
qcvcols:
	MOVQ 128(SP), SI
	MOVQ 88(SI), AX
	SHRQ $2, AX
	MOVQ AX, 144(SP)
	MOVQ $0, 136(SP)
qcvcol:
	MOVQ 128(SP), SI
	MOVQ 136(SP), BX
	MOVQ 88(SI), AX
	CMPQ BX, AX
	JGE qcloop
	MOVQ 80(SI), DX
	LEAQ (DX)(BX*4), DX
	MOVQ DX, 0(SP)
	SHLQ $2, AX
	MOVQ AX, 8(SP)
	MOVQ BX, DX
	CMPQ 104(SI), $0
	JEQ qcvbyte
	SHRQ $1, DX
qcvbyte:
	ADDQ 48(SI), DX
	MOVQ DX, 16(SP)
	MOVQ 56(SI), DX
	MOVQ DX, 24(SP)
	MOVQ 32(SI), DX
	MOVQ DX, R8
	SHRQ $1, DX
	MOVQ DX, 32(SP)
	ANDQ $1, R8
	MOVQ R8, 40(SP)
	MOVQ BX, AX
	XORQ DX, DX
	DIVQ 144(SP)
	MOVQ AX, R10
	LEAQ 32(BX), AX
	XORQ DX, DX
	DIVQ 144(SP)
	SUBQ R10, AX
	SHLQ $2, AX
	MOVQ AX, 64(SP)
	MOVQ 112(SI), DX
	MOVQ 0(DX), AX
	LEAQ (AX)(R10*4), AX
	MOVQ AX, 48(SP)
	MOVQ $64, 56(SP)
	MOVQ 72(SI), AX
	MOVQ AX, 72(SP)
	LEAQ 56(DX), AX
	MOVQ AX, 80(SP)
	LEAQ 72(DX)(R10*4), AX
	MOVQ AX, 88(SP)
	MOVQ $16, 96(SP)
	XORQ AX, AX
	TESTQ BX, BX
	JNE qcvpf
	MOVQ 64(SI), AX
qcvpf:
	MOVQ AX, 104(SP)
	ADDQ $64, BX
	MOVQ BX, 136(SP)
	CMPQ 104(SI), $0
	JNE qcvi4
	CALL ·qvaxpy4i8vnni(SB)
	JMP qcvcol
qcvi4:
	CALL ·qvaxpy4i4vnni(SB)
	JMP qcvcol
qcdone:
	VZEROUPPER
	RET

// qcinvscale: inv[0:4] (R8) = 16383/m where m > 0 and the quotient is
// at most MaxFloat32, else 0; sc[0:4] (R9) = m/16383; m[0:4] at DI.
TEXT qcinvscale<>(SB), NOSPLIT, $0
	VMOVUPS (DI), X0
	MOVL $0x467ffc00, AX // 16383
	VMOVD AX, X1
	VBROADCASTSS X1, X1
	VDIVPS X0, X1, X2 // 16383/m
	VDIVPS X1, X0, X3 // m/16383
	VXORPS X4, X4, X4
	VCMPPS $0x1e, X4, X0, X5 // m > 0 (ordered: NaN fails)
	MOVL $0x7f7fffff, AX // MaxFloat32
	VMOVD AX, X6
	VBROADCASTSS X6, X6
	VCMPPS $0x12, X6, X2, X7 // inv <= MaxFloat32
	VANDPS X5, X2, X2
	VANDPS X7, X2, X2
	VMOVUPS X2, (R8)
	VMOVUPS X3, (R9)
	RET
