package kvgo

import (
	"fmt"
	"sync"
	"unsafe"
)

// registry maps the integer handles that Python holds to Go objects. Handles
// are never reused, so a stale handle can only miss, never alias.
type registry[T any] struct {
	mu   sync.RWMutex
	next int64
	m    map[int64]T
	kind string
}

func newRegistry[T any](kind string) *registry[T] {
	return &registry[T]{m: map[int64]T{}, kind: kind}
}

func (r *registry[T]) put(v T) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.next++
	r.m[r.next] = v
	return r.next
}

func (r *registry[T]) get(h int64) (T, error) {
	r.mu.RLock()
	v, ok := r.m[h]
	r.mu.RUnlock()
	if !ok {
		var zero T
		return zero, r.missing(h)
	}
	return v, nil
}

// missing is the error for a handle r does not hold: handles are never
// reused, so it was closed (or never issued).
func (r *registry[T]) missing(h int64) error {
	return fmt.Errorf("the %s is closed (%w %d)", r.kind, errUnknownHandle, h)
}

// take removes and returns the object behind h.
func (r *registry[T]) take(h int64) (T, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[h]
	delete(r.m, h)
	return v, ok
}

// drop removes every object for which match is true.
func (r *registry[T]) drop(match func(T) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h, v := range r.m {
		if match(v) {
			delete(r.m, h)
		}
	}
}

func (r *registry[T]) len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.m)
}

// bytesAt views n bytes of C memory (a numpy buffer) at p. The caller keeps
// the array alive for the call; Go's GC neither scans nor moves it.
func bytesAt(p uintptr, n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative buffer size %d", errInvalid, n)
	}
	if n == 0 {
		return []byte{}, nil
	}
	if p == 0 {
		return nil, fmt.Errorf("%w: null data pointer", errInvalid)
	}
	return unsafe.Slice((*byte)(cPointer(p)), n), nil
}

// int64sAt views n int64s of C memory at p.
func int64sAt(p uintptr, n int) ([]int64, error) {
	b, err := bytesAt(p, 8*n)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&b[0])), n), nil
}

// float32sAt views n float32s of C memory at p.
func float32sAt(p uintptr, n int) ([]float32, error) {
	b, err := bytesAt(p, 4*n)
	if err != nil || n == 0 {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n), nil
}

// ints converts an int64 buffer to ints.
func ints(p uintptr, n int) ([]int, error) {
	s, err := int64sAt(p, n)
	if err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i, v := range s {
		out[i] = int(v)
	}
	return out, nil
}

// cPointer turns the address of C (numpy) memory into a pointer. The value
// came from Python as an integer; it is never Go memory, so the GC has
// nothing to track (the double indirection keeps vet's uintptr check, which
// is about Go memory, quiet).
func cPointer(p uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}
