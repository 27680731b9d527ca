package cache

import (
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// asF32 reinterprets b (whose length is a multiple of 4) as float32s.
func asF32(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// asU16 reinterprets b (whose length is even) as uint16s.
func asU16(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// convertRows copies n elements from src (type st) to dst (type dt),
// converting through float32 when the types differ. scratch must hold n
// float32s when neither side is float32 (fp16 <-> bf16).
func convertRows(dst []byte, dt ElemType, src []byte, st ElemType, n int, scratch []float32) {
	if dt == st {
		copy(dst[:n*dt.Size()], src[:n*st.Size()])
		return
	}
	switch {
	case st == Float32 && dt == Float16:
		codec.EncodeF16(asU16(dst)[:n], asF32(src)[:n])
	case st == Float32 && dt == BFloat16:
		codec.EncodeBF16(asU16(dst)[:n], asF32(src)[:n])
	case st == Float16 && dt == Float32:
		codec.DecodeF16(asF32(dst)[:n], asU16(src)[:n])
	case st == BFloat16 && dt == Float32:
		codec.DecodeBF16(asF32(dst)[:n], asU16(src)[:n])
	default: // fp16 <-> bf16 through float32
		for off := 0; off < n; off += len(scratch) {
			m := min(len(scratch), n-off)
			convertRows(asBytes(scratch[:m]), Float32, src[off*st.Size():], st, m, nil)
			convertRows(dst[off*dt.Size():], dt, asBytes(scratch[:m]), Float32, m, nil)
		}
	}
}

// asBytes reinterprets a float32 slice as bytes.
func asBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}
