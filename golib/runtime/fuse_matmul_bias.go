package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// matchMatMulBias fuses a projection with a bias, as torch.onnx, optimum
// and the onnxruntime-genai builder write nn.Linear(bias=True) (Qwen2's
// q/k/v projections):
//
//	y = MatMul(a, w)             // w: a float32 2D constant [K, N]
//	out = Add(y, b)              // b: a float32 constant [N], either order
//
// into the fused domain's MatMulBias(a, w, b) (ops/fused.go): MatMul's
// product (w packed at session creation), then the bias added in place.
// y must have no other reader and be neither a graph output nor captured.
// A bias of any other shape (which could broadcast the sum to a larger
// rank) keeps the chain.
func matchMatMulBias(fc *fuseContext, i int) (*onnxpb.NodeProto, []int, func(*ops.Context) bool, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Add" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, nil, false
	}
	for k := range 2 {
		y, b := n.Inputs[k], n.Inputs[1-k]
		bias, ok := fc.consts[b]
		if !ok || y == b || bias.DType() != tensor.Float32 || bias.Rank() != 1 || !fc.internal(y) {
			continue
		}
		mi, mm, ok := fc.node(y, "MatMul")
		if !ok || len(mm.Inputs) != 2 || mm.Inputs[0] == "" {
			continue
		}
		w, ok := fc.f32Weight(mm.Inputs[1])
		if !ok || w.Shape()[1] != bias.Len() {
			continue
		}
		np := fusedNode("MatMulBias", n.Name, []string{mm.Inputs[0], mm.Inputs[1], b}, []string{n.Outputs[0]})
		np.Domain = ptr(ops.FusedDomain)
		return np, []int{i, mi}, nil, true
	}
	return nil, nil, nil, false
}
