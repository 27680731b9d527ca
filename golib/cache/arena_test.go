package cache

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
)

// TestLargeBuffersRoundTrip covers buffers big enough for the huge-page
// mapping path: zeroed on hand-out, zeroed again on reuse, unmapped on trim.
func TestLargeBuffersRoundTrip(t *testing.T) {
	a, _ := NewArena(0)
	const n = 3<<20 + 5
	b, err := a.alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != n {
		t.Fatalf("len %d", len(b))
	}
	for i := 0; i < n; i += 4093 {
		if b[i] != 0 {
			t.Fatal("fresh buffer not zeroed")
		}
		b[i] = 7
	}
	a.release(b)
	b2, _ := a.alloc(n) // reuses the pooled buffer
	for i := 0; i < n; i += 4093 {
		if b2[i] != 0 {
			t.Fatal("reused buffer not zeroed")
		}
	}
	a.release(b2)
	a.Close()
	if st := a.Stats(); st.Pooled != 0 || st.Allocated != 0 {
		t.Fatalf("after close: %+v", st)
	}
	b3, _ := a.alloc(n) // still usable, not pooled on release
	a.release(b3)
	if st := a.Stats(); st.Pooled != 0 {
		t.Fatalf("closed arena pooled %d bytes", st.Pooled)
	}
}

// TestArenaMachineLimit checks that a request beyond the memory the machine
// has available is refused with a BudgetError (Machine set), even without a
// budget, and leaves the arena as it was: the Go heap's out-of-memory would
// end the process instead.
func TestArenaMachineLimit(t *testing.T) {
	avail := sysmem.Available()
	if avail <= 0 {
		t.Skip("available memory unknown on this platform")
	}
	a, err := NewArena(0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	before := a.Stats()
	_, err = a.alloc(int(2 * avail))
	var be *BudgetError
	if !errors.As(err, &be) || !be.Machine || !errors.Is(err, ErrBudget) {
		t.Fatalf("alloc(2 x available) = %v, want a machine BudgetError", err)
	}
	if after := a.Stats(); after != before {
		t.Fatalf("refused allocation changed the arena: %+v -> %+v", before, after)
	}
	if _, err := New(a, Config{Batch: 1, KVHeads: 8, HeadDimK: 128, Capacity: int(avail/(8*128*4)) + 1, Elem: Float32}); !errors.Is(err, ErrBudget) {
		t.Fatalf("a cache larger than the machine: err %v, want ErrBudget", err)
	}
}
