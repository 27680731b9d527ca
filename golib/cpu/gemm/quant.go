package gemm

import "fmt"

// Block-quantized packs. A weight quantized along its inner dimension (the
// 2-, 4- and 8-bit weights of onnxruntime's MatMulNBits, llama.cpp's q4/q8
// blocks) keeps its integers in the pack: the slivers are laid out as
// PackB lays out float32 ones, one byte a value (2 and 8 bits) or two
// values a byte (4 bits), and each sliver k-block is dequantized into L1
// as it is read (PackedB.widenQuant), then multiplied by the float32 panel
// and micro kernels. A 4-bit pack takes a sixth of the float32 bytes
// (scales and zero terms included, groups of 32), and a decode step
// streams that many.

// QuantB is an n x k weight W quantized block-wise along k, as a product's
// B = W^T (PackBQuant packs op(B) = W^T, k x n, like PackB with transB).
//
// Row j of W is stored as Groups() blocks of Block*Bits/8 bytes in Q, the
// values packed low bits first (value 2i in the low nibble of byte i at 4
// bits; the padding of a last partial block is ignored), and
//
//	W[j][l] = (float32(v) - Zeros[j*Groups()+g]) * Scales[j*Groups()+g],  g = l / Block,
//
// computed in float32 in that order (the integer minus the zero is exact).
type QuantB struct {
	Bits  int // 2, 4 or 8
	Block int // values per group along k: a multiple of 8/Bits
	K, N  int
	Q     []byte
	// Scales and Zeros hold one value per row of W and group.
	Scales, Zeros []float32
}

// Groups returns the number of quantization groups per row of W.
func (w *QuantB) Groups() int {
	if w.Block <= 0 {
		return 0
	}
	return (w.K + w.Block - 1) / w.Block
}

// check validates the description and its slices' lengths.
func (w *QuantB) check() error {
	switch {
	case w.Bits != 2 && w.Bits != 4 && w.Bits != 8:
		return fmt.Errorf("%w: quantized B: bits %d (2, 4 or 8)", ErrShape, w.Bits)
	case w.Block <= 0 || w.Block*w.Bits%8 != 0:
		return fmt.Errorf("%w: quantized B: block %d must be a positive multiple of %d", ErrShape, w.Block, 8/w.Bits)
	case w.K < 0 || w.N < 0:
		return fmt.Errorf("%w: quantized B: negative size %d x %d", ErrShape, w.N, w.K)
	}
	groups := w.Groups()
	if len(w.Q) < w.N*groups*(w.Block*w.Bits/8) {
		return fmt.Errorf("%w: quantized B holds %d bytes, %d rows of %d blocks of %d need %d", ErrShape,
			len(w.Q), w.N, groups, w.Block*w.Bits/8, w.N*groups*(w.Block*w.Bits/8))
	}
	if len(w.Scales) < w.N*groups || len(w.Zeros) < w.N*groups {
		return fmt.Errorf("%w: quantized B: %d scales and %d zeros for %d groups", ErrShape,
			len(w.Scales), len(w.Zeros), w.N*groups)
	}
	return nil
}

// value returns the integer of W[j][l].
func (w *QuantB) value(j, l, groups int) byte {
	bit := (l % w.Block) * w.Bits
	b := w.Q[(j*groups+l/w.Block)*(w.Block*w.Bits/8)+bit/8]
	return b >> uint(bit%8) & byte(1<<w.Bits-1)
}

// Dequantize writes W (N x K, row-major) into dst, of at least N*K values:
// the values PackBQuant's packs widen to.
func (w *QuantB) Dequantize(dst []float32) error {
	if err := w.check(); err != nil {
		return err
	}
	if len(dst) < w.N*w.K {
		return fmt.Errorf("%w: dequantized B needs %d values, got %d", ErrShape, w.N*w.K, len(dst))
	}
	groups := w.Groups()
	for j := range w.N {
		row := dst[j*w.K : (j+1)*w.K]
		for l := range row {
			i := j*groups + l/w.Block
			row[l] = (float32(w.value(j, l, groups)) - w.Zeros[i]) * w.Scales[i]
		}
	}
	return nil
}

// PackQuantBytes returns the bytes PackBQuant takes for a k x n op(B) of
// bits-bit values in groups of block along k: the values (nibbles two a
// byte, other widths a byte each) and a float32 scale and zero per group
// and column, the padding columns of the last sliver included.
func PackQuantBytes(k, n, bits, block int) int64 {
	cols := int64(roundUp(n, packNR))
	values := int64(k) * cols
	if bits == 4 {
		values /= 2
	}
	return values + 8*int64((k+block-1)/max(block, 1))*cols
}

// PackBQuant packs the quantized weight w for SgemmPacked: op(B) = W^T
// (k x n), its integers kept (see the file comment). Products equal those
// of PackB over the dequantized W within float32 summation order (the
// dequantized values are the same bits).
func PackBQuant(w QuantB) (*PackedB, error) {
	if err := w.check(); err != nil {
		return nil, err
	}
	k, n, groups := w.K, w.N, w.Groups()
	slivers := (n + packNR - 1) / packNR
	pb := &PackedB{k: k, n: n, nibbles: w.Bits == 4, qblock: w.Block, groups: groups}
	values := k * slivers * packNR
	if pb.nibbles {
		pb.q = newPack[byte](values / 2)
	} else {
		pb.q = newPack[byte](values)
	}
	pb.qs = make([]float32, slivers*groups*packNR)
	pb.qz = make([]float32, slivers*groups*packNR)
	ForThreads(0, slivers, func(sg int) { pb.fillSliver(&w, sg) })
	return pb, nil
}

// fillSliver stores columns sg*packNR.. of op(B) (rows of W) in the pack.
func (b *PackedB) fillSliver(w *QuantB, sg int) {
	groups := b.groups
	jb, jr := sg*packNR/ncBlock, sg*packNR%ncBlock
	for c := range packNR {
		j := sg*packNR + c
		if j >= b.n {
			break // padding columns stay 0 (scale 0, zero 0)
		}
		for g := range groups {
			b.qs[(sg*groups+g)*packNR+c] = w.Scales[j*groups+g]
			b.qz[(sg*groups+g)*packNR+c] = w.Zeros[j*groups+g]
		}
		for l0 := 0; l0 < b.k; l0 += kcBlock {
			kc := min(kcBlock, b.k-l0)
			off, _ := b.slabOffset(jb, l0, kc)
			off += jr * kc
			for l := range kc {
				v := w.value(j, l0+l, groups)
				row := off + l*packNR
				switch {
				case !b.nibbles:
					b.q[row+c] = v
				case c < packNR/2:
					b.q[row/2+c] |= v
				default:
					b.q[row/2+c-packNR/2] |= v << 4
				}
			}
		}
	}
}

// quantRowBytes is the bytes of one sliver row of a quantized pack.
func (b *PackedB) quantRowBytes() int {
	if b.nibbles {
		return packNR / 2
	}
	return packNR
}

// quantGroups calls fn for each run of rows [r0, r1) of the sliver at
// column jr of slab (jb, l0, kc) of a quantized pack that shares one
// quantization group: src holds those rows' integers, s and z the group's
// scales and zeros for the sliver's columns.
func (b *PackedB) quantGroups(jb, l0, kc, jr int, fn func(r0, r1 int, src []byte, s, z *[packNR]float32)) {
	off, _ := b.slabOffset(jb, l0, kc)
	rb := b.quantRowBytes()
	off = (off + jr*kc) / packNR * rb
	src := b.q[off : off+kc*rb]
	sg := (jb*ncBlock + jr) / packNR
	for r0 := 0; r0 < kc; {
		g := (l0 + r0) / b.qblock
		r1 := min(kc, (g+1)*b.qblock-l0)
		i := (sg*b.groups + g) * packNR
		fn(r0, r1, src[r0*rb:r1*rb], (*[packNR]float32)(b.qs[i:i+packNR]), (*[packNR]float32)(b.qz[i:i+packNR]))
		r0 = r1
	}
}

// widenQuant writes the sliver at column jr of slab (jb, l0, kc) of a
// quantized pack into dst (kc*packNR float32 values), dequantized by the
// kernel set's dequant.
func (b *PackedB) widenQuant(ks *kernels, dst []float32, jb, l0, kc, jr int) {
	b.quantGroups(jb, l0, kc, jr, func(r0, r1 int, src []byte, s, z *[packNR]float32) {
		ks.dequant(b.nibbles, dst[r0*packNR:r1*packNR], src, s, z)
	})
}

// panelQuantRow adds a (kc values of one row of A) times the sliver at
// column jr of slab (jb, l0, kc) of a quantized pack to out, by the kernel
// set's panelQuantRow.
func (b *PackedB) panelQuantRow(ks *kernels, a []float32, jb, l0, kc, jr int, out *[packNR]float32) {
	b.quantGroups(jb, l0, kc, jr, func(r0, r1 int, src []byte, s, z *[packNR]float32) {
		ks.panelQuantRow(b.nibbles, a[r0:r1], src, s, z, out)
	})
}

// dequantGo is the portable dequant kernel: for each row r of
// len(dst)/packNR, dst[r][c] = (float32(v) - z[c]) * s[c] where v is
// column c's integer in row r of src (packNR/2 bytes a row with nibbles:
// byte c holds column c low and column c+16 high; else packNR bytes).
func dequantGo(nibbles bool, dst []float32, src []byte, s, z *[packNR]float32) {
	for r := range len(dst) / packNR {
		d := (*[packNR]float32)(dst[r*packNR:])
		if nibbles {
			row := (*[packNR / 2]byte)(src[r*packNR/2:])
			for c, v := range row {
				d[c] = (float32(v&15) - z[c]) * s[c]
				d[c+packNR/2] = (float32(v>>4) - z[c+packNR/2]) * s[c+packNR/2]
			}
			continue
		}
		row := (*[packNR]byte)(src[r*packNR:])
		for c, v := range row {
			d[c] = (float32(v) - z[c]) * s[c]
		}
	}
}
