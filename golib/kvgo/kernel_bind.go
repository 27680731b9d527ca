package kvgo

import "github.com/onnx-light-kv/onnx-light-kv/golib/cpu"

// ReadBandwidth measures the streaming-read bandwidth of a mib MiB buffer
// with threads goroutines, best of iters passes, in GB/s (see
// cpu.ReadBandwidth). Benchmarks report decode attention against it.
func ReadBandwidth(mib, threads, iters int) (gbps float64, err error) {
	defer recoverTo(&err)
	gbps, err = cpu.ReadBandwidth(int64(mib)<<20, threads, iters)
	return gbps, classify(err)
}

// StreamRead reads the n float32s at p (a numpy buffer, not copied) once
// with threads goroutines and returns GB/s (see cpu.StreamRead): a
// bandwidth probe that benchmarks interleave with the calls they time.
func StreamRead(p uintptr, n, threads int) (gbps float64, err error) {
	defer recoverTo(&err)
	buf, err := float32sAt(p, n)
	if err != nil {
		return 0, classify(err)
	}
	gbps, err = cpu.StreamRead(buf, threads)
	return gbps, classify(err)
}
