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

// TestExportTail checks the window-sized export against Export: each
// sequence's last min(length, L) positions from row 0, zeros after, on both
// layouts and after an eviction.
func TestExportTail(t *testing.T) {
	for _, layout := range []Layout{Contiguous, Paged} {
		cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 3, HeadDimV: 2, Capacity: 64, Elem: Float32, Layout: layout, BlockSize: 16}
		a, _ := NewArena(0)
		c := mustNew(t, a, cfg)
		n := 20
		kx, vx := make([]float32, cfg.Batch*cfg.KVHeads*n*3), make([]float32, cfg.Batch*cfg.KVHeads*n*2)
		for i := range kx {
			kx[i] = float32(i + 1)
		}
		for i := range vx {
			vx[i] = -float32(i + 1)
		}
		lens := []int{20, 6}
		mustOK(t, c.Append(asBytes(kx), asBytes(vx), Float32, n, lens))
		cases := []struct {
			name  string
			L     int
			evict int // keep_last before the export (0: none)
		}{{"window shorter than both", 4, 0}, {"window between", 8, 0}, {"window longer", 32, 0},
			{"one row", 1, 0}, {"empty", 0, 0}, {"after eviction", 16, 10}}
		for _, tc := range cases {
			if tc.evict > 0 {
				mustOK(t, c.Evict(tc.evict))
			}
			full := func(d int) []byte { return make([]byte, cfg.Batch*cfg.KVHeads*20*d*4) }
			fk, fv := full(3), full(2)
			mustOK(t, c.Export(fk, fv, Float32, 20))
			size := func(d int) int { return cfg.Batch * cfg.KVHeads * tc.L * d * 4 }
			k, v := make([]byte, size(3)), make([]byte, size(2))
			for i := range k {
				k[i] = 0xff // every byte must be written
			}
			mustOK(t, c.ExportTail(k, v, Float32, tc.L))
			for b := range cfg.Batch {
				T := c.SeqLen(b)
				keep := min(T, tc.L)
				for h := range cfg.KVHeads {
					unit := b*cfg.KVHeads + h
					for _, side := range []struct {
						got, all []byte
						d        int
					}{{k, fk, 3}, {v, fv, 2}} {
						row := side.d * 4
						for r := range tc.L {
							got := side.got[(unit*tc.L+r)*row:][:row]
							want := make([]byte, row)
							if r < keep {
								want = side.all[(unit*20+T-keep+r)*row:][:row]
							}
							if string(got) != string(want) {
								t.Fatalf("%v %s: seq %d head %d row %d: %v, want %v", layout, tc.name, b, h, r, got, want)
							}
						}
					}
				}
			}
		}
		if err := c.ExportTail(make([]byte, 4), nil, Float32, 3); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("short buffers: %v", err)
		}
		if err := c.ExportTail(nil, nil, Float32, -1); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("negative length: %v", err)
		}
		c.Close()
		if err := c.ExportTail(nil, nil, Float32, 0); !errors.Is(err, ErrClosed) {
			t.Fatalf("closed cache: %v", err)
		}
	}
}
