package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestPacksShareByKey(t *testing.T) {
	a, err := tensor.New(tensor.Float32, tensor.Shape{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tensor.New(tensor.Float32, tensor.Shape{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	build := func() (any, error) { builds++; return builds, nil }
	var none *Packs
	none.get(packKey{a: a}, build)
	none.get(packKey{a: a}, build)
	if builds != 2 || none.Len() != 0 {
		t.Fatalf("nil Packs: %d builds, Len %d; want 2 and 0", builds, none.Len())
	}
	p := NewPacks()
	v1, _ := p.get(packKey{a: a, kind: "gemm"}, build)
	v2, _ := p.get(packKey{a: a, kind: "gemm"}, build)
	v3, _ := p.get(packKey{a: b, kind: "gemm"}, build)                  // another tensor of the same shape
	v4, _ := p.get(packKey{a: a, kind: "gemm", ints: [4]int{1}}, build) // other parameters
	if v1 != v2 || v1 == v3 || v1 == v4 || p.Len() != 3 {
		t.Fatalf("values %v %v %v %v, Len %d", v1, v2, v3, v4, p.Len())
	}
	bad := errors.New("refused")
	if _, err := p.get(packKey{a: b, kind: "nbits"}, func() (any, error) { return nil, bad }); !errors.Is(err, bad) {
		t.Fatalf("err %v", err)
	}
	if _, err := p.get(packKey{a: b, kind: "nbits"}, build); !errors.Is(err, bad) {
		t.Fatalf("a failed build is not kept: err %v", err)
	}
}
