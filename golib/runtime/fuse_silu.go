package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// matchSiLU fuses the SiLU that torch.onnx (dynamo and TorchScript),
// optimum and the onnxruntime-genai builder write for Llama-family MLPs,
// with the gate multiply when there is one:
//
//	s = Sigmoid(x)
//	m = Mul(x, s)                // either operand order
//	[out = Mul(m, up)]           // either order: silu(gate_proj(h)) * up_proj(h)
//
// into the fused domain's SiLU(x[, up]) (ops/fused.go), which computes the
// same float32 steps. Proven conditions: x is made by a MatMul with a
// float32 2D constant B (so x is float32); up, when gating, by a MatMul of
// the same A with a float32 constant B of the same shape (so up has x's
// shape); s and m have no other reader and are neither graph outputs nor
// captured. The rule is tried at the gate multiply (chain Sigmoid, Mul,
// Mul) and at the SiLU's own Mul when no gate multiply follows it.
func matchSiLU(fc *fuseContext, i int) (*onnxpb.NodeProto, []int, func(*ops.Context) bool, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Mul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, nil, false
	}
	for k := range 2 {
		m, up := n.Inputs[k], n.Inputs[1-k]
		if m == up || !fc.internal(m) {
			continue
		}
		mi, mul, ok := fc.node(m, "Mul")
		if !ok {
			continue
		}
		x, core, ok := siluCore(fc, mul)
		if !ok {
			continue
		}
		gx, wx, _ := fc.projection(x)
		gu, wu, ok := fc.projection(up)
		if !ok || gu.Inputs[0] != gx.Inputs[0] || !wu.Shape().Equal(wx.Shape()) {
			continue
		}
		np := fusedNode("SiLU", n.Name, []string{x, up}, []string{n.Outputs[0]})
		np.Domain = ptr(ops.FusedDomain)
		return np, append([]int{i, mi}, core...), nil, true
	}
	// no gate: the SiLU alone, unless its output feeds a gate multiply
	// this rule fuses at that later node
	x, core, ok := siluCore(fc, n)
	if !ok {
		return nil, nil, nil, false
	}
	if out := n.Outputs[0]; fc.internal(out) {
		if r := fc.p.Nodes[fc.reader[out]]; r.OpType == "Mul" && r.Domain == "" {
			if _, _, _, gated := matchSiLU(fc, fc.reader[out]); gated {
				return nil, nil, nil, false
			}
		}
	}
	np := fusedNode("SiLU", n.Name, []string{x}, []string{n.Outputs[0]})
	np.Domain = ptr(ops.FusedDomain)
	return np, append([]int{i}, core...), nil, true
}

// siluCore matches mul = Mul(x, Sigmoid(x)) with x a float32 projection
// and the Sigmoid's output read only there; it returns x and the Sigmoid's
// index.
func siluCore(fc *fuseContext, mul *PlanNode) (string, []int, bool) {
	if len(mul.Inputs) != 2 || len(mul.Outputs) != 1 {
		return "", nil, false
	}
	for k := range 2 {
		x, s := mul.Inputs[k], mul.Inputs[1-k]
		if x == s || !fc.internal(s) {
			continue
		}
		si, sig, ok := fc.node(s, "Sigmoid")
		if !ok || len(sig.Inputs) != 1 || sig.Inputs[0] != x {
			continue
		}
		if _, _, ok := fc.projection(x); !ok {
			continue
		}
		return x, []int{si}, true
	}
	return "", nil, false
}

func ptr[T any](v T) *T { return &v }
