package tensor

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// Tensor is a dense, row-major tensor. Its bytes may be owned by the Go heap
// or borrowed (for example a numpy buffer passed through the bindings); the
// typed views below alias those bytes and never copy.
//
// A Tensor is immutable by convention once it is a runtime value: kernels
// write only into outputs they allocated.
type Tensor struct {
	dtype DType
	shape Shape
	data  []byte
	// dims holds the shape of tensors of rank <= inlineRank, so making a
	// tensor header is one allocation, not two (the executor makes
	// hundreds per decode step).
	dims [inlineRank]int
	// pinned marks a header that is held beyond the run that made it (see
	// Recycle).
	pinned atomic.Bool
}

// inlineRank is the largest rank whose dimensions a Tensor keeps in its own
// header.
const inlineRank = 6

// header returns a new tensor header holding a copy of shape.
func header(dt DType, shape Shape, data []byte) *Tensor {
	t := &Tensor{dtype: dt, data: data}
	t.setShape(shape)
	return t
}

// setShape makes t's shape a copy of shape, in the header's own dims when
// the rank allows.
func (t *Tensor) setShape(shape Shape) {
	if n := len(shape); n <= inlineRank {
		copy(t.dims[:n], shape)
		t.shape = t.dims[:n:n]
	} else {
		t.shape = shape.Clone()
	}
}

// New allocates a zero-filled tensor. The buffer is 8-byte aligned so every
// typed view is aligned.
func New(dt DType, shape Shape) (*Tensor, error) {
	nb, err := ByteSize(dt, shape)
	if err != nil {
		return nil, err
	}
	if nb > 0 && nb <= smallBytes {
		return newSmall(dt, shape, nb, nb), nil
	}
	data, err := MakeBytes(nb)
	if err != nil {
		return nil, fmt.Errorf("a %v tensor of shape %v: %w", dt, shape, err)
	}
	return header(dt, shape, data), nil
}

// smallBytes is the largest buffer New places in the same allocation as the
// header: shape arithmetic makes many tensors of a few int64 values per run
// (Shape, Gather, Concat, Range outputs), one heap allocation each, not two.
const smallBytes = 64

// smallTensor is a header with its (small) buffer.
type smallTensor struct {
	t     Tensor
	words [smallBytes / 8]uint64
}

// newSmall returns a zero-filled tensor of nb <= smallBytes bytes whose
// buffer shares the header's allocation (a reference to either keeps both),
// with a capacity of c bytes (nb <= c <= smallBytes).
func newSmall(dt DType, shape Shape, nb, c int) *Tensor {
	s := &smallTensor{t: Tensor{dtype: dt}}
	t := &s.t
	t.data = unsafe.Slice((*byte)(unsafe.Pointer(&s.words[0])), c)[:nb]
	t.setShape(shape)
	return t
}

// NewCap is New with a buffer of at least capBytes bytes behind the
// tensor's own (its capacity, for Reuse): a value that grows a little from
// run to run (a mask or Range over the past length) is rewritten in place
// for several runs before it needs a larger buffer.
func NewCap(dt DType, shape Shape, capBytes int) (*Tensor, error) {
	nb, err := ByteSize(dt, shape)
	if err != nil {
		return nil, err
	}
	switch {
	case nb == 0 || capBytes <= nb:
		return New(dt, shape)
	case nb <= smallBytes:
		return newSmall(dt, shape, nb, smallBytes), nil
	}
	data, err := MakeBytes((capBytes + 7) &^ 7)
	if err != nil {
		return nil, fmt.Errorf("a %v tensor of shape %v: %w", dt, shape, err)
	}
	return header(dt, shape, data[:nb]), nil
}

// Reuse turns prev into a tensor of dt and shape in its own header and
// buffer, when prev is not pinned, its rank fits the header and its
// buffer's capacity holds nb bytes (the size of dt and shape, from
// ByteSize); it returns nil otherwise. The bytes keep their old contents.
// The caller guarantees that nothing reads prev or views its buffer any
// more (the shape cache's spare outputs).
func Reuse(prev *Tensor, dt DType, shape Shape, nb int) *Tensor {
	if prev == nil || prev.pinned.Load() || len(shape) > inlineRank || cap(prev.data) < nb || nb == 0 {
		return nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(prev.data)))%uintptr(max(dt.Size(), 1)) != 0 {
		return nil
	}
	prev.dtype, prev.data = dt, prev.data[:nb]
	copy(prev.dims[:len(shape)], shape)
	prev.shape = prev.dims[:len(shape):len(shape)]
	return prev
}

// Recycle returns a tensor of dt and shape over b, with FromBytes's
// checks, reusing the header prev when it is not nil and not pinned (its
// old dtype, shape and bytes are overwritten), else a new one. The runtime
// keeps the headers each node made in its last run and recycles them in the
// next: a node makes the same outputs step after step, and a header is a
// heap allocation. The caller guarantees that nothing reads prev any more
// unless it was pinned.
func Recycle(prev *Tensor, dt DType, shape Shape, b []byte) (*Tensor, error) {
	if prev == nil || prev.pinned.Load() || len(shape) > inlineRank {
		return FromBytes(dt, shape, b)
	}
	if err := checkBytes(dt, shape, b); err != nil {
		return nil, err
	}
	if b == nil {
		b = []byte{}
	}
	prev.dtype, prev.data = dt, b
	copy(prev.dims[:len(shape)], shape)
	prev.shape = prev.dims[:len(shape):len(shape)]
	return prev, nil
}

// Pin marks t as held beyond the run that made it (an output handed to the
// caller, a persistent value): Recycle never reuses its header.
func (t *Tensor) Pin() {
	if !t.pinned.Load() {
		t.pinned.Store(true)
	}
}

// ByteSize returns the bytes a tensor of dt and shape needs, with the
// checks New applies (valid type and shape, the per-tensor size limit), so
// a caller with its own buffers can size them before allocating.
func ByteSize(dt DType, shape Shape) (int, error) {
	n, err := check(dt, shape)
	if err != nil {
		return 0, err
	}
	nb, ok := checkedMul(n, dt.Size())
	if !ok || int64(nb) > maxBytes.Load() {
		// a size limit, and (by default the machine's memory) a request for more memory
		// than there is: both sentinels, so the bindings raise MemoryError
		return 0, fmt.Errorf("%w (%w): a %v tensor of shape %v needs %s, over the per-tensor limit of %s",
			errs.ErrMemory, errs.ErrLimit, dt, shape, units.Bytes(int64(n)*int64(dt.Size())), units.Bytes(maxBytes.Load()))
	}
	return nb, nil
}

// FromBytes wraps b as a tensor without copying. len(b) must equal the
// shape's size times the element size, and b must be aligned to the element
// size. The caller keeps b alive and unmodified while the tensor is in use.
func FromBytes(dt DType, shape Shape, b []byte) (*Tensor, error) {
	if err := checkBytes(dt, shape, b); err != nil {
		return nil, err
	}
	if b == nil {
		b = []byte{}
	}
	return header(dt, shape, b), nil
}

// FromSlice wraps data as a tensor without copying.
func FromSlice[T Elem](shape Shape, data []T) (*Tensor, error) {
	dt := DTypeOf[T]()
	var b []byte
	if len(data) > 0 {
		b = unsafe.Slice((*byte)(unsafe.Pointer(&data[0])), len(data)*dt.Size())
	}
	return FromBytes(dt, shape, b)
}

// Scalar returns a rank-0 tensor holding v.
func Scalar[T Elem](v T) *Tensor {
	t, _ := FromSlice(Shape{}, []T{v}) // cannot fail: one element, aligned
	return t
}

// checkBytes checks that b holds a tensor of dt and shape: its length and
// alignment.
func checkBytes(dt DType, shape Shape, b []byte) error {
	n, err := check(dt, shape)
	if err != nil {
		return err
	}
	if want, ok := checkedMul(n, dt.Size()); !ok || want != len(b) {
		return fmt.Errorf("%w: %d bytes for a %v tensor of shape %v (want %d)", errs.ErrShape, len(b), dt, shape, n*dt.Size())
	}
	if len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%uintptr(dt.Size()) != 0 {
		return fmt.Errorf("%w: buffer for %v is not %d-byte aligned", errs.ErrInvalidArgument, dt, dt.Size())
	}
	return nil
}

func check(dt DType, shape Shape) (int, error) {
	if !dt.Valid() {
		return 0, fmt.Errorf("%w: unsupported element type %v", errs.ErrType, dt)
	}
	return shape.NumElements()
}

// ReleaseStorage lets go of t's values where nothing will read them again
// (a constant whose every reader kept a derived copy, such as a packed
// weight): t keeps its type, shape and length, and its bytes now read as
// zero from a shared read-only mapping that takes no memory, so the
// collector can free the old storage once no other header aliases it. It
// reports whether it released anything (false for an empty tensor and
// where the platform has no such mapping). Writing t afterwards faults.
func (t *Tensor) ReleaseStorage() bool {
	if len(t.data) == 0 {
		return false
	}
	z := zeroBytes(len(t.data))
	if z == nil {
		return false
	}
	EvictFilePages(t.data)
	t.data = z
	return true
}

// Evict is a hint that t's values will not be read for a while: where they
// are pages of a mapped file (MapFile), the pages wholly inside t leave the
// resident set and are read from the file again on the next read; other
// storage is left alone. A factory that copied a constant into a pack
// calls it, so a model's weights are not resident twice while a session
// is built.
func (t *Tensor) Evict() { EvictFilePages(t.data) }

// Aliases reports whether t's bytes lie inside region (a file mapping,
// say). An empty tensor aliases nothing.
func (t *Tensor) Aliases(region []byte) bool {
	if len(t.data) == 0 || len(region) == 0 {
		return false
	}
	lo, hi := span(t.data)
	r0, r1 := span(region)
	return lo >= r0 && hi <= r1
}

// span returns the address range [lo, hi) of b's bytes.
func span(b []byte) (lo, hi uintptr) {
	lo = uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return lo, lo + uintptr(len(b))
}

// FileBacked reports whether t's values are pages of a file mapped by
// MapFile (an external data file the model loader mapped).
func (t *Tensor) FileBacked() bool { return inFileMap(t.data) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape returns the shape. Callers must not modify it.
func (t *Tensor) Shape() Shape { return t.shape }

// Rank returns the number of dimensions.
func (t *Tensor) Rank() int { return len(t.shape) }

// Len returns the number of elements.
func (t *Tensor) Len() int { return len(t.data) / t.dtype.Size() }

// Bytes returns the raw bytes (aliased, not copied).
func (t *Tensor) Bytes() []byte { return t.data }

// NumBytes returns the size of the data in bytes.
func (t *Tensor) NumBytes() int { return len(t.data) }

// Reshaped returns a tensor sharing t's bytes with a new shape of the same
// element count.
func (t *Tensor) Reshaped(shape Shape) (*Tensor, error) {
	n, err := shape.NumElements()
	if err != nil {
		return nil, err
	}
	if n != t.Len() {
		return nil, fmt.Errorf("%w: cannot reshape %v (%d elements) to %v", errs.ErrShape, t.shape, t.Len(), shape)
	}
	return header(t.dtype, shape, t.data), nil
}

// Clone returns a deep copy with its own buffer.
func (t *Tensor) Clone() *Tensor {
	c, _ := New(t.dtype, t.shape) // t is valid, so this cannot fail
	copy(c.data, t.data)
	return c
}

// String describes the tensor without its data.
func (t *Tensor) String() string {
	return fmt.Sprintf("Tensor(%v, shape=%v)", t.dtype, t.shape)
}

// Data returns t's elements as a []T that aliases the tensor's bytes, or nil
// when T does not match t's element type.
func Data[T Elem](t *Tensor) []T {
	if t == nil || DTypeOf[T]() != t.dtype {
		return nil
	}
	n := t.Len()
	if n == 0 {
		return []T{}
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&t.data[0])), n)
}

// Float32 returns the float32 view, or nil if t is not float32.
func (t *Tensor) Float32() []float32 { return Data[float32](t) }

// Float64 returns the float64 view, or nil if t is not float64.
func (t *Tensor) Float64() []float64 { return Data[float64](t) }

// Int64 returns the int64 view, or nil if t is not int64.
func (t *Tensor) Int64() []int64 { return Data[int64](t) }

// Int32 returns the int32 view, or nil if t is not int32.
func (t *Tensor) Int32() []int32 { return Data[int32](t) }

// Int8 returns the int8 view, or nil if t is not int8.
func (t *Tensor) Int8() []int8 { return Data[int8](t) }

// Uint8 returns the uint8 view, or nil if t is not uint8.
func (t *Tensor) Uint8() []uint8 { return Data[uint8](t) }

// Bool returns the bool view, or nil if t is not bool. Every byte of a bool
// tensor is 0 or 1.
func (t *Tensor) Bool() []bool { return Data[bool](t) }

// Float16 returns the raw half-precision view, or nil if t is not float16.
func (t *Tensor) Float16() []Float16Bits { return Data[Float16Bits](t) }

// BFloat16 returns the raw bfloat16 view, or nil if t is not bfloat16.
func (t *Tensor) BFloat16() []BFloat16Bits { return Data[BFloat16Bits](t) }
