package cache

import (
	"fmt"
	"math"
)

// The one definition of the sealed-row formats: how a group of values gets
// its scale (and zero), how a value is quantized, and how it is read back.
// Sealing, Export, DequantizeSegment and the kernels' oracles all use these.
//
// A group is the set of values that share one scale: one channel of a K
// chunk (per-channel K), or RowGroup(d, Group) consecutive elements of one
// row (per-token K, and V).
//
//   - int8 (symmetric): scale = max|x| / 127, q = round(x / scale) clamped to
//     [-127, 127], x' = scale * q. An all-zero group has scale 0 and q = 0.
//   - int4 (asymmetric): zero = min x, scale = (max x - min x) / 15,
//     q = round((x - zero) / scale) clamped to [0, 15], x' = scale*q + zero.
//     A constant group has scale 0, q = 0 and reads back exactly as zero.
//   - a scale whose largest integer would read back as an infinity (a group
//     reaching float32's largest value: scale*127, or scale*15 + zero, rounds
//     up past it) is stepped down to the next smaller float32 until it does
//     not (fitScale).
//
// Rounding is to nearest, ties to even; every step is a float32 operation
// rounded on its own (no fused multiply-add), so a numpy model computing the
// same formulas in float32 reproduces the bytes exactly.
//
// Non-finite values: a group holding a NaN or an infinity gets a NaN scale
// (and, for int4, a NaN zero) and q = 0, so every value of that group reads
// back as NaN. Sealing never turns a NaN or an infinity into a finite value;
// the price is that the group's finite values read back as NaN too.

// groupParams returns the scale and zero (0 for int8) of the n values
// x[off], x[off+stride], ...
func groupParams(f QuantFormat, x []float32, off, stride, n int) (scale, zero float32) {
	nan := float32(math.NaN())
	if f == QuantInt8 {
		var amax float32
		for i := 0; i < n; i++ {
			a := x[off+i*stride]
			if a-a != 0 { // NaN or an infinity
				return nan, 0
			}
			amax = max(amax, math.Float32frombits(math.Float32bits(a)&^(1<<31)))
		}
		return fitScale(QuantInt8, amax/127, 0), 0
	}
	lo, hi := x[off], x[off]
	for i := 0; i < n; i++ {
		a := x[off+i*stride]
		if a-a != 0 {
			return nan, nan
		}
		lo, hi = min(lo, a), max(hi, a)
	}
	return fitScale(QuantInt4, float32(hi-lo)/15, lo), lo
}

// fitScale returns scale, stepped down to the next smaller float32 while
// the group's largest value would read back as an infinity: scale*127
// (int8) or scale*15 + zero (int4, rounded once or twice) overflowing, as
// it can by one rounding for a group reaching float32's largest finite
// value. Then such a value reads back finite (the largest integer,
// clamped, times the smaller scale). Infinite and NaN scales stay.
func fitScale(f QuantFormat, scale, zero float32) float32 {
	inf := func(x float32) bool { return math.IsInf(float64(x), 0) }
	if inf(scale) || scale != scale {
		return scale
	}
	for scale > 0 {
		if f == QuantInt8 {
			if !inf(float32(scale * 127)) {
				break
			}
		} else if t := float32(scale * 15); !inf(t) && !inf(t+zero) && !inf(float32(math.FMA(float64(scale), 15, float64(zero)))) {
			break
		}
		scale = math.Nextafter32(scale, 0)
	}
	return scale
}

// quantValue returns the stored integer of x in a group of the given scale
// and zero: an int8 as its two's-complement byte, or a 4-bit value 0..15.
func quantValue(f QuantFormat, x, scale, zero float32) uint8 {
	if scale == 0 || scale != scale {
		return 0
	}
	if f == QuantInt8 {
		return quantInt8(x, scale)
	}
	return quantInt4(x, scale, zero)
}

// quantInt8 is quantValue for int8 and a nonzero, finite scale.
func quantInt8(x, scale float32) uint8 {
	r := math.RoundToEven(float64(float32(x / scale)))
	return uint8(int8(max(-127, min(127, r))))
}

// quantInt4 is quantValue for int4 and a nonzero, finite scale.
func quantInt4(x, scale, zero float32) uint8 {
	r := math.RoundToEven(float64(float32(float32(x-zero) / scale)))
	return uint8(max(0, min(15, r)))
}

// quantGroup stores the n values x[xoff+i*xstride] of one group into
// elements e0+i*estride of the rows dst[r*rb:] (r = i when rowStep, else
// row 0 and elements along it): the loops of quantizePerToken and
// quantizePerChannel without a per-element format test.
func quantGroup(f QuantFormat, dst []byte, rb int, x []float32, xoff, xstride, n int, alongRow bool, e0 int, s, z float32) {
	if s == 0 || s != s {
		for i := 0; i < n; i++ {
			if alongRow {
				putQuant(f, dst, e0+i, 0)
			} else {
				putQuant(f, dst[i*rb:], e0, 0)
			}
		}
		return
	}
	switch {
	case f == QuantInt8 && alongRow:
		row := dst[e0 : e0+n]
		for i := range row {
			row[i] = quantInt8(x[xoff+i*xstride], s)
		}
	case f == QuantInt8:
		for i := 0; i < n; i++ {
			dst[i*rb+e0] = quantInt8(x[xoff+i*xstride], s)
		}
	case alongRow && e0%2 == 0 && n%2 == 0:
		row := dst[e0/2 : (e0+n)/2]
		for i := range row {
			lo := quantInt4(x[xoff+2*i*xstride], s, z)
			hi := quantInt4(x[xoff+(2*i+1)*xstride], s, z)
			row[i] = lo | hi<<4
		}
	default:
		for i := 0; i < n; i++ {
			q := quantInt4(x[xoff+i*xstride], s, z)
			if alongRow {
				putQuant(f, dst, e0+i, q)
			} else {
				putQuant(f, dst[i*rb:], e0, q)
			}
		}
	}
}

// dequantValue reads back a stored integer q (as returned by quantValue).
func dequantValue(f QuantFormat, q uint8, scale, zero float32) float32 {
	if f == QuantInt8 {
		return scale * float32(int8(q))
	}
	return float32(scale*float32(q)) + zero
}

// putQuant stores integer q as element i of a sealed row.
func putQuant(f QuantFormat, row []byte, i int, q uint8) {
	if f == QuantInt8 {
		row[i] = q
		return
	}
	if i%2 == 0 {
		row[i/2] = row[i/2]&0xf0 | q&0x0f
	} else {
		row[i/2] = row[i/2]&0x0f | q<<4
	}
}

// getQuant reads element i of a sealed row.
func getQuant(f QuantFormat, row []byte, i int) uint8 {
	if f == QuantInt8 {
		return row[i]
	}
	if i%2 == 0 {
		return row[i/2] & 0x0f
	}
	return row[i/2] >> 4
}

// quantizePerToken seals n rows of d float32 values x (row-major) into dst
// (n rows of f.RowBytes(d) bytes), one scale (and zero) per group of g
// elements of a row: row r's groups go to scale[r*d/g:], zero[r*d/g:] (zero
// is nil for int8). It returns the bytes written (rows and scales).
func quantizePerToken(f QuantFormat, dst []byte, scale, zero, x []float32, n, d, g int) int64 {
	rb, ng := f.RowBytes(d), d/g
	for r := 0; r < n; r++ {
		row := dst[r*rb : (r+1)*rb]
		for gi := 0; gi < ng; gi++ {
			off := r*d + gi*g
			s, z := groupParams(f, x, off, 1, g)
			scale[r*ng+gi] = s
			if zero != nil {
				zero[r*ng+gi] = z
			}
			quantGroup(f, row, rb, x, off, 1, g, true, gi*g, s, z)
		}
	}
	sb := int64(n * ng * 4)
	if zero != nil {
		sb *= 2
	}
	return int64(n*rb) + sb
}

// quantizePerChannel seals n rows of d float32 values x (row-major) into dst
// with one scale (and zero) per channel over the n rows: scale[c], zero[c]
// (zero nil for int8). It returns the bytes written.
func quantizePerChannel(f QuantFormat, dst []byte, scale, zero, x []float32, n, d int) int64 {
	rb := f.RowBytes(d)
	for ch := 0; ch < d; ch++ {
		s, z := groupParams(f, x, ch, d, n)
		scale[ch] = s
		if zero != nil {
			zero[ch] = z
		}
		quantGroup(f, dst, rb, x, ch, d, n, false, ch, s, z)
	}
	sb := int64(d * 4)
	if zero != nil {
		sb *= 2
	}
	return int64(n*rb) + sb
}

// dequantRows reads back n sealed rows of d elements from src into dst
// (n*d float32s). perChannel selects the scale layout: scale[c] for every
// row, or scale[r*(d/g)+i/g] per row and group of g elements.
func dequantRows(f QuantFormat, dst []float32, src []byte, scale, zero []float32, n, d, g int, perChannel bool) {
	rb, ng := f.RowBytes(d), d/g
	for r := 0; r < n; r++ {
		row := src[r*rb : (r+1)*rb]
		for i := 0; i < d; i++ {
			si := i
			if !perChannel {
				si = r*ng + i/g
			}
			var z float32
			if zero != nil {
				z = zero[si]
			}
			dst[r*d+i] = dequantValue(f, getQuant(f, row, i), scale[si], z)
		}
	}
}

// DequantizeSegment writes the float32 values of a sealed segment's rows:
// sg.Len rows of dk elements into dstK and of dv elements into dstV
// (token-major, as the rows are stored). It is the reference reading of the
// formats (see QuantSegment) that kernel tests and oracles use; it returns
// ErrInvalidArgument for a native segment or when a buffer is too short.
func DequantizeSegment(dstK, dstV []float32, sg Segment, dk, dv int) error {
	q := sg.Q
	if q.Format != QuantInt8 && q.Format != QuantInt4 {
		return fmt.Errorf("%w: segment at %d is not quantized (format %v)", ErrInvalidArgument, sg.Start, q.Format)
	}
	n := sg.Len
	perCh := q.KAxis == KPerChannel
	kScales := n * (dk / max(1, q.KGroup))
	if perCh {
		kScales = dk
	}
	vScales := n * (dv / max(1, q.VGroup))
	needZ := q.Format == QuantInt4
	switch {
	case n < 0 || len(dstK) < n*dk || len(dstV) < n*dv:
		return fmt.Errorf("%w: dequantizing %d rows needs %d and %d floats, got %d and %d",
			ErrInvalidArgument, n, n*dk, n*dv, len(dstK), len(dstV))
	case q.KGroup <= 0 || q.VGroup <= 0 || dk%q.KGroup != 0 || dv%q.VGroup != 0:
		return fmt.Errorf("%w: segment groups %d/%d do not divide head dims %d/%d", ErrInvalidArgument, q.KGroup, q.VGroup, dk, dv)
	case len(sg.K) < n*q.Format.RowBytes(dk) || len(sg.V) < n*q.Format.RowBytes(dv):
		return fmt.Errorf("%w: segment at %d holds %d/%d bytes for %d rows", ErrInvalidArgument, sg.Start, len(sg.K), len(sg.V), n)
	case len(q.KScale) < kScales || len(q.VScale) < vScales ||
		needZ && (len(q.KZero) < kScales || len(q.VZero) < vScales):
		return fmt.Errorf("%w: segment at %d has too few scales", ErrInvalidArgument, sg.Start)
	}
	kz, vz := q.KZero, q.VZero
	if !needZ {
		kz, vz = nil, nil
	}
	dequantRows(q.Format, dstK, sg.K, q.KScale, kz, n, dk, q.KGroup, perCh)
	dequantRows(q.Format, dstV, sg.V, q.VScale, vz, n, dv, q.VGroup, false)
	return nil
}
