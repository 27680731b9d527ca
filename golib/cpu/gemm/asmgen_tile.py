#!/usr/bin/env python3
"""Writes tile_avx2_amd64.s: the AVX2 prefill micro kernels, one per tile height.

microNx32asm (N = 1..3) adds alpha * A * B to an N x 32 tile of C, where A is an A panel
packed by the blocked algorithm (kc steps of MR = 3 values; rows N..2 are not read) and B
a packed B sliver (kc rows of 32 floats, 128 bytes, one contiguous run). The three-row
kernel is the full tile of the AVX2 path: twelve accumulators (row r, column vector j in
Y(4+4r+j)), the three A values broadcast into Y0-Y2 and each B vector loaded once into
Y3 and fed to three FMAs: 7 loads for 12 FMAs, every accumulator updated once per 12
FMAs (the FMA latency is hidden). The loop runs two k steps an iteration (then the odd
one): timed as the blocked algorithm calls it (16 slivers of 256 rows in L2, one A panel,
best of 400 calls on the shared 2-core Zen 4), the three-row tile went from 102-112 to
104-114 GFLOP/s against an AVX2 FMA peak of 118 (BenchmarkTileRows, BenchmarkFMAPeak).
The shorter ones run the edge panels of a row count that is not a multiple of three
straight into C (a one-row tail is run as two 2-row panels: the 1 x 32 kernel has four
accumulators, one FMA a cycle at most, and ran at 45-51 GFLOP/s against 80-88 for 2 x 32).
The blocked algorithm runs each sliver against every A panel of a block on this path
(kernels.sliverMajor); the full panels that meet a sliver call the pf variant of the
three-row kernel (micro3x32{,f16,bf16}pfasm, with pfn <= kc: its first 2*(pfn/2) steps
also prefetch a row of `next` each into L2, PREFETCHT1), each a share of the next
sliver's rows (blocked.go nextRows), and the last sliver of a block prefetches the first
of the next block, so weights that come from memory stream in while the current sliver's
panels run. One thread, twelve 1024 x 1024 packed weights used in turn (48 MiB, beyond
the L3), best of 8 rounds on the shared machine: 128 rows 64-78 GFLOP/s panel by panel,
79-80 sliver by sliver, 88-94 with the whole next sliver prefetched by the first panel
(AVX-512 path 64-98); 16 rows 50-54, 54-56, 55-59 (AVX-512 56-67). Spreading the
prefetch over all full panels and across blocks: best of 80 rounds interleaved in one
process with the machine loaded (load 4-5 on 2 cores), 16 rows 63.8 / 64.6 against 62.5
/ 62.8 (first panel only) and 61.7 / 63.6 (none), AVX-512 path 72.9 / 73.4; 128 rows
89.5 / 87.3 against 83.8 / 77.2 and 73.7 / 78.9, AVX-512 93.7 / 94.8. The float16 (F16C VCVTPH2PS) and
bfloat16 variants read a 16-bit pack (PackBHalf, 64-byte sliver rows) and widen it in
registers, as the decode-step kernels do: widening each B block into a float32 buffer
first took about a quarter of a 128-row product's time.

The 6 x 16 tile it replaces (two passes over the two 16-column halves of the sliver)
had as many accumulators but walked the sliver with a 128-byte stride, touching every
other cache line; from memory the hardware prefetchers did not keep up, and it needed
prefetching variants for the first pass over each block. Forced AVX2 on a loaded 2-core
Zen 4, one thread, the decode step's weights (320 MB) cold, best of six runs interleaved
with the AVX-512 path in one process (two processes each), the 3 x 32 tile ran at
1.00-1.02x the AVX-512 path's speed for 5 rows (6 x 16 with prefetches: 0.81-1.08x),
0.83-0.89x for 8 rows (0.65-0.73x), 0.80-0.85x for 16 rows (0.75-0.80x) and 0.83-0.92x
for 64-128 rows (0.85-0.91x): as fast or faster, with three kernels instead of twelve.
A 6 x 16 tile reading each 32-wide sliver in two 16-column halves, with the B sliver
kept in L1 for all A panels (the order the blocked algorithm now uses on this path), was
tried again: per row it took 0.060 of the profile's seconds against 0.044 for 3 x 32
(eight loads per twelve FMAs instead of seven), so it was not kept.
Run from this directory:  python3 asmgen_tile.py > tile_avx2_amd64.s
(TestAsmgenInSync checks that the committed file is this script's output.)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from asmgen_emit import ins, off, out, w  # noqa: E402
from asmgen_panel import KINDS, load  # noqa: E402  (the 16-bit weight loads)

MR = 3  # rows of a packed A panel on this path (kernels.mr)
NR = 32  # columns of a packed B sliver (packNR)


def kernel(rows, kind="", pf=False):
    es, gotype = KINDS[kind]
    name = f"micro{rows}x32{kind}{'pf' if pf else ''}asm"
    if pf:
        w(f"// func {name}(kc int, a *float32, b *{gotype}, alpha float32, c *float32, ldc int, next *{gotype}, pfn int)")
        w(f"TEXT ·{name}(SB), NOSPLIT, $0-64")
    else:
        w(f"// func {name}(kc int, a *float32, b *{gotype}, alpha float32, c *float32, ldc int)")
        w(f"TEXT ·{name}(SB), NOSPLIT, $0-48")
    ins("MOVQ kc+0(FP), CX", "MOVQ a+8(FP), SI", "MOVQ b+16(FP), DI",
        "MOVQ c+32(FP), DX", "MOVQ ldc+40(FP), BX")
    if pf:
        ins("MOVQ next+48(FP), R8")
    acc = [[f"Y{4 + 4 * r + j}" for j in range(4)] for r in range(rows)]
    for r in range(rows):
        for j in range(4):
            ins(f"VXORPS {acc[r][j]}, {acc[r][j]}, {acc[r][j]}")
    loop, tail, done = (f"m{rows}{kind}{'pf' if pf else ''}{x}" for x in ("loop", "tail", "done"))

    def step(sa, sb, prefetch=False):
        for r in range(rows):
            ins(f"VBROADCASTSS {off(sa + 4 * r)}(SI), Y{r}")
        if prefetch:  # a row of the next sliver, into L2
            for line in range(0, es * NR, 64):
                ins(f"PREFETCHT1 {off(sb + line)}(R8)")
        for j in range(4):
            ins(*load(kind, f"{off(sb + 8 * es * j)}(DI)", "Y3"))
            for r in range(rows):
                ins(f"VFMADD231PS Y3, Y{r}, {acc[r][j]}")

    def two_steps(prefetch=False):
        step(0, 0, prefetch)
        step(4 * MR, es * NR, prefetch)
        ins(f"ADDQ ${8 * MR}, SI", f"ADDQ ${2 * es * NR}, DI")

    if pf:
        # The first 2*(pfn/2) steps (pfn <= kc) also prefetch that many
        # rows of next; the rest run the plain loop below.
        ins("MOVQ pfn+56(FP), R9", "SHRQ $1, R9", f"JZ   {loop}pre",
            "SUBQ R9, CX", "SUBQ R9, CX")
        w(f"{loop}pf:")
        two_steps(prefetch=True)
        ins(f"ADDQ ${2 * es * NR}, R8", "DECQ R9", f"JNZ  {loop}pf")
        w(f"{loop}pre:")
    # Two k steps an iteration (the pointer and count updates once per
    # 24 FMAs), then the odd step.
    ins("MOVQ CX, AX", "SHRQ $1, CX", f"JZ   {tail}")
    w(f"{loop}:")
    two_steps()
    ins("DECQ CX", f"JNZ  {loop}")
    w(f"{tail}:")
    ins("ANDQ $1, AX", f"JZ   {done}")
    step(0, 0)
    w(f"{done}:")
    ins("VBROADCASTSS alpha+24(FP), Y0", "SHLQ $2, BX")
    for r in range(rows):
        for j in range(4):
            o = off(32 * j)
            ins(f"VMOVUPS {o}(DX), Y1", f"VFMADD231PS {acc[r][j]}, Y0, Y1", f"VMOVUPS Y1, {o}(DX)")
        if r < rows - 1:
            ins("ADDQ BX, DX")
    ins("VZEROUPPER", "RET")
    w()


def main():
    w("// Code generated by asmgen_tile.py; DO NOT EDIT.")
    w()
    w("//go:build goexperiment.simd && amd64")
    w()
    w('#include "textflag.h"')
    w()
    w("// The AVX2 prefill micro kernels, one per tile height (see asmgen_tile.py).")
    w("// C[r][0:32] += alpha * tile row r for r < N; ldc is in elements. kc > 0.")
    w()
    for kind in KINDS:
        for rows in range(MR, 0, -1):
            kernel(rows, kind)
        kernel(MR, kind, pf=True)
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
