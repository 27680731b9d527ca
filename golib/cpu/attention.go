// Package cpu holds the CPU kernels: decode attention over a cache.View
// (reference and streaming SIMD variants), the worker pool and CPU feature
// dispatch.
package cpu

// Options are the attention parameters shared by every kernel.
type Options struct {
	// Scale multiplies q.k; 0 means 1/sqrt(head_dim_k).
	Scale float32
	// Softcap, when > 0, maps a scaled score s to Softcap*tanh(s/Softcap)
	// before the softmax (applied after Scale, as onnxruntime does).
	Softcap float32
	// Window, when > 0, limits each query at absolute position p to the keys
	// at positions max(0, p-Window+1) .. p (sliding-window attention).
	Window int
	// Threads, when > 0, bounds the threads of this call below the pool's
	// (SetThreads), for callers with a thread budget of their own (an
	// InferenceSession's), and runs the call's tasks on the products'
	// worker pool (package gemm) instead of this package's helpers, so one
	// pool serves every op of a session's step. It never changes the result.
	Threads int
}

// Attention semantics (every kernel implements exactly this):
//
// q is float32 [batch, qHeads, qLen, headDimK], row-major; dst is float32
// [batch, qHeads, qLen, headDimV]. qHeads must be a multiple of the view's
// KVHeads; query head h reads KV head h / (qHeads/KVHeads) (GQA/MQA).
// Causal alignment is to the END of the cache: for sequence b with
// L = SeqLen(b) (which must be >= qLen), query row i sits at absolute
// position p = L - qLen + i and attends keys at positions lo..p, where
// lo = max(WindowStart(b), p-Window+1 if Window > 0 else 0).
// Scores, softmax and accumulation are float32 whatever the storage type.
