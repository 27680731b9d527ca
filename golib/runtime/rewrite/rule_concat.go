package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// concatRule rewrites a layer whose presents are Concat(past, new, axis=2)
// and whose attention reads the presents, directly or through the GQA head
// expansion repeat_kv (Unsqueeze(axis 2) -> Expand -> Reshape, which is
// not materialized), either
//
//   - as standard Attention without past inputs (torch.onnx dynamo at
//     opset 23) with a mask and is_causal=0 (is_causal=1 there would align
//     the triangle to the first key, not to the end of the past), or
//   - decomposed: MatMul(q, Transpose(K, [0, 1, 3, 2])) (or the same
//     transpose as Reshape/Transpose(0, 2, 1)/Reshape, whose targets are
//     checked at run time) with scalar Mul/Div
//     factors on q, on K^T or on the scores, an optional mask (Add, or Where
//     with a very negative fill), Softmax on the last axis (optionally
//     between Casts, optionally followed by the Where(IsNaN(p), 0, p) guard
//     of SDPA exports), and MatMul with V (the built-in GPT-2, TorchScript
//     and optimum exports).
//
// The factors stay graph values (exporters compute sqrt(head_dim) from
// shapes) and are multiplied at run time. Masks are read at run time and
// must be causal plus left padding, which the kernel implements; any
// other mask fails the run with a NotImplementedError and leaves the state
// unchanged. Casts of the scores (fp16 exports) are allowed before the
// mask and around the Softmax. Every intermediate value must be read by its chain only;
// presents may also be read by Shape/Size.
type concatRule struct{}

// Name is the rule's name in cache_plan().
func (concatRule) Name() string { return "concat-past-present" }

// chain collects the nodes a match drops.
type chain struct {
	ix   *index
	drop []int
	why  string
	// expShapes are Shape/Size nodes reading an expanded (repeat_kv) K or
	// V: [batch, q_heads, total, head_dim], answered from the state.
	expShapes []expShape
}

// expShape is a Shape/Size node of an expanded K (value false) or V.
type expShape struct {
	node  int
	value bool
}

// next returns the only consumer of v, which must not be a graph output
// nor read by a subgraph.
func (c *chain) next(v string) (int, *onnxpb.NodeProto) {
	if c.why != "" {
		return -1, nil
	}
	users := c.ix.consumers[v]
	switch {
	case c.ix.outputs[v]:
		c.why = fmt.Sprintf("intermediate %q is a graph output", v)
	case c.ix.captured[v]:
		c.why = fmt.Sprintf("intermediate %q is read inside a subgraph", v)
	case len(users) != 1:
		c.why = fmt.Sprintf("intermediate %q is read by %d nodes (the pattern needs exactly its chain)", v, len(users))
	}
	if c.why != "" {
		return -1, nil
	}
	return users[0], c.ix.node(users[0])
}

// take records node i as dropped and returns its first output.
func (c *chain) take(i int) string {
	c.drop = append(c.drop, i)
	return c.ix.node(i).GetOutput()[0]
}

// concatOf checks that a past feeds Concat(past, new, axis=2) producing
// the paired present, directly or through a Cast to the past's own type
// (GPT-J's TorchScript export casts the keys to float32 whatever their
// type), and returns the nodes the match drops and the new rows.
func concatOf(ix *index, past, present string) ([]int, string, string) {
	i, why := pastUser(ix, past)
	if why != "" {
		return nil, "", why
	}
	n := ix.node(i)
	if !isOp(n, "Concat") {
		return nil, "", fmt.Sprintf("past %q feeds %s, not Concat", past, describe(n))
	}
	ax := attrInt(n, "axis", 0)
	if len(n.GetInput()) != 2 || inputName(n, 0) != past || (ax != 2 && ax != -2) {
		return nil, "", fmt.Sprintf("%s is not Concat(past, new) on the sequence axis 2", describe(n))
	}
	if len(n.GetOutput()) != 1 {
		return nil, "", fmt.Sprintf("%s does not produce the paired present %q", describe(n), present)
	}
	if out := n.GetOutput()[0]; out != present {
		c := &chain{ix: ix}
		j, cast := c.next(out)
		if cast == nil || !isOp(cast, "Cast") || len(cast.GetOutput()) != 1 || cast.GetOutput()[0] != present ||
			attrInt(cast, "to", 0) != int64(ix.inputs[past].DType) {
			return nil, "", fmt.Sprintf("%s does not produce the paired present %q (nor a Cast of it to the past's type)",
				describe(n), present)
		}
		return []int{i, j}, inputName(n, 1), ""
	}
	return []int{i}, inputName(n, 1), ""
}

// presentHead returns the one node that reads a present besides Shape/Size
// (its other readers) and the caller.
func presentHead(ix *index, present string) (int, string) {
	if ix.captured[present] {
		return -1, fmt.Sprintf("present %q is read inside a subgraph", present)
	}
	head := -1
	for _, i := range ix.consumers[present] {
		if isShapeOnly(ix.node(i)) {
			continue
		}
		if head >= 0 {
			return -1, fmt.Sprintf("present %q is read by %s and %s (the cache path exports presents only as outputs)",
				present, describe(ix.node(head)), describe(ix.node(i)))
		}
		head = i
	}
	if head < 0 {
		return -1, fmt.Sprintf("present %q is read by no attention node", present)
	}
	return head, ""
}

// repeatKV follows an optional repeat_kv expansion from v whose first node
// is i; it returns the expanded value (v itself when absent) and the index
// of the node reading it.
func (c *chain) repeatKV(v string, i int, value bool) (string, int) {
	n := c.ix.node(i)
	if !isOp(n, "Unsqueeze") {
		return v, i
	}
	axes := attrInts(n, "axes")
	if len(n.GetInput()) > 1 {
		axes = c.ix.constInts(inputName(n, 1))
	}
	if len(axes) != 1 || (axes[0] != 2 && axes[0] != -3) {
		c.why = fmt.Sprintf("%s on %q is not the repeat_kv Unsqueeze at axis 2", describe(n), v)
		return "", -1
	}
	u := c.take(i)
	j, e := c.next(u)
	if e == nil || !isOp(e, "Expand") || inputName(e, 0) != u {
		if c.why == "" {
			c.why = fmt.Sprintf("repeat_kv of %q: Unsqueeze is not followed by Expand", v)
		}
		return "", -1
	}
	x := c.take(j)
	k, r := c.next(x)
	if r == nil || !isOp(r, "Reshape") || inputName(r, 0) != x {
		if c.why == "" {
			c.why = fmt.Sprintf("repeat_kv of %q: Expand is not followed by Reshape", v)
		}
		return "", -1
	}
	out := c.take(k)
	// exporters read the expanded keys' head_dim (for the scale) with Shape
	head := -1
	for _, u := range c.ix.consumers[out] {
		switch {
		case isShapeOnly(c.ix.node(u)):
			c.expShapes = append(c.expShapes, expShape{node: u, value: value})
		case head >= 0:
			c.why = fmt.Sprintf("the expanded %q is read by two nodes", v)
			return "", -1
		default:
			head = u
		}
	}
	if head < 0 || c.ix.outputs[out] || c.ix.captured[out] {
		c.why = fmt.Sprintf("the expanded %q is not read by one attention node only", v)
		return "", -1
	}
	return out, head
}

// factor is a run-time scalar the scores are multiplied (or divided) by.
type factor struct {
	name string
	sign int64 // +1 multiply, -1 divide
}

// scaleOp reports whether node n is Mul/Div of v by another value, and
// that value with its sign (Div only with v as dividend).
func scaleOp(n *onnxpb.NodeProto, v string) (factor, bool) {
	in := n.GetInput()
	if len(in) != 2 {
		return factor{}, false
	}
	switch {
	case isOp(n, "Mul") && in[0] == v && in[1] != v:
		return factor{in[1], 1}, true
	case isOp(n, "Mul") && in[1] == v && in[0] != v:
		return factor{in[0], 1}, true
	case isOp(n, "Div") && in[0] == v && in[1] != v:
		return factor{in[1], -1}, true
	}
	return factor{}, false
}

// Match checks one layer.
func (concatRule) Match(ix *index, p *pair) (*edit, string) {
	ik, kNew, why := concatOf(ix, p.pastK, p.presK)
	if why != "" {
		return nil, why
	}
	iv, vNew, why := concatOf(ix, p.pastV, p.presV)
	if why != "" {
		return nil, why
	}
	c := &chain{ix: ix, drop: append(ik, iv...)}
	hk, why := presentHead(ix, p.presK)
	if why != "" {
		return nil, why
	}
	hv, why := presentHead(ix, p.presV)
	if why != "" {
		return nil, why
	}
	kEnd, ki := c.repeatKV(p.presK, hk, false)
	vEnd, vi := c.repeatKV(p.presV, hv, true)
	if c.why != "" {
		return nil, c.why
	}
	outType := int64(0) // fp16 exports widen V (and so the output) to float
	if vn := ix.node(vi); isOp(vn, "Cast") {
		outType = attrInt(vn, "to", 0)
		vEnd = c.take(vi)
		if vi, _ = c.next(vEnd); c.why != "" {
			return nil, c.why
		}
	}
	var node *onnxpb.NodeProto
	if n := ix.node(ki); isOp(n, "Attention") {
		node, why = c.attentionEnd(ki, kEnd, vEnd, vi, kNew, vNew, p)
	} else {
		node, why = c.decomposedEnd(ki, kEnd, vEnd, vi, kNew, vNew, p)
	}
	if why != "" {
		return nil, why
	}
	if outType != 0 {
		node.Attribute = append(node.Attribute, intAttr("output_type", outType))
	}
	e := &edit{drop: c.drop, insert: []*onnxpb.NodeProto{node}, pastK: p.pastK, pastV: p.pastV,
		presK: p.presK, presV: p.presV, kNew: kNew, replace: map[int]*onnxpb.NodeProto{}}
	for _, es := range c.expShapes {
		sn := shapeNode(ix.node(es.node), pastRef{value: es.value, present: kNew})
		sn.Input = append(sn.Input, inputName(node, 0)) // q gives the expanded head count
		sn.Attribute = append(sn.Attribute, intAttr("expanded", 1))
		e.replace[es.node] = sn
	}
	return e, ""
}

// attentionEnd matches standard Attention reading the (expanded) presents.
func (c *chain) attentionEnd(ai int, kEnd, vEnd string, vi int, kNew, vNew string, p *pair) (*onnxpb.NodeProto, string) {
	n := c.ix.node(ai)
	in, out := n.GetInput(), n.GetOutput()
	if argAt(in, 1) != kEnd || argAt(in, 2) != vEnd || vi != ai {
		return nil, fmt.Sprintf("%s does not read the presents as its K and V", describe(n))
	}
	if argAt(in, 4) != "" || argAt(in, 5) != "" || argAt(in, 6) != "" || argAt(out, 1) != "" || argAt(out, 2) != "" || argAt(out, 3) != "" {
		return nil, fmt.Sprintf("%s has past/present, nonpad_kv_seqlen or qk_matmul_output besides the Concat pasts", describe(n))
	}
	if v := c.ix.opsets[""]; v < 23 || v > 24 {
		return nil, fmt.Sprintf("Attention opset %d (the rule covers 23 and 24)", v)
	}
	causal := attrInt(n, "is_causal", 0)
	mask := argAt(in, 3)
	if causal != 0 {
		// Without past inputs on the op, is_causal aligns the triangle to the top left of
		// [query, past + new] (the ONNX definition; onnxruntime and torch agree): a query after
		// a past would see only the first keys. The kernel aligns it to the end of the cache.
		return nil, fmt.Sprintf("%s is causal (is_causal=1) over Concat pasts: ONNX aligns that triangle to the "+
			"first key, not to the end of the past, which the cache path does not implement", describe(n))
	}
	if mask == "" {
		return nil, fmt.Sprintf("%s is neither causal nor masked", describe(n))
	}
	c.drop = append(c.drop, ai)
	mode := int64(maskAttention)
	if mask == "" {
		mode = maskNone
	}
	attrs := []*onnxpb.AttributeProto{intAttr("layer", 0), intAttr("mask_mode", mode), intAttr("causal", causal),
		intAttr("q_num_heads", attrInt(n, "q_num_heads", 0)), intAttr("kv_num_heads", attrInt(n, "kv_num_heads", 0))}
	for _, a := range n.GetAttribute() {
		switch a.GetName() {
		case "scale", "softcap":
			attrs = append(attrs, a)
		}
	}
	node := &onnxpb.NodeProto{Name: ptr(n.GetName() + "/cache"), OpType: ptr(opAttention), Domain: ptr(Domain),
		Input: []string{argAt(in, 0), kNew, vNew, mask}, Output: []string{out[0], p.presK, p.presV}, Attribute: attrs}
	withPaddingInput(c.ix, node, mode)
	return node, ""
}

// decomposedEnd matches MatMul-(scale)-(mask)-Softmax-MatMul.
func (c *chain) decomposedEnd(ti int, kEnd, vEnd string, vi int, kNew, vNew string, p *pair) (*onnxpb.NodeProto, string) {
	ix := c.ix
	t := ix.node(ti)
	perm := attrInts(t, "perm")
	var ktShapes []string // the batched form's Reshape targets, checked at run time
	var x string
	switch {
	case isOp(t, "Transpose") && len(perm) == 4 && perm[0] == 0 && perm[1] == 1 && perm[2] == 3 && perm[3] == 2:
		x = c.take(ti)
	case isOp(t, "Reshape"):
		// K^T as Reshape([B*H, T, D]) -> Transpose(0, 2, 1) -> Reshape([B, H, D, T])
		// (torch.onnx dynamo at its default opset)
		s1 := inputName(t, 1)
		x = c.take(ti)
		j, tr := c.next(x)
		if tr == nil {
			return nil, c.why
		}
		if p := attrInts(tr, "perm"); !isOp(tr, "Transpose") || len(p) != 3 || p[0] != 0 || p[1] != 2 || p[2] != 1 {
			return nil, fmt.Sprintf("the reshaped keys feed %s, not Transpose(perm=[0, 2, 1])", describe(tr))
		}
		x = c.take(j)
		j, r2 := c.next(x)
		if r2 == nil {
			return nil, c.why
		}
		if !isOp(r2, "Reshape") || inputName(r2, 0) != x {
			return nil, fmt.Sprintf("the transposed keys feed %s, not Reshape", describe(r2))
		}
		ktShapes = []string{s1, inputName(r2, 1)}
		x = c.take(j)
	default:
		return nil, fmt.Sprintf("the keys %q feed %s, not Transpose(perm=[0, 1, 3, 2]) or Attention", kEnd, describe(t))
	}
	var factors []factor
	i, n := c.next(x)
	for n != nil {
		f, ok := scaleOp(n, x)
		if !ok || !ix.maybeScalar(f.name) {
			break
		}
		factors = append(factors, f)
		x = c.take(i)
		i, n = c.next(x)
	}
	if n == nil {
		return nil, c.why
	}
	if !isOp(n, "MatMul") || inputName(n, 1) != x {
		return nil, fmt.Sprintf("the transposed keys feed %s, not MatMul(q, K^T)", describe(n))
	}
	qk := i
	// q side: scalar factors between q and the MatMul
	q := inputName(n, 0)
	for {
		pi, ok := ix.producer[q]
		if !ok {
			break
		}
		pn := ix.node(pi)
		in := pn.GetInput()
		if len(in) != 2 || len(ix.consumers[q]) != 1 || ix.outputs[q] {
			break
		}
		qi := 0
		if isOp(pn, "Mul") && ix.constantValue(in[0]) && !ix.constantValue(in[1]) {
			qi = 1 // Mul(scale, q)
		}
		f, ok := scaleOp(pn, in[qi])
		if !ok || f.name == in[qi] || !ix.maybeScalar(f.name) {
			break
		}
		factors = append(factors, f)
		c.drop = append(c.drop, pi)
		q = in[qi]
	}
	x = c.take(qk)
	i, n = c.next(x)
	for n != nil {
		f, ok := scaleOp(n, x)
		if !ok || !ix.maybeScalar(f.name) {
			break
		}
		factors = append(factors, f)
		x = c.take(i)
		i, n = c.next(x)
	}
	if n == nil {
		return nil, c.why
	}
	if isOp(n, "Cast") { // fp16 exports widen the scores before the mask
		x = c.take(i)
		if i, n = c.next(x); n == nil {
			return nil, c.why
		}
	}
	mode, mask, low := int64(maskNone), "", ""
	in := n.GetInput()
	switch {
	case isOp(n, "Add") && len(in) == 2:
		mode, mask = maskAdditive, in[1]
		if in[1] == x {
			mask = in[0]
		}
	case isOp(n, "Where") && len(in) == 3 && in[2] == x:
		mode, mask, low = maskBlocked, in[0], in[1]
	case isOp(n, "Where") && len(in) == 3 && in[1] == x:
		mode, mask, low = maskAttend, in[0], in[2]
	}
	if mode != maskNone {
		x = c.take(i)
		i, n = c.next(x)
		if n == nil {
			return nil, c.why
		}
	}
	if mode == maskNone {
		return nil, "the scores are not masked: a causal decomposed attention needs its mask"
	}
	if h := ix.declaredHeads(mask); h > 1 {
		// a per-head additive bias (ALiBi: Falcon-RW, Bloom, MPT) is no causal/padding mask: the
		// cache kernel reads one mask row per sequence, so the layer stays on the tensor path
		return nil, fmt.Sprintf("the scores' mask %q has %d heads (a per-head bias such as ALiBi), "+
			"the cache path reads one mask per sequence", mask, h)
	}
	if isOp(n, "Cast") {
		x = c.take(i)
		i, n = c.next(x)
		if n == nil {
			return nil, c.why
		}
	}
	if !isOp(n, "Softmax") {
		return nil, fmt.Sprintf("the masked scores feed %s, not Softmax", describe(n))
	}
	if ax := attrInt(n, "axis", -1); ax != -1 && ax != 3 {
		return nil, fmt.Sprintf("%s is not over the last axis", describe(n))
	}
	if ix.opsets[""] < 13 && !hasAttr(n, "axis") {
		return nil, fmt.Sprintf("%s (opset < 13) has the default axis 1", describe(n))
	}
	x = c.take(i)
	probs := x
	x, i, n = c.nanGuard(x)
	if n == nil {
		return nil, c.why
	}
	guarded := x != probs
	if isOp(n, "Cast") {
		x = c.take(i)
		i, n = c.next(x)
		if n == nil {
			return nil, c.why
		}
	}
	if !isOp(n, "MatMul") || inputName(n, 0) != x || inputName(n, 1) != vEnd || i != vi {
		return nil, fmt.Sprintf("the probabilities feed %s, not MatMul(p, V) with the paired values", describe(n))
	}
	c.drop = append(c.drop, i)
	signs := make([]int64, len(factors))
	inputs := []string{q, kNew, vNew, mask, low}
	for k, f := range factors {
		signs[k] = f.sign
		inputs = append(inputs, f.name)
	}
	ktAt := 0 // index of the first K^T Reshape target (0: none)
	if len(ktShapes) > 0 {
		ktAt = len(inputs)
	}
	inputs = append(inputs, ktShapes...)
	attrs := []*onnxpb.AttributeProto{intAttr("layer", 0), intAttr("mask_mode", mode), intAttr("causal", 0),
		{Name: ptr("scale"), Type: onnxpb.AttributeProto_FLOAT.Enum(), F: ptr(float32(1))},
		{Name: ptr("factor_signs"), Type: onnxpb.AttributeProto_INTS.Enum(), Ints: signs},
		intAttr("kt_reshape", int64(ktAt))}
	if guarded {
		attrs = append(attrs, intAttr("nan_zero", 1))
	}
	node := &onnxpb.NodeProto{Name: ptr(n.GetName() + "/cache"), OpType: ptr(opAttention), Domain: ptr(Domain),
		Input: inputs, Output: []string{n.GetOutput()[0], p.presK, p.presV}, Attribute: attrs}
	withPaddingInput(c.ix, node, mode)
	return node, ""
}

// nanGuard skips Where(IsNaN(p), 0, p) after the Softmax output p (the
// fill a constant zero) and returns the value and the node that read next;
// guarded reports that it did: the attention op then gives the rows whose
// softmax is NaN (a NaN or +Inf score, or no key it may attend) what the
// guard gives them, zero probabilities (cacheAttention.nanZero).
func (c *chain) nanGuard(p string) (string, int, *onnxpb.NodeProto) {
	users := c.ix.consumers[p]
	if len(users) == 2 && !c.ix.outputs[p] && !c.ix.captured[p] {
		a, b := c.ix.node(users[0]), c.ix.node(users[1])
		ia, ib := users[0], users[1]
		if isOp(b, "IsNaN") {
			a, b, ia, ib = b, a, ib, ia
		}
		if isOp(a, "IsNaN") && isOp(b, "Where") && len(b.GetInput()) == 3 &&
			inputName(b, 0) == a.GetOutput()[0] && inputName(b, 2) == p && len(c.ix.consumers[a.GetOutput()[0]]) == 1 &&
			c.ix.constZero(inputName(b, 1)) {
			c.drop = append(c.drop, ia)
			x := c.take(ib)
			i, n := c.next(x)
			return x, i, n
		}
	}
	i, n := c.next(p)
	return p, i, n
}
