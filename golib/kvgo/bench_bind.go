package kvgo

import (
	"runtime/metrics"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
)

// AttentionLoop runs the same attention call as Attention iters times inside
// Go and returns the total nanoseconds. Benchmarks subtract it from the
// Python-side time of Attention to get the binding's per-call overhead.
func AttentionLoop(h int64, qPtr uintptr, qElems int, outPtr uintptr, outElems int, qHeads, qLen int,
	scale, softcap float32, window int, iters int) (ns int64, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	q, err := float32sAt(arrayData(qPtr), qElems)
	if err != nil {
		return 0, classify(err)
	}
	out, err := float32sAt(arrayData(outPtr), outElems)
	if err != nil {
		return 0, classify(err)
	}
	o := cpu.Options{Scale: scale, Softcap: softcap, Window: window}
	start := time.Now()
	for range iters {
		v, err := c.BeginRead()
		if err != nil {
			return 0, classify(err)
		}
		err = cpu.Attention(out, q, qLen, qHeads, v, o)
		c.EndRead()
		if err != nil {
			return 0, classify(err)
		}
	}
	return time.Since(start).Nanoseconds(), nil
}

// AppendLoop appends the same n tokens iters times (the caller sizes the
// capacity) inside Go and returns the total nanoseconds.
func AppendLoop(h int64, kPtr uintptr, kBytes int, vPtr uintptr, vBytes int, src, n, iters int) (ns int64, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	st, err := elemOf(src)
	if err != nil {
		return 0, classify(err)
	}
	k, err := bytesAt(arrayData(kPtr), kBytes)
	if err != nil {
		return 0, classify(err)
	}
	v, err := bytesAt(arrayData(vPtr), vBytes)
	if err != nil {
		return 0, classify(err)
	}
	start := time.Now()
	for range iters {
		if err := c.Append(k, v, st, n, nil); err != nil {
			return 0, classify(err)
		}
	}
	return time.Since(start).Nanoseconds(), nil
}

// HeapAllocs returns how many Go heap objects the process has allocated so
// far (runtime/metrics "/gc/heap/allocs:objects", read without stopping the
// world). Benchmarks divide a difference over many calls by the call count;
// the counter is flushed per memory span, so single-call differences are
// coarse.
func HeapAllocs() int64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	return int64(s[0].Value.Uint64())
}
