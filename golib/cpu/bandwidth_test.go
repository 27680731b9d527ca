package cpu

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/klauspost/cpuid/v2"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/internal/cstream"
)

// TestReadSum checks every path's probe read loop: the exact sum of small
// integers (exact in float32 in any order) over lengths around the loops'
// steps.
func TestReadSum(t *testing.T) {
	buf := make([]float32, 4099)
	for i := range buf {
		buf[i] = float32(i & 7)
	}
	for _, k := range kernelVariants {
		for _, n := range []int{0, 1, 7, 63, 64, 65, 127, 128, 129, 1000, 4099} {
			var want float32
			for _, x := range buf[:n] {
				want += x
			}
			if got := k.readSum(buf[:n]); got != want {
				t.Errorf("%s readSum(%d) = %v, want %v", k.name, n, got, want)
			}
		}
	}
}

// TestStreamReadVsC runs the probe (every path, 1 and 2 threads) and a plain
// C summing loop (internal/cstream, same threads; also the loop compiled for
// AVX2 where the CPU has it) over the same buffer, eight times the L3
// within 256-512 MiB (64 MiB under -race or -short), in interleaved
// rounds, and logs the best rate of each: `go test -run StreamReadVsC -v`
// shows how close the probe reads to the C loop. It checks that the C loop read every word; rates are reported,
// never asserted.
func TestStreamReadVsC(t *testing.T) {
	if !cstream.Available {
		t.Skip("no cgo: the C reference loop is not built")
	}
	bytes := min(max(8*cpuid.CPU.Cache.L3, 256<<20), 512<<20)
	if raceEnabled || testing.Short() {
		bytes = 64 << 20
	}
	buf, free, err := probeBuffer(bytes / 4)
	if err != nil {
		t.Skipf("cannot map %d bytes: %v", bytes, err)
	}
	defer free()
	words := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)/2)
	var want uint64
	for i := range words {
		words[i] = uint64(i & 1023)
		want += words[i]
	}
	cRead := func(threads int, avx2 bool) float64 {
		sums := make([]uint64, threads)
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < threads; w++ {
			part := words[len(words)*w/threads : len(words)*(w+1)/threads]
			wg.Add(1)
			go func() {
				defer wg.Done()
				sums[w], _ = cstream.Sum(part, avx2)
			}()
		}
		wg.Wait()
		el := time.Since(start)
		var got uint64
		for _, s := range sums {
			got += s
		}
		if got != want {
			t.Fatalf("C loop (avx2 %v) sum %d, want %d", avx2, got, want)
		}
		return float64(bytes) / el.Seconds() / 1e9
	}
	defer restoreKernel(t)
	_, paths := KernelPaths()
	hasAVX2 := cpuid.CPU.Supports(cpuid.AVX2)
	for _, threads := range []int{1, 2} {
		best := map[string]float64{}
		for round := 0; round < 5; round++ {
			best["C"] = max(best["C"], cRead(threads, false))
			if hasAVX2 {
				best["C -mavx2"] = max(best["C -mavx2"], cRead(threads, true))
			}
			for _, path := range paths {
				if err := SetKernel(path); err != nil {
					t.Fatal(err)
				}
				gbps, err := StreamRead(buf, threads)
				if err != nil || !(gbps > 0) || math.IsInf(gbps, 0) {
					t.Fatalf("StreamRead(%s, %d threads) = %v, %v", path, threads, gbps, err)
				}
				best[path] = max(best[path], gbps)
			}
		}
		line := fmt.Sprintf("%d MiB, %d thread(s), best of 5 interleaved rounds: C loop %.1f GB/s", bytes>>20, threads, best["C"])
		if hasAVX2 {
			line += fmt.Sprintf(", C loop -mavx2 %.1f", best["C -mavx2"])
		}
		for _, path := range paths {
			line += fmt.Sprintf("; probe %s %.1f (%.2f of C)", path, best[path], best[path]/best["C"])
		}
		t.Log(line)
	}
}
