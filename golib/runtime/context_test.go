package runtime

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func newCache(t *testing.T, a *cache.Arena) *cache.KVCache {
	t.Helper()
	c, err := cache.New(a, cache.Config{Batch: 1, KVHeads: 1, HeadDimK: 4, Capacity: 8, Elem: cache.Float32})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClearValuesKeepsStateResetReleasesIt(t *testing.T) {
	a, err := cache.NewArena(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	ctx := NewContext()
	kv := newCache(t, a)
	if err := ctx.PutCache("layer0", kv); err != nil {
		t.Fatal(err)
	}
	ctx.DeclarePersistent("step")
	ctx.PutTensor("step", tensor.Scalar(int64(3)))
	ctx.PutTensor("tmp", tensor.Scalar(float32(1)))
	ctx.PutSequence("seq", Sequence{tensor.Scalar(float32(1))})
	ctx.PutShape("tmp", tensor.Shape{1})

	ctx.ClearValues()
	cases := []struct {
		what string
		ok   bool
		want bool
	}{
		{"persistent tensor kept", ctx.HasTensor("step"), true},
		{"temporary tensor dropped", ctx.HasTensor("tmp"), false},
		{"cache kept", ctx.HasCache("layer0"), true},
	}
	for _, c := range cases {
		if c.ok != c.want {
			t.Errorf("after ClearValues: %s: got %v", c.what, c.ok)
		}
	}
	if _, ok := ctx.Sequence("seq"); ok {
		t.Error("sequence survived ClearValues")
	}
	if kv.Closed() {
		t.Fatal("ClearValues closed a cache")
	}
	if err := ctx.ResetState(); err != nil {
		t.Fatal(err)
	}
	if ctx.HasTensor("step") || ctx.HasCache("layer0") || !kv.Closed() {
		t.Error("ResetState must drop persistent values and close caches")
	}
}

func TestChildSeesParentWithoutCopies(t *testing.T) {
	a, err := cache.NewArena(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	parent := NewContext()
	x := tensor.Scalar(float32(2))
	parent.PutTensor("x", x)
	child := parent.NewChild()
	if got, ok := child.Tensor("x"); !ok || got != x {
		t.Fatal("child does not see the parent's tensor by reference")
	}
	child.PutTensor("local", x)
	if parent.HasTensor("local") {
		t.Error("a child's value leaked into the parent")
	}
	kv := newCache(t, a)
	if err := child.PutCache("c", kv); err != nil {
		t.Fatal(err)
	}
	if got, err := parent.GetCache("c"); err != nil || got != kv {
		t.Error("a cache put by a child is the parent's cache")
	}
	if err := child.ResetState(); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("ResetState on a child: %v", err)
	}
}

func TestCacheMapOwnership(t *testing.T) {
	a, err := cache.NewArena(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	ctx := NewContext()
	first, second := newCache(t, a), newCache(t, a)
	if err := ctx.PutCache("c", first); err != nil {
		t.Fatal(err)
	}
	if err := ctx.PutCache("c", first); err != nil || first.Closed() {
		t.Fatal("putting the same handle again must not close it")
	}
	if err := ctx.PutCache("c", second); err != nil || !first.Closed() {
		t.Fatal("a replaced cache must be closed")
	}
	got, ok := ctx.RemoveCache("c")
	if !ok || got != second || second.Closed() || ctx.HasCache("c") {
		t.Fatal("RemoveCache hands the open cache to the caller")
	}
	second.Close()
	if _, err := ctx.GetCache("c"); !errors.Is(err, errs.ErrNotFound) {
		t.Errorf("GetCache of a removed cache: %v", err)
	}
	if err := ctx.PutCache("x", nil); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("PutCache(nil): %v", err)
	}
}

func TestTypeAwareLookup(t *testing.T) {
	a, err := cache.NewArena(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := NewContext()
	x := tensor.Scalar(float32(1))
	kv := newCache(t, a)
	ctx.PutTensor("v", x)
	ctx.PutSequence("v", Sequence{x})
	if err := ctx.PutCache("v", kv); err != nil {
		t.Fatal(err)
	}
	child := ctx.NewChild()
	cases := []struct {
		kind ValueKind
		want any
	}{{ValueTensor, x}, {ValueCache, kv}}
	for _, c := range cases {
		got, ok := child.Value("v", c.kind)
		if !ok || got != c.want {
			t.Errorf("kind %d: got %v, %v", c.kind, got, ok)
		}
	}
	if s, ok := child.Value("v", ValueSequence); !ok || len(s.(Sequence)) != 1 {
		t.Error("sequence lookup")
	}
	if _, ok := child.Value("v", ValueMap); ok {
		t.Error("no map named v exists")
	}
	if err := ctx.ResetState(); err != nil || !kv.Closed() {
		t.Error("reset must close the cache")
	}
}
