package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// matchAttentionRepeatKV fuses the repeat_kv expansion the torch.onnx
// dynamo exporter (opset 23) writes in front of a standard Attention for
// grouped-query models, once for K and once for V of every layer:
//
//	u = Unsqueeze(x, [2])                  // x: [b, kv_heads, t, d]
//	e = Expand(u, [b, kv_heads, rep, t, d]) // computed from Shape(x) at run time
//	r = Reshape(e, [b, kv_heads*rep, t, d])
//	y = Attention(q, rK, rV, mask, ...)
//
// into one AttentionRepeatKV node (fused domain) that hands the Attention
// kernel x itself: Attention groups query heads over K/V heads exactly as
// repeat_kv does (query head j reads K/V head j / rep), so the expanded
// copies (rep times the present, every step) are never made. The shapes
// come from the graph at run time, so the kernel checks on every run that
// the Unsqueeze is at axis 2, the Expand only repeats that axis, the
// Reshape merges it into the heads axis, K and V repeat alike and q has
// kv_heads*rep heads; otherwise it runs the chain's own nodes, so the
// result is the unfused graph's in every case. The Attention node must
// have no past inputs and one output, and every value inside the chain one
// reader, none a graph output or captured.
func matchAttentionRepeatKV(fc *fuseContext, i int) (*PlanNode, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Attention" || n.Domain != "" || len(n.Outputs) != 1 || len(n.Inputs) < 3 || len(n.Inputs) > 7 {
		return nil, nil, false
	}
	for j := attnPastKey; j < len(n.Inputs) && j <= attnPastValue; j++ {
		if n.Inputs[j] != "" {
			return nil, nil, false
		}
	}
	kx, kChain, kArgs, kZero, ok := repeatKVChain(fc, n.Inputs[1])
	if !ok {
		return nil, nil, false
	}
	vx, vChain, vArgs, vZero, ok := repeatKVChain(fc, n.Inputs[2])
	if !ok || kx == vx {
		return nil, nil, false
	}
	inputs := make([]string, rkvInputs, rkvInputs+6)
	copy(inputs, n.Inputs)
	inputs[1], inputs[2] = kx, vx
	inputs = append(append(inputs, kArgs...), vArgs...)
	chain := append(append([]int{i}, kChain...), vChain...)
	chainIn := make([]string, len(inputs))
	copy(chainIn, inputs)
	k := &attentionRepeatKV{attn: n.Kernel, zero: [2]bool{kZero, vZero}, chain: fc.chainRun(chain, chainIn)}
	return fc.plannedNode(n.Name, "AttentionRepeatKV", inputs, n.Outputs[0], k), chain, true
}

// Attention's past inputs, and the fused node's layout: Attention's seven
// inputs (K and V replaced by the unexpanded values), then per K and V the
// Unsqueeze axes, the Expand shape and the Reshape shape.
const (
	attnPastKey, attnPastValue = 4, 5
	rkvInputs                  = 7
)

// repeatKVChain matches r = Reshape(Expand(Unsqueeze(x, axes), shape),
// target) and returns x, the chain's node indices, its run-time arguments
// (axes, shape, target) and the Reshape's allowzero.
func repeatKVChain(fc *fuseContext, r string) (string, []int, []string, bool, bool) {
	ri, rn, ok := fc.node(r, "Reshape")
	if !ok || !fc.internal(r) || len(rn.Inputs) != 2 || rn.Inputs[1] == "" {
		return "", nil, nil, false, false
	}
	allowzero, err := rn.Info.Attrs.Int("allowzero", 0)
	if err != nil {
		return "", nil, nil, false, false
	}
	e := rn.Inputs[0]
	ei, en, ok := fc.node(e, "Expand")
	if !ok || !fc.internal(e) || len(en.Inputs) != 2 || en.Inputs[1] == "" {
		return "", nil, nil, false, false
	}
	u := en.Inputs[0]
	ui, un, ok := fc.node(u, "Unsqueeze")
	if !ok || !fc.internal(u) || len(un.Inputs) != 2 || un.Inputs[0] == "" || un.Inputs[1] == "" {
		return "", nil, nil, false, false
	}
	return un.Inputs[0], []int{ri, ei, ui}, []string{un.Inputs[1], en.Inputs[1], rn.Inputs[1]}, allowzero != 0, true
}

// attentionRepeatKV is AttentionRepeatKV's kernel: the Attention node's
// own kernel on the unexpanded K/V, or the chain.
type attentionRepeatKV struct {
	attn  ops.Kernel
	zero  [2]bool // the K and V Reshapes' allowzero
	chain *chainRun
}

// Compute runs Attention on the unexpanded K/V when this run's shapes are
// a repeat_kv (see matchAttentionRepeatKV), else the chain.
func (k *attentionRepeatKV) Compute(ctx *ops.Context) error {
	q := ctx.Input(0)
	kh, krep, ok1 := repeatedHeads(ctx, 1, rkvInputs, k.zero[0])
	vh, vrep, ok2 := repeatedHeads(ctx, 2, rkvInputs+3, k.zero[1])
	if ok1 && ok2 && kh == vh && krep == vrep && q != nil && q.Rank() == 4 && q.Shape()[1] == kh*krep {
		return k.attn.Compute(ctx)
	}
	return k.chain.run(ctx)
}

// repeatedHeads reports whether the chain arguments at inputs at..at+2
// turn input x ([b, h, t, d]) into its repeat_kv [b, h*rep, t, d], and
// returns h and rep.
func repeatedHeads(ctx *ops.Context, x, at int, allowzero bool) (int, int, bool) {
	t := ctx.Input(x)
	if t == nil || t.Rank() != 4 {
		return 0, 0, false
	}
	if a, ok := oneInt(ctx.Input(at)); !ok || (a != 2 && a != -3) {
		return 0, 0, false
	}
	xs := t.Shape()
	in := [5]int{xs[0], xs[1], 1, xs[2], xs[3]}
	s := ctx.Input(at + 1)
	if s == nil || s.DType() != tensor.Int64 || s.Rank() != 1 || s.Len() != 5 {
		return 0, 0, false
	}
	var ex [5]int
	for j, v := range s.Int64() {
		switch {
		case v == int64(in[j]) || v == 1:
			ex[j] = in[j]
		case in[j] == 1 && v > 1:
			ex[j] = int(v)
		default:
			return 0, 0, false
		}
		if j != 2 && ex[j] != in[j] {
			return 0, 0, false
		}
	}
	rep := ex[2]
	r := ctx.Input(at + 2)
	if r == nil || r.DType() != tensor.Int64 || r.Rank() != 1 || r.Len() != 4 {
		return 0, 0, false
	}
	want := [4]int{xs[0], xs[1] * rep, xs[2], xs[3]}
	total := want[0] * want[1] * want[2] * want[3]
	var got [4]int
	known, infer := 1, -1
	for j, v := range r.Int64() {
		switch {
		case v == 0 && !allowzero:
			got[j] = ex[j]
		case v == -1 && infer < 0:
			infer = j
			continue
		case v < 0:
			return 0, 0, false
		default:
			got[j] = int(v)
		}
		known *= got[j]
	}
	if infer >= 0 {
		if known == 0 || total%known != 0 {
			return 0, 0, false
		}
		got[infer] = total / known
	}
	if got != want {
		return 0, 0, false
	}
	return xs[1], rep, true
}
