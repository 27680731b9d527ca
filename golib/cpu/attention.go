// Package cpu holds the CPU kernels: decode attention over a cache.View
// (reference and streaming SIMD variants), the worker pool and CPU feature
// dispatch.
//
// # Non-finite values
//
// Every kernel path (KernelPaths) returns what ReferenceAttention computes
// in float64, and only that: the rule is IEEE propagation through
// s = scale*q.k (then softcap*tanh(s/softcap)), softmax with the row
// maximum subtracted, and the weighted sum of V. Consequences: a NaN in a
// query row, in a visible K row, or an infinite score (inf - inf in the
// softmax) makes the whole output row NaN; a NaN in V, or an infinity whose
// weight is 0 or that meets the opposite infinity, makes NaN in its column
// only; an infinity in V with a positive weight gives that infinity in its
// column; positions outside the window or before the window start are
// never read, so nothing stored there can leak. Huge finite inputs whose
// float32 products overflow (q = 3e38) give the finite float64 result.
//
// The fast paths compute in float32 and detect every departure: maxOf
// returns NaN for a block with a non-finite score, tanhCap turns NaN and
// ±Inf inputs into NaN (a dot product that overflowed says nothing about
// the sign of the true score), and
// at the end of a row the online-softmax state (m, l) and the accumulator
// are checked (sum(0*acc) is NaN exactly when acc holds a NaN or an
// infinity). A row that fails the check is recomputed by the reference's
// float64 code (exactRow): slow and allocating, but only such rows pay.
// A new path must keep these three properties (maxOf: NaN when any score
// is NaN or ±Inf; tanhCap: NaN for NaN or ±Inf; dots: IEEE products and sums,
// no clamping); TestNonFiniteEveryPath runs every registered path.
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
	// Exact, when set, replaces the float64 recomputation (exactRow) of the
	// rows whose float32 computation met a non-finite value (see
	// "Non-finite values"): the kernel calls it for such a row of sequence
	// b, query head h, query position i (0-based among the q_len new
	// tokens) with the row's output (head_dim_v values) to write, for a
	// caller whose definition of those rows differs from the reference's
	// (the tensor-path Attention op, package mha). It may be called from
	// several goroutines at once, never twice for one row in a call.
	// ReferenceAttention ignores it.
	Exact func(out []float32, b, h, i int) error
	// NonCausal, when set, lets every query row attend every stored
	// position of its sequence (from the window start) instead of the
	// end-aligned causal range; Window must be 0. (A mask may still exclude
	// positions.)
	NonCausal bool
	// Mask, when set, is an attention mask read alongside K (see Mask);
	// it needs Exact, which defines the rows the float32 path cannot.
	Mask *Mask
}

// Mask is a boolean or additive mask with one row per query row, read
// block by block alongside K (nothing of the context's length is
// materialized). Row (sequence b, query head h, query position i among
// the q_len new tokens) starts at element b*StrideB + h*StrideH + i*StrideI
// of Float or Bool and covers key positions 0 .. Len-1; positions from Len
// on are excluded. A stride of 0 broadcasts that axis.
//
// The float32 path follows onnxruntime's conventions: an excluded position
// (Bool false, beyond Len, or a Float value that takes a finite score
// below the float32 range, -Inf included) scores -MaxFloat32 and
// still takes part with weight 0 (so a NaN or an infinity in its V row
// reaches the output, as in onnxruntime's P*V product), a Float value is
// added to the (softcapped) score. A row that meets a non-finite value or
// whose best score is -MaxFloat32 (no position it may attend) is handed to
// Options.Exact, which defines what it holds (the mask conventions are the
// caller's).
type Mask struct {
	Float                     []float32 // additive (exactly one of Float, Bool)
	Bool                      []bool    // true: the position takes part
	StrideB, StrideH, StrideI int
	Len                       int
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
