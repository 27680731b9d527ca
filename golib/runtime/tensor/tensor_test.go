package tensor

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

func TestBroadcastShapes(t *testing.T) {
	cases := []struct {
		in   []Shape
		want Shape
		err  error
	}{
		{[]Shape{{2, 3}, {3}}, Shape{2, 3}, nil},
		{[]Shape{{2, 1, 4}, {3, 1}}, Shape{2, 3, 4}, nil},
		{[]Shape{{}, {5}}, Shape{5}, nil},
		{[]Shape{{0, 3}, {1, 3}}, Shape{0, 3}, nil},
		{[]Shape{{2, 3}, {4}}, nil, errs.ErrShape},
		{[]Shape{{1 << 30, 1}, {1, 1 << 30}}, nil, errs.ErrLimit},
	}
	for _, c := range cases {
		got, err := BroadcastShapes(c.in...)
		if !errors.Is(err, c.err) || (c.err == nil && !got.Equal(c.want)) {
			t.Errorf("BroadcastShapes(%v) = %v, %v; want %v, %v", c.in, got, err, c.want, c.err)
		}
	}
}

func TestBroadcastIndex(t *testing.T) {
	cases := []struct {
		src, dst Shape
		want     []int
	}{
		{Shape{3}, Shape{2, 3}, []int{0, 1, 2, 0, 1, 2}},
		{Shape{2, 1}, Shape{2, 3}, []int{0, 0, 0, 1, 1, 1}},
		{Shape{}, Shape{2}, []int{0, 0}},
		{Shape{2, 1, 2}, Shape{2, 2, 2}, []int{0, 1, 0, 1, 2, 3, 2, 3}},
		{Shape{1, 2, 1}, Shape{2, 2, 2}, []int{0, 0, 1, 1, 0, 0, 1, 1}},
	}
	for _, c := range cases {
		idx := make([]int, c.dst.Size())
		if err := BroadcastIndex(c.src, c.dst, idx); err != nil {
			t.Fatal(err)
		}
		for i := range idx {
			if idx[i] != c.want[i] {
				t.Errorf("BroadcastIndex(%v -> %v) = %v, want %v", c.src, c.dst, idx, c.want)
				break
			}
		}
	}
	if err := BroadcastIndex(Shape{3}, Shape{2}, make([]int, 2)); !errors.Is(err, errs.ErrShape) {
		t.Errorf("bad broadcast: %v", err)
	}
}

func TestViewsAliasWithoutCopy(t *testing.T) {
	src := []float32{1, 2, 3, 4, 5, 6}
	x, err := FromSlice(Shape{2, 3}, src)
	if err != nil {
		t.Fatal(err)
	}
	x.Float32()[4] = 42
	if src[4] != 42 {
		t.Fatal("FromSlice view copied the data")
	}
	if x.Int64() != nil || x.Float16() != nil {
		t.Fatal("view of the wrong type must be nil")
	}
	r, err := x.Reshaped(Shape{3, 2})
	if err != nil || &r.Float32()[0] != &src[0] {
		t.Fatalf("Reshaped must alias: %v", err)
	}
	if _, err := x.Reshaped(Shape{4}); !errors.Is(err, errs.ErrShape) {
		t.Fatalf("bad reshape: %v", err)
	}
}

func TestNewLimits(t *testing.T) {
	cases := []struct {
		dt    DType
		shape Shape
		err   error
	}{
		{Float32, Shape{2, 3}, nil},
		{Float32, Shape{0}, nil},
		{Float32, Shape{-1}, errs.ErrShape},
		{DType(8), Shape{1}, errs.ErrType},
		{Float32, Shape{1 << 21, 1 << 21}, errs.ErrLimit},
	}
	for _, c := range cases {
		_, err := New(c.dt, c.shape)
		if !errors.Is(err, c.err) {
			t.Errorf("New(%v, %v) error %v, want %v", c.dt, c.shape, err, c.err)
		}
	}
	if _, err := FromBytes(Float32, Shape{2}, make([]byte, 7)); !errors.Is(err, errs.ErrShape) {
		t.Errorf("FromBytes with a short buffer: %v", err)
	}
}

func TestFloatConversions(t *testing.T) {
	vals := []float32{0, 1, -2.5, 65504, 1e-3, 3.14159}
	for _, dt := range []DType{Float32, Float16, BFloat16, Float64, Int64, Int32, Int8, Uint8, Bool} {
		x, err := New(dt, Shape{len(vals)})
		if err != nil {
			t.Fatal(err)
		}
		if err := FromFloat32(x, vals); err != nil {
			t.Fatal(err)
		}
		back, err := AsFloat32(x)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			want := v
			switch {
			case dt == Bool:
				want = map[bool]float32{true: 1, false: 0}[v != 0]
			case dt.IsInt():
				want = float32(SaturateInt(float64(v), -128, 127))
				if dt == Uint8 && want < 0 {
					want = 0
				}
				if v == 65504 && dt != Int8 && dt != Uint8 {
					want = 65504
				} else if v == 65504 && dt == Uint8 {
					want = 255
				}
			}
			tol := float32(0)
			if dt == Float16 || dt == BFloat16 {
				tol = 0.01 * (1 + abs(v))
				if dt == BFloat16 && v == 65504 {
					tol = 300
				}
			}
			if abs(back[i]-want) > tol {
				t.Errorf("%v: %v -> %v, want %v", dt, v, back[i], want)
			}
		}
	}
}

func abs(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

func TestConvertSliceWrapsLikeACast(t *testing.T) {
	i8 := make([]int8, 3)
	ConvertSlice(i8, []int64{300, -129, 7})
	if i8[0] != 44 || i8[1] != 127 || i8[2] != 7 {
		t.Fatalf("int64 -> int8: got %v, want [44 127 7]", i8)
	}
	f := make([]float32, 2, 4) // dst may be longer than src
	ConvertSlice(f[:4], []uint8{255, 1})
	if f[0] != 255 || f[1] != 1 {
		t.Fatalf("uint8 -> float32: got %v", f)
	}
}

func TestSaturateInt(t *testing.T) {
	nan := 0.0
	nan /= nan
	cases := []struct {
		v      float64
		lo, hi int64
		want   int64
	}{{1.9, -5, 5, 1}, {-1.9, -5, 5, -1}, {1e30, -5, 5, 5}, {-1e30, -5, 5, -5}, {nan, -5, 5, 0}}
	for _, c := range cases {
		if got := SaturateInt(c.v, c.lo, c.hi); got != c.want {
			t.Errorf("SaturateInt(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

func TestMaxBytes(t *testing.T) {
	old := SetMaxBytes(1024)
	defer SetMaxBytes(old)
	if _, err := New(Float32, Shape{256}); err != nil {
		t.Fatalf("exactly at the limit: %v", err)
	}
	if _, err := New(Float32, Shape{257}); !errors.Is(err, errs.ErrLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	if SetMaxBytes(0); MaxBytes() != defaultMaxBytes() || MaxBytes() <= 0 {
		t.Fatalf("default limit %d", MaxBytes())
	}
}

// TestMakeBytesAvailable: a fresh buffer of at least memCheckMin bytes
// larger than what the system can still give is refused with ErrMemory
// (the Go heap's out-of-memory would end the process); smaller buffers and
// an unknown figure (0) are not checked.
func TestMakeBytesAvailable(t *testing.T) {
	old := availableMemory
	defer func() { availableMemory = old }()
	for _, c := range []struct {
		avail  int64
		nb     int
		refuse bool
	}{
		{100 << 20, 128 << 20, true},
		{100 << 20, 96 << 20, false},
		{100 << 20, memCheckMin - 8, false},
		{1 << 20, memCheckMin - 8, false}, // under the threshold: never checked
		{0, 128 << 20, false},             // unknown
	} {
		availableMemory = func() int64 { return c.avail }
		b, err := MakeBytes(c.nb)
		if c.refuse {
			if !errors.Is(err, errs.ErrMemory) || b != nil {
				t.Errorf("avail %d, %d bytes: err %v, want ErrMemory", c.avail, c.nb, err)
			}
			continue
		}
		if err != nil || len(b) != c.nb || uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
			t.Errorf("avail %d, %d bytes: %d bytes, err %v", c.avail, c.nb, len(b), err)
		}
	}
	availableMemory = func() int64 { return 100 << 20 }
	if _, err := New(Float32, Shape{32 << 20}); !errors.Is(err, errs.ErrMemory) {
		t.Errorf("New of 128 MiB with 100 MiB available: %v", err)
	}
	if _, err := NewCap(Float32, Shape{1 << 20}, 128<<20); !errors.Is(err, errs.ErrMemory) {
		t.Errorf("NewCap of 128 MiB with 100 MiB available: %v", err)
	}
}

// TestRecycle: Recycle reuses a header only when it is not pinned and the
// rank fits in the header, applies FromBytes's checks, and the recycled
// header describes the new tensor only.
func TestRecycle(t *testing.T) {
	buf := make([]float32, 12)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 48)
	for _, c := range []struct {
		name  string
		prev  func() *Tensor
		dt    DType
		shape Shape
		data  []byte
		same  bool
		fails bool
	}{
		{"nil", func() *Tensor { return nil }, Float32, Shape{3, 4}, b, false, false},
		{"free", func() *Tensor { x, _ := New(Int64, Shape{2}); return x }, Float32, Shape{3, 4}, b, true, false},
		{"pinned", func() *Tensor { x, _ := New(Int64, Shape{2}); x.Pin(); return x }, Float32, Shape{3, 4}, b, false, false},
		{"rank 7", func() *Tensor { x, _ := New(Int64, Shape{2}); return x }, Float32, Shape{1, 1, 1, 3, 1, 4, 1}, b, false, false},
		{"scalar", func() *Tensor { x, _ := New(Int64, Shape{2}); return x }, Int32, Shape{}, b[:4], true, false},
		{"short", func() *Tensor { x, _ := New(Int64, Shape{2}); return x }, Float32, Shape{3, 5}, b, false, true},
		{"misaligned", func() *Tensor { x, _ := New(Int64, Shape{2}); return x }, Float32, Shape{11}, b[2:46], false, true},
	} {
		prev := c.prev()
		got, err := Recycle(prev, c.dt, c.shape, c.data)
		if c.fails {
			if err == nil {
				t.Errorf("%s: no error", c.name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if (got == prev) != c.same {
			t.Errorf("%s: reused = %v, want %v", c.name, got == prev, c.same)
		}
		if got.DType() != c.dt || !got.Shape().Equal(c.shape) || got.NumBytes() != len(c.data) {
			t.Errorf("%s: got %v with %d bytes", c.name, got, got.NumBytes())
		}
		if prev != nil && !c.same && (prev.DType() != Int64 || !prev.Shape().Equal(Shape{2})) {
			t.Errorf("%s: the unreused header changed to %v", c.name, prev)
		}
	}
	// The header owns its dimensions: changing the caller's shape later
	// changes nothing.
	s := Shape{3, 4}
	x, _ := FromBytes(Float32, s, b)
	s[0] = 99
	if !x.Shape().Equal(Shape{3, 4}) {
		t.Errorf("the header shares the caller's shape: %v", x.Shape())
	}
}

// TestNewSmall checks the tensors whose buffer shares the header's
// allocation against the plain ones: zero-filled, exactly their byte size
// (capacity included, so an append cannot reach past the tensor), separate
// buffers per tensor, one allocation.
func TestNewSmall(t *testing.T) {
	cases := []struct {
		dt     DType
		shape  Shape
		allocs float64 // at most, per New
	}{
		{Int64, Shape{}, 1},
		{Int64, Shape{3}, 1},
		{Int64, Shape{8}, 1},      // 64 bytes: the largest small buffer
		{Int64, Shape{9}, 2},      // 72 bytes: header and buffer
		{Float32, Shape{2, 3}, 1}, // 24 bytes
		{Bool, Shape{5}, 1},
		{Int64, Shape{1, 1, 1, 1, 1, 1, 2}, 2}, // rank above the inline shape
		{Float32, Shape{0, 4}, 2},
	}
	for _, c := range cases {
		nb, err := ByteSize(c.dt, c.shape)
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(c.dt, c.shape)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := New(c.dt, c.shape)
		if a.DType() != c.dt || !a.Shape().Equal(c.shape) || len(a.Bytes()) != nb || cap(a.Bytes()) != nb {
			t.Errorf("New(%v, %v): %v %v, %d bytes (cap %d), want %d", c.dt, c.shape, a.DType(), a.Shape(), len(a.Bytes()), cap(a.Bytes()), nb)
		}
		for i := range a.Bytes() {
			if a.Bytes()[i] != 0 {
				t.Fatalf("New(%v, %v): byte %d is %d, want 0", c.dt, c.shape, i, a.Bytes()[i])
			}
			a.Bytes()[i] = 0xff
		}
		for i, v := range b.Bytes() {
			if v != 0 {
				t.Fatalf("New(%v, %v): writing one tensor changed byte %d of another", c.dt, c.shape, i)
			}
		}
		if got := testing.AllocsPerRun(16, func() { _, _ = New(c.dt, c.shape) }); got > c.allocs {
			t.Errorf("New(%v, %v): %v allocations, want at most %v", c.dt, c.shape, got, c.allocs)
		}
	}
}

// TestMapFileEvictRelease: a tensor over a mapped file reads the file's
// values, is file-backed, reads the same values after Evict (the pages
// come back from the file), and after ReleaseStorage reads zero while the
// file keeps its bytes; a heap tensor is not file-backed and Evict leaves
// it alone.
func TestMapFileEvictRelease(t *testing.T) {
	vals := []float32{1.5, -2, 3.25, 4, 5, 6, 7, 8}
	raw := make([]byte, 4+4*len(vals)) // the values at offset 4
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4+4*i:], math.Float32bits(v))
	}
	path := filepath.Join(t.TempDir(), "w.bin")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := MapFile(path)
	if err != nil {
		t.Skipf("no file mapping here: %v", err)
	}
	x, err := FromBytes(Float32, Shape{len(vals)}, m[4:])
	if err != nil {
		t.Fatal(err)
	}
	if !x.FileBacked() {
		t.Fatal("a tensor over a mapped file is not file-backed")
	}
	for round := 0; round < 2; round++ {
		for i, v := range x.Float32() {
			if v != vals[i] {
				t.Fatalf("round %d: value %d = %v, want %v", round, i, v, vals[i])
			}
		}
		x.Evict()
	}
	if !x.ReleaseStorage() || x.FileBacked() {
		t.Fatal("release of a file-backed tensor")
	}
	for _, v := range x.Float32() {
		if v != 0 {
			t.Fatalf("released tensor reads %v", v)
		}
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != string(raw) {
		t.Fatalf("the file changed: %v", err)
	}
	h, err := FromSlice(Shape{2}, []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	h.Evict()
	if h.FileBacked() || h.Float32()[1] != 2 {
		t.Fatal("Evict touched a heap tensor")
	}
}
