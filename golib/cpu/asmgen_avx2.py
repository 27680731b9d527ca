#!/usr/bin/env python3
"""Writes kern_avx2_amd64.s: the AVX2+FMA+F16C decode attention inner loops.

The float32, IEEE half (F16C VCVTPH2PS) and bfloat16 (VPMOVZXWD + VPSLLD) variants
differ only in how a K/V vector is loaded, so they are generated from one template per
loop. Register blocking is chosen for the 16 ymm registers of AVX2 (see each loop).
Run from this directory:  python3 asmgen_avx2.py > kern_avx2_amd64.s
(TestAsmgenAVX2InSync checks that the committed file is this script's output.)
"""
import struct
import sys

from asmgen_emit import ins, off, out, w


# Bytes of a row per PREFETCHT1 in the unrolled single-row loops (dots1w, axpy1w), per
# kind. float32: one line in four. With 256-bit loads a row already takes two load ops per
# line, and the loops streamed DRAM faster the fewer prefetch instructions they added (forced
# AVX2 on a Zen 4, one thread, MHA 32/32 fp32 16k tokens, interleaved runs, K+V GB/s
# relative to the AVX-512 path in the same run: every line 0.77 (d128) / 1.08 (d64), one in
# four 0.89 / 1.25, none 0.85 / 1.37); one in four keeps a software stream ahead of each row
# for CPUs whose hardware prefetchers do less. On the Granite Rapids-class Xeon every line
# measured 1.00-1.015x as fast for float32 (d64/d128, 16k/32k, 1-2 threads, old and new
# alternated call by call), so float32 keeps one in four. 16-bit rows: every line (as the
# AVX-512 loops do), 1.03-1.05x as fast at d128 and 1.09-1.16x at d64 there (MHA 32/32
# fp16/bf16 16k, 1 and 2 threads), where one in four left the AVX2 path at 0.70-0.86 of the
# paired streaming read against the AVX-512 path's 0.90-1.04.
ROW_PF_STEP = {"f32": 256, "f16": 64, "bf16": 64}

# The kinds whose four-row score loops use the wide register block (dots4 4x3: twelve
# score accumulators), the others keep dots4x2 (4x2); every kind's V loop takes passes of
# 24 dims (axpy4x24; float32 had passes of 16, axpy4x16, until the measurement below).
# Forced AVX2 on a Zen 4 (shared machine), GQA 32/8 d128, old and new loops alternated
# call by call in one process, median time ratio: fp16 and bfloat16 1.04-1.10x
# faster at 2k (L3) and 16k (beyond the L3) tokens, one and two threads (L2-resident loops
# alone: dots4 0.92-0.98x, axpy4 0.88-0.99x the time); float32 0.95-0.98x as fast beyond the
# L3 with either wide loop (1.00-1.02x at 2k; that harness always ran the same side first).
# On the Granite Rapids-class Xeon, with the order swapped every pair, the float32 24-dim V
# loop measured 1.027-1.036x as fast (GQA 32/8 d128 16k/32k, 1 and 2 threads, two runs;
# d64 1.014-1.031x; MHA, which does not use it, 0.998-1.004x) and the 4x3 score loop
# 0.99-1.01x, so float32 takes the wide V loop and keeps the 4x2 scores.
WIDE_KINDS = ("f16", "bf16")

# The kinds whose four-row loops read the rows of a call as separate streams: the float32
# score loop (dots4x2) pairs token t with t + n/2 and the row-streaming V loop (axpy4s)
# takes t, t + n/3 and t + 2n/3, so that each stream is read front to back, instead of two
# or three neighbouring rows side by side, 64 bytes of each in turn (a pattern the AVX2-only
# Zen 3's prefetchers followed poorly: the fp32 4x2 score loop alone from DRAM took about
# 1.3x the time of a streaming read of its bytes, in C with and without software prefetch,
# and the split one about 1.05-1.1x). GQA 32/8 fp32 decode step on that Zen 3, the builds
# alternated run by run (six rounds, median K+V GB/s), 16k / 32k tokens: d128 one thread
# 13.3 -> 16.7 / 13.4 -> 17.0, two threads 20.3 -> 24.3 / 21.8 -> 26.7 (the split score loop
# alone: 14.8 / 15.1 and 22.0 / 23.0); d64 one thread 13.6 -> 15.5 at 16k. The 16-bit rows
# (128-256 bytes) measured no faster split (fp16/bf16 d64 0.85-0.95x, d128 0.95-1.05x):
# their neighbouring rows are a few lines each, close to one stream already.
SPLIT_KINDS = ("f32",)

# The FMA-port budget of a 16-bit GQA token (Granite Rapids-class Xeon, 256-bit FMAs on
# ports 0 and 1 only): twelve independent FMAs take 6 cycles, and each VCVTPH2PS (memory
# form) or VPSLLD added to them costs another half cycle, so a conversion takes an FMA
# slot; VPMOVZXWD, VPSHUFB, loads and broadcasts do not. A GQA 32/8 d128 token is 128
# FMAs (four query rows against its K and its V row) and 32 conversions, about 80 cycles,
# plus about 4 for its share of the exp and 2 for the score reductions: 512 bytes in some
# 22-24 ns at 3.6-3.7 GHz, near the one-thread streaming read, so the memory and the FMAs
# must overlap for the 16-bit fractions of the paired probe. Alone on a 512-token block
# in L2 the fp16 4x3 score loop takes 5.3-5.9 us, against 5.5 us for its 40 cycles a
# token at 3.7 GHz (the clock twelve-FMA chains measured): no slack is left in the loops.

# The head dims whose single-row (MHA) loops are unrolled per dim (dots1w, axpy1w): rows
# read one after another, each front to back. Other dims read four rows side by side
# (dots1) and V in passes of 64 dims over tiles of rows (axpy1), which streamed DRAM at
# 0.7-0.85x the d128 loops' rate on the AVX2-only Zen 3 (MHA 32/32 fp32, 2M-token-dims
# caches: d80 11.7, d96 13.8, d256 12.8 against d128 16.5 GB/s on one thread). 16-bit
# rows go in place only at multiples of 32 (halfAVX2.ok), so they have no 80.
WIDE_DIMS = {"f32": (64, 80, 96, 128, 256), "f16": (64, 96, 128, 256), "bf16": (64, 96, 128, 256)}

# element size in bytes, K/V Go type, bytes of one 8-lane K/V chunk
KINDS = {"f32": (4, "float32", 32), "f16": (2, "uint16", 16), "bf16": (2, "uint16", 16)}


def load(kind, addr, reg, shuf=False):
    """Loads eight K/V elements at addr into ymm reg as float32.

    bfloat16 takes two ops: VPMOVZXWD + VPSLLD, or with shuf VBROADCASTI128 of the 16
    bytes and a VPSHUFB with a memory control vector (bf16ctl) that puts element i in the
    high half of lane i: no shift, which on Intel cores takes one of the two FMA ports
    (VPSHUFB runs on ports 1 and 5, VPMOVZXWD on 5), for one more load. The 4x3 score loop
    (dots4x3) uses shuf: alone on a 512-token block in L2 (Granite Rapids-class Xeon) it
    took 5.96-6.55 us against 6.62-7.16; the 24-dim V loop took 6.51-6.72 us with it
    against 6.03-6.25 (ten loads per twelve FMAs there), and on the shared Zen 4 both
    wide loops measured 0.94-0.97x as fast with it (forced AVX2, GQA 32/8 d128 and d64, 4k
    and 16k tokens, 1 and 2 threads, median time ratio), so the other loops keep the shift.
    The 4x3 loop is emitted both ways (dots4bf16avx2, dots4bf16shavx2) and the CPU tuning
    picks one: the Zen tuning the shift, which measured 1.01-1.04x as fast there.
    """
    if kind == "f32":
        return [f"VMOVUPS {addr}, {reg}"]
    if kind == "f16":
        return [f"VCVTPH2PS {addr}, {reg}"]
    if shuf:
        return [f"VBROADCASTI128 {addr}, {reg}", f"VPSHUFB bf16ctl<>(SB), {reg}, {reg}"]
    return [f"VPMOVZXWD {addr}, {reg}", f"VPSLLD $16, {reg}, {reg}"]


def qscale(kind):
    # q (float32) byte offset = K byte offset * qscale
    return 1 if kind == "f32" else 2


w("//go:build goexperiment.simd && amd64")
w()
w("// Code generated by asmgen_avx2.py; DO NOT EDIT.")
w("// AVX2 + FMA + F16C inner loops of the decode attention kernel for float32, IEEE half")
w("// (VCVTPH2PS) and bfloat16 (VPMOVZXWD + VPSLLD) K/V rows read straight from the cache's")
w("// storage; math is float32. Contracts are in kern_avx2_amd64.go.")
w()
w('#include "textflag.h"')
w()


def dots4token(kind, name, chunks, cb, qs, shuf=False):
    """Emits one token's four-row scores (the tails of the four-row score
    loops): Y0-Y3 accumulate the token's K row (at SI, R13 bytes) against
    the query rows at R8-R11 over label {name}tin, then the four sums go to
    the score rows at DI, DI+BX, DI+2BX, DI+DX."""
    for i in range(4):
        ins(f"VXORPS Y{i}, Y{i}, Y{i}")
    ins("XORQ CX, CX")
    w(f"{name}tin:")
    for c in range(chunks):
        ins(*load(kind, f"{off(cb*c)}(SI)(CX*1)", "Y8", shuf))
        for r, qb in enumerate(["R8", "R9", "R10", "R11"]):
            ins(f"VFMADD231PS {off(32*c)}({qb})(CX*{qs}), Y8, Y{r}")
    ins("ADDQ $64, CX", "CMPQ CX, R13", f"JLT {name}tin")
    ins("VHADDPS Y1, Y0, Y0", "VHADDPS Y3, Y2, Y2", "VHADDPS Y2, Y0, Y0",
        "VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0",
        "VMOVSS X0, (DI)", "VEXTRACTPS $1, X0, (DI)(BX*1)", "VEXTRACTPS $2, X0, (DI)(BX*2)",
        "VEXTRACTPS $3, X0, (DI)(DX*1)")


def dots4x2(kind):
    es, gt, cb = KINDS[kind]
    qs = qscale(kind)
    chunks = 64 // cb  # 8-lane chunks per 64-byte step of a K row
    name = f"dots4{kind}avx2"
    w(f"// func {name}(s *float32, ldS int, q *float32, k *{gt}, krb int, nt int, pfd int)")
    w("//")
    w("// For query rows r < 4 and tokens t < nt: s[r*ldS/4 + t] = dot(q_r, k_t), q rows of")
    w(f"// krb*{qs} bytes, K rows of krb bytes (a multiple of 64). Two tokens per step, t and")
    w("// t + h (h = nt/2): the 4x2 block of accumulators is Y0-Y7, each K vector (Y8, Y9)")
    w("// feeds four FMAs and each q vector (Y10) two; an odd last token runs a 4x1 step. The")
    w("// two halves of the rows are two streams read front to back (SI, R12), each")
    w("// prefetched pfd bytes ahead (R14, R15), with the scores of the second half at DX.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-56")
    ins("MOVQ s+0(FP), DI", "MOVQ ldS+8(FP), BX", "MOVQ q+16(FP), R8", "MOVQ k+24(FP), SI",
        "MOVQ krb+32(FP), R13", "MOVQ nt+40(FP), AX", "MOVQ pfd+48(FP), R14",
        f"LEAQ (R8)(R13*{qs}), R9", f"LEAQ (R9)(R13*{qs}), R10", f"LEAQ (R10)(R13*{qs}), R11",
        "SHRQ $1, AX",
        # R12 = the first row of the second half, DX = its first score, R15 its prefetch
        "MOVQ AX, R12", "IMULQ R13, R12", "ADDQ SI, R12", "LEAQ (DI)(AX*4), DX",
        "ADDQ SI, R14", "MOVQ R14, R15", "ADDQ R12, R15", "SUBQ SI, R15",
        "TESTQ AX, AX", f"JZ {name}tail")
    w(f"{name}pair:")
    for i in range(8):
        ins(f"VXORPS Y{i}, Y{i}, Y{i}")
    ins("XORQ CX, CX")
    w(f"{name}in:")
    ins("PREFETCHT1 (R14)(CX*1)", "PREFETCHT1 (R15)(CX*1)")
    for c in range(chunks):
        ins(*load(kind, f"{off(cb*c)}(SI)(CX*1)", "Y8"))
        ins(*load(kind, f"{off(cb*c)}(R12)(CX*1)", "Y9"))
        for r, qb in enumerate(["R8", "R9", "R10", "R11"]):
            ins(f"VMOVUPS {off(32*c)}({qb})(CX*{qs}), Y10",
                f"VFMADD231PS Y8, Y10, Y{2*r}",
                f"VFMADD231PS Y9, Y10, Y{2*r+1}")
    ins("ADDQ $64, CX", "CMPQ CX, R13", f"JLT {name}in")
    # rows (0,1) -> X0 = [r0t, r0(t+h), r1t, r1(t+h)]; rows (2,3) -> X4
    ins("VHADDPS Y1, Y0, Y0", "VHADDPS Y3, Y2, Y2", "VHADDPS Y2, Y0, Y0",
        "VEXTRACTF128 $1, Y0, X2", "VADDPS X2, X0, X0",
        "VHADDPS Y5, Y4, Y4", "VHADDPS Y7, Y6, Y6", "VHADDPS Y6, Y4, Y4",
        "VEXTRACTF128 $1, Y4, X6", "VADDPS X6, X4, X4",
        "VMOVSS X0, (DI)", "VEXTRACTPS $1, X0, (DX)",
        "VEXTRACTPS $2, X0, (DI)(BX*1)", "VEXTRACTPS $3, X0, (DX)(BX*1)",
        "VMOVSS X4, (DI)(BX*2)", "VEXTRACTPS $1, X4, (DX)(BX*2)",
        "LEAQ (DI)(BX*2), CX", "ADDQ BX, CX", "VEXTRACTPS $2, X4, (CX)",
        "LEAQ (DX)(BX*2), CX", "ADDQ BX, CX", "VEXTRACTPS $3, X4, (CX)",
        "ADDQ $4, DI", "ADDQ $4, DX", "ADDQ R13, SI", "ADDQ R13, R12", "ADDQ R13, R14", "ADDQ R13, R15",
        "DECQ AX", f"JNZ {name}pair")
    w(f"{name}tail:")
    # the odd last token, 2h: its row follows the second half (R12), its score too (DX)
    ins("MOVQ nt+40(FP), AX", "ANDQ $1, AX", f"JZ {name}done",
        "MOVQ R12, SI", "MOVQ DX, DI", "LEAQ (BX)(BX*2), DX")
    dots4token(kind, name, chunks, cb, qs)
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def dots4x3(kind, shuf=True):
    """The 4x3 score loop; for bfloat16 shuf=False emits the shift-widening twin
    dots4bf16shavx2 (picked by the Zen tuning: see cpuTunings in kern_avx2_amd64.go).

    How it reduces its twelve accumulators. On the AVX2-only Zen 3,
    next to a stream of FMAs (microbenchmark: twelve independent FMAs a loop, one op kind
    added), in-lane shuffles (VUNPCKLPS/HPS, VSHUFPS) and VADDPS cost the FMAs almost nothing
    (four: +0.0-0.3 cycles on 6), while each VHADDPS, VEXTRACTF128 or VPERM2F128 took about half
    a cycle from them and each vector store (VMOVSS, VEXTRACTPS to memory, VMOVUPS) 0.6-0.9. The
    VHADDPS trees (nine VHADDPS, three extracts and eight partial stores a three-token step)
    became per row: two unpack pairs and two VSHUFPS with their adds, one extract and one
    16-byte store whose fourth lane the next step overwrites (four extracts and four stores a
    step). The sums are added in another order: scores change by float32 rounding.
    BenchmarkTunePaired with both loops in one binary (the old as the variant), GQA 32/8 16k
    tokens: fp16 d64 / d128 1.02-1.03x / 1.01-1.03x as fast on one and two threads, bfloat16
    1.00 / 0.996-1.016x.
    """
    es, gt, cb = KINDS[kind]
    qs = qscale(kind)
    chunks = 64 // cb  # 8-lane chunks per 64-byte step of a K row
    name = f"dots4{kind}avx2" if shuf else f"dots4{kind}shavx2"
    w(f"// func {name}(s *float32, ldS int, q *float32, k *{gt}, krb int, nt int, pfd int)")
    w("//")
    w("// For query rows r < 4 and tokens t < nt: s[r*ldS/4 + t] = dot(q_r, k_t), q rows of")
    w(f"// krb*{qs} bytes, K rows of krb bytes (a multiple of 64). Three tokens per step: the")
    w("// 4x3 block of accumulators is Y0-Y11 (row r, token t in Y(3r+t)), each K vector")
    w("// (Y12-Y14) feeds four FMAs and each q vector (Y15) three: twelve independent FMA")
    w("// chains and 7 loads per 12 FMAs (dots4x2: eight, 6 per 8). Each row's three sums")
    w("// are reduced by in-lane shuffles and adds and one lane-crossing extract and stored 16")
    w("// bytes at a time (the last step stores 12). The three K")
    w("// rows of a step are contiguous: three lines per step (R15) cover them, pfd bytes")
    w("// ahead. The last one or two tokens run 4x1 steps.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-56")
    ins("MOVQ s+0(FP), DI", "MOVQ ldS+8(FP), BX", "MOVQ q+16(FP), R8", "MOVQ k+24(FP), SI",
        "MOVQ krb+32(FP), R13", "MOVQ nt+40(FP), AX", "MOVQ pfd+48(FP), R14",
        f"LEAQ (R8)(R13*{qs}), R9", f"LEAQ (R9)(R13*{qs}), R10", f"LEAQ (R10)(R13*{qs}), R11",
        "ADDQ SI, R14", "LEAQ (SI)(R13*1), R12", "LEAQ (SI)(R13*2), DX",
        "SUBQ $3, AX", f"JLT {name}tail")
    w(f"{name}tri:")
    for i in range(12):
        ins(f"VXORPS Y{i}, Y{i}, Y{i}")
    ins("XORQ CX, CX", "MOVQ R14, R15")
    w(f"{name}in:")
    ins("PREFETCHT1 (R15)", "PREFETCHT1 64(R15)", "PREFETCHT1 128(R15)", "ADDQ $192, R15")
    for c in range(chunks):
        for t, kb in enumerate(["SI", "R12", "DX"]):
            ins(*load(kind, f"{off(cb*c)}({kb})(CX*1)", f"Y{12+t}", shuf=shuf))
        for r, qb in enumerate(["R8", "R9", "R10", "R11"]):
            ins(f"VMOVUPS {off(32*c)}({qb})(CX*{qs}), Y15")
            for t in range(3):
                ins(f"VFMADD231PS Y{12+t}, Y15, Y{3*r+t}")
    ins("ADDQ $64, CX", "CMPQ CX, R13", f"JLT {name}in")
    # Row r's three sums -> X(3r) = [t0 t1 t2 t2] with in-lane shuffles and adds (which
    # Zen 3 runs beside its FMAs) and one lane-crossing extract per row
    for r in range(4):
        a, b, c = 3 * r, 3 * r + 1, 3 * r + 2
        ins(f"VUNPCKLPS Y{b}, Y{a}, Y12", f"VUNPCKHPS Y{b}, Y{a}, Y{a}", f"VADDPS Y12, Y{a}, Y{a}",
            f"VUNPCKLPS Y{c}, Y{c}, Y13", f"VUNPCKHPS Y{c}, Y{c}, Y{c}", f"VADDPS Y13, Y{c}, Y{c}",
            f"VSHUFPS $0x44, Y{c}, Y{a}, Y12", f"VSHUFPS $0xee, Y{c}, Y{a}, Y{a}",
            f"VADDPS Y12, Y{a}, Y{a}", f"VEXTRACTF128 $1, Y{a}, X12", f"VADDPS X12, X{a}, X{a}")
    # a step with tokens after it stores 16 bytes a row (its fourth lane is overwritten
    # by the next step or the tail); the last step stores the three sums exactly
    ins("LEAQ (BX)(BX*2), CX", "ADDQ DI, CX", "SUBQ $3, AX", f"JLT {name}last",
        "VMOVUPS X0, (DI)", "VMOVUPS X3, (DI)(BX*1)", "VMOVUPS X6, (DI)(BX*2)", "VMOVUPS X9, (CX)",
        "ADDQ $12, DI", "LEAQ (R13)(R13*2), CX", "ADDQ CX, SI", "ADDQ CX, R12", "ADDQ CX, DX",
        "ADDQ CX, R14", f"JMP {name}tri")
    w(f"{name}last:")
    ins("VMOVLPS X0, (DI)", "VEXTRACTPS $2, X0, 8(DI)",
        "VMOVLPS X3, (DI)(BX*1)", "VEXTRACTPS $2, X3, 8(DI)(BX*1)",
        "VMOVLPS X6, (DI)(BX*2)", "VEXTRACTPS $2, X6, 8(DI)(BX*2)",
        "VMOVLPS X9, (CX)", "VEXTRACTPS $2, X9, 8(CX)",
        # the tail reads on from DI and SI only
        "ADDQ $12, DI", "LEAQ (R13)(R13*2), CX", "ADDQ CX, SI")
    w(f"{name}tail:")
    ins("ADDQ $3, AX", f"JZ {name}done", "LEAQ (BX)(BX*2), DX")
    w(f"{name}one:")
    dots4token(kind, name, chunks, cb, qs, shuf=shuf)
    ins("ADDQ $4, DI", "ADDQ R13, SI", "DECQ AX", f"JNZ {name}one")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def dots1(kind):
    es, gt, cb = KINDS[kind]
    qs = qscale(kind)
    chunks = 64 // cb
    name = f"dots1{kind}avx2"
    w(f"// func {name}(s *float32, q *float32, k *{gt}, krb int, nt int, pfd int)")
    w("//")
    w("// s[t] = dot(q, k_t) for t < nt, K rows of krb bytes (a multiple of 64). Four tokens")
    w("// per step, each row read front to back; even and odd chunks go to separate")
    w("// accumulators (Y0-Y3, Y4-Y7) so the FMA latency is hidden. The four rows of a step")
    w("// are contiguous: PREFETCHT1 at 4*offset covers them, pfd bytes ahead. Tokens past")
    w("// the last multiple of four run one at a time.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-48")
    ins("MOVQ s+0(FP), DI", "MOVQ q+8(FP), R8", "MOVQ k+16(FP), SI", "MOVQ krb+24(FP), DX",
        "MOVQ nt+32(FP), AX", "MOVQ pfd+40(FP), R12", "ADDQ SI, R12",
        "SHRQ $2, AX", f"JZ {name}tail")
    w(f"{name}quad:")
    ins("LEAQ (SI)(DX*1), R9", "LEAQ (SI)(DX*2), R10", "LEAQ (R9)(DX*2), R11")
    for i in range(8):
        ins(f"VXORPS Y{i}, Y{i}, Y{i}")
    ins("XORQ CX, CX")
    w(f"{name}in:")
    ins("PREFETCHT1 (R12)(CX*4)", "PREFETCHT1 64(R12)(CX*4)", "PREFETCHT1 128(R12)(CX*4)",
        "PREFETCHT1 192(R12)(CX*4)")
    for c in range(chunks):
        ins(f"VMOVUPS {off(32*c)}(R8)(CX*{qs}), Y8")
        base = 4 * (c % 2)
        for t, kb in enumerate(["SI", "R9", "R10", "R11"]):
            if kind == "f32":
                ins(f"VFMADD231PS {off(cb*c)}({kb})(CX*1), Y8, Y{base+t}")
            else:
                ins(*load(kind, f"{off(cb*c)}({kb})(CX*1)", f"Y{9+t}"))
                ins(f"VFMADD231PS Y{9+t}, Y8, Y{base+t}")
    ins("ADDQ $64, CX", "CMPQ CX, DX", f"JLT {name}in")
    ins("VADDPS Y4, Y0, Y0", "VADDPS Y5, Y1, Y1", "VADDPS Y6, Y2, Y2", "VADDPS Y7, Y3, Y3",
        "VHADDPS Y1, Y0, Y0", "VHADDPS Y3, Y2, Y2", "VHADDPS Y2, Y0, Y0",
        "VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0", "VMOVUPS X0, (DI)",
        "ADDQ $16, DI", "LEAQ (SI)(DX*4), SI", "LEAQ (R12)(DX*4), R12",
        "DECQ AX", f"JNZ {name}quad")
    w(f"{name}tail:")
    ins("MOVQ nt+32(FP), AX", "ANDQ $3, AX", f"JZ {name}done")
    w(f"{name}one:")
    ins("VXORPS Y0, Y0, Y0", "VXORPS Y4, Y4, Y4", "XORQ CX, CX")
    w(f"{name}tin:")
    for c in range(chunks):
        acc = "Y0" if c % 2 == 0 else "Y4"
        ins(*load(kind, f"{off(cb*c)}(SI)(CX*1)", "Y9"))
        ins(f"VFMADD231PS {off(32*c)}(R8)(CX*{qs}), Y9, {acc}")
    ins("ADDQ $64, CX", "CMPQ CX, DX", f"JLT {name}tin")
    ins("VADDPS Y4, Y0, Y0", "VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0",
        "VHADDPS X0, X0, X0", "VHADDPS X0, X0, X0", "VMOVSS X0, (DI)",
        "ADDQ $4, DI", "ADDQ DX, SI", "DECQ AX", f"JNZ {name}one")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def axpy4x24(kind):
    es, gt, cb = KINDS[kind]
    name = f"axpy4{kind}avx2"
    w(f"// func {name}(acc *float32, rb int, p *float32, ldP int, v *{gt}, n int, alpha *[4]float32, pfd int)")
    w("//")
    w("// For rows r < 4: acc_r = alpha[r]*acc_r + sum_{t<n} p_r[t]*v_t (alpha nil: 1, the")
    w("// rows are loaded without the multiply), acc_r at acc + r*rb")
    w(f"// bytes (rows of rb/4 float32, rb a multiple of 64), p_r at p + r*ldP bytes, v_t at")
    w(f"// v + t*rb*{es}/4 bytes; n >= 1. Passes of 24 dims: the 4x24 accumulator block is")
    w("// Y0-Y11 (twelve independent FMA chains), a token's three V vectors Y12-Y14 and each")
    w("// row's weight Y15 in turn, so every V element is loaded once for the four rows and")
    w("// each weight feeds three FMAs. The last 16 or 32 dims of a row (rb/32 mod 3 = 2 or 1)")
    w("// go in passes of 16 (Y0-Y7). V is prefetched pfd bytes ahead.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-64")
    ins("MOVQ acc+0(FP), CX", "MOVQ rb+8(FP), DX", "MOVQ ldP+24(FP), R9", "MOVQ v+32(FP), SI",
        "MOVQ pfd+56(FP), R11", "LEAQ (CX)(DX*1), DI")
    if es == 4:
        ins("MOVQ DX, R12")
    else:
        ins("MOVQ DX, R12", "SHRQ $1, R12")
    w(f"{name}pass:")
    ins("MOVQ DI, R14", "SUBQ CX, R14", f"JLE {name}done",
        "CMPQ R14, $64", f"JEQ {name}p2", "CMPQ R14, $128", f"JEQ {name}p2")
    for wc, lab in ((3, "p3"), (2, "p2")):
        w(f"{name}{lab}:")
        ins("MOVQ alpha+48(FP), R13", "TESTQ R13, R13", f"JZ {name}{lab}load")
        rows = ["(CX)", "(CX)(DX*1)", "(CX)(DX*2)", "(R13)(DX*1)"]
        for r in range(4):
            ins(f"VBROADCASTSS {4*r}(R13), Y15")
            if r == 3:
                ins("LEAQ (CX)(DX*2), R13")
            for c in range(wc):
                ins(f"VMULPS {off(32*c)}{rows[r]}, Y15, Y{wc*r+c}")
        ins(f"JMP {name}{lab}go")
        w(f"{name}{lab}load:")
        ins("LEAQ (CX)(DX*2), R13")
        for r in range(4):
            for c in range(wc):
                ins(f"VMOVUPS {off(32*c)}{rows[r]}, Y{wc*r+c}")
        w(f"{name}{lab}go:")
        ins("MOVQ p+16(FP), R8", "LEAQ (R9)(R9*2), R10", "ADDQ R8, R10",
            "MOVQ SI, BX", "MOVQ n+40(FP), AX")
        w(f"{name}{lab}t:")
        ins("PREFETCHT1 (BX)(R11*1)")
        if wc * cb > 64:
            ins("PREFETCHT1 64(BX)(R11*1)")
        for c in range(wc):
            ins(*load(kind, f"{off(cb*c)}(BX)", f"Y{12+c}"))
        for r, pa in enumerate(["(R8)", "(R8)(R9*1)", "(R8)(R9*2)", "(R10)"]):
            ins(f"VBROADCASTSS {pa}, Y15")
            for c in range(wc):
                ins(f"VFMADD231PS Y{12+c}, Y15, Y{wc*r+c}")
        ins("ADDQ $4, R8", "ADDQ $4, R10", "ADDQ R12, BX", "DECQ AX", f"JNZ {name}{lab}t")
        ins("LEAQ (CX)(DX*2), R13")
        for r in range(4):
            for c in range(wc):
                ins(f"VMOVUPS Y{wc*r+c}, {off(32*c)}{rows[r]}")
        ins(f"ADDQ ${wc*cb}, SI", f"ADDQ ${32*wc}, CX", f"JMP {name}pass")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def axpy4s_step(kind, name, lab, tokens, split=False):
    """One step of axpy4s over `tokens` V rows (3, or 1 for the tail): the four rows' weights
    of those tokens broadcast into Y4.. (row r, token t in Y(4+tokens*r+t)), then the rows
    walked front to back 64 bytes at a time, each accumulator chunk loaded into Y3, given
    one FMA per token and stored. The three-token step prefetches its rows pfd bytes ahead."""
    es, gt, cb = KINDS[kind]
    qs = qscale(kind)
    chunks = 64 // cb  # 8-lane chunks per 64-byte step of a V row
    acc = ["DI", "R13", "R14", "R10"]
    rows = ["SI", "BX", "R11"][:tokens]
    if split and tokens > 1:
        # token j of the step is t + j*h: its weights 4h*j bytes on (h4), its row h*rowbytes*j (hk)
        ins("MOVQ h4-8(SP), R15", "MOVQ R8, DX")
        for r in range(4):
            if r > 0:
                ins("ADDQ R9, DX")
            for t, a in enumerate(["(DX)", "(DX)(R15*1)", "(DX)(R15*2)"]):
                ins(f"VBROADCASTSS {a}, Y{4+tokens*r+t}")
        ins("MOVQ hk-16(SP), BX", "ADDQ SI, BX", "MOVQ hk-16(SP), R11", "ADDQ BX, R11",
            "MOVQ pfd+48(FP), DX")
    else:
        ins("LEAQ (R9)(R9*2), DX", "ADDQ R8, DX")
        for r, pa in enumerate(["(R8)", "(R8)(R9*1)", "(R8)(R9*2)", "(DX)"]):
            for t in range(tokens):
                ins(f"VBROADCASTSS {off(4*t)}{pa}, Y{4+tokens*r+t}")
        if tokens > 1:
            ins("LEAQ (SI)(R12*1), BX", "LEAQ (BX)(R12*1), R11", "MOVQ pfd+48(FP), DX", "ADDQ SI, DX")
    ins("XORQ CX, CX")
    w(f"{name}{lab}:")
    if split and tokens > 1:
        ins("PREFETCHT1 (SI)(DX*1)", "PREFETCHT1 (BX)(DX*1)", "PREFETCHT1 (R11)(DX*1)", "ADDQ $64, DX")
    elif tokens > 1:
        ins("PREFETCHT1 (DX)", "PREFETCHT1 64(DX)", "PREFETCHT1 128(DX)", "ADDQ $192, DX")
    for c in range(chunks):
        for t, vb in enumerate(rows):
            ins(*load(kind, f"{off(cb*c)}({vb})(CX*1)", f"Y{t}"))
        for r in range(4):
            a = f"{off(32*c)}({acc[r]})(CX*{qs})"
            ins(f"VMOVUPS {a}, Y3")
            for t in range(tokens):
                ins(f"VFMADD231PS Y{t}, Y{4+tokens*r+t}, Y3")
            ins(f"VMOVUPS Y3, {a}")
    ins("ADDQ $64, CX", "CMPQ CX, R12", f"JLT {name}{lab}")


def axpy4s(kind, split=False):
    """The row-streaming four-row V loop: three V rows at a time front to back, the
    accumulators in memory (L1)."""
    es, gt, cb = KINDS[kind]
    qs = qscale(kind)
    name = f"axpy4s{kind}avx2"
    w(f"// func {name}(acc *float32, rb int, p *float32, ldP int, v *{gt}, n int, pfd int)")
    w("//")
    w("// For rows r < 4: acc_r += sum_{t<n} p_r[t]*v_t, acc_r at acc + r*rb bytes (rows of")
    w(f"// rb/4 float32, rb a multiple of {64 * qs}), p_r at p + r*ldP bytes, v_t at v + t*rb*{es}/4")
    w("// bytes; n >= 1. Three tokens per step: their twelve weights stay in Y4-Y15 while the")
    w("// step walks the three V rows front to back, 64 bytes of each at a time (Y0-Y2), and")
    w("// each accumulator chunk is loaded, takes three FMAs and is stored (Y3): the V rows are")
    w("// read front to back, as the score loops read K, where the register-blocked passes")
    w("// (axpy4x24) take a few bytes of every row of a tile in each of six passes.")
    if split:
        w("// The tokens of a step are t, t+h and t+2h (h = n/3, t < h): the three thirds of the")
        w("// rows are three streams read in storage order, each prefetched pfd bytes ahead")
        w("// (DX), and the tokens reach each accumulator in that order, not token order. The")
        w("// last n - 3h tokens run one-token steps.")
    else:
        w("// The three rows of a step are contiguous: three lines per 64-byte step (DX) cover")
        w("// them, pfd bytes ahead. The last one or two tokens run one-token steps.")
    w(f"TEXT ·{name}(SB), NOSPLIT, ${16 if split else 0}-56")
    ins("MOVQ acc+0(FP), DI", "MOVQ rb+8(FP), DX", "MOVQ p+16(FP), R8", "MOVQ ldP+24(FP), R9",
        "MOVQ v+32(FP), SI", "MOVQ n+40(FP), AX",
        "LEAQ (DI)(DX*1), R13", "LEAQ (R13)(DX*1), R14", "LEAQ (R14)(DX*1), R10")
    if es == 4:
        ins("MOVQ DX, R12")
    else:
        ins("MOVQ DX, R12", "SHRQ $1, R12")
    if split:
        # h = n/3 steps of tokens t, t+h, t+2h, then the last n - 3h one at a time
        ins("MOVL $0xAAAAAAAB, CX", "IMULQ CX, AX", "SHRQ $33, AX",
            "LEAQ (AX*4), CX", "MOVQ CX, h4-8(SP)", "MOVQ AX, CX", "IMULQ R12, CX", "MOVQ CX, hk-16(SP)",
            "TESTQ AX, AX", f"JZ {name}tail")
        w(f"{name}tri:")
        axpy4s_step(kind, name, "in", 3, split=True)
        ins("ADDQ $4, R8", "ADDQ R12, SI", "DECQ AX", f"JNZ {name}tri")
        w(f"{name}tail:")
        # from token 3h: weights 8h bytes and rows 2h on; n - 3h tokens (MOVQ and LEAQ
        # keep SUBQ's flags for the JZ)
        ins("MOVQ h4-8(SP), CX", "LEAQ (R8)(CX*2), R8", "LEAQ (CX)(CX*2), CX", "SHRQ $2, CX",
            "MOVQ n+40(FP), AX", "SUBQ CX, AX", "MOVQ hk-16(SP), CX", "LEAQ (SI)(CX*2), SI",
            f"JZ {name}done")
    else:
        ins("SUBQ $3, AX", f"JLT {name}tail")
        w(f"{name}tri:")
        axpy4s_step(kind, name, "in", 3)
        ins("ADDQ $12, R8", "LEAQ (R11)(R12*1), SI", "SUBQ $3, AX", f"JGE {name}tri")
        w(f"{name}tail:")
        ins("ADDQ $3, AX", f"JZ {name}done")
    w(f"{name}one:")
    axpy4s_step(kind, name, "oin", 1)
    ins("ADDQ $4, R8", "ADDQ R12, SI", "DECQ AX", f"JNZ {name}one")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def axpy1(kind):
    es, gt, cb = KINDS[kind]
    name = f"axpy1{kind}avx2"
    w(f"// func {name}(acc *float32, rb int, p *float32, v *{gt}, n int, alpha float32, pfd int)")
    w("//")
    w("// acc = alpha*acc + sum_{t<n} p[t]*v_t, acc of rb/4 float32 (rb a multiple of 128),")
    w(f"// v_t at v + t*rb*{es}/4 bytes, n >= 1. Passes of 64 dims (Y0-Y7: eight independent")
    w("// FMA chains per token hide the latency), then one pass of 32 dims (Y0-Y3, tokens")
    w("// alternating with Y4-Y7) when rb/4 is an odd multiple of 32. Each pass reads its")
    w("// part of every V row (256 bytes of a float32 row) and prefetches it pfd bytes ahead:")
    w("// passes of 32 dims over head dim 128 read DRAM in strides of a row, and MHA decode")
    w("// measured about 0.6x the AVX-512 path's speed with them.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-56")
    ins("MOVQ acc+0(FP), DI", "MOVQ rb+8(FP), DX", "MOVQ p+16(FP), R8", "MOVQ v+24(FP), SI",
        "MOVQ n+32(FP), AX", "VBROADCASTSS alpha+40(FP), Y15", "MOVQ pfd+48(FP), R9",
        "SHLQ $2, AX", "XORQ CX, CX", "LEAQ -255(DX), R11")
    if es == 4:
        ins("MOVQ DX, R10")
    else:
        ins("MOVQ DX, R10", "SHRQ $1, R10")
    ins("CMPQ CX, R11", f"JGE {name}half")
    w(f"{name}pass:")
    for j in range(8):
        ins(f"VMULPS {off(32*j)}(DI)(CX*1), Y15, Y{j}")
    ins("MOVQ SI, BX", "XORQ R12, R12")
    w(f"{name}t:")
    for l in range(8 * cb // 64):
        ins(f"PREFETCHT1 {off(64*l)}(BX)(R9*1)")
    ins("VBROADCASTSS (R8)(R12*1), Y8")
    for j in range(8):
        if kind == "f32":
            ins(f"VFMADD231PS {off(cb*j)}(BX), Y8, Y{j}")
        else:
            t = f"Y{9+j%4}"
            ins(*load(kind, f"{off(cb*j)}(BX)", t))
            ins(f"VFMADD231PS {t}, Y8, Y{j}")
    ins("ADDQ R10, BX", "ADDQ $4, R12", "CMPQ R12, AX", f"JLT {name}t")
    for j in range(8):
        ins(f"VMOVUPS Y{j}, {off(32*j)}(DI)(CX*1)")
    ins(f"ADDQ ${8*cb}, SI", "ADDQ $256, CX", "CMPQ CX, R11", f"JLT {name}pass")
    w(f"{name}half:")
    ins("CMPQ CX, DX", f"JGE {name}done")
    for j in range(4):
        ins(f"VMULPS {off(32*j)}(DI)(CX*1), Y15, Y{j}")
    for j in range(4):
        ins(f"VXORPS Y{4+j}, Y{4+j}, Y{4+j}")
    ins("MOVQ SI, BX", "XORQ R12, R12")
    w(f"{name}ht:")
    for s in range(2):
        for l in range(max(1, 4 * cb // 64)):
            ins(f"PREFETCHT1 {off(64*l)}(BX)(R9*1)")
        ins(f"VBROADCASTSS (R8)(R12*1), Y{8+s}")
        for j in range(4):
            acc = f"Y{4*s+j}"
            if kind == "f32":
                ins(f"VFMADD231PS {off(cb*j)}(BX), Y{8+s}, {acc}")
            else:
                ins(*load(kind, f"{off(cb*j)}(BX)", f"Y{10+j}"))
                ins(f"VFMADD231PS Y{10+j}, Y{8+s}, {acc}")
        ins("ADDQ R10, BX", "ADDQ $4, R12", "CMPQ R12, AX")
        ins(f"JGE {name}hstore" if s == 0 else f"JLT {name}ht")
    w(f"{name}hstore:")
    for j in range(4):
        ins(f"VADDPS Y{4+j}, Y{j}, Y{j}")
    for j in range(4):
        ins(f"VMOVUPS Y{j}, {off(32*j)}(DI)(CX*1)")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def dots1w(kind, D):
    es, gt, cb = KINDS[kind]
    rowb = D * es
    chunks = D // 8
    name = f"dots1w{D}{kind}avx2"
    w(f"// func {name}(s *float32, q *float32, k *{gt}, nt int, pfd int)")
    w("//")
    w(f"// s[t] = dot(q, k_t) for t < nt (a multiple of 4), head dim {D}: the rows are read one")
    w("// after another, each front to back, fully unrolled with fixed offsets (the single-row")
    w("// loop of MHA decode, which has no GQA reuse and must stream at the memory's speed).")
    w("// Token j of a step accumulates even chunks in Yj and odd ones in Y(4+j); q is a")
    w("// memory operand (it stays in L1). Each row is prefetched pfd bytes ahead, one line")
    w(f"// in {ROW_PF_STEP[kind] // 64} (ROW_PF_STEP in asmgen_avx2.py).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
    ins("MOVQ s+0(FP), DI", "MOVQ q+8(FP), R8", "MOVQ k+16(FP), SI", "MOVQ nt+24(FP), AX",
        "MOVQ pfd+32(FP), R9", "SHRQ $2, AX", f"JZ {name}done")
    w(f"{name}loop:")
    for j in range(4):
        ro = j * rowb
        for l in range(0, rowb, ROW_PF_STEP[kind]):
            ins(f"PREFETCHT1 {off(ro + l)}(SI)(R9*1)")
        for c in range(chunks):
            tmp = f"Y{8 + c % 4}"
            acc = f"Y{j + 4 * (c % 2)}"
            ins(*load(kind, f"{off(ro + cb * c)}(SI)", tmp))
            op = "VMULPS" if c < 2 else "VFMADD231PS"
            ins(f"{op} {off(32 * c)}(R8), {tmp}, {acc}")
    ins("VADDPS Y4, Y0, Y0", "VADDPS Y5, Y1, Y1", "VADDPS Y6, Y2, Y2", "VADDPS Y7, Y3, Y3",
        "VHADDPS Y1, Y0, Y0", "VHADDPS Y3, Y2, Y2", "VHADDPS Y2, Y0, Y0",
        "VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0", "VMOVUPS X0, (DI)",
        f"ADDQ $16, DI", f"ADDQ ${4 * rowb}, SI", "DECQ AX", f"JNZ {name}loop")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def axpy1w(kind, D):
    es, gt, cb = KINDS[kind]
    rowb = D * es
    # parts of up to 64 dims (eight accumulators each); one part stays in registers
    parts = [(o, min(64, D - o) // 8) for o in range(0, D, 64)]
    single = len(parts) == 1
    name = f"axpy1w{D}{kind}avx2"
    w(f"// func {name}(acc *float32, p *float32, v *{gt}, n int, alpha float32, pfd int)")
    w("//")
    w(f"// acc = alpha*acc + sum_{{t<n}} p[t]*v_t, head dim {D}, n >= 0. Four tokens per step,")
    w("// their rows read one after another (within the step's window of four rows) and")
    w(f"// prefetched pfd bytes ahead (one line in {ROW_PF_STEP[kind] // 64}, see ROW_PF_STEP): the single-row")
    w("// accumulation of MHA decode. Dims go in parts of up to 64 (Y0-Y7, up to eight")
    if single:
        w("// independent FMA chains); the four weights of a step are in Y8-Y11 and the")
        w("// accumulator stays in registers for the whole call. Tokens past the")
    else:
        w("// independent FMA chains); the four weights of a step stay in Y8-Y11 for every part,")
        w("// whose accumulators go through memory (L1) between steps: 16 ymm registers do not")
        w(f"// hold a row of {D} float32. Tokens past the")
    w("// last multiple of four run one at a time.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-48")
    ins("MOVQ acc+0(FP), DI", "MOVQ p+8(FP), R8", "MOVQ v+16(FP), SI", "MOVQ n+24(FP), AX",
        "VBROADCASTSS alpha+32(FP), Y15", "MOVQ pfd+40(FP), R9")

    def accs(o, nr, op):
        for j in range(nr):
            a = f"{off(4 * o + 32 * j)}(DI)"
            ins(f"VMULPS {a}, Y15, Y{j}" if op == "scale" else
                f"VMOVUPS {a}, Y{j}" if op == "load" else f"VMOVUPS Y{j}, {a}")

    def fmas(o, nr, ro, wreg):
        for j in range(nr):
            a = ro + (o // 8 + j) * cb
            if kind == "f32":
                ins(f"VFMADD231PS {off(a)}(SI), {wreg}, Y{j}")
            else:
                tmp = f"Y{12 + j % 2}"
                ins(*load(kind, f"{off(a)}(SI)", tmp))
                ins(f"VFMADD231PS {tmp}, {wreg}, Y{j}")

    for o, nr in parts:
        accs(o, nr, "scale")
        if not single:
            accs(o, nr, "store")
    if len(parts) > 2:
        # rows of more than 128 dims: one token a step, its row in storage order (a step of
        # four rows would read a part of each in turn)
        ins("TESTQ AX, AX", f"JZ {name}store")
    else:
        ins("MOVQ AX, DX", "SHRQ $2, DX", f"JZ {name}tail")
        w(f"{name}quad:")
        for t in range(4):
            ins(f"VBROADCASTSS {off(4 * t)}(R8), Y{8 + t}")
        for h, (o, nr) in enumerate(parts):
            if not single:
                accs(o, nr, "load")
            for t in range(4):
                ro = t * rowb
                if h == 0:
                    for l in range(0, rowb, ROW_PF_STEP[kind]):
                        ins(f"PREFETCHT1 {off(ro + l)}(SI)(R9*1)")
                fmas(o, nr, ro, f"Y{8 + t}")
            if not single:
                accs(o, nr, "store")
        ins("ADDQ $16, R8", f"ADDQ ${4 * rowb}, SI", "DECQ DX", f"JNZ {name}quad")
        w(f"{name}tail:")
        ins("ANDQ $3, AX", f"JZ {name}store")
    w(f"{name}one:")
    ins("VBROADCASTSS (R8), Y8")
    for o, nr in parts:
        if not single:
            accs(o, nr, "load")
        fmas(o, nr, 0, "Y8")
        if not single:
            accs(o, nr, "store")
    ins("ADDQ $4, R8", f"ADDQ ${rowb}, SI", "DECQ AX", f"JNZ {name}one")
    w(f"{name}store:")
    if single:
        accs(*parts[0], "store")
    ins("VZEROUPPER", "RET")
    w()


def f32bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


# The constants of expf (ops_go.go) as float32 bits, in table order.
EXPCONST = [
    ("hi", f32bits(88.0)), ("lo", f32bits(-88.0)), ("log2e", 0x3FB8AA3B), ("mag", 0x4B400000),
    ("nln2hi", f32bits(-0.693359375)), ("nln2lo", 0x395E8083),
    ("p0", 0x39506967), ("p1", 0x3AB743CE), ("p2", 0x3C088908), ("p3", 0x3D2AA9C1),
    ("p4", 0x3E2AAAAA), ("p5", 0x3F000000), ("one", 0x3F800000), ("bias", 0x3F800000),
]
CI = {name: i * 32 for i, (name, _) in enumerate(EXPCONST)}


def maxsub():
    w("// func maxavx2(s *float32, n int) float32")
    w("//")
    w("// The largest of s[0..n) (n a positive multiple of 8), or NaN when one of them is NaN")
    w("// or infinite (maxOf's contract): four VMAXPS chains (Y0-Y3) and four chains of x*0")
    w("// (Y4-Y7, zero in Y8: NaN exactly when an element is not finite) over 32 elements a")
    w("// step, then 8 a step. It is the maxOf of the AVX-512 path too: the archsimd loops it")
    w("// replaced (8 and 16 lanes) took 820-840 ns for a 512-score block row on a Granite")
    w("// Rapids-class Xeon, this one 25 ns.")
    w("TEXT ·maxavx2(SB), NOSPLIT, $0-20")
    ins("MOVQ s+0(FP), SI", "MOVQ n+8(FP), CX", "VMOVUPS (SI), Y0", "VMOVAPS Y0, Y1",
        "VMOVAPS Y0, Y2", "VMOVAPS Y0, Y3", "VXORPS Y8, Y8, Y8", "VXORPS Y4, Y4, Y4",
        "VXORPS Y5, Y5, Y5", "VXORPS Y6, Y6, Y6", "VXORPS Y7, Y7, Y7",
        "LEAQ (SI)(CX*4), DX", "LEAQ -96(DX), CX", "CMPQ SI, CX", "JGE maxavx2one")
    w("maxavx2four:")
    for j in range(4):
        ins(f"VMAXPS {off(32*j)}(SI), Y{j}, Y{j}", f"VFMADD231PS {off(32*j)}(SI), Y8, Y{4+j}")
    ins("ADDQ $128, SI", "CMPQ SI, CX", "JLT maxavx2four")
    w("maxavx2one:")
    ins("CMPQ SI, DX", "JGE maxavx2done",
        "VMAXPS (SI), Y0, Y0", "VFMADD231PS (SI), Y8, Y4", "ADDQ $32, SI", "JMP maxavx2one")
    w("maxavx2done:")
    ins("VMAXPS Y1, Y0, Y0", "VMAXPS Y3, Y2, Y2", "VMAXPS Y2, Y0, Y0",
        "VADDPS Y5, Y4, Y4", "VADDPS Y7, Y6, Y6", "VADDPS Y6, Y4, Y4",
        "VEXTRACTF128 $1, Y0, X1", "VMAXPS X1, X0, X0", "VPERMILPS $0x4e, X0, X1",
        "VMAXPS X1, X0, X0", "VPERMILPS $0xb1, X0, X1", "VMAXPS X1, X0, X0",
        "VEXTRACTF128 $1, Y4, X5", "VADDPS X5, X4, X4", "VHADDPS X4, X4, X4", "VHADDPS X4, X4, X4",
        "VUCOMISS X4, X4", "JPS maxavx2nan", "VMOVSS X0, ret+16(FP)", "VZEROUPPER", "RET")
    w("maxavx2nan:")
    ins("VMOVSS X4, ret+16(FP)", "VZEROUPPER", "RET")
    w()


def expsub():
    w("// func expSubavx2(s *float32, n int, m float32) float32")
    w("//")
    w("// s[i] = exp(s[i]-m) for i < n (a multiple of 8) and returns their sum: the algorithm")
    w("// and constants of expf (clamp, 2^k split, degree-5 polynomial), operand order as in")
    w("// expSubasm so NaN and clamping behave alike. m and eight constants stay in Y7-Y15,")
    w("// the polynomial coefficients are memory operands (AVX2 has no embedded broadcast, the")
    w("// table holds eight copies of each).")
    w("TEXT ·expSubavx2(SB), NOSPLIT, $0-28")
    ins("MOVQ s+0(FP), SI", "MOVQ n+8(FP), CX", "VBROADCASTSS m+16(FP), Y7",
        "MOVQ $expconst8<>(SB), AX",
        f"VMOVUPS {CI['hi']}(AX), Y8", f"VMOVUPS {CI['lo']}(AX), Y9", f"VMOVUPS {CI['log2e']}(AX), Y10",
        f"VMOVUPS {CI['mag']}(AX), Y11", f"VMOVUPS {CI['nln2hi']}(AX), Y12",
        f"VMOVUPS {CI['nln2lo']}(AX), Y13", f"VMOVUPS {CI['one']}(AX), Y14", f"VMOVUPS {CI['bias']}(AX), Y15",
        "VXORPS Y6, Y6, Y6", "SHRQ $3, CX", "JZ expavx2done")
    w("expavx2loop:")
    ins("VMOVUPS (SI), Y0", "VSUBPS Y7, Y0, Y0", "VMINPS Y0, Y8, Y0", "VMAXPS Y0, Y9, Y0",
        "VMOVAPS Y11, Y1", "VFMADD231PS Y10, Y0, Y1", "VSUBPS Y11, Y1, Y2",
        "VFMADD231PS Y12, Y2, Y0", "VFMADD231PS Y13, Y2, Y0",
        f"VMOVUPS {CI['p0']}(AX), Y3",
        f"VFMADD213PS {CI['p1']}(AX), Y0, Y3", f"VFMADD213PS {CI['p2']}(AX), Y0, Y3",
        f"VFMADD213PS {CI['p3']}(AX), Y0, Y3", f"VFMADD213PS {CI['p4']}(AX), Y0, Y3",
        f"VFMADD213PS {CI['p5']}(AX), Y0, Y3",
        "VMULPS Y0, Y0, Y4", "VMULPS Y4, Y3, Y3", "VADDPS Y0, Y3, Y3", "VADDPS Y14, Y3, Y3",
        "VPSLLD $23, Y1, Y5", "VPADDD Y15, Y5, Y5", "VMULPS Y5, Y3, Y3",
        "VMOVUPS Y3, (SI)", "VADDPS Y3, Y6, Y6", "ADDQ $32, SI", "DECQ CX", "JNZ expavx2loop")
    w("expavx2done:")
    ins("VEXTRACTF128 $1, Y6, X0", "VADDPS X6, X0, X0", "VHADDPS X0, X0, X0", "VHADDPS X0, X0, X0",
        "MOVSS X0, ret+24(FP)", "VZEROUPPER", "RET")
    w()
    for i, (name, bits) in enumerate(EXPCONST):
        for lane in range(8):
            w(f"DATA expconst8<>+{i*32+lane*4}(SB)/4, ${bits:#010x}")
    w(f"GLOBL expconst8<>(SB), RODATA|NOPTR, ${len(EXPCONST)*32}")
    w()


def cvt(kind):
    name = "cvtF16avx2" if kind == "f16" else "cvtBF16avx2"
    what = "IEEE halves with VCVTPH2PS" if kind == "f16" else "bfloat16 values (zero-extend, shift into the high half)"
    w(f"// func {name}(dst *float32, src *uint16, n int)")
    w("//")
    w(f"// Widens n {what}, n a multiple of 32; exact (a signalling NaN may come back quieted).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-24")
    ins("MOVQ dst+0(FP), DI", "MOVQ src+8(FP), SI", "MOVQ n+16(FP), CX", "SHRQ $5, CX", f"JZ {name}done")
    w(f"{name}loop:")
    for j in range(4):
        ins(*load(kind, f"{off(16*j)}(SI)", f"Y{j}"))
    for j in range(4):
        ins(f"VMOVUPS Y{j}, {off(32*j)}(DI)")
    ins("ADDQ $64, SI", "ADDQ $128, DI", "DECQ CX", f"JNZ {name}loop")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


for k in ("f32", "f16", "bf16"):
    if k in WIDE_KINDS:
        dots4x3(k)
        if k == "bf16":
            dots4x3(k, shuf=False)
    else:
        dots4x2(k)
    dots1(k)
    axpy4x24(k)
    axpy4s(k, split=k in SPLIT_KINDS)
    axpy1(k)
    for dim in WIDE_DIMS[k]:
        dots1w(k, dim)
        axpy1w(k, dim)
maxsub()
expsub()
# bf16ctl: VPSHUFB control of load(shuf): dword lane j takes bytes 2j, 2j+1 of its
# 128-bit half (elements j, of 0-3 in the low half and 4-7 in the high) into its high
# half and zeroes the low one
for j in range(8):
    b = 2 * (j % 4) + (8 if j >= 4 else 0)
    w(f"DATA bf16ctl<>+{4*j}(SB)/4, ${0x8080 | b << 16 | (b + 1) << 24:#010x}")
w("GLOBL bf16ctl<>(SB), RODATA|NOPTR, $32")
w()
cvt("f16")
cvt("bf16")

sys.stdout.write("\n".join(out).rstrip("\n") + "\n")
