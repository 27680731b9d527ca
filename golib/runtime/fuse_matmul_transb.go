package runtime

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"

// matchMatMulTransB fuses a MatMul whose B is a Transpose swapping the last
// two axes (the decomposed attention's q x k^T, as the built-in GPT-2
// decoder and eager-attention exports write it):
//
//	bT = Transpose(b, perm=[0, ..., r-1, r-2])
//	y  = MatMul(a, bT)
//
// into one MatMulTransB node (fused domain) whose product reads b in place
// with B transposed (ops.MatMulTransB), so the transposed copy of the
// present keys is not made each step. Types the fused product does not
// take (integers, mixed types) run the chain's own nodes. The transposed
// value must have one reader and be neither a graph output nor captured.
func matchMatMulTransB(fc *fuseContext, i int) (*PlanNode, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "MatMul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 || n.Inputs[0] == "" {
		return nil, nil, false
	}
	ti, tn, ok := fc.node(n.Inputs[1], "Transpose")
	if !ok || !fc.internal(n.Inputs[1]) || len(tn.Inputs) != 1 || tn.Inputs[0] == "" {
		return nil, nil, false
	}
	perm, ok, err := tn.Info.Attrs.Ints("perm")
	r := len(perm)
	if err != nil || !ok || r < 2 || perm[r-2] != int64(r-1) || perm[r-1] != int64(r-2) {
		return nil, nil, false
	}
	for j, p := range perm[:r-2] {
		if p != int64(j) {
			return nil, nil, false
		}
	}
	inputs := []string{n.Inputs[0], tn.Inputs[0]}
	chain := []int{i, ti}
	k := &matmulTransB{rank: r, chain: fc.chainRun(chain, inputs)}
	return fc.plannedNode(n.Name, "MatMulTransB", inputs, n.Outputs[0], k), chain, true
}

// matmulTransB is MatMulTransB's kernel: the transposed product, or the
// chain.
type matmulTransB struct {
	rank  int // the Transpose's rank
	chain *chainRun
}

// Compute runs the transposed product when the types allow it and b has
// the Transpose's rank (otherwise the Transpose's own error comes from the
// chain), else the chain.
func (k *matmulTransB) Compute(ctx *ops.Context) error {
	a, bt := ctx.Input(0), ctx.Input(1)
	if a != nil && bt != nil && bt.Rank() == k.rank {
		if ok, err := ops.MatMulTransB(ctx, a, bt); ok {
			return err
		}
	}
	return k.chain.run(ctx)
}
