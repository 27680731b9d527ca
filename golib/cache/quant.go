package cache

import "fmt"

// QuantFormat is the integer format of a cache's sealed (quantized) rows.
// It is an explicit option of the cache descriptor (Config.Quant), never
// inferred from tensor types.
type QuantFormat int

// Quantized row formats.
const (
	// QuantNone keeps every row in the cache's native ElemType.
	QuantNone QuantFormat = iota
	// QuantInt8 stores signed int8 values with symmetric float32 scales:
	// x = scale * q, q in [-127, 127]. A row of d elements takes d bytes.
	QuantInt8
	// QuantInt4 stores unsigned 4-bit values with a float32 scale and a
	// float32 zero (offset) per group: x = scale * q + zero, q in [0, 15].
	// Two values share a byte: element 2i in the low nibble, 2i+1 in the
	// high one; a row of d elements (d even) takes d/2 bytes.
	QuantInt4
)

// String returns the option name of the format ("none", "int8", "int4").
func (f QuantFormat) String() string {
	switch f {
	case QuantNone:
		return "none"
	case QuantInt8:
		return "int8"
	case QuantInt4:
		return "int4"
	}
	return fmt.Sprintf("QuantFormat(%d)", int(f))
}

// ParseQuantFormat maps an option name ("", "none", "int8", "int4") to a
// QuantFormat.
func ParseQuantFormat(s string) (QuantFormat, error) {
	switch s {
	case "", "none":
		return QuantNone, nil
	case "int8":
		return QuantInt8, nil
	case "int4":
		return QuantInt4, nil
	}
	return 0, fmt.Errorf("%w: unsupported cache quantization %q (want none, int8 or int4)", ErrInvalidArgument, s)
}

// RowBytes returns the bytes of one sealed row of d elements.
func (f QuantFormat) RowBytes(d int) int {
	switch f {
	case QuantInt8:
		return d
	case QuantInt4:
		return (d + 1) / 2
	}
	return 0
}

// KAxis says along which axis K's sealed rows share a scale. V is always
// quantized per token.
type KAxis int

// K quantization axes.
const (
	// KPerChannel gives every channel (element of the head dim) of a sealed
	// chunk its own scale (and zero), computed over the chunk's tokens.
	// Outlier channels then cost only their own precision.
	KPerChannel KAxis = iota
	// KPerToken gives every K row its own scales, one per group of
	// RowGroup(d, group) elements, like V.
	KPerToken
)

// String returns the option name of the axis ("channel", "token").
func (a KAxis) String() string {
	switch a {
	case KPerChannel:
		return "channel"
	case KPerToken:
		return "token"
	}
	return fmt.Sprintf("KAxis(%d)", int(a))
}

// ParseKAxis maps an option name ("", "channel", "token") to a KAxis.
func ParseKAxis(s string) (KAxis, error) {
	switch s {
	case "", "channel":
		return KPerChannel, nil
	case "token":
		return KPerToken, nil
	}
	return 0, fmt.Errorf("%w: unsupported k_axis %q (want channel or token)", ErrInvalidArgument, s)
}

// QuantConfig is the quantization part of a cache descriptor.
//
// Tokens newer than the last Residual stay in the cache's native ElemType.
// When Group tokens have left that window they are quantized once (sealed)
// as one chunk, with scales computed from the chunk itself. A sealed chunk
// is never re-quantized: truncating into it only shortens it.
type QuantConfig struct {
	Format QuantFormat
	// Group is the number of tokens per sealed chunk (the span of a
	// per-channel K scale) and the number of elements per per-token scale
	// group along a row (see RowGroup). 32 or 64; 0 means DefaultQuantGroup.
	Group int
	KAxis KAxis
	// Residual is the number of most recent tokens kept in the native type
	// (0 allowed: rows are sealed as soon as a chunk is complete).
	Residual int
}

// Defaults of QuantConfig.
const (
	DefaultQuantGroup    = 32
	DefaultQuantResidual = 128
)

// Enabled reports whether the cache quantizes anything.
func (q QuantConfig) Enabled() bool { return q.Format != QuantNone }

// RowGroup returns the number of elements per scale group of a per-token
// quantized row of d elements: group when it divides d, else the whole row.
func RowGroup(d, group int) int {
	if group > 0 && d%group == 0 {
		return group
	}
	return d
}

// QuantSegment describes how a Segment's rows are stored when they are
// sealed. The zero value (Format QuantNone) means native rows of the view's
// ElemType. A quantized segment never spans two sealed chunks, so one set
// of per-channel scales covers all its rows.
//
// Rows are token-major as for native segments: row r starts at byte
// r*Format.RowBytes(HeadDimK) of Segment.K (HeadDimV for V).
//
//   - K per channel (KAxis == KPerChannel): KScale (and, for int4, KZero)
//     hold HeadDimK values, one per channel, for every row of the segment.
//   - K per token: KScale/KZero hold Len*(HeadDimK/KGroup) values, row r's
//     groups at [r*ng, (r+1)*ng), where KGroup = RowGroup(HeadDimK, Group).
//   - V is always per token: VScale/VZero hold Len*(HeadDimV/VGroup) values,
//     VGroup = RowGroup(HeadDimV, Group).
//
// KZero and VZero are nil for int8 (symmetric).
type QuantSegment struct {
	Format         QuantFormat
	KAxis          KAxis
	KGroup, VGroup int // elements per scale group along a per-token row
	KScale, KZero  []float32
	VScale, VZero  []float32
	// Bounded reports that the cache checked, when the chunk was sealed,
	// that every scale and zero of the chunk (every head) is finite and
	// below ScaleBound in magnitude: no dequantized value s*q + z leaves
	// float32's range, so a kernel may skip its own check of the scales.
	// False means unchecked, not unbounded.
	Bounded bool
	// KUneven reports that the cache found, when the chunk was sealed, a
	// head whose per-channel K scales spread wider than KSpreadMax (the
	// largest above KSpreadMax times the mean of the others: a channel with a
	// large offset or an extreme outlier): the decode kernels then
	// use their float score loop for the chunk, whose precision does not
	// depend on the spread. False means even or unchecked.
	KUneven bool
}

// KSpreadMax is the widest spread of a chunk's per-channel K scales (per
// head, the largest over the mean of the others) that the kernels' integer
// score loop takes (QuantSegment.KUneven). That loop rounds the query times
// the channel scales to int16 steps of 1/32767 of the largest product, so
// the other channels keep fewer steps the wider the spread: measured with
// one int8 channel offset by 3e3 (spread about 1000), its attention error
// was 13% of the quantization's own error, growing in proportion to the
// offset; at 512 it stays near 7%. A trained model's outlier channels
// (scales tens of times the others') are far below it.
const KSpreadMax = 512

// chunk flags (quantSeq.flags)
const (
	chunkBounded uint8 = 1 << iota
	chunkUneven
)

// scalesUneven reports whether the largest of the scales s is above
// KSpreadMax times the mean of the others (NaN scales count as uneven).
func scalesUneven(s []float32) bool {
	if len(s) < 2 {
		return false
	}
	var sum, hi float32
	for _, x := range s {
		if x != x {
			return true
		}
		sum += x
		hi = max(hi, x)
	}
	return hi > KSpreadMax*(sum-hi)/float32(len(s)-1)
}

// ScaleBound bounds the magnitude of the scales and zeros of a chunk that
// QuantSegment.Bounded reports (2^56).
const ScaleBound = 0x1p56

// scalesBounded reports whether every value of each run is finite and below
// ScaleBound in magnitude.
func scalesBounded(runs ...[]float32) bool {
	for _, r := range runs {
		for _, x := range r {
			if !(x < ScaleBound && x > -ScaleBound) { // NaN fails too
				return false
			}
		}
	}
	return true
}
