#!/usr/bin/env python3
"""Writes panel_avx2_amd64.s: the three- and four-row AVX2 decode-step panel kernels.

Each kernel adds a_i . sliver into out row i for a packed sliver of k rows of 32
columns (PackB's layout: 32 floats a row; PackBHalf's: 32 16-bit values a row) with
all rows of A in one pass over the sliver. The float32, IEEE half (F16C VCVTPH2PS)
and bfloat16 (VPMOVZXWD + VPSLLD) variants differ only in how eight weights are
loaded, so they come from one template.

Register blocking for the 16 ymm registers:
- three rows: 3 x 32 columns in twelve accumulators (Y4-Y15), the three broadcasts in
  Y0-Y2 and each weight vector loaded once into Y3 and fed to three FMAs (7 loads for
  12 FMAs; each accumulator is updated once per 12 FMAs, so the FMA latency is hidden).
- four rows: 4 x 32 columns would need sixteen accumulators plus the broadcasts, so
  rows 0-2 run as above and row 3 is accumulated in out itself: after every two sliver
  rows, its four column vectors are loaded from out, updated by one FMA per sliver row
  (the float32 weights as the FMA's memory operand, L1 hits) and stored back. That
  chain through L1 (a store-to-load forwarding and the FMAs) is walked once per two
  steps: walked once per step, it had made the four-row kernel twice as slow as the
  three-row one with the sliver in L1/L2 (BenchmarkPanel on a Zen 4: 1058-1288 ns
  against 526-675; two steps: 777-874), though from DRAM a 128-byte sliver row takes
  about twenty cycles to arrive and the pass was bound by the weight stream. On a
  loaded Zen 4 (the one-step version; forced AVX2, the decode step's weights cold, best
  of twelve interleaved runs) it
  read 19.1 GB/s on one thread and 26.9 on two where the two two-row passes it
  replaced read 16.6 and 22.8 (0.86x of the one-row rate against 0.74x). The kernels
  tried before it lost: 4 rows x 16 columns (eight accumulators, the two 16-column
  halves each over the whole sliver, or alternating over 16-row blocks with the
  accumulators kept in out) at 0.56x of the one-row rate, and software prefetches of
  the next sliver during the second two-row pass (PREFETCHT0, T1 or NTA) were 10-35%
  slower than none.
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


def rows012(kind, es, acc, k_off, a_off):
    """One step of rows 0-2 (sliver row at byte k_off from DI, A at byte a_off from each row
    pointer) into their twelve accumulators."""
    for r in range(3):
        ins(f"VBROADCASTSS {a_off}({ROW_REGS[r]}), Y{r}")
    for j in range(4):
        ins(*load(kind, f"{off(k_off + j * 8 * es)}(DI)", "Y3"))
        for r in range(3):
            ins(f"VFMADD231PS Y3, Y{r}, {acc[r][j]}")


def row3(kind, es, steps):
    """Row 3 over `steps` consecutive sliver rows, accumulated in out: each of its four column
    vectors is loaded from out once, updated by one FMA per step and stored back."""
    for u in range(steps):
        ins(f"VBROADCASTSS {4 * u}({ROW_REGS[3]}), Y{u}")
    for j in range(4):
        o = off(3 * OUT_ROW + j * 32)
        t = f"Y{2 + j % 2}" if kind == "" else "Y2"
        ins(f"VMOVUPS {o}(DX), {t}")
        for u in range(steps):
            src = off(u * NR * es + j * 8 * es)
            if kind == "":
                ins(f"VFMADD231PS {src}(DI), Y{u}, {t}")
            else:
                ins(*load(kind, f"{src}(DI)", "Y3"))
                ins(f"VFMADD231PS Y3, Y{u}, {t}")
        ins(f"VMOVUPS {t}, {o}(DX)")


def panel(kind, rows):
    """Three or four rows in one pass over a packed sliver.

    Rows 0-2 keep their 32 columns in twelve ymm accumulators. With four rows there is no
    register left for row 3's columns, so row 3's four column vectors are read from out,
    updated and stored back (an L1-resident chain through memory). The four-row kernel runs
    two sliver rows per iteration, so that chain (a store-to-load forwarding plus an FMA per
    update) is walked once per two steps instead of once per step: with the sliver in L1/L2
    it had made the four-row kernel take twice the three-row one's time (BenchmarkPanel,
    Zen 4: 1084 ns against 533 for a 256-row sliver)."""
    es, _ = KINDS[kind]
    name = f"panel{rows}{kind}asm"
    header(name, rows, kind)
    acc = [[f"Y{4 + 4 * r + j}" for j in range(4)] for r in range(3)]
    for r in range(3):
        for j in range(4):
            ins(f"VXORPS {acc[r][j]}, {acc[r][j]}, {acc[r][j]}")
    label = f"p{rows}{kind}loop"
    if rows == 4:
        ins("MOVQ CX, BX", "SHRQ $1, BX", f"JZ   p4{kind}tail")
        w(f"{label}:")
        rows012(kind, es, acc, 0, 0)
        rows012(kind, es, acc, NR * es, 4)
        row3(kind, es, 2)
        for r in range(rows):
            ins(f"ADDQ $8, {ROW_REGS[r]}")
        ins(f"ADDQ ${2 * NR * es}, DI", "DECQ BX", f"JNZ  {label}")
        w(f"p4{kind}tail:")
        ins("ANDQ $1, CX", f"JZ   p4{kind}store")
        rows012(kind, es, acc, 0, 0)
        row3(kind, es, 1)
        w(f"p4{kind}store:")
    else:
        w(f"{label}:")
        rows012(kind, es, acc, 0, 0)
        for r in range(rows):
            ins(f"ADDQ $4, {ROW_REGS[r]}")
        ins(f"ADDQ ${NR * es}, DI", "DECQ CX", f"JNZ  {label}")
        w()
    for r in range(3):
        for j in range(4):
            store(acc[r][j], r, j)
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
        panel(kind, 3)
    for kind in KINDS:
        panel(kind, 4)
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
