// Package cache holds the backend-neutral KVCache runtime value: element
// types, the persistent arena that owns cache memory, the contiguous cache
// handle and its operations, and the block-iterator contract (View) that
// attention kernels consume.
package cache

import "fmt"

// ElemType is the storage element type of a cache's K and V rows.
// Accumulation is always float32, whatever the storage type.
type ElemType int

// Storage element types.
const (
	Float32 ElemType = iota
	Float16
	BFloat16
)

// Size returns the size in bytes of one element.
func (e ElemType) Size() int {
	switch e {
	case Float32:
		return 4
	case Float16, BFloat16:
		return 2
	}
	return 0
}

// String returns the numpy-style name of the type.
func (e ElemType) String() string {
	switch e {
	case Float32:
		return "float32"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("ElemType(%d)", int(e))
}

// ParseElemType maps a numpy-style name ("float32", "float16", "bfloat16")
// to an ElemType.
func ParseElemType(s string) (ElemType, error) {
	switch s {
	case "float32", "fp32", "f32":
		return Float32, nil
	case "float16", "fp16", "f16", "half":
		return Float16, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	}
	return 0, fmt.Errorf("%w: unsupported cache dtype %q (want float32, float16 or bfloat16)", ErrInvalidArgument, s)
}
