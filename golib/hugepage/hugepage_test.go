package hugepage

import (
	"runtime"
	"testing"
	"unsafe"
)

func TestSpan(t *testing.T) {
	const s = Size
	for _, c := range []struct {
		name        string
		p, n        uintptr
		off, length uintptr
	}{
		{"empty", s, 0, 0, 0},
		{"aligned one page", s, s, 0, s},
		{"aligned, short by one byte", s, s - 1, 0, 0},
		{"aligned three pages and a tail", 4 * s, 3*s + 100, 0, 3 * s},
		{"unaligned start", s + 1, 3 * s, s - 1, 2 * s},
		{"unaligned start, short end", s + 1, 2 * s, s - 1, s},
		{"unaligned start, two pages inside", s + 4096, 3*s - 4096, s - 4096, 2 * s},
		{"inside one page", s + 10, s - 20, 0, 0},
		{"wraps around", ^uintptr(0) - s, 3 * s, 0, 0},
	} {
		off, length := span(c.p, c.n)
		if off != c.off || length != c.length {
			t.Errorf("%s: span(%#x, %#x) = %#x, %#x, want %#x, %#x", c.name, c.p, c.n, off, length, c.off, c.length)
		}
		if length > 0 && ((c.p+off)%Size != 0 || off+length > c.n) {
			t.Errorf("%s: span %#x+%#x is not aligned inside the buffer", c.name, off, length)
		}
	}
}

// TestAdvise advises buffers of several sizes and alignments (Go heap
// memory, as the weight packs are) and checks that their contents are
// kept and that the kernel accepts the advice for a buffer holding whole
// huge pages (Linux; it can still decline to back them).
func TestAdvise(t *testing.T) {
	for _, n := range []int{0, 1, 4096, Size - 1, Size, 3*Size + 123, 8 * Size} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i * 7)
		}
		ok := Advise(b)
		for i := range b {
			if b[i] != byte(i*7) {
				t.Fatalf("n %d: byte %d changed to %d", n, i, b[i])
			}
		}
		_, whole := span(uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(n))
		if runtime.GOOS == "linux" && ok != (whole > 0) {
			t.Errorf("n %d: Advise = %v with %d bytes of whole huge pages inside", n, ok, whole)
		}
		if runtime.GOOS != "linux" && ok {
			t.Errorf("n %d: Advise = true off Linux", n)
		}
	}
	if Advise(nil) {
		t.Error("Advise(nil) = true")
	}
}
