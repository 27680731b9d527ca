package runtime

import (
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
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
// output nor captured. A float32 weight implies a float32 x (Mul's operands
// share their type), so the fused kernel sees the types the chain did; it
// sums the squares in float64 and applies the scale in float32, which
// differs from the chain's float32 steps by a few ulps.
func matchRMSNorm(fc *fuseContext, i int) (*onnxpb.NodeProto, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Mul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, false
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
		return nil, nil, false
	}
	chain := []int{i}
	if ci, c, ok := fc.node(y, "Cast"); ok {
		if to, err := c.Info.Attrs.Int("to", 0); err != nil || tensor.DType(to) != tensor.Float32 || !fc.internal(c.Inputs[0]) {
			return nil, nil, false
		}
		chain = append(chain, ci)
		y = c.Inputs[0]
	}
	mi, mul, ok := fc.node(y, "Mul")
	if !ok || len(mul.Inputs) != 2 {
		return nil, nil, false
	}
	for k := range 2 {
		x, r := mul.Inputs[k], mul.Inputs[1-k]
		if x == r || !fc.internal(r) {
			continue
		}
		core, eps, ok := matchInvRMS(fc, r, x)
		if !ok {
			continue
		}
		chain = append(append(chain, mi), core...)
		np := fusedNode("SimplifiedLayerNormalization", n.Name, []string{x, w}, []string{n.Outputs[0]},
			attrInt("axis", -1), attrFloat("epsilon", eps))
		return np, chain, true
	}
	return nil, nil, false
}

// matchInvRMS matches r = 1 / Sqrt(ReduceMean(Pow(x, 2), [-1]) + eps) and
// returns the chain's node indices and eps.
func matchInvRMS(fc *fuseContext, r, x string) ([]int, float32, bool) {
	var chain []int
	var s string
	if ri, rec, ok := fc.node(r, "Reciprocal"); ok && len(rec.Inputs) == 1 {
		chain, s = append(chain, ri), rec.Inputs[0]
	} else if di, div, ok := fc.node(r, "Div"); ok && len(div.Inputs) == 2 {
		if one, ok := fc.scalar(div.Inputs[0]); !ok || one != 1 {
			return nil, 0, false
		}
		chain, s = append(chain, di), div.Inputs[1]
	} else {
		return nil, 0, false
	}
	si, sqrt, ok := fc.node(s, "Sqrt")
	if !ok || !fc.internal(s) || len(sqrt.Inputs) != 1 {
		return nil, 0, false
	}
	a := sqrt.Inputs[0]
	ai, add, ok := fc.node(a, "Add")
	if !ok || !fc.internal(a) || len(add.Inputs) != 2 {
		return nil, 0, false
	}
	var m string
	var eps float64
	for k := range 2 {
		if e, ok := fc.scalar(add.Inputs[k]); ok {
			m, eps = add.Inputs[1-k], e
			break
		}
	}
	if m == "" || !(eps >= 0) || math.IsInf(eps, 0) || !fc.internal(m) {
		return nil, 0, false
	}
	mi, mean, ok := fc.node(m, "ReduceMean")
	if !ok || !lastAxisMean(fc, mean) {
		return nil, 0, false
	}
	q := mean.Inputs[0]
	pi, pow, ok := fc.node(q, "Pow")
	if !ok || !fc.internal(q) || len(pow.Inputs) != 2 || pow.Inputs[0] != x {
		return nil, 0, false
	}
	if two, ok := fc.scalar(pow.Inputs[1]); !ok || two != 2 {
		return nil, 0, false
	}
	return append(chain, si, ai, mi, pi), float32(eps), true
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
