package cpu

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestAttentionRejectsQuantizedRows: until the kernels read sealed rows,
// every path returns ErrNotImplemented for a view with quantized segments
// instead of reading their bytes as native rows.
func TestAttentionRejectsQuantizedRows(t *testing.T) {
	a, _ := cache.NewArena(0)
	defer a.Close()
	c, err := cache.New(a, cache.Config{Batch: 1, KVHeads: 1, HeadDimK: 32, Capacity: 64, Elem: cache.Float32,
		Quant: cache.QuantConfig{Format: cache.QuantInt8, Group: 32}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := make([]float32, 40*32)
	if err := c.Append(f32bytes(k), f32bytes(k), cache.Float32, 40, nil); err != nil {
		t.Fatal(err)
	}
	q := make([]float32, 32)
	dst := make([]float32, 32)
	for name, run := range map[string]func(cache.View) error{
		"stream":    func(v cache.View) error { return Attention(dst, q, 1, 1, v, Options{}) },
		"reference": func(v cache.View) error { return ReferenceAttention(dst, q, 1, 1, v, Options{}) },
	} {
		v, err := c.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		err = run(v)
		c.EndRead()
		if !errors.Is(err, cache.ErrNotImplemented) {
			t.Errorf("%s: err %v, want ErrNotImplemented", name, err)
		}
	}
}

func f32bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}
