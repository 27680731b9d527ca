package runtime

import (
	"math"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// matchRMSNorm fuses the RMSNorm that torch.onnx (dynamo and TorchScript)
// and optimum write for Llama-family norms (LlamaRMSNorm, Qwen3's q/k norms,
// Gemma's norms with their folded 1 + weight):
//
//	q = Pow(x, 2)
//	m = ReduceMean(q, axes=[-1], keepdims=1)
//	s = Sqrt(Add(m, eps))                 // eps: a scalar constant
//	r = Reciprocal(s) | Div(1, s)
//	y = Mul(x, r)                         // either operand order
//	[y = Cast(y, to=float)]               // the no-op Cast of TorchScript exports
//	out = Mul(w, y)                       // w: a rank-1 float32 constant, either order
//
// into SimplifiedLayerNormalization(x, w, axis=-1, epsilon=eps), the kernel
// of the contrib op onnxruntime fuses the same chain into. Every value
// inside the chain must have exactly one reader and be neither a graph
// output nor captured. Without the Cast a float32 weight implies a float32
// x (Mul's operands share their type); with it x may be another float type,
// so the fused op runs only on a float32 x (the guard) and the fused kernel
// sees the types the chain did; it
// sums the squares in float64 and applies the scale in float32, which
// differs from the chain's float32 steps by a few ulps.
//
// The fused op keeps x's shape; the chain broadcasts x with its constants
// and the weight. They agree when x's last dimension is the weight's
// length and x's rank is at least every constant's (1 for the weight):
// decided per run (x's shape is not known at plan time), the other runs
// execute the chain (a weight of 8 over a last dimension of 1 broadcasts
// there, eps of shape [1, 1, 1] raises a 2D x's rank).
func matchRMSNorm(fc *fuseContext, i int) (*onnxpb.NodeProto, []int, func(*ops.Context) bool, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Mul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, nil, false
	}
	w, y := "", ""
	for k, in := range n.Inputs {
		t, ok := fc.consts[in]
		if ok && t.DType() == tensor.Float32 && t.Rank() == 1 {
			w, y = in, n.Inputs[1-k]
			break
		}
	}
	if w == "" || y == "" || fc.consts[y] != nil || !fc.internal(y) {
		return nil, nil, nil, false
	}
	chain := []int{i}
	if ci, c, ok := fc.node(y, "Cast"); ok {
		if to, err := c.Info.Attrs.Int("to", 0); err != nil || tensor.DType(to) != tensor.Float32 || !fc.internal(c.Inputs[0]) {
			return nil, nil, nil, false
		}
		chain = append(chain, ci)
		y = c.Inputs[0]
	}
	mi, mul, ok := fc.node(y, "Mul")
	if !ok || len(mul.Inputs) != 2 {
		return nil, nil, nil, false
	}
	for k := range 2 {
		x, r := mul.Inputs[k], mul.Inputs[1-k]
		if x == r || !fc.internal(r) {
			continue
		}
		core, eps, rank, ok := matchInvRMS(fc, r, x)
		if !ok {
			continue
		}
		chain = append(append(chain, mi), core...)
		np := fusedNode("SimplifiedLayerNormalization", n.Name, []string{x, w}, []string{n.Outputs[0]},
			attrInt("axis", -1), attrFloat("epsilon", eps))
		cols, minRank := fc.consts[w].Len(), max(rank, 1)
		guard := func(ctx *ops.Context) bool {
			x := ctx.Input(0)
			// float32 x only: with the Cast in the chain x may be float16
			// or float64 and the chain's output is float32, the fused op's
			// x's type
			return x != nil && x.DType() == tensor.Float32 && x.Rank() >= minRank && x.Shape()[x.Rank()-1] == cols
		}
		return np, chain, guard, true
	}
	return nil, nil, nil, false
}

// matchInvRMS matches r = 1 / Sqrt(ReduceMean(Pow(x, 2), [-1]) + eps) and
// returns the chain's node indices, eps and the largest rank of the
// chain's constants (the 1, eps and 2), which x's rank must reach for the
// chain to keep x's shape.
func matchInvRMS(fc *fuseContext, r, x string) ([]int, float32, int, bool) {
	var chain []int
	var s string
	rank := 0
	if ri, rec, ok := fc.node(r, "Reciprocal"); ok && len(rec.Inputs) == 1 {
		chain, s = append(chain, ri), rec.Inputs[0]
	} else if di, div, ok := fc.node(r, "Div"); ok && len(div.Inputs) == 2 {
		one, k, ok := fc.scalar(div.Inputs[0])
		if !ok || one != 1 {
			return nil, 0, 0, false
		}
		chain, s, rank = append(chain, di), div.Inputs[1], max(rank, k)
	} else {
		return nil, 0, 0, false
	}
	si, sqrt, ok := fc.node(s, "Sqrt")
	if !ok || !fc.internal(s) || len(sqrt.Inputs) != 1 {
		return nil, 0, 0, false
	}
	a := sqrt.Inputs[0]
	ai, add, ok := fc.node(a, "Add")
	if !ok || !fc.internal(a) || len(add.Inputs) != 2 {
		return nil, 0, 0, false
	}
	var m string
	var eps float64
	for k := range 2 {
		if e, er, ok := fc.scalar(add.Inputs[k]); ok {
			m, eps, rank = add.Inputs[1-k], e, max(rank, er)
			break
		}
	}
	if m == "" || !(eps >= 0) || math.IsInf(eps, 0) || !fc.internal(m) {
		return nil, 0, 0, false
	}
	mi, mean, ok := fc.node(m, "ReduceMean")
	if !ok || !lastAxisMean(fc, mean) {
		return nil, 0, 0, false
	}
	q := mean.Inputs[0]
	pi, pow, ok := fc.node(q, "Pow")
	if !ok || !fc.internal(q) || len(pow.Inputs) != 2 || pow.Inputs[0] != x {
		return nil, 0, 0, false
	}
	two, k, ok := fc.scalar(pow.Inputs[1])
	if !ok || two != 2 {
		return nil, 0, 0, false
	}
	return append(chain, si, ai, mi, pi), float32(eps), max(rank, k), true
}

// lastAxisMean reports whether a ReduceMean node averages over the last
// axis only, keeping it (axes [-1] as attribute or constant input,
// keepdims 1).
func lastAxisMean(fc *fuseContext, n *PlanNode) bool {
	if keep, err := n.Info.Attrs.Int("keepdims", 1); err != nil || keep != 1 {
		return false
	}
	axes, _, err := n.Info.Attrs.Ints("axes")
	if err != nil {
		return false
	}
	if len(n.Inputs) > 1 && n.Inputs[1] != "" {
		t, ok := fc.consts[n.Inputs[1]]
		if !ok || len(axes) > 0 {
			return false
		}
		if axes, err = tensor.Int64Values(t); err != nil {
			return false
		}
	}
	return len(axes) == 1 && axes[0] == -1 && len(n.Inputs) >= 1 && n.Inputs[0] != ""
}

// matchRMSNormHalf fuses the RMSNorm of float16 TorchScript exports, which
// compute the statistics in float32 between two Casts:
//
//	x32 = Cast(x, to=float)              // read by the Pow and the Mul only
//	r   = 1 / Sqrt(ReduceMean(Pow(x32, 2), [-1]) + eps)
//	n   = Cast(Mul(x32, r), to=float16)
//	out = Mul(w, n)                      // w: a rank-1 float16 constant
//
// into one RMSNormHalf node. Its own path (w as long as x's last axis, x
// of at least the constants' rank, so neither broadcasts x's shape; x of
// any type the Cast converts, as the Cast does) computes the inverse like SimplifiedLayerNormalization (sum
// of squares in float64), rounds x*r to float16 and multiplies by w in
// float32 with a float16 rounding, as the chain's Cast and Mul do (results
// within an ulp of float16 of the chain's); any other run executes the
// chain's own nodes. Every value inside the chain must have exactly its
// chain readers and be neither a graph output nor captured.
func matchRMSNormHalf(fc *fuseContext, i int) (*PlanNode, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Mul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, false
	}
	w, c := "", ""
	for k, in := range n.Inputs {
		t, ok := fc.consts[in]
		if ok && t.DType() == tensor.Float16 && t.Rank() == 1 {
			w, c = in, n.Inputs[1-k]
			break
		}
	}
	if w == "" || c == "" || fc.consts[c] != nil || !fc.internal(c) {
		return nil, nil, false
	}
	ci, cast16, ok := fc.node(c, "Cast")
	if !ok || len(cast16.Inputs) != 1 || !fc.internal(cast16.Inputs[0]) {
		return nil, nil, false
	}
	if to, err := cast16.Info.Attrs.Int("to", 0); err != nil || tensor.DType(to) != tensor.Float16 {
		return nil, nil, false
	}
	mi, mul, ok := fc.node(cast16.Inputs[0], "Mul")
	if !ok || len(mul.Inputs) != 2 {
		return nil, nil, false
	}
	for k := range 2 {
		x32, r := mul.Inputs[k], mul.Inputs[1-k]
		if x32 == r || !fc.internal(r) || fc.readers[x32] != 2 || fc.pinned[x32] {
			continue
		}
		xi, cast32, ok := fc.node(x32, "Cast")
		if !ok || len(cast32.Inputs) != 1 || cast32.Inputs[0] == "" {
			continue
		}
		if to, err := cast32.Info.Attrs.Int("to", 0); err != nil || tensor.DType(to) != tensor.Float32 {
			continue
		}
		core, eps, rank, ok := matchInvRMS(fc, r, x32)
		if !ok {
			continue
		}
		chain := append([]int{i, ci, mi, xi}, core...)
		inputs := []string{cast32.Inputs[0], w}
		wf, err := tensor.AsFloat32(fc.consts[w])
		if err != nil {
			continue
		}
		k := &rmsNormHalf{eps: eps, w: wf, minRank: max(rank, 1), chain: fc.chainRun(chain, inputs)}
		return fc.plannedNode(n.Name, "RMSNormHalf", inputs, n.Outputs[0], k), chain, true
	}
	return nil, nil, false
}

// rmsNormHalf is RMSNormHalf's kernel: inputs x and the weight.
type rmsNormHalf struct {
	eps     float32
	w       []float32 // the weight, widened once
	minRank int       // the largest rank of the chain's constants: below it they raise x's rank
	chain   *chainRun
}

// halfBufs recycles the float32 rows of rmsNormHalf runs.
var halfBufs = sync.Pool{New: func() any { return new([]float32) }}

// Compute runs the fused path for an x whose last axis the weight covers
// and whose rank the constants do not raise, else the chain.
func (k *rmsNormHalf) Compute(ctx *ops.Context) error {
	x := ctx.Input(0)
	if x == nil || x.Rank() < k.minRank || x.Shape()[x.Rank()-1] != len(k.w) || len(k.w) == 0 {
		return k.chain.run(ctx)
	}
	bp := halfBufs.Get().(*[]float32)
	defer halfBufs.Put(bp)
	if cap(*bp) < x.Len() {
		*bp = make([]float32, x.Len())
	}
	buf := (*bp)[:x.Len()]
	if err := tensor.ToFloat32(x, buf); err != nil { // the chain's Cast (to float32) of any type
		return k.chain.run(ctx)
	}
	out, err := ctx.NewOutputUninit(0, tensor.Float16, x.Shape())
	if err != nil {
		return err
	}
	cols := len(k.w)
	for r := 0; r < len(buf); r += cols {
		row := buf[r : r+cols]
		var sq float64
		for _, v := range row {
			sq += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(sq/float64(cols)+float64(k.eps)))
		for j, v := range row {
			row[j] = v * inv
		}
	}
	// the chain's Cast to float16, then its float16 Mul by the weight
	if err := tensor.FromFloat32(out, buf); err != nil {
		return err
	}
	if err := tensor.ToFloat32(out, buf); err != nil {
		return err
	}
	for r := 0; r < len(buf); r += cols {
		row := buf[r : r+cols]
		for j, v := range row {
			row[j] = k.w[j] * v
		}
	}
	return tensor.FromFloat32(out, buf)
}
