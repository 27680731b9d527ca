package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
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
	none.get(packKey{a: a}, 16, build)
	none.get(packKey{a: a}, 16, build)
	if builds != 2 || none.Len() != 0 {
		t.Fatalf("nil Packs: %d builds, Len %d; want 2 and 0", builds, none.Len())
	}
	p := NewPacks()
	v1, _ := p.get(packKey{a: a, kind: "gemm"}, 16, build)
	v2, _ := p.get(packKey{a: a, kind: "gemm"}, 16, build)
	v3, _ := p.get(packKey{a: b, kind: "gemm"}, 16, build)                  // another tensor of the same shape
	v4, _ := p.get(packKey{a: a, kind: "gemm", ints: [4]int{1}}, 16, build) // other parameters
	if v1 != v2 || v1 == v3 || v1 == v4 || p.Len() != 3 {
		t.Fatalf("values %v %v %v %v, Len %d", v1, v2, v3, v4, p.Len())
	}
	bad := errors.New("refused")
	if _, err := p.get(packKey{a: b, kind: "nbits"}, 16, func() (any, error) { return nil, bad }); !errors.Is(err, bad) {
		t.Fatalf("err %v", err)
	}
	if _, err := p.get(packKey{a: b, kind: "nbits"}, 16, build); !errors.Is(err, bad) {
		t.Fatalf("a failed build is not kept: err %v", err)
	}
}

// TestPacksRefuseWhatTheMachineCannotHold: a weight whose pack would take
// the machine's available memory below packReserve fails its factory with
// a *cache.BudgetError naming the sizes (no pack built, nothing kept), and
// succeeds once the memory is there.
func TestPacksRefuseWhatTheMachineCannotHold(t *testing.T) {
	defer func(f func() int64) { availableMemory = f }(availableMemory)
	w, err := tensor.New(tensor.Float32, tensor.Shape{64, 64})
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{OpType: "MatMul", Opset: 13, NumInputs: 2, NumOutputs: 1, InputPresent: []bool{true, true},
		OutputPresent: []bool{true}, Constants: []*tensor.Tensor{nil, w}, Packs: NewPacks()}
	availableMemory = func() int64 { return packReserve + 64*64*4 - 1 }
	_, err = newMatMul(n)
	var be *cache.BudgetError
	if !errors.As(err, &be) || !be.Machine || be.Requested != 64*64*4 || n.Packs.Len() != 0 {
		t.Fatalf("err %v (%+v), %d packs; want a machine BudgetError for %d bytes and no pack", err, be, n.Packs.Len(), 64*64*4)
	}
	availableMemory = func() int64 { return packReserve + 64*64*4 }
	if _, err := newMatMul(n); err != nil || n.Packs.Len() != 1 || len(n.Packed) < 2 || !n.Packed[1] {
		t.Fatalf("with the memory there: err %v, %d packs", err, n.Packs.Len())
	}
	availableMemory = func() int64 { return 0 } // unknown: never refused
	if err := checkMemory(1<<50, 0); err != nil {
		t.Fatalf("unknown available memory refused a pack: %v", err)
	}
}
