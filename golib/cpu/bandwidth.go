package cpu

import (
	"fmt"
	"sync"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// ReadBandwidth measures the machine's streaming-read bandwidth, the
// physical limit of decode attention over a cache larger than the LLC: it
// allocates a buffer of the given size (use well above the L3, e.g. 1 GiB;
// on Linux backed by transparent huge pages where the kernel grants them, as
// numpy's large arrays are, so TLB misses do not understate the limit),
// writes it once, then reads it iters times with threads goroutines, each
// streaming its contiguous share with the active SIMD path, and returns the
// best pass in GB/s (1e9 bytes per second). It allocates and is not meant
// for a hot path.
func ReadBandwidth(bytes int64, threads, iters int) (float64, error) {
	if bytes < 1<<20 || bytes > maxProbeBytes || threads < 1 || threads > maxProbeThreads || iters < 1 {
		return 0, fmt.Errorf("%w: read bandwidth needs 1 MiB <= bytes <= 1 TiB, threads 1..%d, iters >= 1 (got %d, %d, %d)",
			cache.ErrInvalidArgument, maxProbeThreads, bytes, threads, iters)
	}
	if avail := sysmem.Room(bytes, sysmem.Available); avail > 0 && bytes > avail {
		return 0, fmt.Errorf("%w: a probe buffer of %s exceeds the memory available (%s)",
			cache.ErrInvalidArgument, units.Bytes(bytes), units.Bytes(avail))
	}
	buf, free, err := probeBuffer(int(bytes / 4))
	if err != nil {
		return 0, fmt.Errorf("%w: cannot map a probe buffer of %s: %v", cache.ErrBudget, units.Bytes(bytes), err)
	}
	defer free()
	for i := range buf {
		buf[i] = float32(i & 1023)
	}
	best := 0.0
	for it := 0; it < iters; it++ {
		gbps, err := StreamRead(buf, threads)
		if err != nil {
			return 0, err
		}
		best = max(best, gbps)
	}
	return best, nil
}

// maxProbeThreads bounds the goroutines of one probe pass; maxProbeBytes
// the probe buffer where the available memory is unknown.
const (
	maxProbeThreads = 1024
	maxProbeBytes   = 1 << 40
)

// StreamRead reads buf once with threads goroutines, each streaming its
// contiguous share with the active path's read loop (plain vector loads of
// that path's width into eight accumulators: no prefetch, no non-temporal
// hint, the speed of a plain C summing loop), and returns the rate in GB/s.
// Benchmarks call it on a buffer they keep, between the calls they time, so
// that the bandwidth they compare a kernel with is measured at the same
// moment (shared machines drift by tens of percent within minutes).
func StreamRead(buf []float32, threads int) (float64, error) {
	if len(buf) == 0 || threads < 1 || threads > maxProbeThreads {
		return 0, fmt.Errorf("%w: stream read needs a non-empty buffer and threads 1..%d (got %d floats, %d threads)",
			cache.ErrInvalidArgument, maxProbeThreads, len(buf), threads)
	}
	ops := activeOps()
	sinks := make([]float32, threads)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < threads; w++ {
		part := buf[len(buf)*w/threads : len(buf)*(w+1)/threads]
		if len(part) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sinks[w] += ops.readSum(part)
		}()
	}
	wg.Wait()
	return float64(len(buf)*4) / time.Since(start).Seconds() / 1e9, nil
}
