package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// attentionRule rewrites standard ONNX Attention (opset 23/24) whose
// past_key/past_value inputs are a layer's pasts and whose
// present_key/present_value outputs are its presents (torch.onnx dynamo at
// opset 23, the built-in Llama). Legal when the pasts are observed only by
// it and by Shape/Size, the presents only by the caller, attention is
// causal (is_causal=1, aligned to the end of the cache as onnxruntime
// does), qk_matmul_output and nonpad_kv_seqlen are unused, and the mask is
// absent or a mask (proven a key-padding mask of an attention_mask input,
// or read at run time and checked to be causal plus left padding).
type attentionRule struct{}

// Name is the rule's name in cache_plan().
func (attentionRule) Name() string { return "attention-past-present" }

// Match checks one layer.
func (attentionRule) Match(ix *index, p *pair) (*edit, string) {
	ik, why := pastUser(ix, p.pastK)
	if why != "" {
		return nil, why
	}
	iv, why := pastUser(ix, p.pastV)
	if why != "" {
		return nil, why
	}
	n := ix.node(ik)
	if !isOp(n, "Attention") {
		return nil, fmt.Sprintf("past %q feeds %s, not Attention", p.pastK, describe(n))
	}
	if iv != ik {
		return nil, fmt.Sprintf("past key and value feed different nodes (%s, %s)", describe(n), describe(ix.node(iv)))
	}
	if v := ix.opsets[""]; v < 23 || v > 24 {
		return nil, fmt.Sprintf("Attention opset %d (the rule covers 23 and 24)", v)
	}
	in, out := n.GetInput(), n.GetOutput()
	if why := wiredToPair(ix, n, ik, p, 4); why != "" {
		return nil, why
	}
	if argAt(out, 3) != "" {
		return nil, fmt.Sprintf("%s outputs qk_matmul_output (it observes the past's scores)", describe(n))
	}
	if argAt(in, 6) != "" {
		return nil, fmt.Sprintf("%s takes nonpad_kv_seqlen (not supported on the cache path)", describe(n))
	}
	causal := attrInt(n, "is_causal", 0)
	mask, mode := argAt(in, 3), int64(maskNone)
	if mask == "" && causal != 1 {
		return nil, fmt.Sprintf("%s is not causal (is_causal=0) and has no mask: the cache path runs causal attention only", describe(n))
	}
	if mask != "" {
		// a proven key-padding mask is read as the [batch, total] input it
		// is built from; any other mask is read as the op reads it, and
		// checked at run time
		mode = maskAttention
		if src, why := paddingMaskSource(ix, mask); why == "" {
			mask, mode = src, maskPadding
		}
	}
	attrs := []*onnxpb.AttributeProto{intAttr("layer", 0), intAttr("mask_mode", mode), intAttr("causal", causal)}
	for _, name := range []string{"q_num_heads", "kv_num_heads"} {
		attrs = append(attrs, intAttr(name, attrInt(n, name, 0)))
	}
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "scale", "softcap":
			attrs = append(attrs, a)
		}
	}
	node := &onnxpb.NodeProto{
		Name:      ptr(n.GetName() + "/cache"),
		OpType:    ptr(opAttention),
		Domain:    ptr(Domain),
		Input:     []string{argAt(in, 0), argAt(in, 1), argAt(in, 2), mask},
		Output:    []string{argAt(out, 0), p.presK, p.presV},
		Attribute: attrs,
	}
	withPaddingInput(ix, node, mode)
	return &edit{drop: []int{ik}, insert: []*onnxpb.NodeProto{node}, pastK: p.pastK, pastV: p.pastV,
		presK: p.presK, presV: p.presV, kNew: argAt(in, 1)}, ""
}

// paddingMaskSource proves that mask is a key-padding mask built from an
// int attention_mask graph input [batch, total] (1 = attend):
// Expand(Unsqueeze(Cast(attention_mask, to=BOOL), axes=[1, 2]), shape),
// whose value at [b, 0, i, t] is attention_mask[b, t] != 0 for every query
// row i. It returns the input's name.
func paddingMaskSource(ix *index, mask string) (string, string) {
	fail := func() (string, string) {
		return "", fmt.Sprintf("attention mask %q is not proven a key-padding mask "+
			"(Expand(Unsqueeze(Cast(attention_mask, bool), [1, 2]))) of a graph input", mask)
	}
	ex := ix.producerOf(mask)
	if !isOp(ex, "Expand") {
		return fail()
	}
	un := ix.producerOf(inputName(ex, 0))
	if !isOp(un, "Unsqueeze") {
		return fail()
	}
	axes := attrInts(un, "axes")
	if len(un.GetInput()) > 1 {
		t, ok := ix.g.Initializers[inputName(un, 1)]
		if !ok || t.Int64() == nil {
			return fail()
		}
		axes = t.Int64()
	}
	if len(axes) != 2 || axes[0] != 1 || axes[1] != 2 {
		return fail()
	}
	c := ix.producerOf(inputName(un, 0))
	if !isOp(c, "Cast") || attrInt(c, "to", 0) != int64(onnxpb.TensorProto_BOOL) {
		return fail()
	}
	src := inputName(c, 0)
	if !ix.isGraphInput(src) || ix.captured[src] {
		return fail()
	}
	if vi := ix.inputs[src]; vi.Shape != nil && len(vi.Shape) != 2 {
		return "", fmt.Sprintf("attention mask source %q is not 2-D [batch, total]", src)
	}
	return src, ""
}
