package kvgo

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// Attention runs decode attention of q (float32 [batch, qHeads, qLen,
// head_dim_k], qElems values; qPtr and outPtr are array references, see
// arrayref.go) over cache h, writing float32
// [batch, qHeads, qLen, head_dim_v] (outElems values) at outPtr. reference
// selects the plain oracle kernel instead of the streaming one, which takes
// any qLen >= 1 (beyond cpu.MaxQLen in tiles, see cpu.AttentionPrefill). It
// holds the cache's read lock for the duration of the kernel.
func Attention(h int64, qPtr uintptr, qElems int, outPtr uintptr, outElems int, qHeads, qLen int,
	scale, softcap float32, window int, reference bool) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	q, err := float32sAt(arrayData(qPtr), qElems)
	if err != nil {
		return classify(err)
	}
	out, err := float32sAt(arrayData(outPtr), outElems)
	if err != nil {
		return classify(err)
	}
	v, err := c.BeginRead()
	if err != nil {
		return classify(err)
	}
	defer c.EndRead()
	o := cpu.Options{Scale: scale, Softcap: softcap, Window: window}
	if reference {
		return classify(cpu.ReferenceAttention(out, q, qLen, qHeads, v, o))
	}
	return classify(cpu.AttentionPrefill(out, q, qLen, qHeads, v, o))
}

// SetThreads sets the number of kernel worker threads (n <= 0: all CPUs).
func SetThreads(n int) (err error) {
	defer recoverTo(&err)
	if n > cpu.MaxThreads {
		return classify(fmt.Errorf("%w: threads must be at most %d, got %d", cache.ErrInvalidArgument, cpu.MaxThreads, n))
	}
	cpu.SetThreads(n)
	return nil
}

// Threads returns the number of kernel worker threads.
func Threads() int { return cpu.Threads() }

// SetKernel forces a kernel path ("auto", "go", "avx2", "avx512").
func SetKernel(name string) (err error) {
	defer recoverTo(&err)
	return classify(cpu.SetKernel(name))
}

// SetQuantIntLoops turns the integer loops of the quantized (int8/int4)
// decode kernel on or off: the score loop (query rounded to int8 per row:
// faster, less exact) and the accumulation loop (int16 weights). See
// cpu.SetQuantIntLoops.
func SetQuantIntLoops(scores, accumulate bool) (err error) {
	defer recoverTo(&err)
	cpu.SetQuantIntLoops(scores, accumulate)
	return nil
}

// QuantIntLoops reports the integer loops that are on: bit 0 the score
// loop, bit 1 the accumulation loop.
func QuantIntLoops() int {
	scores, accum := cpu.QuantIntLoops()
	n := 0
	if scores {
		n |= 1
	}
	if accum {
		n |= 2
	}
	return n
}

// quantIntLoopsName names the integer loops that are on, as build_info
// reports them: "scores+accumulate", "scores", "accumulate" or "off".
func quantIntLoopsName() string {
	return [4]string{"off", "scores", "accumulate", "scores+accumulate"}[QuantIntLoops()]
}

// newestOpsets names the default domain "ai.onnx" for readers outside Go.
func newestOpsets() map[string]int {
	out := ops.NewestOpsets()
	if v, ok := out[""]; ok {
		delete(out, "")
		out["ai.onnx"] = v
	}
	return out
}

// InfoJSON describes the build and the machine: versions, CPU features and
// the active kernel paths (attention and matrix kernels).
func InfoJSON() (s string, err error) {
	defer recoverTo(&err)
	f := cpu.DetectFeatures()
	active, avail := cpu.KernelPaths()
	info := map[string]any{
		"version":           version,
		"go_version":        runtime.Version(),
		"goos":              runtime.GOOS,
		"goarch":            runtime.GOARCH,
		"cpu":               f.Brand,
		"vendor":            f.Vendor,
		"logical_cpus":      f.LogicalCPU,
		"cpu_features":      f.Flags,
		"cache_bytes":       map[string]int{"l1d": f.L1D, "l2": f.L2, "l3": f.L3},
		"threads":           cpu.Threads(),
		"attention_kernel":  active,
		"attention_kernels": avail,
		"gemm_kernel":       gemm.Path(),
		"kernel_tuning":     cpu.KernelTuning(),
		"quant_int_loops":   quantIntLoopsName(),
		"newest_opsets":     newestOpsets(),
	}
	if e := cpu.KernelStartupError(); e != nil {
		info["kernel_startup_error"] = e.Error()
	}
	b, err := json.Marshal(info)
	return string(b), classify(err)
}
