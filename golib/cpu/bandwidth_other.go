//go:build !linux

package cpu

// probeBuffer allocates the bandwidth probe's buffer on the Go heap.
func probeBuffer(n int) ([]float32, func(), error) { return make([]float32, n), func() {}, nil }

// physicalMemory is unknown on this platform (0): ReadBandwidth then only
// checks its other arguments.
func physicalMemory() int64 { return 0 }
