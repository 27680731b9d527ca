package model

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
)

// allocatedBy returns the bytes f allocated on the Go heap.
func allocatedBy(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestLoadDevicesBounded reads endless devices: the load fails with an
// invalid-model or limit error after reading little, whatever the limit.
func TestLoadDevicesBounded(t *testing.T) {
	cases := []struct {
		path  string
		limit int64
	}{
		{"/dev/zero", 0},
		{"/dev/zero", 1 << 20},
		{"/dev/urandom", 1 << 20},
		{"/dev/urandom", 0},
	}
	for _, c := range cases {
		if _, err := os.Stat(c.path); err != nil {
			t.Skipf("%s: %v", c.path, err)
		}
		var err error
		alloc := allocatedBy(func() { _, err = Load(c.path, Options{MaxModelBytes: c.limit}) })
		if !errors.Is(err, errs.ErrInvalidModel) && !errors.Is(err, errs.ErrLimit) {
			t.Errorf("%s limit %d: error %v", c.path, c.limit, err)
		}
		// The first chunk plus the limit's worth of growth at most; the
		// framing check makes both devices fail on the first chunk.
		bound := uint64(4 << 20)
		if c.limit > 0 {
			bound = uint64(4*c.limit) + 1<<20
		}
		if alloc > bound {
			t.Errorf("%s limit %d: allocated %d bytes, bound %d", c.path, c.limit, alloc, bound)
		}
	}
}

// TestLoadPipe reads models through a named pipe: a valid model loads, an
// oversized one fails with ErrLimit while reading, garbage fails early.
func TestLoadPipe(t *testing.T) {
	valid := modelBytes()
	if _, err := LoadBytes(reordered(valid), Options{}); err != nil {
		t.Fatalf("the reordered model must be valid protobuf: %v", err)
	}
	cases := []struct {
		name  string
		data  []byte
		limit int64
		err   error
	}{
		{"valid", valid, 0, nil},
		{"valid at the limit", valid, int64(len(valid)), nil},
		{"over the limit", valid, int64(len(valid)) - 1, errs.ErrLimit},
		{"zeros", make([]byte, 1<<16), 0, errs.ErrInvalidModel},
		{"unknown field", append([]byte{0x78, 0x01}, valid...), 0, errs.ErrInvalidModel},
		{"huge length", []byte{0x08, 0x0a, 0x3a, 0xff, 0xff, 0xff, 0xff, 0x0f}, 1 << 20, errs.ErrInvalidModel},
		{"graph before ir_version", reordered(valid), 0, errs.ErrInvalidModel},
		{"truncated", valid[:len(valid)/2], 0, errs.ErrInvalidModel},
		{"empty", nil, 0, errs.ErrInvalidModel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "model.pipe")
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				w, err := os.OpenFile(path, os.O_WRONLY, 0)
				if err != nil {
					return
				}
				defer w.Close()
				// Small writes so the reader sees the stream in pieces.
				for i := 0; i < len(c.data); i += 7 {
					if _, err := w.Write(c.data[i:min(i+7, len(c.data))]); err != nil {
						return
					}
				}
			}()
			m, err := Load(path, Options{MaxModelBytes: c.limit})
			// Unblock a writer left behind by an early failure.
			if r, oerr := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); oerr == nil {
				r.Close()
			}
			<-done
			if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Fatalf("error %v, want %v", err, c.err)
			}
			if err == nil && m.Graph == nil {
				t.Fatal("loaded model has no graph")
			}
		})
	}
}

// reordered moves the first top-level field (ir_version) of a serialized
// model to the end: still a valid protobuf, but not in field order.
func reordered(b []byte) []byte {
	_, _, n := protowire.ConsumeField(b)
	return append(append([]byte(nil), b[n:]...), b[:n]...)
}

// modelBytes is a small valid serialized model.
func modelBytes() []byte {
	return onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3})))
}
