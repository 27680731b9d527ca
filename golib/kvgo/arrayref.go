package kvgo

import (
	"sync/atomic"
	"unsafe"
)

// Reading a numpy array's data pointer from Python (arr.ctypes.data) costs
// about 1.3 us, more than a whole decode-step call should. The hot entry
// points (Attention, CacheAppend) therefore accept an "array reference":
// either a data pointer, or, once ProbeArrayLayout has verified where a
// numpy array object keeps its data pointer in this process, the address of
// the array object itself (id(arr) in CPython), read here in a few ns.
// The probe compares against the value numpy reports, so a different object
// layout (another numpy ABI, a free-threaded interpreter) simply keeps the
// slow, always-correct path.

// arrayDataOffset is the byte offset of the data pointer inside a numpy
// array object, or 0 when array references are plain data pointers.
var arrayDataOffset atomic.Int64

// ProbeArrayLayout looks for the data pointer data inside the first words
// of the array object at obj (a live numpy array that the caller keeps
// alive) and, if found, switches the hot entry points to array-object
// references. It returns the offset, or 0 when the layout is not recognized.
func ProbeArrayLayout(obj, data uintptr) (off int, err error) {
	defer recoverTo(&err)
	if obj == 0 || data == 0 {
		return 0, nil
	}
	// The first two words are the refcount and the type of any object; a
	// data pointer equal to them is impossible, so search after them.
	for o := 16; o <= 48; o += 8 {
		if *(*uintptr)(unsafe.Add(cPointer(obj), o)) == data {
			arrayDataOffset.Store(int64(o))
			return o, nil
		}
	}
	return 0, nil
}

// arrayData resolves an array reference to its data pointer.
func arrayData(ref uintptr) uintptr {
	off := arrayDataOffset.Load()
	if off == 0 || ref == 0 {
		return ref
	}
	return *(*uintptr)(unsafe.Add(cPointer(ref), off))
}

// ResolveArrayRef returns the data pointer an array reference stands for
// (used by the Python side to double-check the probe on a second array).
func ResolveArrayRef(ref uintptr) (p uintptr, err error) {
	defer recoverTo(&err)
	return arrayData(ref), nil
}

// DisableArrayObjects switches the hot entry points back to plain data
// pointers.
func DisableArrayObjects() (err error) {
	arrayDataOffset.Store(0)
	return nil
}
