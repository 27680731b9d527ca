//go:build !(goexperiment.simd && amd64)

package codec

// This build has no vector conversions: the slice functions run the scalar
// loop throughout.

func decodeF16Vec([]float32, []uint16) int  { return 0 }
func encodeF16Vec([]uint16, []float32) int  { return 0 }
func decodeBF16Vec([]float32, []uint16) int { return 0 }
func encodeBF16Vec([]uint16, []float32) int { return 0 }
