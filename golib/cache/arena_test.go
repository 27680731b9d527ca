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

// TestArenaPoolIsBounded: caches of ever-changing sizes, created and closed
// one at a time, leave at most about twice the largest buffer pooled (the
// pool once kept every size it saw, forever, without a budget), while one
// size freed and asked for again is still reused.
func TestArenaPoolIsBounded(t *testing.T) {
	cases := []struct {
		name  string
		sizes []int
	}{
		{"growing", []int{1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20, 6 << 20}},
		{"shrinking", []int{6 << 20, 5 << 20, 4 << 20, 3 << 20, 2 << 20, 1 << 20}},
		{"mixed", []int{3 << 20, 1 << 20, 5 << 20, 2 << 20, 5<<20 + 4096, 4 << 20, 1<<20 + 64}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := NewArena(0)
			defer a.Close()
			largest := 0
			for _, n := range tc.sizes {
				b, err := a.alloc(n)
				mustOK(t, err)
				a.release(b)
				largest = max(largest, n)
				if st := a.Stats(); st.Pooled > 2*int64(largest) {
					t.Fatalf("after %d bytes: %d pooled, more than twice the largest buffer (%d)", n, st.Pooled, largest)
				}
			}
			before := a.Stats().Allocations
			n := tc.sizes[len(tc.sizes)-1]
			b, err := a.alloc(n)
			mustOK(t, err)
			if st := a.Stats(); st.Allocations != before+1 || st.Pooled > 2*int64(largest) {
				t.Fatalf("stats %+v", st)
			}
			a.release(b)
		})
	}
}

// TestArenaTrimsThePoolBeforeRefusing: an allocation the machine cannot
// back while the pool holds buffers of other sizes gives those back and
// tries again, instead of refusing with memory the arena itself keeps idle.
func TestArenaTrimsThePoolBeforeRefusing(t *testing.T) {
	a, _ := NewArena(0)
	defer a.Close()
	b1, err := a.alloc(3 << 20)
	mustOK(t, err)
	b2, err := a.alloc(2 << 20)
	mustOK(t, err)
	a.release(b1, b2)
	if st := a.Stats(); st.Pooled != 5<<20 {
		t.Fatalf("stats %+v, want both buffers pooled (the peak held both)", st)
	}
	// a machine with 4 MiB left, of which the pool's idle 5 MiB would give back room
	defer func(f func(int64) (bool, int64)) { machineFits = f }(machineFits)
	machineFits = func(n int64) (bool, int64) {
		avail := int64(4<<20) + 5<<20 - a.pooled
		return n <= avail, avail
	}
	b, err := a.alloc(6 << 20)
	if err != nil {
		t.Fatalf("alloc with 5 MiB pooled of other sizes: %v", err)
	}
	if st := a.Stats(); st.Pooled != 0 || st.Allocated != 6<<20 {
		t.Fatalf("stats %+v, want the pool given back", st)
	}
	a.release(b)
	machineFits = func(n int64) (bool, int64) { return false, 0 }
	_, err = a.alloc(7 << 20)
	var be *BudgetError
	if !errors.As(err, &be) || !be.Machine {
		t.Fatalf("nothing fits: %v, want a machine BudgetError", err)
	}
}
