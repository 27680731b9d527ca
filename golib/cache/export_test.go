package cache

import (
	"errors"
	"sync"
	"testing"
)

// TestExportUpTo checks the length contract: short bounds write nothing and
// report the length, sufficient bounds write the same tensors as Export.
func TestExportUpTo(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 3, HeadDimV: 2, Capacity: 8, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	row := func(n int, d int) []float32 {
		x := make([]float32, cfg.Batch*cfg.KVHeads*n*d)
		for i := range x {
			x[i] = float32(i + 1)
		}
		return x
	}
	mustOK(t, c.Append(asBytes(row(3, 3)), asBytes(row(3, 2)), Float32, 3, []int{3, 2}))
	size := func(L, d int) int { return cfg.Batch * cfg.KVHeads * L * d * 4 }
	want := func(L int) ([]byte, []byte) {
		k, v := make([]byte, size(L, 3)), make([]byte, size(L, 2))
		mustOK(t, c.Export(k, v, Float32, L))
		return k, v
	}
	wk, wv := want(3)
	cases := []struct {
		name    string
		maxL    int
		kb, vb  int
		wantL   int
		wantErr error
	}{
		{"exact", 3, size(3, 3), size(3, 2), 3, nil},
		{"larger buffers", 8, size(8, 3), size(8, 2), 3, nil},
		{"bound too short", 2, size(2, 3), size(2, 2), 3, nil},
		{"zero bound", 0, 0, 0, 3, nil},
		{"negative bound", -1, 0, 0, 0, ErrInvalidArgument},
		{"buffers too small", 3, size(3, 3) - 4, size(3, 2), 0, ErrInvalidArgument},
	}
	for _, tc := range cases {
		k, v := make([]byte, tc.kb), make([]byte, tc.vb)
		L, err := c.ExportUpTo(k, v, Float32, tc.maxL)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Fatalf("%s: error %v, want %v", tc.name, err, tc.wantErr)
		}
		if err != nil {
			continue
		}
		if L != tc.wantL {
			t.Fatalf("%s: L = %d, want %d", tc.name, L, tc.wantL)
		}
		if L <= tc.maxL && (string(k[:len(wk)]) != string(wk) || string(v[:len(wv)]) != string(wv)) {
			t.Fatalf("%s: exported bytes differ from Export", tc.name)
		}
		if L > tc.maxL {
			for _, x := range append(k, v...) {
				if x != 0 {
					t.Fatalf("%s: a too-short bound wrote into the buffers", tc.name)
				}
			}
		}
	}
	c.Close()
	if _, err := c.ExportUpTo(nil, nil, Float32, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed cache: %v", err)
	}
}

// TestExportUpToConcurrent exports while another goroutine appends and
// resets: every export sees one consistent state (length and rows agree:
// each row written so far holds its sequence's value, nothing past it).
func TestExportUpToConcurrent(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 1, HeadDimK: 4, Capacity: 64, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	k := []float32{1, 1, 1, 1}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if c.Lengths()[0] >= cfg.Capacity || i%17 == 0 {
				mustOK(t, c.Reset())
			}
			mustOK(t, c.Append(asBytes(k), asBytes(k), Float32, 1, nil))
		}
	}()
	buf := make([]byte, cfg.Capacity*cfg.HeadDimK*4)
	for range 2000 {
		bound := c.MaxLen() // a stale hint on purpose
		L, err := c.ExportUpTo(buf, buf, Float32, bound)
		if err != nil {
			t.Fatal(err)
		}
		if L > bound {
			continue // too short: the caller retries
		}
		for i, x := range asF32(buf[:L*cfg.HeadDimK*4]) {
			if x != 1 {
				t.Fatalf("export of length %d: element %d is %v", L, i, x)
			}
		}
	}
	close(stop)
	wg.Wait()
}
