package rewrite

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// The internal ops of Domain.
const (
	// opAttention appends a layer's new K/V to its cache and attends over
	// the cache: inputs Q, K, V, [attention_mask]; outputs Y, [present_key,
	// present_value] (exported only when the caller asks for them).
	opAttention = "CacheAttention"
	// opShape is Shape/Size of a removed past: the state's logical shape
	// [batch, kv_heads, past_length, head_dim]; of a present (input: the
	// step's new keys) [batch, kv_heads, past_length + new, head_dim].
	opShape = "CacheShape"
	// opGQA is GroupQueryAttention with its shared buffer replaced by the
	// layer's cache: the op's inputs without past_key/past_value.
	opGQA = "CacheGroupQueryAttention"
)

func ptr[T any](v T) *T { return &v }

func intAttr(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: ptr(name), Type: onnxpb.AttributeProto_INT.Enum(), I: ptr(v)}
}

// setLayer sets the "layer" attribute of the rewritten nodes.
func setLayer(n *onnxpb.NodeProto, layer int) {
	for _, a := range n.GetAttribute() {
		if a.GetName() == "layer" {
			a.I = ptr(int64(layer))
			return
		}
	}
	n.Attribute = append(n.Attribute, intAttr("layer", int64(layer)))
}

// shapeNode turns Shape(past) or Size(past) into a CacheShape node with the
// same output and the same start/end.
func shapeNode(n *onnxpb.NodeProto, ref pastRef) *onnxpb.NodeProto {
	value := int64(0)
	if ref.value {
		value = 1
	}
	attrs := []*onnxpb.AttributeProto{intAttr("layer", int64(ref.layer)), intAttr("value", value)}
	if n.GetOpType() == "Size" {
		attrs = append(attrs, intAttr("size", 1))
	} else {
		for _, a := range n.GetAttribute() {
			if a.GetName() == "start" || a.GetName() == "end" {
				attrs = append(attrs, a)
			}
		}
	}
	var inputs []string
	if ref.present != "" {
		// a present's shape: past length plus the new keys' sequence axis
		inputs = []string{ref.present}
	}
	return &onnxpb.NodeProto{Name: ptr(n.GetName() + "/cache"), OpType: ptr(opShape), Domain: ptr(Domain),
		Input: inputs, Output: n.GetOutput(), Attribute: attrs}
}

// prune drops nodes none of whose outputs is read or is a graph output
// (the mask construction a rewritten Attention no longer reads), until
// none is left. Nodes with subgraphs are kept.
func prune(nodes []*onnxpb.NodeProto, outputs map[string]bool) []*onnxpb.NodeProto {
	for {
		used := map[string]bool{}
		for _, n := range nodes {
			for _, in := range n.GetInput() {
				used[in] = true
			}
			for _, a := range n.GetAttribute() {
				if a.GetG() != nil || len(a.GetGraphs()) > 0 {
					for _, o := range n.GetOutput() {
						used[o] = true // conservative: subgraphs may read anything
					}
				}
			}
		}
		kept := nodes[:0:0]
		for _, n := range nodes {
			live := false
			for _, o := range n.GetOutput() {
				if o != "" && (used[o] || outputs[o]) {
					live = true
					break
				}
			}
			if live {
				kept = append(kept, n)
			}
		}
		if len(kept) == len(nodes) {
			return kept
		}
		nodes = kept
	}
}
