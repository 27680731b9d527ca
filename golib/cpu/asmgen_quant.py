#!/usr/bin/env python3
"""Writes kern_quant_amd64.s: the decode attention loops over quantized (int8, int4) rows.

The AVX-512 (zmm, 16 lanes) and AVX2+FMA (ymm, 8 lanes) variants differ in the vector
width and the register blocking only, so both come from one template per loop. Rows are
dequantized in registers as they are loaded: int8 VPMOVSXBD + VCVTDQ2PS; int4 (two values
per byte, element 2i in the low nibble) VPAND/VPSRLW into two byte vectors interleaved back
in element order by VPUNPCKLBW/VPUNPCKHBW, then VPMOVZXBD + VCVTDQ2PS; then x*s (+ z) with
the group's broadcast scale (and zero). Contracts are in kern_quant_amd64.go.
The integer loops (query rows and V weights rounded to int16) come in an AVX-512 VNNI
flavour (vnni, vint(.., "avx512"): VPDPWSSD) and an AVX2 one (maddw, vint(.., "avx2"):
VPMADDWD) computing the same integers and float32 steps: bit-identical.
Run from this directory:  python3 asmgen_quant.py > kern_quant_amd64.s
(TestAsmgenQuantInSync checks that the committed file is this script's output.)
"""

from asmgen_emit import ins, off, out, w


ISAS = {
    # lanes, vector register prefix
    "avx512": (16, "Z"),
    "avx2": (8, "Y"),
}


def load_chunk(fmt, isa, base, o, regs, tmp):
    """Loads 32 elements (one chunk) at o(base) into float32 vectors regs (2 zmm or 4 ymm).

    tmp: three xmm register numbers that may be clobbered (int4)."""
    lanes, vp = ISAS[isa]
    code = []
    if fmt == "i8":
        for i, r in enumerate(regs):
            code.append(f"VPMOVSXBD {off(o+lanes*i)}({base}), {vp}{r}")
    else:
        a, b, c = tmp
        code += [f"VMOVDQU {off(o)}({base}), X{a}", f"VPSRLW $4, X{a}, X{b}",
                 f"VPAND nibmask<>(SB), X{a}, X{a}", f"VPAND nibmask<>(SB), X{b}, X{b}",
                 f"VPUNPCKLBW X{b}, X{a}, X{c}", f"VPUNPCKHBW X{b}, X{a}, X{a}"]
        # X{c}: elements 0..15 as bytes, X{a}: 16..31
        if isa == "avx512":
            code += [f"VPMOVZXBD X{c}, Z{regs[0]}", f"VPMOVZXBD X{a}, Z{regs[1]}"]
        else:
            code += [f"VPMOVZXBD X{c}, Y{regs[0]}", f"VPSRLDQ $8, X{c}, X{c}", f"VPMOVZXBD X{c}, Y{regs[1]}",
                     f"VPMOVZXBD X{a}, Y{regs[2]}", f"VPSRLDQ $8, X{a}, X{a}", f"VPMOVZXBD X{a}, Y{regs[3]}"]
    for r in regs:
        code.append(f"VCVTDQ2PS {vp}{r}, {vp}{r}")
    return code


def reduce4(vp, accs):
    """Sums the accumulators of four rows (accs[r] = list of registers) into X0 = [r0 r1 r2 r3].

    Accumulators are Y/Z0-7 (2 per row); Y1, Y3, Y5, Y7 are clobbered."""
    code = []
    for r in range(4):
        a, b = accs[r]
        code.append(f"VADDPS {vp}{b}, {vp}{a}, {vp}{a}")
        if vp == "Z":
            code += [f"VEXTRACTF64X4 $1, Z{a}, Y{b}", f"VADDPS Y{b}, Y{a}, Y{a}"]
    code += ["VHADDPS Y2, Y0, Y0", "VHADDPS Y6, Y4, Y4", "VHADDPS Y4, Y0, Y0",
             "VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0"]
    return code


def reduce1(vp, accs):
    """Sums the accumulators of one row into X0[0] (clobbers Y1/Z1)."""
    code = []
    a = accs[0]
    for b in accs[1:]:
        code.append(f"VADDPS {vp}{b}, {vp}{a}, {vp}{a}")
    if vp == "Z":
        code += ["VEXTRACTF64X4 $1, Z0, Y1", "VADDPS Y1, Y0, Y0"]
    code += ["VEXTRACTF128 $1, Y0, X1", "VADDPS X1, X0, X0", "VHADDPS X0, X0, X0", "VHADDPS X0, X0, X0"]
    return code


def dots(rows, fmt, scaled, isa):
    lanes, vp = ISAS[isa]
    nv = 32 // lanes  # vectors per 32-element chunk
    cb = 32 if fmt == "i8" else 16  # bytes per chunk
    mode = "s" if scaled else "r"
    name = f"qdots{rows}{fmt}{mode}{isa}"
    w(f"// func {name}(s *float32, ldS int, q *float32, qrb int, k *byte, krb int, nt int, ng int, cpg int, ks *float32, kz *float32, pfd int)")
    w("//")
    w(f"// For query rows r < {rows} and tokens t < nt: s[r*ldS/4 + t] = dot(q_r, x_t), q rows of qrb")
    w(f"// bytes, K rows of krb bytes, each ng groups of cpg chunks of 32 elements. x_t is the row's")
    if scaled:
        w("// integers times its group's scale (ks, ng per row)" + (" plus its zero (kz)." if fmt == "i4" else "."))
    else:
        w("// raw integers (the per-channel scales are folded into q).")
    w("// One token per step; a chunk's vectors feed every row, q comes from memory (L1).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-96")
    ins("MOVQ s+0(FP), DI", "MOVQ ldS+8(FP), BX", "MOVQ q+16(FP), R8", "MOVQ qrb+24(FP), DX")
    qregs = ["R8", "R9", "R10", "R11"][:rows]
    for i in range(1, rows):
        ins(f"LEAQ ({qregs[i-1]})(DX*1), {qregs[i]}")
    ins("MOVQ k+32(FP), SI", "MOVQ nt+48(FP), AX", "MOVQ ks+72(FP), R13", "MOVQ kz+80(FP), R14")
    if pairs := (isa == "avx512" and rows == 4 and not scaled):
        dots_pairs(name, fmt, cb)
    ins("TESTQ AX, AX", f"JZ {name}done")
    # accumulators: rows x 2 (or 4 for one row on avx2) in 0..7
    nacc = 2 if rows == 4 else (2 if isa == "avx512" else 4)
    accs = [[r * nacc + i for i in range(nacc)] for r in range(rows)]
    vregs = list(range(8, 8 + nv))  # chunk vectors
    sreg, zreg = 12, 13
    tmp = (12, 13, 14)
    w(f"{name}tok:")
    for r in range(rows):
        for a in accs[r]:
            ins(f"VXORPS {vp}{a}, {vp}{a}, {vp}{a}")
    ins("MOVQ pfd+88(FP), R12", "PREFETCHT1 (SI)(R12*1)", "PREFETCHT1 64(SI)(R12*1)",
        "XORQ CX, CX", "MOVQ SI, R12", "MOVQ ng+56(FP), DX")
    w(f"{name}grp:")
    ins("MOVQ cpg+64(FP), R15")
    w(f"{name}chunk:")
    ins(*load_chunk(fmt, isa, "R12", 0, vregs, tmp))
    if scaled:
        ins(f"VBROADCASTSS (R13), {vp}{sreg}")
        if fmt == "i4":
            ins(f"VBROADCASTSS (R14), {vp}{zreg}")
            for v in vregs:
                ins(f"VFMADD213PS {vp}{zreg}, {vp}{sreg}, {vp}{v}")
        else:
            for v in vregs:
                ins(f"VMULPS {vp}{sreg}, {vp}{v}, {vp}{v}")
    for r in range(rows):
        for i, v in enumerate(vregs):
            a = accs[r][i % nacc]
            ins(f"VFMADD231PS {off(i*lanes*4)}({qregs[r]})(CX*1), {vp}{v}, {vp}{a}")
    ins(f"ADDQ ${cb}, R12", "ADDQ $128, CX", "DECQ R15", f"JNZ {name}chunk")
    if scaled:
        ins("ADDQ $4, R13")
        if fmt == "i4":
            ins("ADDQ $4, R14")
    ins("DECQ DX", f"JNZ {name}grp")
    if rows == 4:
        ins(*reduce4(vp, accs))
        ins("LEAQ (BX)(BX*2), R15", "VMOVSS X0, (DI)", "VEXTRACTPS $1, X0, (DI)(BX*1)",
            "VEXTRACTPS $2, X0, (DI)(BX*2)", "VEXTRACTPS $3, X0, (DI)(R15*1)")
    else:
        ins(*reduce1(vp, accs[0]))
        ins("VMOVSS X0, (DI)")
    ins("ADDQ $4, DI", "ADDQ krb+40(FP), SI", "DECQ AX", f"JNZ {name}tok")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def dots_pairs(name, fmt, cb):
    """The two-token step of qdots4*ravx512: a 4x2 block of accumulators (Z0-Z7, row r
    token u in Z(2r+u)), two vectors per token and chunk (Z8-Z11), one joint reduction per
    pair. Leaves the odd last token (AX = nt&1) to the one-token loop after it."""
    w("// Pairs of tokens first (one reduction of eight accumulators per pair), then the odd")
    w("// last token in the one-token loop.")
    ins("MOVQ krb+40(FP), BX", "SHRQ $1, AX", f"JZ {name}odd")
    w(f"{name}pair:")
    for i in range(8):
        ins(f"VXORPS Z{i}, Z{i}, Z{i}")
    ins("MOVQ pfd+88(FP), R12", "LEAQ (SI)(R12*1), R12", "PREFETCHT1 (R12)", "PREFETCHT1 64(R12)",
        "PREFETCHT1 (R12)(BX*1)", "PREFETCHT1 64(R12)(BX*1)",
        "XORQ CX, CX", "MOVQ SI, R12", "LEAQ (SI)(BX*1), R13", "MOVQ cpg+64(FP), R15")
    w(f"{name}pchunk:")
    ins(*load_chunk(fmt, "avx512", "R12", 0, [8, 9], (12, 13, 14)))
    ins(*load_chunk(fmt, "avx512", "R13", 0, [10, 11], (12, 13, 14)))
    qregs = ["R8", "R9", "R10", "R11"]
    for r in range(4):
        for u in range(2):
            for x in range(2):
                ins(f"VFMADD231PS {off(x*64)}({qregs[r]})(CX*1), Z{8+2*u+x}, Z{2*r+u}")
    ins(f"ADDQ ${cb}, R12", f"ADDQ ${cb}, R13", "ADDQ $128, CX", "DECQ R15", f"JNZ {name}pchunk")
    for i in range(8):
        ins(f"VEXTRACTF64X4 $1, Z{i}, Y{8+i}", f"VADDPS Y{8+i}, Y{i}, Y{i}")
    ins("VHADDPS Y1, Y0, Y0", "VHADDPS Y3, Y2, Y2", "VHADDPS Y2, Y0, Y0",
        "VEXTRACTF128 $1, Y0, X2", "VADDPS X2, X0, X0",
        "VHADDPS Y5, Y4, Y4", "VHADDPS Y7, Y6, Y6", "VHADDPS Y6, Y4, Y4",
        "VEXTRACTF128 $1, Y4, X6", "VADDPS X6, X4, X4",
        "MOVQ ldS+8(FP), R13", "LEAQ (R13)(R13*2), R15",
        "VMOVLPS X0, (DI)", "VMOVHPS X0, (DI)(R13*1)", "VMOVLPS X4, (DI)(R13*2)", "VMOVHPS X4, (DI)(R15*1)",
        "ADDQ $8, DI", "LEAQ (SI)(BX*2), SI", "DECQ AX", f"JNZ {name}pair")
    w(f"{name}odd:")
    ins("MOVQ ldS+8(FP), BX", "MOVQ nt+48(FP), AX", "ANDQ $1, AX", "MOVQ ks+72(FP), R13")


def axpy(rows, fmt, isa, wide=False):
    lanes, vp = ISAS[isa]
    # column block: avx512 64 elements (4 zmm), avx2 16 (2 ymm) per row, or with wide (avx2, one
    # row) 32 (4 ymm)
    wide1 = wide and isa == "avx2" and rows == 1
    cbe = 64 if isa == "avx512" else 32 if wide1 else 16
    nv = cbe // lanes
    name = f"qaxpy{rows}{'w' if wide1 else ''}{fmt}{isa}"
    w(f"// func {name}(acc *float32, accrb int, p *float32, ldP int, v *byte, vrb int, n int, alpha *[4]float32, vs *float32, vz *float32, srb int, s2 int, pfd int)")
    w("//")
    w(f"// One column block of {cbe} elements: for rows r < {rows}, acc_r = alpha[r]*acc_r +")
    w("// sum_t p[r*ldP/4 + t] * x_t, acc rows accrb bytes apart, V rows vrb bytes apart, x_t the")
    w("// block's elements of V row t dequantized: integers times the scale at vs + t*srb" +
      (" plus the zero" if fmt == "i4" else ""))
    if isa == "avx512":
        w("// at vz + t*srb (the block's second 32 elements: s2 bytes further). The accumulators")
    else:
        w("// at vz + t*srb (s2 unused: a block is in one group). The accumulators")
    w("// stay in registers over the tokens; each dequantized vector feeds every row. V is")
    w("// prefetched pfd bytes ahead.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-104")
    ins("MOVQ acc+0(FP), DI", "MOVQ accrb+8(FP), BX", "MOVQ p+16(FP), R8", "MOVQ ldP+24(FP), DX")
    pregs = ["R8", "R9", "R10", "R11"][:rows]
    for i in range(1, rows):
        ins(f"LEAQ ({pregs[i-1]})(DX*1), {pregs[i]}")
    ins("MOVQ v+32(FP), SI", "MOVQ n+48(FP), AX", "MOVQ alpha+56(FP), R12", "MOVQ vs+64(FP), R13",
        "MOVQ vz+72(FP), R14", "MOVQ s2+88(FP), DX", "MOVQ pfd+96(FP), CX")
    if rows == 4:
        ins("LEAQ (BX)(BX*2), R15", "ADDQ DI, R15")

    def accaddr(r, o):
        if r == 0:
            return f"{off(o)}(DI)"
        if r in (1, 2):
            return f"{off(o)}(DI)(BX*{r})"
        return f"{off(o)}(R15)"

    # registers: avx512: acc Z16.. (rows*nv), values Z0-3, scale Z4-5, zero Z6-7, p Z8-11, temps X12-14
    #            avx2:   acc Y0-7 (rows*nv <= 8), values Y8-9 (temps X8-X9), scale Y10, zero Y11, p Y12-15
    if isa == "avx512":
        acc = [[16 + r * nv + i for i in range(nv)] for r in range(rows)]
        vals, sc, zr = [0, 1, 2, 3], [4, 5], [6, 7]
        pr = [8 + r for r in range(rows)]
    else:
        acc = [[r * nv + i for i in range(nv)] for r in range(rows)]
        vals, sc, zr = [8, 9], [10], [11]
        pr = [12 + r for r in range(rows)]
        if wide1:  # acc Y0-3, values Y4-7, scale Y8, zero Y9, zero sum Y10, p Y11, temps X12-14
            vals, sc, zr, pr = [4, 5, 6, 7], [8], [9], [11]
    for r in range(rows):
        ins(f"VBROADCASTSS {off(4*r)}(R12), {vp}{pr[r]}")
        for i, a in enumerate(acc[r]):
            ins(f"VMULPS {accaddr(r, i*lanes*4)}, {vp}{pr[r]}, {vp}{a}")
    # zacc: the one-row loop's sums of p*z per group (int4)
    zacc = [24, 25] if isa == "avx512" else [10] if wide1 else [13]
    if rows == 1 and fmt == "i4":
        for z in zacc:
            ins(f"VXORPS {vp}{z}, {vp}{z}, {vp}{z}")
    ins("XORQ R12, R12", "TESTQ AX, AX", f"JZ {name}store")
    w(f"{name}tok:")
    ins("PREFETCHT1 (SI)(CX*1)")
    if isa == "avx512":
        if fmt == "i8":
            ins(*load_chunk(fmt, isa, "SI", 0, vals, None))
        else:
            ins(*load_chunk(fmt, isa, "SI", 0, vals[0:2], (12, 13, 14)))
            ins(*load_chunk(fmt, isa, "SI", 16, vals[2:4], (12, 13, 14)))
        ins(f"VBROADCASTSS (R13), Z{sc[0]}", f"VBROADCASTSS (R13)(DX*1), Z{sc[1]}")
        if fmt == "i4":
            ins(f"VBROADCASTSS (R14), Z{zr[0]}", f"VBROADCASTSS (R14)(DX*1), Z{zr[1]}")
        groups = [0, 0, 1, 1]
    elif wide1:
        ins(*load_chunk(fmt, isa, "SI", 0, vals, (12, 13, 14)), f"VBROADCASTSS (R13), Y{sc[0]}")
        if fmt == "i4":
            ins(f"VBROADCASTSS (R14), Y{zr[0]}")
        groups = [0, 0, 0, 0]
    else:
        if fmt == "i8":
            ins("VPMOVSXBD (SI), Y8", "VPMOVSXBD 8(SI), Y9")
        else:
            ins("VMOVQ (SI), X8", "VPSRLW $4, X8, X9", "VPAND nibmask<>(SB), X8, X8",
                "VPAND nibmask<>(SB), X9, X9", "VPUNPCKLBW X9, X8, X8", "VPSRLDQ $8, X8, X9",
                "VPMOVZXBD X8, Y8", "VPMOVZXBD X9, Y9")
        ins("VCVTDQ2PS Y8, Y8", "VCVTDQ2PS Y9, Y9", f"VBROADCASTSS (R13), Y{sc[0]}")
        if fmt == "i4":
            ins(f"VBROADCASTSS (R14), Y{zr[0]}")
        groups = [0, 0]
    if rows == 1:
        # one row: the weight folded into the group scales (w_g = p*s_g) and the zero terms
        # p*z_g summed apart (zacc), added to the group's columns at the end
        ins(f"VBROADCASTSS (R8)(R12*4), {vp}{pr[0]}")
        for g in range(len(sc)):
            ins(f"VMULPS {vp}{pr[0]}, {vp}{sc[g]}, {vp}{sc[g]}")
            if fmt == "i4":
                ins(f"VFMADD231PS {vp}{zr[g]}, {vp}{pr[0]}, {vp}{zacc[g]}")
        for i, v in enumerate(vals):
            ins(f"VFMADD231PS {vp}{v}, {vp}{sc[groups[i]]}, {vp}{acc[0][i]}")
    else:
        for i, v in enumerate(vals):
            g = groups[i]
            if fmt == "i4":
                ins(f"VFMADD213PS {vp}{zr[g]}, {vp}{sc[g]}, {vp}{v}")
            else:
                ins(f"VMULPS {vp}{sc[g]}, {vp}{v}, {vp}{v}")
        for r in range(rows):
            ins(f"VBROADCASTSS ({pregs[r]})(R12*4), {vp}{pr[r]}")
        for r in range(rows):
            for i, v in enumerate(vals):
                ins(f"VFMADD231PS {vp}{v}, {vp}{pr[r]}, {vp}{acc[r][i]}")
    ins("ADDQ vrb+40(FP), SI", "ADDQ srb+80(FP), R13")
    if fmt == "i4":
        ins("ADDQ srb+80(FP), R14")
    ins("INCQ R12", "CMPQ R12, AX", f"JLT {name}tok")
    w(f"{name}store:")
    if rows == 1 and fmt == "i4":
        for i, a in enumerate(acc[0]):
            ins(f"VADDPS {vp}{zacc[groups[i]]}, {vp}{a}, {vp}{a}")
    for r in range(rows):
        for i, a in enumerate(acc[r]):
            ins(f"VMOVUPS {vp}{a}, {accaddr(r, i*lanes*4)}")
    ins("VZEROUPPER", "RET")
    w()


def transpose4(op, regs, dst, tmp):
    """Reduces four xmm registers regs (four lanes each) by op (VMAXPS, VADDPS: any order of
    the lanes) into X{dst} = [op(regs[0]) .. op(regs[3])]; X{tmp[0]}, X{tmp[1]} clobbered (dst
    may be one of them or of regs)."""
    a, b = tmp
    r0, r1, r2, r3 = regs
    return [f"VUNPCKLPS X{r1}, X{r0}, X{a}", f"VUNPCKHPS X{r1}, X{r0}, X{b}", f"{op} X{b}, X{a}, X{a}",
            f"VUNPCKLPS X{r3}, X{r2}, X{b}", f"VUNPCKHPS X{r3}, X{r2}, X{r0}", f"{op} X{r0}, X{b}, X{b}",
            f"VMOVLHPS X{b}, X{a}, X{r0}", f"VMOVHLPS X{a}, X{b}, X{a}", f"{op} X{a}, X{r0}, X{dst}"]


def vnni():
    """AVX-512 VNNI score loop for int8 and int4 K per channel: q (scales folded) quantized to
    int16 per row once per segment (qprep: maximum, checks and rounding in one call), integer
    dots by VPDPWSSD."""
    w("// func qprepavx512(dst *int16, q *float32, ks *float32, n int, rows int, sc *float32, sums *float32, i4 int, kz *float32, aff *float32) int")
    w("//")
    w("// intPrep in one pass per row (q n elements apart, dst n words apart; n a multiple of 16,")
    w("// of 128 with i4 set): m = max_i |q_ri*ks_i|, sc[r] = m/32767, dst_r[i] =")
    w("// round-to-even(q_ri*ks_i*(32767/m)) as int16 (0 for a row of zeros), sums[r] = the sum of")
    w("// the row's dst values. With i4 set the row is stored in qi16Order: of each 64 elements,")
    w("// the 32 even ones, then the 32 odd ones. It returns 0, at the first row that fails, when a")
    w("// product is not finite or a nonzero m/32767 or 32767/m leaves float32's normal range; 1")
    w("// otherwise.")
    w("// With aff != nil (rows a multiple of four) each group of four rows also gets its score")
    w("// offsets in sums instead (int8: 0; int4, kz the channel zeros: the dot of the float query")
    w("// row with kz) and intDots4's argument block at aff")
    w("// (24 floats a group: [c0 c0 c1 c1 c2 c2 c3 c3], the offsets so, [c0..c3], [o0..o3]).")
    w("TEXT ·qprepavx512(SB), NOSPLIT, $0-88")
    ins("MOVQ dst+0(FP), DI", "MOVQ q+8(FP), SI", "MOVQ ks+16(FP), R8", "MOVQ n+24(FP), CX",
        "MOVQ rows+32(FP), R10", "MOVQ sc+40(FP), DX", "MOVQ sums+48(FP), R11",
        "VXORPS Z4, Z4, Z4", "MOVL $0x7fffffff, R9", "VPBROADCASTD R9, Z2",
        "MOVL $0x46fffe00, R9", "VMOVD R9, X6",  # 32767
        "MOVL $0x7f7fffff, R9", "VMOVD R9, X7")  # MaxFloat32
    # four rows at a time while four are left: the channel scales loaded once per step, four
    # independent chains (q rows SI R13 R14 R15, dst rows DI R9 R12 AX)
    qrow, drow = ["SI", "R13", "R14", "R15"], ["DI", "R9", "R12", "AX"]
    w("qprep4grp:")
    ins("CMPQ R10, $4", "JLT qprep1start", "LEAQ (SI)(CX*4), R13", "LEAQ (R13)(CX*4), R14",
        "LEAQ (R14)(CX*4), R15")
    for i in range(4):
        ins(f"VXORPS Z{16+i}, Z{16+i}, Z{16+i}", f"VXORPS Z{20+i}, Z{20+i}, Z{20+i}",
            f"VXORPS Z{25+i}, Z{25+i}, Z{25+i}", f"VXORPS Z{12+i}, Z{12+i}, Z{12+i}")
    ins("XORQ BX, BX", "MOVQ kz+64(FP), R9", "TESTQ R9, R9", "JNZ qprep4maxz")
    w("qprep4max:")
    ins("VMOVUPS (R8)(BX*4), Z5")
    for i in range(4):
        ins(f"VMULPS ({qrow[i]})(BX*4), Z5, Z{8+i}", f"VFMADD231PS Z4, Z{8+i}, Z{20+i}",
            f"VANDPS Z2, Z{8+i}, Z{8+i}", f"VMAXPS Z{8+i}, Z{16+i}, Z{16+i}")
    ins("ADDQ $16, BX", "CMPQ BX, CX", "JLT qprep4max", "JMP qprep4red")
    # the same with the dots of the float rows and the channel zeros (int4 offsets, head dim
    # 128), summed as dots16 sums them (dots1wasm: even chunks of 16 in Z25-Z28, odd ones in
    # Z12-Z15, then REDUCE4's order), so the offsets are bit for bit those quantPart had
    w("qprep4maxz:")
    for h, (kzr, accs) in enumerate(((29, 25), (24, 12))):
        ins(f"VMOVUPS {off(64*h)}(R8)(BX*4), Z5", f"VMOVUPS {off(64*h)}(R9)(BX*4), Z{kzr}")
        for i in range(4):
            ins(f"VMOVUPS {off(64*h)}({qrow[i]})(BX*4), Z{8+i}", f"VFMADD231PS Z{kzr}, Z{8+i}, Z{accs+i}",
                f"VMULPS Z5, Z{8+i}, Z{8+i}", f"VFMADD231PS Z4, Z{8+i}, Z{20+i}", f"VANDPS Z2, Z{8+i}, Z{8+i}",
                f"VMAXPS Z{8+i}, Z{16+i}, Z{16+i}")
    ins("ADDQ $32, BX", "CMPQ BX, CX", "JLT qprep4maxz")
    for i in range(4):
        ins(f"VADDPS Z{12+i}, Z{25+i}, Z{25+i}")
    w("qprep4red:")
    # the four rows' maxima (X1) and sums of products times 0 (X3) side by side, then the
    # checks, scales and inverses of the four at once: the same values as one row at a time
    for i in range(4):
        ins(f"VEXTRACTF64X4 $1, Z{16+i}, Y0", f"VMAXPS Y0, Y{16+i}, Y{8+i}", f"VEXTRACTF128 $1, Y{8+i}, X0",
            f"VMAXPS X0, X{8+i}, X{8+i}",
            f"VEXTRACTF64X4 $1, Z{20+i}, Y0", f"VADDPS Y0, Y{20+i}, Y{12+i}", f"VEXTRACTF128 $1, Y{12+i}, X0",
            f"VADDPS X0, X{12+i}, X{12+i}")
    ins(*transpose4("VMAXPS", [8, 9, 10, 11], 1, (0, 3)), *transpose4("VADDPS", [12, 13, 14, 15], 3, (0, 5)))
    ins("VXORPS X5, X5, X5",
        # a product that is not finite: its x*0 is NaN
        "VCMPPS $4, X5, X3, X0", "VPTEST X0, X0", "JNZ qprepfail",
        # rows with m > 0 (X8): sc = m/32767 must not be 0, inv = 32767/m not above MaxFloat32
        "VCMPPS $4, X5, X1, X8", "VBROADCASTSS X6, X9", "VDIVPS X9, X1, X10", "VDIVPS X1, X9, X11",
        "VCMPPS $0, X5, X10, X0", "VANDPS X8, X0, X0", "VPTEST X0, X0", "JNZ qprepfail",
        "VBROADCASTSS X7, X12", "VCMPPS $0x1e, X12, X11, X0", "VANDPS X8, X0, X0", "VPTEST X0, X0", "JNZ qprepfail",
        "VANDPS X8, X10, X10", "VANDPS X8, X11, X11", "VMOVUPS X10, (DX)")
    for i in range(4):
        ins(f"VSHUFPS ${i * 0x55}, X11, X11, X{12+i}", f"VBROADCASTSS X{12+i}, Z{12+i}",
            f"VPXORD Z{16+i}, Z{16+i}, Z{16+i}")
    ins("LEAQ (DI)(CX*2), R9", "LEAQ (R9)(CX*2), R12", "LEAQ (R12)(CX*2), AX")
    ins("XORQ BX, BX", "CMPQ i4+56(FP), $0", "JNE qprep4i4")
    w("qprep4i8:")
    ins("VMOVUPS (R8)(BX*4), Z5")
    for i in range(4):
        ins(f"VMULPS ({qrow[i]})(BX*4), Z5, Z{8+i}", f"VMULPS Z{12+i}, Z{8+i}, Z{8+i}",
            f"VCVTPS2DQ Z{8+i}, Z{8+i}", f"VPADDD Z{8+i}, Z{16+i}, Z{16+i}", f"VPMOVSDW Z{8+i}, ({drow[i]})(BX*2)")
    ins("ADDQ $16, BX", "CMPQ BX, CX", "JLT qprep4i8", "LEAQ (DI)(CX*8), DI", "JMP qprep4sum")
    # qi16Order: of each 64 elements, the even ones first, then the odd ones (VPERMI2D of the two
    # halves of 32 rounded elements; Z30, Z31 the even and odd indices)
    w("qprep4i4:")
    ins("VMOVDQU32 qevn<>(SB), Z30", "VMOVDQU32 qodd<>(SB), Z31")
    w("qprep4i4blk:")
    for h in range(2):
        ins(f"VMOVUPS {off(128*h)}(R8)(BX*4), Z5", f"VMOVUPS {128*h+64}(R8)(BX*4), Z24")
        for i in range(4):
            a, b = f"Z{8+i}", f"Z{20+i}"
            ins(f"VMULPS {off(128*h)}({qrow[i]})(BX*4), Z5, {a}", f"VMULPS Z{12+i}, {a}, {a}",
                f"VCVTPS2DQ {a}, {a}", f"VPADDD {a}, Z{16+i}, Z{16+i}",
                f"VMULPS {128*h+64}({qrow[i]})(BX*4), Z24, {b}", f"VMULPS Z{12+i}, {b}, {b}",
                f"VCVTPS2DQ {b}, {b}", f"VPADDD {b}, Z{16+i}, Z{16+i}",
                "VMOVDQA32 Z30, Z1", f"VPERMI2D {b}, {a}, Z1", f"VPMOVSDW Z1, {off(32*h)}({drow[i]})",
                "VMOVDQA32 Z31, Z3", f"VPERMI2D {b}, {a}, Z3", f"VPMOVSDW Z3, {64+32*h}({drow[i]})")
    ins(*[f"ADDQ $128, {r}" for r in drow])
    ins("ADDQ $64, BX", "CMPQ BX, CX", "JLT qprep4i4blk",
        "LEAQ (CX)(CX*2), R9", "LEAQ (DI)(R9*2), DI")  # DI had moved 2n on: 8n in all
    w("qprep4sum:")
    for i in range(4):
        ins(f"VEXTRACTI64X4 $1, Z{16+i}, Y0", f"VPADDD Y0, Y{16+i}, Y{8+i}", f"VEXTRACTI128 $1, Y{8+i}, X0",
            f"VPADDD X0, X{8+i}, X{8+i}")
    ins("VPHADDD X9, X8, X0", "VPHADDD X11, X10, X1", "VPHADDD X1, X0, X0", "VCVTDQ2PS X0, X0", "VMOVUPS X0, (R11)",
        "MOVQ aff+72(FP), R9", "TESTQ R9, R9", "JZ qprep4gnext", "VMOVUPS (DX), X1", "CMPQ i4+56(FP), $0",
        "JNE qprep4off4",
        # int8: no offset (signed products)
        "VXORPS X0, X0, X0", "JMP qprep4aff")
    w("qprep4off4:")
    # REDUCE4 (kern_avx512_amd64.s) of the four rows' sums
    for i in range(4):
        ins(f"VEXTRACTF64X4 $1, Z{25+i}, Y{8+i}", f"VADDPS Y{25+i}, Y{8+i}, Y{8+i}")
    ins("VHADDPS Y9, Y8, Y8", "VHADDPS Y11, Y10, Y10", "VHADDPS Y10, Y8, Y8", "VEXTRACTF128 $1, Y8, X0",
        "VADDPS X0, X8, X0")
    # (Z2, the abs mask, stays for the next group)
    w("qprep4aff:")
    ins("VMOVUPS X0, (R11)", "VUNPCKLPS X1, X1, X3", "VMOVUPS X3, (R9)", "VUNPCKHPS X1, X1, X3", "VMOVUPS X3, 16(R9)",
        "VUNPCKLPS X0, X0, X3", "VMOVUPS X3, 32(R9)", "VUNPCKHPS X0, X0, X3", "VMOVUPS X3, 48(R9)",
        "VMOVUPS X1, 64(R9)", "VMOVUPS X0, 80(R9)", "ADDQ $96, aff+72(FP)")
    w("qprep4gnext:")
    ins("LEAQ (R15)(CX*4), SI", "ADDQ $16, DX", "ADDQ $16, R11", "SUBQ $4, R10", "JMP qprep4grp")
    prep_rows("avx512", "qprep", 80)
    w()
    vnni_dots("i8")
    vnni_dots("i4")
    vnni_dots1("i8")
    vnni_dots1("i4")


def prep_rows(isa, pfx, ret=64):
    """intPrep's one-row loop (qprep*: the rows left after the four-row groups, every row on
    AVX2), from label {pfx}1start: rows R10, q SI, dst DI, ks R8, n CX, sc DX, sums R11, with
    Y/Z2 the abs mask, Y/Z4 zero, X6 32767 and X7 MaxFloat32 set. The same products, maximum,
    divisions and rounding on both instruction sets: bit-identical rows."""
    lanes, vp = ISAS[isa]
    wide = isa == "avx512"

    def reduce_max(r):  # Y/Z{r} -> X{r}[0] by VMAXPS (X0 clobbered)
        c = [f"VEXTRACTF64X4 $1, Z{r}, Y0", f"VMAXPS Y0, Y{r}, Y{r}"] if wide else []
        return c + [f"VEXTRACTF128 $1, Y{r}, X0", f"VMAXPS X0, X{r}, X{r}", f"VPERMILPS $0x4e, X{r}, X0",
                    f"VMAXPS X0, X{r}, X{r}", f"VPERMILPS $0xb1, X{r}, X0", f"VMAXPS X0, X{r}, X{r}"]

    def rnd(src, r):  # lanes products at src times Y/Z9 rounded into Y/Z{r}, summed into Y/Z1
        return [f"VMOVUPS {src.format('SI')}, {vp}{r}", f"VMULPS {src.format('R8')}, {vp}{r}, {vp}{r}",
                f"VMULPS {vp}9, {vp}{r}, {vp}{r}", f"VCVTPS2DQ {vp}{r}, {vp}{r}", f"VPADDD {vp}{r}, {vp}1, {vp}1"]

    def store(r, dst, t):  # the int32 lanes of Y/Z{r} as int16 at dst (avx2: X{t} clobbered)
        if wide:
            return [f"VPMOVSDW Z{r}, {dst}"]
        return [f"VEXTRACTI128 $1, Y{r}, X{t}", f"VPACKSSDW X{t}, X{r}, X{r}", f"VMOVDQU X{r}, {dst}"]

    w(f"{pfx}1start:")
    ins("TESTQ R10, R10", f"JZ {pfx}ok", "MOVQ i4+56(FP), AX")
    w(f"{pfx}row:")
    ins(f"VXORPS {vp}1, {vp}1, {vp}1", f"VXORPS {vp}3, {vp}3, {vp}3", "XORQ BX, BX")
    w(f"{pfx}max:")
    ins(f"VMOVUPS (SI)(BX*4), {vp}0", f"VMULPS (R8)(BX*4), {vp}0, {vp}0",
        f"VFMADD231PS {vp}4, {vp}0, {vp}3", f"VANDPS {vp}2, {vp}0, {vp}0", f"VMAXPS {vp}0, {vp}1, {vp}1",
        f"ADDQ ${lanes}, BX", "CMPQ BX, CX", f"JLT {pfx}max")
    ins(*reduce_max(1))
    if wide:
        ins("VEXTRACTF64X4 $1, Z3, Y0", "VADDPS Y0, Y3, Y3")
    ins("VEXTRACTF128 $1, Y3, X0", "VADDPS X0, X3, X3", "VHADDPS X3, X3, X3", "VHADDPS X3, X3, X3",
        # every product finite: the sum of products times 0 is exactly 0
        "VXORPS X5, X5, X5", "VUCOMISS X5, X3", f"JNE {pfx}fail", f"JPS {pfx}fail",
        "VXORPS X8, X8, X8", "VXORPS X9, X9, X9", "VUCOMISS X5, X1", f"JEQ {pfx}inv")
    # m > 0: sc = m/32767 must not be 0, inv = 32767/m not above MaxFloat32
    ins("VDIVSS X6, X1, X8", "VUCOMISS X5, X8", f"JEQ {pfx}fail", "VDIVSS X1, X6, X9",
        "VUCOMISS X7, X9", f"JHI {pfx}fail")
    w(f"{pfx}inv:")
    ins("VMOVSS X8, (DX)", f"VBROADCASTSS X9, {vp}9", f"VPXOR{'D' if wide else ''} {vp}1, {vp}1, {vp}1",
        "XORQ BX, BX", "TESTQ AX, AX", f"JNZ {pfx}4")
    w(f"{pfx}quant:")
    ins(*rnd("({})(BX*4)", 0), *store(0, "(DI)(BX*2)", 3), f"ADDQ ${lanes}, BX", "CMPQ BX, CX",
        f"JLT {pfx}quant", f"JMP {pfx}sum")
    w(f"{pfx}4:")
    ins("MOVQ DI, R12")
    if wide:
        ins("VMOVDQU32 qevn<>(SB), Z30", "VMOVDQU32 qodd<>(SB), Z31")
    w(f"{pfx}4loop:")
    # qi16Order: of each 64 elements, the 32 even ones, then the 32 odd ones; two runs of lanes
    # elements at a time split into their even and odd halves (AVX-512: VPERMI2D; AVX2: VSHUFPS
    # within the 128-bit lanes, then VPERMQ)
    for k in range(64 // (2 * lanes)):
        e = 2 * lanes * k
        ins(*rnd(f"{off(4*e)}({{}})(BX*4)", 0), *rnd(f"{4*(e+lanes)}({{}})(BX*4)", 3))
        if wide:
            ins("VMOVDQA32 Z30, Z5", "VPERMI2D Z3, Z0, Z5", "VMOVDQA32 Z31, Z10", "VPERMI2D Z3, Z0, Z10")
        else:
            ins("VSHUFPS $0x88, Y3, Y0, Y5", "VSHUFPS $0xdd, Y3, Y0, Y10", "VPERMQ $0xd8, Y5, Y5",
                "VPERMQ $0xd8, Y10, Y10")
        ins(*store(5, f"{off(e)}(R12)", 11), *store(10, f"{64+e}(R12)", 11))
    ins("ADDQ $128, R12", "ADDQ $64, BX", "CMPQ BX, CX", f"JLT {pfx}4loop")
    w(f"{pfx}sum:")
    if wide:
        ins("VEXTRACTI64X4 $1, Z1, Y0", "VPADDD Y0, Y1, Y1")
    ins("VEXTRACTI128 $1, Y1, X0", "VPADDD X0, X1, X1",
        "VPHADDD X1, X1, X1", "VPHADDD X1, X1, X1", "VCVTDQ2PS X1, X1", "VMOVSS X1, (R11)",
        "LEAQ (SI)(CX*4), SI", "LEAQ (DI)(CX*2), DI", "ADDQ $4, DX", "ADDQ $4, R11", "DECQ R10", f"JNZ {pfx}row")
    w(f"{pfx}ok:")
    ins(f"MOVQ $1, ret+{ret}(FP)", "VZEROUPPER", "RET")
    w(f"{pfx}fail:")
    ins(f"MOVQ $0, ret+{ret}(FP)", "VZEROUPPER", "RET")


def pair_store_int(corr=False):
    """pair_store's contract from int32 sums of row r token u in Y(2r+u): the integers are reduced
    first (VPHADDD, the two lanes joined by VPERM2I128) and converted once. The sums are exact
    integers below 2^24 (the integer loops' bound), so the float32 steps after the conversion give
    pair_store's results bit for bit (R13, R15, Y2, Y6, Y8, X4 clobbered)."""
    return ["VPHADDD Y1, Y0, Y0", "VPHADDD Y3, Y2, Y2", "VPHADDD Y2, Y0, Y0",
            "VPHADDD Y5, Y4, Y4", "VPHADDD Y7, Y6, Y6", "VPHADDD Y6, Y4, Y4",
            "VPERM2I128 $0x20, Y4, Y0, Y2", "VPERM2I128 $0x31, Y4, Y0, Y6", "VPADDD Y6, Y2, Y0",
            "VCVTDQ2PS Y0, Y0", *(["VADDPS (SP), Y0, Y0"] if corr else []),
            "VMOVUPS (R14), Y8", "VFMADD213PS 32(R14), Y8, Y0", "VEXTRACTF128 $1, Y0, X4",
            "MOVQ ldS+8(FP), R13", "LEAQ (R13)(R13*2), R15",
            "VMOVLPS X0, (DI)", "VMOVHPS X0, (DI)(R13*1)", "VMOVLPS X4, (DI)(R13*2)", "VMOVHPS X4, (DI)(R15*1)"]


def k16_chunk(fmt, isa, bases, kregs, mask):
    """One step of the int16 score loops over the K rows of a few tokens at bases: the rows'
    int8 (VPMOVSXBW) or int4 (VPMOVZXBW, then the low nibble by VPAND with the word mask and
    the high one by VPSRLW) values widened to int16 words, token u's in registers kregs[u]
    (int8: one; int4: two, the even and the odd elements). A step covers 32 K bytes on AVX-512
    (int8: 32 elements; int4: 64) and 16 on AVX2. Returns the code and, per token, the
    (q byte offset, register) pairs its words meet (the query rows in qi16Order)."""
    code, ops = [], []
    wide = isa == "avx512"
    vp = "Z" if wide else "Y"
    for u, base in enumerate(bases):
        if fmt == "i8":
            code.append(f"VPMOVSXBW {base}, {vp}{kregs[u][0]}")
            ops.append([(0, kregs[u][0])])
        else:
            lo, hi = kregs[u]
            code += [f"VPMOVZXBW {base}, {vp}{lo}", f"VPSRLW $4, {vp}{lo}, {vp}{hi}",
                     f"VPAND{'D' if wide else ''} {vp}{mask}, {vp}{lo}, {vp}{lo}"]
            # the even elements meet q words [0, 32) of the 64-element block, the odd ones
            # [32, 64) (AVX2: the first or second 16 of each, the caller's offset)
            ops.append([(0, lo), (64, hi)])
    return code, ops


def single_store_int(ld):
    """The store of a one-token step from int32 sums of row r in Y(r), r < 4: reduced as
    integers (VPHADDD) to X0 = [r0 r1 r2 r3] and converted once, s = sum*aff[16:20] +
    aff[20:24], stored at DI (rows ldS apart, loaded into register ld; R15, X1, X8 clobbered)."""
    return ["VPHADDD Y1, Y0, Y0", "VPHADDD Y3, Y2, Y2", "VPHADDD Y2, Y0, Y0",
            "VEXTRACTI128 $1, Y0, X1", "VPADDD X1, X0, X0", "VCVTDQ2PS X0, X0",
            "VMOVUPS 64(R14), X8", "VFMADD213PS 80(R14), X8, X0",
            f"MOVQ ldS+8(FP), {ld}", f"LEAQ ({ld})({ld}*2), R15", "VMOVSS X0, (DI)", f"VEXTRACTPS $1, X0, (DI)({ld}*1)",
            f"VEXTRACTPS $2, X0, (DI)({ld}*2)", "VEXTRACTPS $3, X0, (DI)(R15*1)"]


def vnni_chunk_body(fmt, bases, qregs, accs, kbase):
    """One 64-byte chunk of the VPDPWSSD score loops: the K rows of the tokens at bases (two
    steps of 32 bytes, words in Z(kbase)...) dotted with the int16 query rows at qregs (q offset
    CX; int8 32 elements a step, int4 64), row r token u accumulated in Z(accs(r, u))."""
    qstep = 64 if fmt == "i8" else 128
    for h in range(2):
        kregs = [(kbase + 2 * u, kbase + 1 + 2 * u) if fmt == "i4" else (kbase + u,) for u in range(len(bases))]
        code, ops = k16_chunk(fmt, "avx512", [f"{off(32*h)}{b}" for b in bases], kregs, 31)
        ins(*code)
        for r, q in enumerate(qregs):
            for u in range(len(bases)):
                for o, reg in ops[u]:
                    ins(f"VPDPWSSD {off(qstep*h + o)}({q})(CX*1), Z{reg}, Z{accs(r, u)}")


def dots_header(name, fmt, how):
    w(f"// func {name}(s *float32, ldS int, qi *int16, qib int, k *byte, krb int, nt int, cpg int, aff *[24]float32, pfd int)")
    w("//")
    if fmt == "i8":
        w("// Scores of four rows from int16 query rows qi (qib bytes apart) and int8 K rows (krb bytes,")
        w(f"// cpg chunks of 64): {how} of the K bytes widened to int16 (VPMOVSXBW) with the q words,")
        w("// then s = acc*scale + offset per row.")
    else:
        w("// Scores of four rows from int16 query rows qi (qib bytes apart) and int4 K rows (krb bytes,")
        w("// cpg chunks of 64 bytes, 128 elements): the bytes widened to words (VPMOVZXBW) give the even")
        w("// elements by VPAND 0x000f and the odd ones by VPSRLW 4, so the q rows are stored with each 64")
        w(f"// elements' even ones first (qi16Order); {how}. s = acc*scale + offset per row (offset: the")
        w("// row's zero term).")
    w("// The int32 sums (at most 32767*127*256 in magnitude: exact) are reduced as integers and")
    w("// converted once on both instruction sets: bit-identical scores.")


def vnni_dots(fmt):
    """The VPDPWSSD score loop of four rows over K per channel: int16 query rows (intPrep)
    against K widened to int16 words (k16_chunk)."""
    name = f"qdots4{fmt}vnni"
    dots_header(name, fmt, "VPDPWSSD")
    w("// Four tokens per step (a 4x4 block of accumulators, row r token u in Z(4r+u), reduced by a")
    w("// transpose tree into one vector of the 16 sums, lane 4r+u; aff[16:24] spread per lane), then")
    w("// a two-token step (Z(2r+u); aff[0:8] scales and aff[8:16] offsets in the order of the pair")
    w("// reduction, [r0 r0 r1 r1], [r2 r2 r3 r3]), then an odd last token (aff[16:20] scales of")
    w("// r0..r3, aff[20:24] offsets).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-80")
    ins("MOVQ s+0(FP), DI", "MOVQ qi+16(FP), R8", "MOVQ qib+24(FP), DX", "LEAQ (R8)(DX*1), R9",
        "LEAQ (R9)(DX*1), R10", "LEAQ (R10)(DX*1), R11", "MOVQ k+32(FP), SI", "MOVQ krb+40(FP), BX",
        "MOVQ nt+48(FP), AX", "MOVQ aff+64(FP), R14",
        "MOVL $0x000f000f, CX", "VPBROADCASTD CX, Z31", "VMOVDQU32 qidx4<>(SB), Z30",
        "VMOVUPS 64(R14), X28", "VPERMPS Z28, Z30, Z28", "VMOVUPS 80(R14), X29", "VPERMPS Z29, Z30, Z29",
        "SHRQ $2, AX", f"JZ {name}pairs")
    qregs = ["R8", "R9", "R10", "R11"]
    # a chunk (64 K bytes) is two steps of 32 bytes: int8 32 elements (q 64 bytes), int4 64 (128)
    qstep = 64 if fmt == "i8" else 128

    def chunk(label, bases, accs):
        """The loop over the rows' chunks for the tokens at bases, row r token u accumulated
        in Z(accs(r, u)); K words in Z16-Z23."""
        ins("XORQ CX, CX", "MOVQ SI, R12", "LEAQ (SI)(BX*1), R13", "MOVQ cpg+56(FP), R15")
        w(f"{label}:")
        vnni_chunk_body(fmt, bases, qregs, accs, 16)
        ins("ADDQ $64, R12", "ADDQ $64, R13", f"ADDQ ${2*qstep}, CX", "DECQ R15", f"JNZ {label}")

    w(f"{name}quad:")
    for i in range(16):
        ins(f"VPXORD Z{i}, Z{i}, Z{i}")
    ins("MOVQ pfd+72(FP), R12", "LEAQ (SI)(R12*1), R12", "PREFETCHT1 (R12)", "PREFETCHT1 64(R12)",
        "PREFETCHT1 (R12)(BX*1)", "PREFETCHT1 64(R12)(BX*1)", "LEAQ (R12)(BX*2), R12",
        "PREFETCHT1 (R12)", "PREFETCHT1 64(R12)", "PREFETCHT1 (R12)(BX*1)", "PREFETCHT1 64(R12)(BX*1)")
    chunk(f"{name}qchunk", ["(R12)", "(R13)", "(R12)(BX*2)", "(R13)(BX*2)"], lambda r, u: 4 * r + u)
    for r in range(4):
        a = [f"Z{4*r+u}" for u in range(4)]
        ins(f"VPUNPCKLDQ {a[1]}, {a[0]}, Z16", f"VPUNPCKHDQ {a[1]}, {a[0]}, Z17", "VPADDD Z17, Z16, Z16",
            f"VPUNPCKLDQ {a[3]}, {a[2]}, Z18", f"VPUNPCKHDQ {a[3]}, {a[2]}, Z19", "VPADDD Z19, Z18, Z18",
            "VPUNPCKLQDQ Z18, Z16, Z17", "VPUNPCKHQDQ Z18, Z16, Z19", f"VPADDD Z19, Z17, Z{20+r}")
    ins("VSHUFI32X4 $0x44, Z21, Z20, Z16", "VSHUFI32X4 $0xee, Z21, Z20, Z17", "VPADDD Z17, Z16, Z16",
        "VSHUFI32X4 $0x44, Z23, Z22, Z18", "VSHUFI32X4 $0xee, Z23, Z22, Z19", "VPADDD Z19, Z18, Z18",
        "VSHUFI32X4 $0x88, Z18, Z16, Z17", "VSHUFI32X4 $0xdd, Z18, Z16, Z19", "VPADDD Z19, Z17, Z17",
        "VCVTDQ2PS Z17, Z17", "VFMADD213PS Z29, Z28, Z17",
        "MOVQ ldS+8(FP), R13", "LEAQ (R13)(R13*2), R15",
        "VMOVUPS X17, (DI)", "VEXTRACTF32X4 $1, Z17, (DI)(R13*1)", "VEXTRACTF32X4 $2, Z17, (DI)(R13*2)",
        "VEXTRACTF32X4 $3, Z17, (DI)(R15*1)",
        "ADDQ $16, DI", "LEAQ (SI)(BX*4), SI", "DECQ AX", f"JNZ {name}quad")
    w(f"{name}pairs:")
    ins("MOVQ nt+48(FP), AX", "TESTQ $2, AX", f"JZ {name}odd")
    for i in range(8):
        ins(f"VPXORD Z{i}, Z{i}, Z{i}")
    chunk(f"{name}pchunk", ["(R12)", "(R13)"], lambda r, u: 2 * r + u)
    for i in range(8):
        ins(f"VEXTRACTI64X4 $1, Z{i}, Y{8+i}", f"VPADDD Y{8+i}, Y{i}, Y{i}")
    ins(*pair_store_int(), "ADDQ $8, DI", "LEAQ (SI)(BX*2), SI")
    w(f"{name}odd:")
    ins("MOVQ nt+48(FP), AX", "ANDQ $1, AX", f"JZ {name}done")
    for i in range(4):
        ins(f"VPXORD Z{i}, Z{i}, Z{i}")
    chunk(f"{name}ochunk", ["(R12)"], lambda r, u: r)
    for i in range(4):
        ins(f"VEXTRACTI64X4 $1, Z{i}, Y{8+i}", f"VPADDD Y{8+i}, Y{i}, Y{i}")
    ins(*single_store_int("BX"))
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def dots1_header(name, fmt, how, step):
    w(f"// func {name}(s *float32, qi *int16, k *byte, krb int, nt int, cpg int, aff *[2]float32, pfd int)")
    w("//")
    w("// The score loop of one query row (a KV head's only row: MHA decode, or a row left after the")
    w("// groups of four) over K per channel: s[t] = acc_t*aff[0] + aff[1] for t < nt, acc_t the dot")
    w("// of the int16 query row qi (intPrep; int4: qi16Order) with token t's K row (krb bytes, cpg")
    w(f"// chunks of 64 bytes) widened to int16 words (k16_chunk), by {how}. {step} tokens per step, one")
    w("// accumulator each, reduced as integers and converted once, then one token at a time: the")
    w("// same integers and float32 steps as the four-row loops, bit-identical across instruction sets.")


def dots1_tail(name, step, chunk, zero, reduce):
    """The one-row score loops' end: the tokens left after the steps of step tokens one at a
    time (zero clears the accumulator, chunk(label, 1) sums the token's row into it, reduce
    leaves its score in X0), then the return."""
    w(f"{name}tail:")
    ins("MOVQ nt+32(FP), AX", f"ANDQ ${step - 1}, AX", f"JZ {name}done")
    w(f"{name}one:")
    ins(*zero)
    chunk(f"{name}tchunk", 1)
    ins(*reduce, "VMOVSS X0, (DI)", "ADDQ $4, DI", "ADDQ BX, SI", "DECQ AX", f"JNZ {name}one")
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def vnni_dots1(fmt):
    """The VPDPWSSD score loop of one row: eight tokens per step (token u in Z(u), reduced by a
    transpose tree into the eight sums of one ymm), then single tokens."""
    name = f"qdots1{fmt}vnni"
    dots1_header(name, fmt, "VPDPWSSD", "Eight")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-64")
    ins("MOVQ s+0(FP), DI", "MOVQ qi+8(FP), R8", "MOVQ k+16(FP), SI", "MOVQ krb+24(FP), BX",
        "LEAQ (BX)(BX*2), R14", "MOVQ nt+32(FP), AX", "MOVQ aff+48(FP), DX",
        "MOVL $0x000f000f, CX", "VPBROADCASTD CX, Z31", "VBROADCASTSS (DX), Z28", "VBROADCASTSS 4(DX), Z29",
        "SHRQ $3, AX", f"JZ {name}tail")
    qstep = 64 if fmt == "i8" else 128

    def chunk(label, ntok):
        """The loop over the row's chunks for ntok tokens (at R12 + u*BX, u < 4, and R10 + (u-4)*BX),
        token u accumulated in Z(u); K words in Z8-Z23."""
        bases = ["(R12)", "(R12)(BX*1)", "(R12)(BX*2)", "(R12)(R14*1)",
                 "(R10)", "(R10)(BX*1)", "(R10)(BX*2)", "(R10)(R14*1)"][:ntok]
        ins("XORQ CX, CX", "MOVQ SI, R12", "LEAQ (SI)(BX*4), R10", "MOVQ cpg+40(FP), R15")
        w(f"{label}:")
        vnni_chunk_body(fmt, bases, ["R8"], lambda r, u: u, 8)
        ins("ADDQ $64, R12", "ADDQ $64, R10", f"ADDQ ${2*qstep}, CX", "DECQ R15", f"JNZ {label}")

    w(f"{name}oct:")
    for i in range(8):
        ins(f"VPXORD Z{i}, Z{i}, Z{i}")
    ins("MOVQ pfd+56(FP), R12", "LEAQ (SI)(R12*1), R12", "LEAQ (R12)(BX*4), R10")
    for b in ("(R12)", "(R12)(BX*1)", "(R12)(BX*2)", "(R12)(R14*1)", "(R10)", "(R10)(BX*1)", "(R10)(BX*2)", "(R10)(R14*1)"):
        ins(f"PREFETCHT1 {b}")
        if fmt == "i8":
            ins(f"PREFETCHT1 64{b}")
    chunk(f"{name}ochunk", 8)
    # [t0 t1 t2 t3] in each 128-bit lane of Z16, [t4..t7] in Z17, then the lanes summed
    for i, (a, b) in enumerate(((0, 1), (2, 3), (4, 5), (6, 7))):
        ins(f"VPUNPCKLDQ Z{b}, Z{a}, Z{8+2*i}", f"VPUNPCKHDQ Z{b}, Z{a}, Z{9+2*i}", f"VPADDD Z{9+2*i}, Z{8+2*i}, Z{a}")
    for i, (a, b) in enumerate(((0, 2), (4, 6))):
        ins(f"VPUNPCKLQDQ Z{b}, Z{a}, Z8", f"VPUNPCKHQDQ Z{b}, Z{a}, Z9", f"VPADDD Z9, Z8, Z{16+i}")
    ins("VSHUFI32X4 $0x44, Z17, Z16, Z8", "VSHUFI32X4 $0xee, Z17, Z16, Z9", "VPADDD Z9, Z8, Z8",
        "VSHUFI32X4 $0x88, Z8, Z8, Z9", "VSHUFI32X4 $0xdd, Z8, Z8, Z10", "VPADDD Z10, Z9, Z9",
        "VCVTDQ2PS Y9, Y9", "VFMADD213PS Y29, Y28, Y9", "VMOVUPS Y9, (DI)",
        "ADDQ $32, DI", "LEAQ (SI)(BX*8), SI", "DECQ AX", f"JNZ {name}oct")
    dots1_tail(name, 8, chunk, ["VPXORD Z0, Z0, Z0"],
               ["VEXTRACTI64X4 $1, Z0, Y1", "VPADDD Y1, Y0, Y0", "VEXTRACTI128 $1, Y0, X1", "VPADDD X1, X0, X0",
                "VPHADDD X0, X0, X0", "VPHADDD X0, X0, X0", "VCVTDQ2PS X0, X0", "VFMADD213PS X29, X28, X0"])


def maddw_dots1(fmt):
    """The AVX2 score loop of one row (no VNNI): qdots1*vnni's integers by VPMADDWD and VPADDD,
    four tokens per step (token u in Y(u)), then single tokens."""
    name = f"qdots1{fmt}maddw"
    dots1_header(name, fmt, "VPMADDWD", "Four")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-64")
    ins("MOVQ s+0(FP), DI", "MOVQ qi+8(FP), R8", "MOVQ k+16(FP), SI", "MOVQ krb+24(FP), BX",
        "LEAQ (BX)(BX*2), R14", *bcast(0x000f000f, 15),
        # DX: the end of the row in q bytes (int8: 2 per element, int4: 256 per 64-byte chunk)
        "MOVQ cpg+40(FP), DX", f"SHLQ ${7 if fmt == 'i8' else 8}, DX",
        "MOVQ nt+32(FP), AX", "SHRQ $2, AX", f"JZ {name}tail")
    bases_all = ["(R12)", "(R12)(BX*1)", "(R12)(BX*2)", "(R12)(R14*1)"]

    def chunk(label, ntok):
        """The loop over the row for ntok tokens (at R12 + u*BX), token u accumulated in Y(u); K
        words in Y4-Y11, products in Y12, Y13. A step covers 32 K bytes (two of 16)."""
        ins("XORQ CX, CX", "MOVQ SI, R12")
        w(f"{label}:")
        for h in range(2):
            kregs = [(4 + 2 * u, 5 + 2 * u) if fmt == "i4" else (4 + u,) for u in range(ntok)]
            code, ops = k16_chunk(fmt, "avx2", [f"{off(16*h)}{b}" for b in bases_all[:ntok]], kregs, 15)
            ins(*code)
            j = 0
            for u in range(ntok):
                for o, reg in ops[u]:
                    t = 12 + j % 2
                    j += 1
                    ins(f"VPMADDWD {off(32*h + o)}(R8)(CX*1), Y{reg}, Y{t}", f"VPADDD Y{t}, Y{u}, Y{u}")
        ins("ADDQ $32, R12", f"ADDQ ${64 if fmt == 'i8' else 128}, CX", "CMPQ CX, DX", f"JLT {label}")

    w(f"{name}quad:")
    for i in range(4):
        ins(f"VPXOR Y{i}, Y{i}, Y{i}")
    ins("MOVQ pfd+56(FP), R12", "LEAQ (SI)(R12*1), R12")
    for b in bases_all:
        ins(f"PREFETCHT1 {b}")
        if fmt == "i8":
            ins(f"PREFETCHT1 64{b}")
    chunk(f"{name}qchunk", 4)
    ins("VPHADDD Y1, Y0, Y0", "VPHADDD Y3, Y2, Y2", "VPHADDD Y2, Y0, Y0",
        "VEXTRACTI128 $1, Y0, X1", "VPADDD X1, X0, X0", "VCVTDQ2PS X0, X0",
        "MOVQ aff+48(FP), R13", "VBROADCASTSS (R13), X12", "VBROADCASTSS 4(R13), X13",
        "VFMADD213PS X13, X12, X0", "VMOVUPS X0, (DI)",
        "ADDQ $16, DI", "LEAQ (SI)(BX*4), SI", "DECQ AX", f"JNZ {name}quad")
    dots1_tail(name, 4, chunk, ["VPXOR Y0, Y0, Y0"],
               ["VEXTRACTI128 $1, Y0, X1", "VPADDD X1, X0, X0", "VPHADDD X0, X0, X0", "VPHADDD X0, X0, X0",
                "VCVTDQ2PS X0, X0", "MOVQ aff+48(FP), R13", "VBROADCASTSS (R13), X12", "VBROADCASTSS 4(R13), X13",
                "VFMADD213PS X13, X12, X0"])


def maddw():
    """AVX2 integer score loop (no VNNI): intPrep's rows by qprepavx2 (prep_rows, the same
    rounding as qprepavx512), dots by VPMADDWD (int16 pairs to int32)."""
    w("// func qprepavx2(dst *int16, q *float32, ks *float32, n int, rows int, sc *float32, sums *float32, i4 int) int")
    w("//")
    w("// qprepavx512 in ymm registers (four rows at a time while four are left, then one): the same")
    w("// products, maxima, divisions and rounding, so the same integers, scales and sums bit for bit.")
    w("TEXT ·qprepavx2(SB), NOSPLIT, $0-72")
    ins("MOVQ dst+0(FP), DI", "MOVQ q+8(FP), SI", "MOVQ ks+16(FP), R8", "MOVQ n+24(FP), CX",
        "MOVQ rows+32(FP), R10", "MOVQ sc+40(FP), DX", "MOVQ sums+48(FP), R11")
    prep4_avx2("qprepy")
    prep_rows("avx2", "qprepy")
    w()
    maddw_dots("i8")
    maddw_dots("i4")
    maddw_dots1("i8")
    maddw_dots1("i4")


def prep_consts(isa):
    """The constants of the prep loops: Y4 zero, Y2 the abs mask, X6 32767, X7 MaxFloat32 (R9
    clobbered)."""
    return ["VXORPS Y4, Y4, Y4", "MOVL $0x7fffffff, R9", "VMOVD R9, X2", "VPBROADCASTD X2, Y2",
            "MOVL $0x46fffe00, R9", "VMOVD R9, X6", "MOVL $0x7f7fffff, R9", "VMOVD R9, X7"]


def prep4_avx2(pfx):
    """qprepavx2's four-row groups (while four rows are left; then prep_rows): the channel
    scales loaded once per step for four rows, four independent chains. The maximum is taken
    on the bits of |q*ks| (VPMAXUD: for non-negative floats the order of the bits is that of
    the values), which also tells a non-finite product (bits >= 0x7f800000) in one step of
    latency 1; the scales, inverses and rounding are then qprepavx512's (bit-identical)."""
    qrow, drow = ["SI", "R13", "R14", "R15"], ["DI", "R9", "R12", "AX"]
    tmp = [0, 1, 3, 14]
    w(f"{pfx}4grp:")
    ins(*prep_consts("avx2"), "CMPQ R10, $4", f"JLT {pfx}1start", "LEAQ (SI)(CX*4), R13", "LEAQ (R13)(CX*4), R14",
        "LEAQ (R14)(CX*4), R15", "LEAQ (DI)(CX*2), R9", "LEAQ (R9)(CX*2), R12", "LEAQ (R12)(CX*2), AX")
    for i in range(4):
        ins(f"VPXOR Y{8+i}, Y{8+i}, Y{8+i}")
    ins("XORQ BX, BX")
    w(f"{pfx}4max:")
    ins("VMOVUPS (R8)(BX*4), Y5")
    for i in range(4):
        t = tmp[i]
        ins(f"VMULPS ({qrow[i]})(BX*4), Y5, Y{t}", f"VANDPS Y2, Y{t}, Y{t}", f"VPMAXUD Y{t}, Y{8+i}, Y{8+i}")
    ins("ADDQ $8, BX", "CMPQ BX, CX", f"JLT {pfx}4max")
    for i in range(4):
        m = 8 + i
        ins(f"VEXTRACTI128 $1, Y{m}, X0", f"VPMAXUD X0, X{m}, X{m}", f"VPSHUFD $0x4e, X{m}, X0",
            f"VPMAXUD X0, X{m}, X{m}", f"VPSHUFD $0xb1, X{m}, X0", f"VPMAXUD X0, X{m}, X{m}",
            f"VMOVD X{m}, BX", "CMPL BX, $0x7f800000", f"JAE {pfx}fail",
            "VXORPS X5, X5, X5", "VXORPS X0, X0, X0", f"VXORPS X{12+i}, X{12+i}, X{12+i}",
            f"VUCOMISS X5, X{m}", f"JEQ {pfx}4inv{i}",
            f"VDIVSS X6, X{m}, X0", "VUCOMISS X5, X0", f"JEQ {pfx}fail", f"VDIVSS X{m}, X6, X{12+i}",
            f"VUCOMISS X7, X{12+i}", f"JHI {pfx}fail")
        w(f"{pfx}4inv{i}:")
        ins(f"VMOVSS X0, {off(4*i)}(DX)", f"VBROADCASTSS X{12+i}, Y{12+i}", f"VPXOR Y{8+i}, Y{8+i}, Y{8+i}")
    # Y12-15: the rows' inverses, Y8-11: their integer sums
    ins("XORQ BX, BX", "CMPQ i4+56(FP), $0", f"JNE {pfx}4i4")

    # (Y2 the abs mask, Y4 zero, X6 and X7 clobbered below: reset by prep_consts)
    def rnd(i, src, ks, t):  # the products at src times Y{ks}, times the row's inverse, rounded into Y{t}
        return [f"VMULPS {src.format(qrow[i])}, Y{ks}, Y{t}", f"VMULPS Y{12+i}, Y{t}, Y{t}", f"VCVTPS2DQ Y{t}, Y{t}",
                f"VPADDD Y{t}, Y{8+i}, Y{8+i}"]

    def store(t, dst, tmp):  # the int32 lanes of Y{t} as int16 at dst
        return [f"VEXTRACTI128 $1, Y{t}, X{tmp}", f"VPACKSSDW X{tmp}, X{t}, X{t}", f"VMOVDQU X{t}, {dst}"]

    w(f"{pfx}4i8:")
    ins("VMOVUPS (R8)(BX*4), Y5")
    for i in range(4):
        t = [0, 1, 3, 2][i]
        ins(*rnd(i, "({})(BX*4)", 5, t), *store(t, f"({drow[i]})(BX*2)", 4))
    ins("ADDQ $8, BX", "CMPQ BX, CX", f"JLT {pfx}4i8", "LEAQ (DI)(CX*8), DI", f"JMP {pfx}4sum")
    w(f"{pfx}4i4:")
    # qi16Order, as prep_rows: 16 elements a step split into their even and odd halves
    for k in range(4):
        e = 16 * k
        ins(f"VMOVUPS {off(4*e)}(R8)(BX*4), Y5", f"VMOVUPS {4*e+32}(R8)(BX*4), Y7")
        for i in range(4):
            ins(*rnd(i, f"{off(4*e)}({{}})(BX*4)", 5, 0), *rnd(i, f"{4*e+32}({{}})(BX*4)", 7, 1),
                "VSHUFPS $0x88, Y1, Y0, Y2", "VSHUFPS $0xdd, Y1, Y0, Y3", "VPERMQ $0xd8, Y2, Y2",
                "VPERMQ $0xd8, Y3, Y3", *store(2, f"{off(e // 2 * 2)}({drow[i]})", 4),
                *store(3, f"{64 + e // 2 * 2}({drow[i]})", 6))
    ins(*[f"ADDQ $128, {r}" for r in drow])
    ins("ADDQ $64, BX", "CMPQ BX, CX", f"JLT {pfx}4i4", "LEAQ (CX)(CX*2), R9",
        "LEAQ (DI)(R9*2), DI")  # DI had moved 2n on: 8n in all
    w(f"{pfx}4sum:")
    for i in range(4):
        s = 8 + i
        ins(f"VEXTRACTI128 $1, Y{s}, X0", f"VPADDD X0, X{s}, X{s}", f"VPHADDD X{s}, X{s}, X{s}",
            f"VPHADDD X{s}, X{s}, X{s}", f"VCVTDQ2PS X{s}, X{s}", f"VMOVSS X{s}, {off(4*i)}(R11)")
    ins("LEAQ (R15)(CX*4), SI", "ADDQ $16, DX", "ADDQ $16, R11", "SUBQ $4, R10", f"JMP {pfx}4grp")


def bcast(const, reg):
    """A 32-bit constant in every lane of Y{reg} (AVX2: by way of X{reg}; CX clobbered)."""
    return [f"MOVL ${const:#010x}, CX", f"VMOVD CX, X{reg}", f"VPBROADCASTD X{reg}, Y{reg}"]


def maddw_dots(fmt):
    """The AVX2 score loop of four rows over K per channel (no VNNI): qdots4*vnni's integers by
    VPMADDWD (int16 pairs to int32) and VPADDD, two tokens per step (row r token u in Y(2r+u)),
    then the odd last one."""
    name = f"qdots4{fmt}maddw"
    dots_header(name, fmt, "VPMADDWD")
    w("// qdots4" + fmt + "vnni's contract without VNNI: two tokens per step (row r token u in Y(2r+u)),")
    w("// then the odd last one.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-80")
    ins("MOVQ s+0(FP), DI", "MOVQ qi+16(FP), R8", "MOVQ qib+24(FP), DX", "LEAQ (R8)(DX*1), R9",
        "LEAQ (R9)(DX*1), R10", "LEAQ (R10)(DX*1), R11", "MOVQ k+32(FP), SI", "MOVQ krb+40(FP), BX",
        "MOVQ aff+64(FP), R14", *bcast(0x000f000f, 15),
        # DX: the end of a row, in elements (int8, CX counts elements) or q bytes (int4, CX
        # counts q bytes while R12 and R13 walk the K rows)
        "MOVQ cpg+56(FP), DX", f"SHLQ ${6 if fmt == 'i8' else 8}, DX")
    qregs = ["R8", "R9", "R10", "R11"]

    def prefetch(tokens):
        c = ["MOVQ pfd+72(FP), R12", "LEAQ (SI)(R12*1), R12"]
        for u in range(tokens):
            base = "(R12)" if u == 0 else "(R12)(BX*1)"
            c.append(f"PREFETCHT1 {base}")
            if fmt == "i8":
                c.append(f"PREFETCHT1 64{base}")
        return c

    def chunk(label, ntok):
        """The loop over a row for ntok tokens (at SI and SI+BX), row r token u accumulated in
        Y(ntok*r+u)."""
        acc = lambda r, u: ntok * r + u
        if fmt == "i8":
            ins("XORQ CX, CX", "LEAQ (SI)(BX*1), R13")
            w(f"{label}:")
            for h in range(2):
                code, ops = k16_chunk(fmt, "avx2", [f"{off(16*h)}(SI)(CX*1)", f"{off(16*h)}(R13)(CX*1)"][:ntok],
                                      [(8,), (9,)], 15)
                ins(*code)
                for r in range(4):
                    ins(f"VMOVDQU {off(32*h)}({qregs[r]})(CX*2), Y12")
                    for u in range(ntok):
                        t = 10 + u
                        ins(f"VPMADDWD Y12, Y{ops[u][0][1]}, Y{t}", f"VPADDD Y{t}, Y{acc(r, u)}, Y{acc(r, u)}")
            ins("ADDQ $32, CX", "CMPQ CX, DX", f"JLT {label}")
            return
        ins("XORQ CX, CX", "MOVQ SI, R12", "LEAQ (SI)(BX*1), R13")
        w(f"{label}:")
        for h in range(2):
            code, ops = k16_chunk(fmt, "avx2", [f"{off(16*h)}(R12)", f"{off(16*h)}(R13)"][:ntok],
                                  [(8, 9), (13, 14)], 15)
            ins(*code)
            for r in range(4):
                for u in range(ntok):
                    for j, (o, reg) in enumerate(ops[u]):
                        t = 10 + j
                        ins(f"VPMADDWD {off(32*h + o)}({qregs[r]})(CX*1), Y{reg}, Y{t}",
                            f"VPADDD Y{t}, Y{acc(r, u)}, Y{acc(r, u)}")
        ins("ADDQ $32, R12", "ADDQ $32, R13", "ADDQ $128, CX", "CMPQ CX, DX", f"JLT {label}")

    ins("MOVQ nt+48(FP), AX", "SHRQ $1, AX", f"JZ {name}odd")
    w(f"{name}pair:")
    for i in range(8):
        ins(f"VPXOR Y{i}, Y{i}, Y{i}")
    ins(*prefetch(2))
    chunk(f"{name}chunk", 2)
    ins(*pair_store_int(), "ADDQ $8, DI", "LEAQ (SI)(BX*2), SI", "DECQ AX", f"JNZ {name}pair")
    w(f"{name}odd:")
    ins("MOVQ nt+48(FP), AX", "ANDQ $1, AX", f"JZ {name}done")
    for i in range(4):
        ins(f"VPXOR Y{i}, Y{i}, Y{i}")
    chunk(f"{name}ochunk", 1)
    ins(*single_store_int("BX"))
    w(f"{name}done:")
    ins("VZEROUPPER", "RET")
    w()


def vaxpy_maddw(fmt, rows=4):
    name = f"qvaxpy{rows}{fmt}maddw"
    w(f"// func {name}(acc *float32, accrb int, v *byte, vrb int, np int, odd int, w *int32, wpb int, bpg int, alpha *[4]float32, sc *[4]float32, zt *float32, zrb int, pfd int, nb int, wstep int)")
    w("//")
    if rows == 1:
        w("// One row (qvaxpy1" + fmt + "vnni's contract): rows 1-3 are neither read nor written.")
    w("// qvaxpy4" + fmt + "vnni's contract without VNNI over every column of the rows (accrb/4 elements) in")
    w("// one call: blocks of 16 columns, bpg blocks to a scale group of the four-group layout (the")
    w("// weights and zero terms of the block's group 4 bytes on from the last group's); the same")
    w("// int32 sums, exact, and the same float32 steps when stored (bit-identical). Per token pair")
    w("// the two rows are widened to int16 and interleaved")
    if fmt == "i8":
        w("// (VPMOVSXBW, VPUNPCKLWD/HWD: accumulators of elements 0-3, 8-11 and 4-7, 12-15), dotted by")
    else:
        w("// (VPUNPCKLBW, VPMOVZXBW), split into even and odd elements (VPAND, VPSRLW), dotted by")
    w("// VPMADDWD with the pair's weight dword broadcast (VPBROADCASTD) and summed by VPADDD. The")
    w("// first block prefetches the rows pfd bytes ahead. nb and wstep are unused (qvaxpy4*vnni's).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-128")
    ins("MOVQ vrb+24(FP), BX", "MOVQ zrb+96(FP), R9", "LEAQ (R9)(R9*2), R11", "MOVQ pfd+104(FP), CX",
        "XORQ R15, R15", "XORQ R13, R13", "MOVQ bpg+64(FP), R10")
    if fmt == "i4":
        ins("MOVL $0x000f000f, DX", "VMOVD DX, X7", "VPBROADCASTD X7, Y7")
    wrow = ["(R8)", "(R8)(R9*1)", "(R8)(R9*2)", "(R8)(R11*1)"]

    def body():
        if fmt == "i8":
            ins("VPMOVSXBW (SI), Y0", "VPMOVSXBW (SI)(BX*1), Y1", "VPUNPCKLWD Y1, Y0, Y2", "VPUNPCKHWD Y1, Y0, Y3")
        else:
            ins("VMOVQ (SI), X0", "VMOVQ (SI)(BX*1), X1", "VPUNPCKLBW X1, X0, X0", "VPMOVZXBW X0, Y0",
                "VPSRLW $4, Y0, Y3", "VPAND Y7, Y0, Y2")
        for r in range(rows):
            ins(f"VBROADCASTSS {wrow[r]}, Y4", f"VPMADDWD Y4, Y2, Y5", f"VPADDD Y5, Y{8+2*r}, Y{8+2*r}",
                f"VPMADDWD Y4, Y3, Y6", f"VPADDD Y6, Y{9+2*r}, Y{9+2*r}")

    def pairs(lb, prefetch):
        w(f"{name}{lb}:")
        if prefetch:
            ins("LEAQ (SI)(CX*1), R12", "PREFETCHT1 (R12)", "PREFETCHT1 (R12)(BX*1)")
            if fmt == "i8":  # a 128-byte row spans two cache lines
                ins("PREFETCHT1 64(R12)", "PREFETCHT1 64(R12)(BX*1)")
        body()
        ins("ADDQ wpb+56(FP), R8", "LEAQ (SI)(BX*2), SI", "DECQ AX", f"JNZ {name}{lb}", f"JMP {name}odd")

    w(f"{name}blk:")
    ins("MOVQ np+32(FP), AX", "MOVQ v+16(FP), SI", "MOVQ R15, R12", f"SHLQ ${4 if fmt == 'i8' else 3}, R12",
        "ADDQ R12, SI", "MOVQ w+48(FP), R8", "ADDQ R13, R8")
    for i in range(8, 8 + 2 * rows):
        ins(f"VPXOR Y{i}, Y{i}, Y{i}")
    ins("TESTQ AX, AX", f"JZ {name}odd", "TESTQ R15, R15", f"JNZ {name}pair")
    pairs("pairpf", True)
    pairs("pair", False)
    w(f"{name}odd:")
    ins("MOVQ odd+40(FP), AX", "TESTQ AX, AX", f"JZ {name}store", "XORQ BX, BX")
    body()
    w(f"{name}store:")
    ins("MOVQ acc+0(FP), DI", "MOVQ R15, R12", "SHLQ $6, R12", "ADDQ R12, DI", "MOVQ accrb+8(FP), BX",
        "MOVQ alpha+72(FP), R12", "MOVQ sc+80(FP), DX", "MOVQ zt+88(FP), R14", "ADDQ R13, R14")
    for r in range(rows):
        lo, hi = 8 + 2 * r, 9 + 2 * r
        ins(f"VBROADCASTSS {off(4*r)}(R12), Y4", f"VBROADCASTSS {off(4*r)}(DX), Y5",
            f"VCVTDQ2PS Y{lo}, Y{lo}", f"VCVTDQ2PS Y{hi}, Y{hi}")
        if fmt == "i4":  # even and odd elements back in order
            ins(f"VUNPCKLPS Y{hi}, Y{lo}, Y2", f"VUNPCKHPS Y{hi}, Y{lo}, Y3", "VPERM2F128 $0x20, Y3, Y2, Y0",
                "VPERM2F128 $0x31, Y3, Y2, Y1", "VBROADCASTSS (R14), Y6")
        else:
            ins(f"VPERM2F128 $0x20, Y{hi}, Y{lo}, Y0", f"VPERM2F128 $0x31, Y{hi}, Y{lo}, Y1")
        for x in range(2):
            ins(f"VMULPS {off(32*x)}(DI), Y4, Y2", f"VFMADD231PS Y{x}, Y5, Y2")
            if fmt == "i4":
                ins("VADDPS Y6, Y2, Y2")
            ins(f"VMOVUPS Y2, {off(32*x)}(DI)")
        ins("ADDQ BX, DI")
        if fmt == "i4":
            ins("ADDQ R9, R14")
    # the next block: its group's weights 4 bytes on after bpg blocks
    ins("MOVQ vrb+24(FP), BX", "INCQ R15", "DECQ R10", f"JNZ {name}next", "MOVQ bpg+64(FP), R10", "ADDQ $4, R13")
    w(f"{name}next:")
    ins("MOVQ accrb+8(FP), R12", "SHRQ $6, R12", "CMPQ R15, R12", f"JLT {name}blk")
    ins("VZEROUPPER", "RET")
    w()


def zscales(src, dst, ng):
    """Four tokens' V scales (or zeros) at src in the layout of two pairs (qvwprep's pair
    layout, the second pair in the upper 256 bits) into Z{dst}, by the index vector in Z16."""
    if ng == 4:
        return [f"VPERMPS {src}, Z16, Z{dst}"]
    return [f"VMOVUPS {src}, Y{dst}", f"VPERMPS Z{dst}, Z16, Z{dst}"]


def vint(ng, isa, rows=4):
    """AVX-512 VNNI accumulation of V over token pairs: softmax weights times V scales
    quantized to int16 per row (qvwprep), V rows widened to int16 and interleaved
    by token pair, VPDPWSSD with the pair's weights broadcast from memory.

    ng: V scale groups per row, 4 (qvwprep) or 2 (qvwprep2: each group's
    scale and zero stand for two groups of the four-group layout, as if repeated). isa "avx2":
    the same functions (suffix avx2) in AVX2 encodings only (the same weights bit for bit), and
    with ng 4 the AVX2 accumulation loops (vaxpy_maddw). rows 1 (qvwprep1*): the weights of
    row 0 alone (the one-row loops, qvaxpy1*), dense (wpb 16): the same operations in the same
    order as row 0 of the four-row functions, so the same weights and zero terms bit for bit."""
    sfx = ("1" if rows == 1 else "") + ("" if ng == 4 else "2") + ("avx2" if isa == "avx2" else "")
    perm = "vwperm" if ng == 4 else "vwperm2"
    sb = 4 * ng * 2  # scale bytes per token pair

    def ldpair(src, dst):  # the two tokens' scales, interleaved by group into Y{dst}
        if ng == 4:
            return [f"VPERMPS {src}, Y15, Y{dst}"]
        return [f"VMOVUPS {src}, X{dst}", f"VPERMPS Y{dst}, Y15, Y{dst}"]

    def ldodd(src, dst):  # the last token's (the other's lanes 0)
        return [f"VMOVUPS {src}, X{dst}" if ng == 4 else f"VMOVSD {src}, X{dst}", f"VPERMPS Y{dst}, Y15, Y{dst}"]

    nm = f"qvwprep{sfx}"
    w(f"// func {nm}(w *int32, p *float32, ldP int, vs *float32, n int, vz *float32, zt *[16]float32, ms *[3][4]float32)")
    w("//")
    w("// The int16 weights of the integer accumulation loop in one call, three passes over the")
    w("// part's weights (L1):")
    if ng == 4:
        w("// 1. ms[0][r] = max_t,g |p[r*ldP/4 + t] * vs[4t + g]| over tokens t < n (four scale groups")
        w("//    per row) for the four rows r (p >= 0);")
    else:
        w("// 1. ms[0][r] = max_t,g |p[r*ldP/4 + t] * vs[2t + g]| (rows of two scale groups);")
    w("// 2. ms[1][r] = 16383/ms[0][r] where that is finite and ms[0][r] > 0, else 0 (every weight")
    w("//    0; a NaN maximum keeps the row's NaN in ms[2]), ms[2][r] = ms[0][r]/16383 (the step);")
    if ng == 4:
        w("// 3. for token pairs j (the last one padded with a zero weight when n is odd), rows r < 4")
        w("//    and groups g < 4, w[16j + 4r + g] packs round(p_r,2j * vs[8j+g] * ms[1][r]) (low")
        w("//    word) and the same of token 2j+1 (high word). vz != nil (int4): zt[4r + g] = sum_t")
        w("//    p_rt * vz[4t + g].")
    else:
        w("// 3. the weights in the four-group layout: w[16j + 4r + g] from vs[4j + g/2], and")
        w("//    zt[4r + g] = sum_t p_rt * vz[2t + g/2].")
    if rows == 1:
        w("// One row (rows 1-3 of ms 0, zt and w only row 0's): w[4j + g], 16 bytes a token pair.")
    w(f"TEXT ·{nm}(SB), NOSPLIT, $0-64")
    mx = nm + "m"
    ins("MOVQ p+8(FP), R8", "MOVQ ldP+16(FP), DX", "LEAQ (R8)(DX*1), R9", "LEAQ (R9)(DX*1), R10",
        "LEAQ (R10)(DX*1), R11", "MOVQ vs+24(FP), SI", "MOVQ n+32(FP), AX", "MOVQ ms+56(FP), DI",
        f"VMOVDQU {perm}<>(SB), Y15", "MOVL $0x7fffffff, CX",
        *(["VPBROADCASTD CX, Y14"] if isa == "avx512" else ["VMOVD CX, X14", "VPBROADCASTD X14, Y14"]),
        "VXORPS Y0, Y0, Y0", "VXORPS Y1, Y1, Y1", "VXORPS Y2, Y2, Y2", "VXORPS Y3, Y3, Y3",
        "XORQ CX, CX")
    pr = ["R8", "R9", "R10", "R11"]
    if isa == "avx512":
        # four tokens a step in zmm (two pairs: the pair layout twice), then the pair loop
        # for the last pair and the odd token; the maxima in Z0-Z3 folded into Y0-Y3
        ins("VMOVDQU32 " + ("vwq4idx" if ng == 4 else "vwq2idx") + "<>(SB), Z16", "VMOVDQU32 vwpidx<>(SB), Z17",
            "MOVL $0x7fffffff, BX", "VPBROADCASTD BX, Z18",
            "MOVQ AX, BX", "SHRQ $2, BX", f"JZ {mx}qdone")
        w(f"{mx}quad:")
        ins(*zscales("(SI)", 19, ng), "VANDPS Z18, Z19, Z19")
        for r in range(rows):
            ins(f"VMOVUPS ({pr[r]})(CX*4), X20", "VPERMPS Z20, Z17, Z20", "VMULPS Z19, Z20, Z20",
                f"VMAXPS Z20, Z{r}, Z{r}")
        ins(f"ADDQ ${2*sb}, SI", "ADDQ $4, CX", "DECQ BX", f"JNZ {mx}quad")
        w(f"{mx}qdone:")
        for r in range(4):
            ins(f"VEXTRACTF64X4 $1, Z{r}, Y5", f"VMAXPS Y5, Y{r}, Y{r}")
        ins("MOVQ AX, BX", "ANDQ $3, AX", "SHRQ $1, AX", "XCHGQ AX, BX", "TESTQ BX, BX", f"JZ {mx}odd")
    else:
        ins("MOVQ AX, BX", "SHRQ $1, BX", f"JZ {mx}odd")
    w(f"{mx}pair:")
    ins(*ldpair("(SI)", 4), "VANDPS Y14, Y4, Y4")
    for r in range(rows):
        ins(f"VBROADCASTSD ({pr[r]})(CX*4), Y5", "VMULPS Y4, Y5, Y5", f"VMAXPS Y5, Y{r}, Y{r}")
    ins(f"ADDQ ${sb}, SI", "ADDQ $2, CX", "DECQ BX", f"JNZ {mx}pair")
    w(f"{mx}odd:")
    ins("ANDQ $1, AX", f"JZ {mx}done", *ldodd("(SI)", 4), "VANDPS Y14, Y4, Y4")
    for r in range(rows):
        ins(f"VMOVSS ({pr[r]})(CX*4), X5", "VPBROADCASTQ X5, Y5", "VMULPS Y4, Y5, Y5", f"VMAXPS Y5, Y{r}, Y{r}")
    w(f"{mx}done:")
    for r in range(4):
        ins(f"VEXTRACTF128 $1, Y{r}, X5", f"VMAXPS X5, X{r}, X{r}", f"VPERMILPS $0x4e, X{r}, X5",
            f"VMAXPS X5, X{r}, X{r}", f"VPERMILPS $0xb1, X{r}, X5", f"VMAXPS X5, X{r}, X{r}",
            f"VMOVSS X{r}, {off(4*r)}(DI)")
    # 2: the inverse steps and the steps of the four rows at once (float32 divisions)
    ins("VMOVUPS (DI), X0", "MOVL $0x467ffc00, CX", "VMOVD CX, X1", "VBROADCASTSS X1, X1",
        "MOVL $0x7f800000, CX", "VMOVD CX, X3", "VBROADCASTSS X3, X3",
        "VDIVPS X0, X1, X2", "VCMPPS $0x11, X3, X2, X4", "VANDPS X4, X2, X2", "VMOVUPS X2, 16(DI)",
        "VDIVPS X1, X0, X5", "VMOVUPS X5, 32(DI)")
    # 3: the weights
    qn = nm + "q"
    ins("MOVQ w+0(FP), DI", "MOVQ vs+24(FP), SI", "MOVQ n+32(FP), AX",
        "MOVQ vz+40(FP), R13", "MOVQ R13, R14")
    for r in range(4):
        ins(f"VSHUFPS ${r * 0x55}, X2, X2, X{8+r}", f"VINSERTF128 $1, X{8+r}, Y{8+r}, Y{8+r}",
            f"VXORPS Y{4+r}, Y{4+r}, Y{4+r}")
    ins("XORQ CX, CX")
    if isa == "avx512":
        # four tokens a step: two pairs' weights per zmm, stored 64 bytes apart; the zero terms
        # (int4) summed pair by pair in Y4-Y7 as in the pair loop (the same order of sums)
        ins("VMOVDQU32 " + ("vwq4idx" if ng == 4 else "vwq2idx") + "<>(SB), Z16", "VMOVDQU32 vwpidx<>(SB), Z17")
        for r in range(4):
            ins(f"VBROADCASTSS X{8+r}, Z{22+r}")
        ins("MOVQ AX, BX", "SHRQ $2, BX", f"JZ {qn}qdone")
        w(f"{qn}quad:")
        ins(*zscales("(SI)", 19, ng), "TESTQ R14, R14", f"JZ {qn}qnoz", *zscales("(R13)", 20, ng))
        w(f"{qn}qnoz:")
        t = [26, 27, 28, 29]
        for r in range(rows):
            ins(f"VMOVUPS ({pr[r]})(CX*4), X{t[r]}", f"VPERMPS Z{t[r]}, Z17, Z{t[r]}")
        ins("TESTQ R14, R14", f"JZ {qn}qnozt")
        for r in range(rows):
            ins(f"VFMADD231PS Y20, Y{t[r]}, Y{4+r}")
        ins("VEXTRACTF64X4 $1, Z20, Y21")
        for r in range(rows):
            ins(f"VEXTRACTF64X4 $1, Z{t[r]}, Y30", f"VFMADD231PS Y21, Y30, Y{4+r}")
        w(f"{qn}qnozt:")
        for r in range(rows):
            ins(f"VMULPS Z19, Z{t[r]}, Z{t[r]}", f"VMULPS Z{22+r}, Z{t[r]}, Z{t[r]}", f"VCVTPS2DQ Z{t[r]}, Z{t[r]}")
        if rows == 1:  # the two pairs' words in order (the signed saturation of VPACKSSDW)
            ins(f"VPMOVSDW Z{t[0]}, (DI)")
        for h in range(2 if rows == 4 else 0):
            a, b = t[2*h], t[2*h+1]
            ins(f"VPACKSSDW Z{b}, Z{a}, Z{a}", f"VPERMQ $0xd8, Z{a}, Z{a}", f"VMOVDQU64 Y{a}, {off(32*h)}(DI)",
                f"VEXTRACTI64X4 $1, Z{a}, {64+32*h}(DI)")
        ins(f"ADDQ ${2*sb}, SI", f"ADDQ ${2*sb}, R13", f"ADDQ ${32 * rows}, DI", "ADDQ $4, CX", "DECQ BX",
            f"JNZ {qn}quad")
        w(f"{qn}qdone:")
        ins("MOVQ AX, BX", "ANDQ $3, BX", "SHRQ $1, BX", f"JZ {qn}odd")
    else:
        ins("MOVQ AX, BX", "SHRQ $1, BX", f"JZ {qn}odd")

    def body(odd):
        ld = ldodd if odd else ldpair
        ins(*ld("(SI)", 0))
        ins("TESTQ R14, R14", f"JZ {qn}{'o' if odd else 'p'}noz")
        ins(*ld("(R13)", 1))
        w(f"{qn}{'o' if odd else 'p'}noz:")
        t = [2, 3, 12, 13]  # row r's int32 weights
        for r in range(rows):
            if odd:
                ins(f"VMOVSS ({pr[r]})(CX*4), X{t[r]}", f"VPBROADCASTQ X{t[r]}, Y{t[r]}")
            else:
                ins(f"VBROADCASTSD ({pr[r]})(CX*4), Y{t[r]}")
            ins(f"VFMADD231PS Y1, Y{t[r]}, Y{4+r}", f"VMULPS Y0, Y{t[r]}, Y{t[r]}", f"VMULPS Y{8+r}, Y{t[r]}, Y{t[r]}",
                f"VCVTPS2DQ Y{t[r]}, Y{t[r]}")
        if rows == 1:  # the row's words: the low 128 bits
            ins(f"VPACKSSDW Y{t[0]}, Y{t[0]}, Y{t[0]}", f"VPERMQ $0x08, Y{t[0]}, Y{t[0]}", f"VMOVDQU X{t[0]}, (DI)")
        # two rows' int16 weights at once (signed saturation), back in row order by VPERMQ
        for h in range(2 if rows == 4 else 0):
            a, b = t[2*h], t[2*h+1]
            ins(f"VPACKSSDW Y{b}, Y{a}, Y{a}", f"VPERMQ $0xd8, Y{a}, Y{a}", f"VMOVDQU Y{a}, {off(32*h)}(DI)")

    w(f"{qn}pair:")
    ins("VXORPS Y1, Y1, Y1")
    body(False)
    ins(f"ADDQ ${sb}, SI", f"ADDQ ${sb}, R13", f"ADDQ ${16 * rows}, DI", "ADDQ $2, CX", "DECQ BX", f"JNZ {qn}pair")
    w(f"{qn}odd:")
    ins("ANDQ $1, AX", f"JZ {qn}zt", "VXORPS Y1, Y1, Y1")
    body(True)
    w(f"{qn}zt:")
    ins("MOVQ zt+48(FP), DI", "TESTQ R14, R14", f"JZ {qn}done")
    for r in range(rows):
        ins(f"VHADDPS Y{4+r}, Y{4+r}, Y{4+r}", f"VPERMQ $0x08, Y{4+r}, Y{4+r}", f"VMOVUPS X{4+r}, {off(16*r)}(DI)")
    w(f"{qn}done:")
    ins("VZEROUPPER", "RET")
    w()
    if ng == 4 and rows == 4:
        # one row: int4 only (for int8 the weights' preparation costs what the loop saves
        # over the float one, and beyond the L3 it was slower; see kern_quant_amd64.go)
        for rows, fmt in ((4, "i8"), (4, "i4"), (1, "i4")):
            if isa == "avx512":
                vaxpy(fmt, rows)
            else:
                vaxpy_maddw(fmt, rows)


def sumsq(isa):
    """Sum of squares of two float32 runs (scalesSafe's check of a segment's scales and zeros):
    AVX-512 with the tail of each run by a masked load, AVX2 with a scalar tail."""
    lanes, vp = ISAS[isa]
    name = f"qsumsq2{isa}"
    w(f"// func {name}(a *float32, na int, b *float32, nb int) float32")
    w("//")
    w(f"// sum_i a[i]^2 + sum_i b[i]^2 in float32 ({lanes} partial sums; NaN or +Inf when any term is).")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-36")
    ins(f"VXORPS {vp}0, {vp}0, {vp}0", f"VXORPS {vp}1, {vp}1, {vp}1")
    for run, (p, n) in enumerate((("a+0(FP)", "na+8(FP)"), ("b+16(FP)", "nb+24(FP)"))):
        lb = f"{name}r{run}"
        ins(f"MOVQ {p}, SI", f"MOVQ {n}, CX")
        w(f"{lb}loop:")
        ins(f"CMPQ CX, ${lanes}", f"JLT {lb}tail", f"VMOVUPS (SI), {vp}2", f"VFMADD231PS {vp}2, {vp}2, {vp}0",
            f"ADDQ ${4*lanes}, SI", f"SUBQ ${lanes}, CX", f"JMP {lb}loop")
        w(f"{lb}tail:")
        if isa == "avx512":
            ins("TESTQ CX, CX", f"JZ {lb}done", "MOVL $1, AX", "SHLL CX, AX", "DECL AX", "KMOVW AX, K1",
                "VMOVUPS.Z (SI), K1, Z2", "VFMADD231PS Z2, Z2, Z1")
        else:  # lane 0 of Y1
            ins("TESTQ CX, CX", f"JZ {lb}done", "VMOVSS (SI), X2", "VFMADD231SS X2, X2, X1", "ADDQ $4, SI",
                "DECQ CX", f"JMP {lb}tail")
        w(f"{lb}done:")
    ins(f"VADDPS {vp}1, {vp}0, {vp}0")
    if isa == "avx512":
        ins("VEXTRACTF64X4 $1, Z0, Y1", "VADDPS Y1, Y0, Y0")
    ins("VEXTRACTF128 $1, Y0, X1",
        "VADDPS X1, X0, X0", "VHADDPS X0, X0, X0", "VHADDPS X0, X0, X0", "VMOVSS X0, ret+32(FP)",
        "VZEROUPPER", "RET")
    w()


def max4(isa):
    """The maxima of four score rows in one call (quantOps.max4): the quantized super-block's
    maxOf, four independent chains, and a non-finite test by sums of x*0 (NaN exactly when some
    score is not finite), so a row's result is NaN then, as maxOf's."""
    lanes, vp = ISAS[isa]
    name = f"qmax4{isa}"
    w(f"// func {name}(s *float32, ldS int, n int, m *[4]float32)")
    w("//")
    w("// m[r] = max_t s[r*ldS/4 + t] over t < n (n >= 1) for rows r < 4, or NaN when a score of")
    w(f"// row r is not finite. Vectors of {lanes}, the last one overlapping the one before it")
    w(f"// (n >= {lanes}); rows shorter than {lanes} scalar.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-32")
    rows = ["SI", "R8", "R9", "R10"]
    ins("MOVQ s+0(FP), SI", "MOVQ ldS+8(FP), DX", "LEAQ (SI)(DX*1), R8", "LEAQ (R8)(DX*1), R9",
        "LEAQ (R9)(DX*1), R10", "MOVQ n+16(FP), CX", f"VXORPS {vp}15, {vp}15, {vp}15")
    for r in range(4):
        ins(f"VXORPS {vp}{4+r}, {vp}{4+r}, {vp}{4+r}")
    ins(f"CMPQ CX, ${lanes}", f"JLT {name}short")
    for r in range(4):
        ins(f"VMOVUPS ({rows[r]}), {vp}{r}", f"VFMADD231PS {vp}15, {vp}{r}, {vp}{4+r}")
    ins(f"MOVQ ${lanes}, AX")
    w(f"{name}loop:")
    ins(f"LEAQ {lanes}(AX), BX", "CMPQ BX, CX", f"JGT {name}last")
    for r in range(4):
        ins(f"VMOVUPS ({rows[r]})(AX*4), {vp}{8+r}", f"VMAXPS {vp}{8+r}, {vp}{r}, {vp}{r}",
            f"VFMADD231PS {vp}15, {vp}{8+r}, {vp}{4+r}")
    ins("MOVQ BX, AX", f"JMP {name}loop")
    w(f"{name}last:")
    ins("CMPQ AX, CX", f"JEQ {name}red", f"LEAQ -{lanes}(CX), AX")
    for r in range(4):
        ins(f"VMOVUPS ({rows[r]})(AX*4), {vp}{8+r}", f"VMAXPS {vp}{8+r}, {vp}{r}, {vp}{r}",
            f"VFMADD231PS {vp}15, {vp}{8+r}, {vp}{4+r}")
    w(f"{name}red:")
    for r in range(4):
        a, z = r, 4 + r
        if vp == "Z":
            ins(f"VEXTRACTF64X4 $1, Z{a}, Y12", f"VMAXPS Y12, Y{a}, Y{a}",
                f"VEXTRACTF64X4 $1, Z{z}, Y12", f"VADDPS Y12, Y{z}, Y{z}")
        ins(f"VEXTRACTF128 $1, Y{a}, X12", f"VMAXPS X12, X{a}, X{a}", f"VPERMILPS $0x4e, X{a}, X12",
            f"VMAXPS X12, X{a}, X{a}", f"VPERMILPS $0xb1, X{a}, X12", f"VMAXPS X12, X{a}, X{a}",
            f"VEXTRACTF128 $1, Y{z}, X12", f"VADDPS X12, X{z}, X{z}", f"VHADDPS X{z}, X{z}, X{z}",
            f"VHADDPS X{z}, X{z}, X{z}")
    ins(f"JMP {name}out")
    w(f"{name}short:")
    for r in range(4):
        ins(f"VMOVSS ({rows[r]}), X{r}")
    ins("MOVQ $1, AX")
    w(f"{name}sloop:")
    ins("CMPQ AX, CX", f"JGE {name}sdone")
    for r in range(4):
        ins(f"VMOVSS ({rows[r]})(AX*4), X{8+r}", f"VMAXSS X{8+r}, X{r}, X{r}", f"VFMADD231SS X15, X{8+r}, X{4+r}")
    ins("INCQ AX", f"JMP {name}sloop")
    w(f"{name}sdone:")
    for r in range(4):  # the first element's x*0 too
        ins(f"VMOVSS ({rows[r]}), X{8+r}", f"VFMADD231SS X15, X{8+r}, X{4+r}")
    w(f"{name}out:")
    # [m0 m1 m2 m3] and [z0 z1 z2 z3]: z where it is not 0 (NaN), else m
    ins("VINSERTPS $0x10, X1, X0, X0", "VINSERTPS $0x20, X2, X0, X0", "VINSERTPS $0x30, X3, X0, X0",
        "VINSERTPS $0x10, X5, X4, X4", "VINSERTPS $0x20, X6, X4, X4", "VINSERTPS $0x30, X7, X4, X4",
        "VCMPPS $4, X15, X4, X8", "VBLENDVPS X8, X4, X0, X0", "MOVQ m+24(FP), DI", "VMOVUPS X0, (DI)",
        "VZEROUPPER", "RET")
    w()


def vaxpy(fmt, rows=4):
    name = f"qvaxpy{rows}{fmt}vnni"
    w(f"// func {name}(acc *float32, accrb int, v *byte, vrb int, np int, odd int, w *int32, wpb int, s2 int, alpha *[4]float32, sc *[4]float32, zt *float32, zrb int, pfd int, nb int, wstep int)")
    w("//")
    if rows == 1:
        w("// qvaxpy4" + fmt + "vnni for one row (MHA decode, or the rows left after the groups of four):")
        w("// the weights of rows 1-3 and their accumulators are neither read nor written.")
    w("// nb column blocks of 64 elements of four rows, one after the other, block i's weights and")
    w("// zero terms wstep*i bytes on (the first block prefetches pfd bytes ahead, the others not);")
    w("// each: acc_r = alpha[r]*acc_r + sc[r] * sum_t w_rt")
    w("// * q_t" + (" + zt_r (int4: the zero term of the element's group)" if fmt == "i4" else "") + ", acc rows accrb bytes apart,")
    w("// V rows (" + ("int8" if fmt == "i8" else "int4") + ") vrb bytes apart, np token pairs and an odd last token (odd = 1,")
    w("// its pair's second weight 0). The weights (qvwprep) are int16 pairs, one dword per row")
    w("// and scale group: row r's for the block's first 32 elements at w + r*zrb, its second 32")
    w("// s2 bytes further, the next pair's wpb bytes on; zt likewise (rows zrb bytes apart).")
    if fmt == "i8":
        w("// V rows are interleaved by pair (VPUNPCKLBW/HBW in 128-bit lanes: the accumulators hold")
        w("// elements 0-7, 16-23 and 8-15, 24-31 of 32) and widened to int16 (VPMOVSXBW), dotted")
    else:
        w("// V rows are interleaved by pair (VPUNPCKLBW/HBW), widened to int16 (VPMOVZXBW) and split")
        w("// into even and odd elements (VPANDD, VPSRLW), dotted")
    w("// by VPDPWSSD with the weight dword broadcast (VPBROADCASTD, once for the two halves of")
    w("// the block's elements); int32 sums, exact (|w| <= 16383, |q| <= 128,")
    w("// at most 1024 tokens a call), put back in element order when the block is stored.")
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-128")
    ins("MOVQ nb+112(FP), R15")
    w(f"{name}blk:")
    ins("MOVQ v+16(FP), SI", "MOVQ vrb+24(FP), BX", "MOVQ w+48(FP), R8", "MOVQ zrb+96(FP), R9",
        "LEAQ (R9)(R9*2), R11", "MOVQ s2+64(FP), R10", "ADDQ R8, R10", "MOVQ np+32(FP), AX",
        "MOVQ pfd+104(FP), CX")
    if fmt == "i4":
        ins("MOVL $0x000f000f, DX", "VPBROADCASTD DX, Z15")
    for i in range(16, 16 + 4 * rows):
        ins(f"VPXORD Z{i}, Z{i}, Z{i}")

    def acc(r, h, x):
        return f"Z{16 + r*4 + h*2 + x}"

    def wrow(r, h):
        b = "R8" if h == 0 else "R10"
        return [f"({b})", f"({b})(R9*1)", f"({b})(R9*2)", f"({b})(R11*1)"][r]

    def body():
        for h in range(2):
            if fmt == "i8":
                ins(f"VMOVDQU {off(32*h)}(SI), Y0", f"VMOVDQU {off(32*h)}(SI)(BX*1), Y1",
                    "VPUNPCKLBW Y1, Y0, Y2", "VPUNPCKHBW Y1, Y0, Y3", "VPMOVSXBW Y2, Z2", "VPMOVSXBW Y3, Z3")
            else:
                ins(f"VMOVDQU {off(16*h)}(SI), X0", f"VMOVDQU {off(16*h)}(SI)(BX*1), X1",
                    "VPUNPCKLBW X1, X0, X2", "VPUNPCKHBW X1, X0, X3", "VINSERTI128 $1, X3, Y2, Y2",
                    # words of zero-extended bytes: the high nibble is word >> 4 as it is
                    "VPMOVZXBW Y2, Z2", "VPSRLW $4, Z2, Z3", "VPANDD Z15, Z2, Z2")
            # each weight dword broadcast once into Z4-Z11 for its two VPDPWSSD (one load
            # instead of two)
            for r in range(rows):
                ins(f"VPBROADCASTD {wrow(r, h)}, Z{4+4*h+r}")
            for r in range(rows):
                for x in range(2):
                    ins(f"VPDPWSSD Z{4+4*h+r}, Z{2+x}, {acc(r, h, x)}")

    ins("TESTQ AX, AX", f"JZ {name}odd")
    w(f"{name}pair:")
    ins("LEAQ (SI)(CX*1), R12", "PREFETCHT1 (R12)", "PREFETCHT1 (R12)(BX*1)")
    if fmt == "i8":  # a 128-byte row spans two cache lines
        ins("PREFETCHT1 64(R12)", "PREFETCHT1 64(R12)(BX*1)")
    body()
    ins("ADDQ wpb+56(FP), R8", "ADDQ wpb+56(FP), R10", "LEAQ (SI)(BX*2), SI", "DECQ AX", f"JNZ {name}pair")
    w(f"{name}odd:")
    ins("MOVQ odd+40(FP), AX", "TESTQ AX, AX", f"JZ {name}store", "XORQ BX, BX")
    body()
    w(f"{name}store:")
    ins("MOVQ acc+0(FP), DI", "MOVQ accrb+8(FP), BX", "MOVQ alpha+72(FP), R12", "MOVQ sc+80(FP), R13",
        "MOVQ zt+88(FP), R14", "MOVQ s2+64(FP), R10")
    for r in range(rows):
        ins(f"VBROADCASTSS {off(4*r)}(R12), Z12", f"VBROADCASTSS {off(4*r)}(R13), Z13")
        for h in range(2):
            lo, hi = acc(r, h, 0), acc(r, h, 1)
            if fmt == "i4":
                # even/odd elements -> the int8 layout (elements 8k..8k+3, 8k+4..8k+7 per lane)
                ins(f"VPUNPCKLDQ {hi}, {lo}, Z0", f"VPUNPCKHDQ {hi}, {lo}, Z1")
                ins("VCVTDQ2PS Z0, Z0", "VCVTDQ2PS Z1, Z1",
                    "VSHUFF32X4 $0x44, Z1, Z0, Z2", "VSHUFF32X4 $0xee, Z1, Z0, Z3",
                    "VSHUFF32X4 $0xd8, Z2, Z2, Z2", "VSHUFF32X4 $0xd8, Z3, Z3, Z3")
            else:
                # lanes of lo: elements 0-7, 16-23; of hi: 8-15, 24-31
                ins(f"VCVTDQ2PS {lo}, Z0", f"VCVTDQ2PS {hi}, Z1",
                    "VSHUFF32X4 $0x44, Z1, Z0, Z2", "VSHUFF32X4 $0xee, Z1, Z0, Z3")
            if fmt == "i4":
                ins("VBROADCASTSS (R14), Z14" if h == 0 else "VBROADCASTSS (R14)(R10*1), Z14")
            for x in range(2):
                o = 128 * h + 64 * x
                ins(f"VMULPS {off(o)}(DI), Z12, Z{4+x}", f"VFMADD231PS Z{2+x}, Z13, Z{4+x}")
                if fmt == "i4":
                    ins(f"VADDPS Z14, Z{4+x}, Z{4+x}")
                ins(f"VMOVUPS Z{4+x}, {off(o)}(DI)")
        ins("ADDQ BX, DI")
        if fmt == "i4":
            ins("ADDQ zrb+96(FP), R14")
    # the next column block: its accumulators, V bytes, weights and zero terms
    ins("ADDQ $256, acc+0(FP)", f"ADDQ ${64 if fmt == 'i8' else 32}, v+16(FP)", "MOVQ wstep+120(FP), AX",
        "ADDQ AX, w+48(FP)", "ADDQ AX, zt+88(FP)", "MOVQ $0, pfd+104(FP)", "DECQ R15", f"JNZ {name}blk")
    ins("VZEROUPPER", "RET")
    w()



w("//go:build goexperiment.simd && amd64")
w()
w("// Code generated by asmgen_quant.py; DO NOT EDIT.")
w("// AVX-512 and AVX2+FMA loops of the decode attention kernel over quantized (int8, int4)")
w("// K/V rows read straight from the cache's storage: float32 loops dequantizing in registers,")
w("// and integer loops (AVX-512 VNNI, AVX2). Contracts are in kern_quant_amd64.go.")
w()
w('#include "textflag.h"')
w()
w("// nibmask: 0x0f in every byte (the low nibble of int4 pairs).")
w("DATA nibmask<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f")
w("DATA nibmask<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f")
w("GLOBL nibmask<>(SB), RODATA|NOPTR, $16")
w()
w("// qidx4: VPERMPS indices spreading four row values over the four 128-bit lanes.")
for i in range(16):
    w(f"DATA qidx4<>+{4*i}(SB)/4, ${i // 4}")
w("GLOBL qidx4<>(SB), RODATA|NOPTR, $64")
w()
w("// qevn, qodd: VPERMI2D indices taking the even and the odd dwords of two vectors (qi16Order).")
for i in range(16):
    w(f"DATA qevn<>+{4*i}(SB)/4, ${2*i}")
w("GLOBL qevn<>(SB), RODATA|NOPTR, $64")
for i in range(16):
    w(f"DATA qodd<>+{4*i}(SB)/4, ${2*i+1}")
w("GLOBL qodd<>(SB), RODATA|NOPTR, $64")
w()
w("// vwperm: VPERMPS indices interleaving the four group scales of two tokens.")
for i, x in enumerate([0, 4, 1, 5, 2, 6, 3, 7]):
    w(f"DATA vwperm<>+{4*i}(SB)/4, ${x}")
w("GLOBL vwperm<>(SB), RODATA|NOPTR, $32")
w()
w("// vwq4idx, vwq2idx: vwperm and vwperm2 for four tokens (two pairs, the second in the upper")
w("// 256 bits); vwpidx: a pair of weights p_t, p_t+1 repeated in each 256-bit half.")
for i, x in enumerate([0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]):
    w(f"DATA vwq4idx<>+{4*i}(SB)/4, ${x}")
w("GLOBL vwq4idx<>(SB), RODATA|NOPTR, $64")
for i, x in enumerate([0, 2, 0, 2, 1, 3, 1, 3, 4, 6, 4, 6, 5, 7, 5, 7]):
    w(f"DATA vwq2idx<>+{4*i}(SB)/4, ${x}")
w("GLOBL vwq2idx<>(SB), RODATA|NOPTR, $64")
for i, x in enumerate([0, 1] * 4 + [2, 3] * 4):
    w(f"DATA vwpidx<>+{4*i}(SB)/4, ${x}")
w("GLOBL vwpidx<>(SB), RODATA|NOPTR, $64")
w()
w("// vwperm2: the same from the two group scales of two tokens (each group twice).")
for i, x in enumerate([0, 2, 0, 2, 1, 3, 1, 3]):
    w(f"DATA vwperm2<>+{4*i}(SB)/4, ${x}")
w("GLOBL vwperm2<>(SB), RODATA|NOPTR, $32")
w()
for isa in ("avx512", "avx2"):
    for fmt in ("i8", "i4"):
        for rows in (4, 1):
            for scaled in (False, True):
                dots(rows, fmt, scaled, isa)
            axpy(rows, fmt, isa)
        if isa == "avx2":
            axpy(1, fmt, isa, wide=True)
vnni()
vint(4, "avx512")
vint(2, "avx512")
vint(4, "avx512", rows=1)
vint(2, "avx512", rows=1)
maddw()
vint(4, "avx2")
vint(2, "avx2")
vint(4, "avx2", rows=1)
vint(2, "avx2", rows=1)
sumsq("avx512")
sumsq("avx2")
max4("avx512")
max4("avx2")
print("\n".join(out))
