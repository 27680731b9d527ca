package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// gqaRule rewrites com.microsoft GroupQueryAttention whose past_key and
// past_value are a layer's pasts and whose present_key/present_value its
// presents (onnxruntime-genai exports, which share one max_length buffer
// between past and present). On a state the buffer is the layer's
// KVCache: seqlens_k and total_sequence_length (computed in the graph from
// attention_mask) must agree with what the state holds, which the kernel
// checks at run time. Legal when nothing else reads the pasts (not even
// their shape: a shared buffer's shape is its capacity, which a state does
// not have), the presents are read by no node but Shape/Size, and the op
// uses no feature the cache path lacks (smooth softmax, head_sink,
// attention_bias, quantized caches, qk output, causal=0). A layer with
// window-sized buffers (sliding_window_cache=1) keeps every position in its
// KVCache and attends within local_window_size; its presents are exported
// as the window-sized buffer (Layer.WindowBuffer).
type gqaRule struct{}

// Name is the rule's name in cache_plan().
func (gqaRule) Name() string { return "group-query-attention-shared-buffer" }

// Match checks one layer.
func (gqaRule) Match(ix *index, p *pair) (*edit, string) {
	ik, why := pastUser(ix, p.pastK)
	if why != "" {
		return nil, why
	}
	n := ix.node(ik)
	if n.GetDomain() != "com.microsoft" || n.GetOpType() != "GroupQueryAttention" {
		return nil, fmt.Sprintf("past %q feeds %s, not com.microsoft GroupQueryAttention", p.pastK, describe(n))
	}
	for _, past := range []string{p.pastK, p.pastV} {
		if users := ix.consumers[past]; len(users) != 1 || users[0] != ik {
			return nil, fmt.Sprintf("past %q is read by other nodes than %s (a shared buffer's shape is its capacity)", past, describe(n))
		}
	}
	in, out := n.GetInput(), n.GetOutput()
	if why := wiredToPair(ix, n, ik, p, 3); why != "" {
		return nil, why
	}
	for i, name := range map[int]string{10: "attention_bias", 11: "head_sink", 12: "k_scale", 13: "v_scale",
		14: "q_norm_weight", 15: "k_norm_weight", 16: "query_seqlens"} {
		if argAt(in, i) != "" {
			return nil, fmt.Sprintf("%s uses the %s input (not supported on the cache path)", describe(n), name)
		}
	}
	if argAt(out, 3) != "" || attrInt(n, "qk_output", 0) != 0 {
		return nil, fmt.Sprintf("%s outputs output_qk", describe(n))
	}
	for name, want := range map[string]int64{"causal": 1, "smooth_softmax": 0, "kv_cache_bit_width": 0} {
		if v := attrInt(n, name, want); v != want {
			return nil, fmt.Sprintf("%s has %s=%d (the cache path supports %d)", describe(n), name, v, want)
		}
	}
	windowBuffer := 0
	switch swc, w := attrInt(n, "sliding_window_cache", 0), attrInt(n, "local_window_size", -1); {
	case swc == 1 && w > 0:
		windowBuffer = int(w)
	case swc != 0:
		return nil, fmt.Sprintf("%s has sliding_window_cache=%d with local_window_size %d", describe(n), swc, w)
	}
	for _, a := range n.GetAttribute() {
		if (a.GetName() == "k_quant_type" || a.GetName() == "v_quant_type") && string(a.GetS()) != "NONE" {
			return nil, fmt.Sprintf("%s has a quantized cache (%s=%s)", describe(n), a.GetName(), a.GetS())
		}
	}
	attrs := []*onnxpb.AttributeProto{intAttr("layer", 0), intAttr("window_buffer", int64(windowBuffer))}
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "num_heads", "kv_num_heads", "scale", "softcap", "local_window_size", "do_rotary", "rotary_interleaved":
			attrs = append(attrs, a)
		}
	}
	inputs := append([]string(nil), in...)
	inputs[3], inputs[4] = "", ""
	node := &onnxpb.NodeProto{Name: ptr(n.GetName() + "/cache"), OpType: ptr(opGQA), Domain: ptr(Domain),
		Input: inputs, Output: []string{out[0], p.presK, p.presV}, Attribute: attrs}
	kNew := argAt(in, 1)
	if kNew == "" {
		kNew = argAt(in, 0) // packed QKV: the sequence axis is the query's
	}
	return &edit{drop: []int{ik}, insert: []*onnxpb.NodeProto{node}, pastK: p.pastK, pastV: p.pastV,
		presK: p.presK, presV: p.presV, kNew: kNew, windowBuffer: windowBuffer}, ""
}
