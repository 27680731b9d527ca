package cache

import (
	"sync"
	"testing"
)

// TestConcurrentReadersAndWriters runs readers (as attention kernels do,
// through BeginRead) against appends, truncates and reorders from other
// goroutines; with -race it proves the locking, and the invariant checked by
// readers (every visible row of sequence b holds the value b+1) proves that
// no reader ever sees a half-applied mutation.
func TestConcurrentReadersAndWriters(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 4, Capacity: 64, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	k := make([]float32, cfg.Batch*cfg.KVHeads*cfg.HeadDimK)
	for i := range k {
		k[i] = float32(i/(cfg.KVHeads*cfg.HeadDimK) + 1)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan string, 4)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var segs []Segment
			for {
				select {
				case <-stop:
					return
				default:
				}
				v, err := c.BeginRead()
				if err != nil {
					errs <- err.Error()
					return
				}
				for b := range v.Batch() {
					for h := range v.KVHeads() {
						segs = v.AppendSegments(segs[:0], b, h, v.WindowStart(b), v.SeqLen(b))
						for _, s := range segs {
							for _, x := range asF32(s.K) {
								if x != float32(b+1) {
									errs <- "reader saw a foreign row"
									c.EndRead()
									return
								}
							}
						}
					}
				}
				c.EndRead()
			}
		}()
	}
	for i := range 300 {
		if c.Lengths()[0] >= cfg.Capacity {
			mustOK(t, c.Truncate([]int{0}))
		}
		mustOK(t, c.Append(asBytes(k), asBytes(k), Float32, 1, nil))
		if i%7 == 0 {
			mustOK(t, c.Reorder([]int{0, 1}))
		}
	}
	close(stop)
	wg.Wait()
	select {
	case e := <-errs:
		t.Fatal(e)
	default:
	}
}
