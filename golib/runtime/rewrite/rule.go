package rewrite

import (
	"fmt"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// Rule is one cache rewrite pattern. Match either returns the edit that
// puts the layer of p on a KVCache or a reason (a short sentence) why the
// pattern does not apply or is not legal here.
type Rule interface {
	Name() string
	Match(ix *index, p *pair) (*edit, string)
}

// Mask modes of CacheAttention (attribute mask_mode): how input 3 is read.
// Every mask is checked at run time to be causal plus left padding.
const (
	maskNone      = 0 // no mask (causal)
	maskPadding   = 1 // attention_mask [batch, total] ints, with causal
	maskAttention = 2 // an Attention op mask: bool (true attends) or additive float; causal attr adds is_causal
	maskAdditive  = 3 // added to the scores
	maskBlocked   = 4 // Where(mask, low, scores): true blocks
	maskAttend    = 5 // Where(mask, scores, low): true attends
)

// rules are tried in order; the first that matches a layer rewrites it.
var rules = []Rule{attentionRule{}, concatRule{}, gqaRule{}}

// RuleNames lists the rules, in the order they are tried.
func RuleNames() []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Name()
	}
	return out
}

// pastUser checks the legality conditions every rule shares for a past: it
// is a fed input, no subgraph reads it, it is not a graph output, and every
// node that reads it except one reads only its shape (Shape, Size). It
// returns that one node's index.
func pastUser(ix *index, past string) (int, string) {
	if !ix.isGraphInput(past) {
		return -1, fmt.Sprintf("past %q is not a fed graph input", past)
	}
	if ix.captured[past] {
		return -1, fmt.Sprintf("past %q is read inside a subgraph (If/Loop/Scan)", past)
	}
	if ix.outputs[past] {
		return -1, fmt.Sprintf("past %q is also a graph output", past)
	}
	user := -1
	var others []string
	for _, i := range ix.consumers[past] {
		n := ix.node(i)
		if isShapeOnly(n) {
			continue
		}
		if user >= 0 {
			others = append(others, describe(n))
			continue
		}
		user = i
	}
	if user < 0 {
		return -1, fmt.Sprintf("past %q is read by no attention node", past)
	}
	if len(others) > 0 {
		return -1, fmt.Sprintf("past %q is read by %s and also by %s (only Shape/Size may observe a past)",
			past, describe(ix.node(user)), strings.Join(others, ", "))
	}
	return user, ""
}

// presentFree checks that a present is produced by node i and observed by
// nobody but the caller and Shape/Size nodes: no other node and no subgraph
// reads it.
func presentFree(ix *index, present string, i int) string {
	if p, ok := ix.producer[present]; !ok || p != i {
		return fmt.Sprintf("present %q is not produced by %s", present, describe(ix.node(i)))
	}
	for _, u := range ix.consumers[present] {
		if n := ix.node(u); !isShapeOnly(n) {
			return fmt.Sprintf("present %q is also read by %s (the cache path exports presents only as outputs)",
				present, describe(n))
		}
	}
	if ix.captured[present] {
		return fmt.Sprintf("present %q is read inside a subgraph", present)
	}
	return ""
}

func describe(n interface {
	GetOpType() string
	GetName() string
}) string {
	if n.GetName() != "" {
		return fmt.Sprintf("%s node %q", n.GetOpType(), n.GetName())
	}
	return n.GetOpType() + " node"
}

// withPaddingInput gives a CacheAttention node whose mask is read as a
// whole the graph's attention_mask input too (when the graph has one, as
// exporters name it): its zeros say where each sequence's left padding
// ends, which a sliding-window mask alone does not.
func withPaddingInput(ix *index, n *onnxpb.NodeProto, mode int64) {
	if len(n.Input) > 3 && n.Input[3] != "" {
		// the mask's value name keys its verdict within a run (its buffer
		// may be reused by another mask of the same run)
		n.Attribute = append(n.Attribute, &onnxpb.AttributeProto{Name: ptr("mask_value"),
			Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte(n.Input[3])})
	}
	if mode < maskAttention || !ix.isGraphInput("attention_mask") || ix.captured["attention_mask"] {
		return
	}
	if vi := ix.inputs["attention_mask"]; vi.Shape != nil && len(vi.Shape) != 2 {
		return
	}
	n.Attribute = append(n.Attribute, intAttr("padding_input", int64(len(n.Input))))
	n.Input = append(n.Input, "attention_mask")
}

// argAt is s[i], or "" past its end (an omitted optional input or output).
func argAt(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}

// wiredToPair checks that attention node n takes the pair's pasts as its
// inputs pastIn and pastIn+1, produces its presents as outputs 1 and 2,
// and that nothing but the caller (and Shape/Size) reads those presents;
// it returns the reason when not ("" when it is).
func wiredToPair(ix *index, n *onnxpb.NodeProto, node int, p *pair, pastIn int) string {
	in, out := n.GetInput(), n.GetOutput()
	if argAt(in, pastIn) != p.pastK || argAt(in, pastIn+1) != p.pastV {
		return fmt.Sprintf("the pasts are not %s's past_key/past_value inputs", describe(n))
	}
	if argAt(out, 1) != p.presK || argAt(out, 2) != p.presV {
		return fmt.Sprintf("%s's present outputs are not the paired presents", describe(n))
	}
	for _, pr := range []string{p.presK, p.presV} {
		if why := presentFree(ix, pr, node); why != "" {
			return why
		}
	}
	return ""
}
