package cache

import "testing"

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
