#!/usr/bin/env python3
"""Writes panel_avx2_amd64.s: the three- and four-row AVX2 decode-step panel kernels.

Each kernel adds a_i . sliver into out row i for a packed sliver of k rows of 32
columns (PackB's layout: 32 floats a row; PackBHalf's: 32 16-bit values a row) with
every row of A in one pass over the sliver. The float32, IEEE half (F16C VCVTPH2PS)
and bfloat16 (VPMOVZXWD + VPSLLD) variants differ only in how eight weights are
loaded, so they come from one template per row count.

Register blocking for the 16 ymm registers:
- three rows: 3 x 32 columns in twelve accumulators (Y4-Y15), the three broadcasts in
  Y0-Y2 and each weight vector loaded once into Y3 and fed to three FMAs (7 loads for
  12 FMAs; each accumulator is updated once per 12 FMAs, so the FMA latency is hidden).
- four rows: 4 x 32 columns would need sixteen accumulators, so the 32 columns run as
  two 16-column halves, each holding 4 rows x 2 vectors in eight accumulators (Y6-Y13)
  with two weight vectors (Y0, Y1) and four broadcasts (Y2-Y5) per step. The halves
  alternate over blocks of P4_BLOCK sliver rows (in L1 for the second half), each
  half's accumulators kept in out between blocks, so the sliver streams from memory
  once, in order. (Each half over the whole sliver, a stride-128-byte walk for
  float32, halved the one-thread four-row decode step's bandwidth from DRAM.)
Run from this directory:  python3 asmgen_panel.py > panel_avx2_amd64.s
(TestAsmgenInSync checks that the committed file is this script's output.)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from asmgen_emit import ins, off, out, w  # noqa: E402

# element size in bytes and the Go type of the packed sliver
KINDS = {"": (4, "float32"), "f16": (2, "uint16"), "bf16": (2, "uint16")}

NR = 32  # columns of a sliver (packNR)
OUT_ROW = NR * 4  # bytes between out rows

# Sliver rows per block of the four-row kernel: both 16-column halves run over a block
# while it is in L1, so memory sees one sequential stream.
P4_BLOCK = 16


def load(kind, addr, reg):
    """Loads eight weights at addr into ymm reg as float32."""
    if kind == "":
        return [f"VMOVUPS {addr}, {reg}"]
    if kind == "f16":
        return [f"VCVTPH2PS {addr}, {reg}"]
    return [f"VPMOVZXWD {addr}, {reg}", f"VPSLLD $16, {reg}, {reg}"]


ROW_REGS = ["SI", "R8", "R9", "R10"]


def header(name, rows, kind):
    es, gotype = KINDS[kind]
    args = ", ".join(f"a{i}" for i in range(rows))
    w(f"// func {name}(k int, {args} *float32, p *{gotype}, out *float32)")
    frame = 8 * (rows + 3)
    w(f"TEXT ·{name}(SB), NOSPLIT, $0-{frame}")
    ins("MOVQ k+0(FP), CX")
    for i in range(rows):
        ins(f"MOVQ a{i}+{8 * (i + 1)}(FP), {ROW_REGS[i]}")
    ins(f"MOVQ p+{8 * (rows + 1)}(FP), DI", f"MOVQ out+{8 * (rows + 2)}(FP), DX")


def store(acc, row, vec):
    """Adds accumulator acc into out row row, column vector vec, and stores it."""
    o = off(row * OUT_ROW + vec * 32)
    ins(f"VADDPS {o}(DX), {acc}, {acc}", f"VMOVUPS {acc}, {o}(DX)")


def panel3(kind):
    es, _ = KINDS[kind]
    name = f"panel3{kind}asm"
    header(name, 3, kind)
    acc = [[f"Y{4 + 4 * r + j}" for j in range(4)] for r in range(3)]
    for r in range(3):
        for j in range(4):
            ins(f"VXORPS {acc[r][j]}, {acc[r][j]}, {acc[r][j]}")
    label = f"p3{kind}loop"
    w(f"{label}:")
    for r in range(3):
        ins(f"VBROADCASTSS 0({ROW_REGS[r]}), Y{r}")
    for j in range(4):
        ins(*load(kind, f"{off(j * 8 * es)}(DI)", "Y3"))
        for r in range(3):
            ins(f"VFMADD231PS Y3, Y{r}, {acc[r][j]}")
    for r in range(3):
        ins(f"ADDQ $4, {ROW_REGS[r]}")
    ins(f"ADDQ ${NR * es}, DI", "DECQ CX", f"JNZ  {label}")
    w()
    for r in range(3):
        for j in range(4):
            store(acc[r][j], r, j)
    ins("VZEROUPPER", "RET")
    w()


def panel4(kind):
    es, _ = KINDS[kind]
    name = f"panel4{kind}asm"
    header(name, 4, kind)
    acc = [[f"Y{6 + 2 * r + j}" for j in range(2)] for r in range(4)]
    outer = f"p4{kind}block"
    w(f"{outer}:")
    # BX = steps in this block: min(P4_BLOCK, steps left)
    ins(f"MOVQ ${P4_BLOCK}, BX", "CMPQ CX, BX", "CMOVQLT CX, BX")
    for h in range(2):
        for r in range(4):
            for j in range(2):
                ins(f"VMOVUPS {off(r * OUT_ROW + (2 * h + j) * 32)}(DX), {acc[r][j]}")
        ins("MOVQ DI, R12", "XORQ R13, R13", "MOVQ BX, R11")
        label = f"p4{kind}half{h}"
        w(f"{label}:")
        for j in range(2):
            ins(*load(kind, f"{off((2 * h + j) * 8 * es)}(R12)", f"Y{j}"))
        for r in range(4):
            ins(f"VBROADCASTSS ({ROW_REGS[r]})(R13*4), Y{2 + r}")
        for r in range(4):
            for j in range(2):
                ins(f"VFMADD231PS Y{j}, Y{2 + r}, {acc[r][j]}")
        ins(f"ADDQ ${NR * es}, R12", "INCQ R13", "DECQ R11", f"JNZ  {label}")
        for r in range(4):
            for j in range(2):
                ins(f"VMOVUPS {acc[r][j]}, {off(r * OUT_ROW + (2 * h + j) * 32)}(DX)")
    ins("MOVQ R12, DI")
    for r in range(4):
        ins(f"LEAQ ({ROW_REGS[r]})(BX*4), {ROW_REGS[r]}")
    ins("SUBQ BX, CX", f"JNZ  {outer}")
    ins("VZEROUPPER", "RET")
    w()


def main():
    w("// Code generated by asmgen_panel.py; DO NOT EDIT.")
    w()
    w("//go:build goexperiment.simd && amd64")
    w()
    w('#include "textflag.h"')
    w()
    w("// Three- and four-row decode-step panel kernels over a packed sliver (see")
    w("// asmgen_panel.py for the register blocking). k > 0.")
    w()
    for kind in KINDS:
        panel3(kind)
        panel4(kind)
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
