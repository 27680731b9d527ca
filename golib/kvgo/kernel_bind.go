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
