package kvgo

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("x: %w", cache.ErrInvalidArgument), "ValueError: "},
		{fmt.Errorf("x: %w", cache.ErrOutOfRange), "IndexError: "},
		{&cache.BudgetError{Requested: 1, Committed: 2, Budget: 3}, "BudgetError: "},
		{fmt.Errorf("x: %w", cache.ErrCapacity), "CapacityError: "},
		{fmt.Errorf("x: %w", errTypeMismatch), "TypeError: "},
		{fmt.Errorf("x: %w", errNotImplemented), "NotImplementedError: "},
		{errors.New("other"), "RuntimeError: "},
	}
	for _, tc := range cases {
		if got := classify(tc.err).Error(); !strings.HasPrefix(got, tc.want) {
			t.Errorf("classify(%v) = %q, want prefix %q", tc.err, got, tc.want)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}

func TestRecoverTurnsPanicIntoError(t *testing.T) {
	f := func() (err error) {
		defer recoverTo(&err)
		var m map[string]int
		m["x"] = 1 // panics
		return nil
	}
	err := f()
	if err == nil || !strings.HasPrefix(err.Error(), "RuntimeError: internal error") {
		t.Fatalf("panic became %v", err)
	}
}

func TestHandlesAndBadPointers(t *testing.T) {
	a, err := ArenaNew(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ArenaFree(a)
	h, err := CacheNew(a, 1, 1, 4, 4, 8, 0, 0, 0, "none", 0, "channel", 0)
	if err != nil {
		t.Fatal(err)
	}
	k := make([]float32, 4)
	p := uintptr(unsafe.Pointer(&k[0]))
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"unknown cache", CacheReset(h + 1000), "ValueError"},
		{"null pointer", CacheAppend(h, 0, 16, p, 16, 0, 1, 0), "ValueError"},
		{"negative size", CacheAppend(h, p, -1, p, 16, 0, 1, 0), "ValueError"},
		{"bad elem code", CacheAppend(h, p, 16, p, 16, 9, 1, 0), "TypeError"},
		{"bad arena", func() error { _, err := CacheNew(a+99, 1, 1, 4, 4, 8, 0, 0, 0, "none", 0, "channel", 0); return err }(), "ValueError"},
		{"bad quant", func() error { _, err := CacheNew(a, 1, 1, 4, 4, 8, 0, 0, 0, "int3", 0, "channel", 0); return err }(), "ValueError"},
		{"bad k axis", func() error { _, err := CacheNew(a, 1, 1, 4, 4, 8, 0, 0, 0, "int8", 32, "row", 0); return err }(), "ValueError"},
	}
	for _, tc := range cases {
		if tc.err == nil || !strings.HasPrefix(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.want)
		}
	}
	if err := CacheAppend(h, p, 16, p, 16, 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := CacheMaxLen(h); n != 1 {
		t.Fatalf("length %d after append", n)
	}
	CacheClose(h)
	if err := CacheReset(h); err == nil {
		t.Fatal("closed handle still usable")
	}
}
