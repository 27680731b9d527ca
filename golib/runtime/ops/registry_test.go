package ops

import (
	"errors"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

func TestRegistry(t *testing.T) {
	for _, err := range RegistryErrors() {
		t.Error(err)
	}
}

func TestLookupUnknown(t *testing.T) {
	_, err := Lookup("com.example", "NoSuchOp", 7)
	if !errors.Is(err, errs.ErrUnsupportedOp) {
		t.Fatalf("want ErrUnsupportedOp, got %v", err)
	}
	for _, part := range []string{"NoSuchOp", "com.example", "7"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q does not name %q", err, part)
		}
	}
}

func TestParallelForCoversRangeAndRecovers(t *testing.T) {
	seen := make([]int, 1000)
	if err := ParallelFor(4, len(seen), 10, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			seen[i]++
		}
	}); err != nil {
		t.Fatal(err)
	}
	for i, v := range seen {
		if v != 1 {
			t.Fatalf("index %d visited %d times", i, v)
		}
	}
	err := ParallelFor(2, 10, 1, func(lo, hi int) {
		var s []int
		_ = s[lo+100]
	})
	if err == nil {
		t.Fatal("a panicking worker must return an error")
	}
}
