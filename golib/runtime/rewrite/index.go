package rewrite

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// index is what the rules ask of a graph: who produces and who consumes
// each value, which names subgraphs read, which names are graph outputs.
type index struct {
	g         *model.Graph
	opsets    map[string]int
	producer  map[string]int   // value -> node index
	consumers map[string][]int // value -> node indices (a node once per value)
	captured  map[string]bool  // values read inside some node's subgraph
	outputs   map[string]bool
	inputs    map[string]model.ValueInfo
}

func newIndex(g *model.Graph, opsets map[string]int) *index {
	ix := &index{g: g, opsets: opsets, producer: map[string]int{}, consumers: map[string][]int{},
		captured: map[string]bool{}, outputs: map[string]bool{}, inputs: map[string]model.ValueInfo{}}
	for i, n := range g.Nodes {
		seen := map[string]bool{}
		for _, in := range n.GetInput() {
			if in != "" && !seen[in] {
				seen[in] = true
				ix.consumers[in] = append(ix.consumers[in], i)
			}
		}
		for _, o := range n.GetOutput() {
			if o != "" {
				ix.producer[o] = i
			}
		}
		for _, a := range n.GetAttribute() {
			if a.GetG() != nil {
				markCaptured(a.GetG(), ix.captured)
			}
			for _, sg := range a.GetGraphs() {
				markCaptured(sg, ix.captured)
			}
		}
	}
	for _, o := range g.Outputs {
		ix.outputs[o.Name] = true
	}
	for _, in := range g.Inputs {
		ix.inputs[in.Name] = in
	}
	return ix
}

// markCaptured records every name a subgraph's nodes read (a superset of
// its outer-scope captures: the rules only need "never read inside").
func markCaptured(g *onnxpb.GraphProto, dst map[string]bool) {
	for _, n := range g.GetNode() {
		for _, in := range n.GetInput() {
			dst[in] = true
		}
		for _, a := range n.GetAttribute() {
			if a.GetG() != nil {
				markCaptured(a.GetG(), dst)
			}
			for _, sg := range a.GetGraphs() {
				markCaptured(sg, dst)
			}
		}
	}
}

// node returns node i.
func (ix *index) node(i int) *onnxpb.NodeProto { return ix.g.Nodes[i] }

// producerOf returns the node producing name (nil for inputs, initializers).
func (ix *index) producerOf(name string) *onnxpb.NodeProto {
	if i, ok := ix.producer[name]; ok {
		return ix.g.Nodes[i]
	}
	return nil
}

// isGraphInput reports whether name is a fed graph input (not an
// initializer).
func (ix *index) isGraphInput(name string) bool {
	_, in := ix.inputs[name]
	_, init := ix.g.Initializers[name]
	return in && !init
}

// fixedDims returns the declared KV heads (axis 1) and head dim (axis 3) of
// a 4-D past input, 0 where not fixed.
func (ix *index) fixedDims(name string) (heads, dim int) {
	vi, ok := ix.inputs[name]
	if !ok || len(vi.Shape) != 4 {
		return 0, 0
	}
	if d := vi.Shape[1].Value; d > 0 {
		heads = int(d)
	}
	if d := vi.Shape[3].Value; d > 0 {
		dim = int(d)
	}
	return heads, dim
}

// declared returns the declared type and shape of value name: a graph
// input's, else the graph's value_info entry.
func (ix *index) declared(name string) (model.ValueInfo, bool) {
	if vi, ok := ix.inputs[name]; ok {
		return vi, true
	}
	vi, ok := ix.g.ValueInfos[name]
	return vi, ok
}

// declaredHeads returns the declared size of axis -3 (the heads axis of a
// [batch, heads, S, T] attention mask or bias) of value name, from the graph's
// inputs, value_info or a constant, 0 where unknown or of rank < 3.
func (ix *index) declaredHeads(name string) int {
	if t := ix.constTensor(name); t != nil {
		if sh := t.Shape(); len(sh) >= 3 {
			return sh[len(sh)-3]
		}
		return 0
	}
	vi, ok := ix.declared(name)
	if !ok || len(vi.Shape) < 3 {
		return 0
	}
	if d := vi.Shape[len(vi.Shape)-3].Value; d > 0 {
		return int(d)
	}
	return 0
}

// maybeScalar reports whether value name may hold a single element: false
// when a constant or a declared shape (graph input, value_info) shows more
// (a norm's weight vector, a per-row factor), so that such a Mul is never
// taken for the attention's scale.
func (ix *index) maybeScalar(name string) bool {
	if t := ix.constTensor(name); t != nil {
		return t.Len() == 1
	}
	vi, ok := ix.declared(name)
	if !ok {
		return true
	}
	for _, d := range vi.Shape {
		if d.Value > 1 {
			return false
		}
	}
	return true
}

// isShapeOnly reports whether n reads only the shape of its input.
func isShapeOnly(n *onnxpb.NodeProto) bool {
	d := n.GetDomain()
	return (d == "" || d == "ai.onnx") && (n.GetOpType() == "Shape" || n.GetOpType() == "Size") && len(n.GetInput()) == 1
}

// attrInt returns an int attribute of n (def when absent).
func attrInt(n *onnxpb.NodeProto, name string, def int64) int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name && a.GetType() == onnxpb.AttributeProto_INT {
			return a.GetI()
		}
	}
	return def
}

// attrInts returns an ints attribute of n (nil when absent).
func attrInts(n *onnxpb.NodeProto, name string) []int64 {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name && a.GetType() == onnxpb.AttributeProto_INTS {
			return a.GetInts()
		}
	}
	return nil
}

// hasAttr reports whether n sets the attribute name.
func hasAttr(n *onnxpb.NodeProto, name string) bool {
	for _, a := range n.GetAttribute() {
		if a.GetName() == name {
			return true
		}
	}
	return false
}

// isOp reports whether n is op in the default domain.
func isOp(n *onnxpb.NodeProto, op string) bool {
	d := n.GetDomain()
	return n != nil && (d == "" || d == "ai.onnx") && n.GetOpType() == op
}

// constantValue reports whether name is an initializer or a Constant node's
// output, directly or through Cast, Sqrt or Reciprocal (a scale, never the
// activations the scale multiplies).
func (ix *index) constantValue(name string) bool {
	for depth := 0; depth < 8; depth++ {
		if _, ok := ix.g.Initializers[name]; ok {
			return true
		}
		n := ix.producerOf(name)
		switch {
		case isOp(n, "Constant"):
			return true
		case isOp(n, "Cast") || isOp(n, "Sqrt") || isOp(n, "Reciprocal"):
			name = inputName(n, 0)
		default:
			return false
		}
	}
	return false
}

// constTensor returns the value of an initializer or of a Constant node's
// output (its value, value_float(s) or value_int(s) attribute); nil when
// name is neither or the value does not decode.
func (ix *index) constTensor(name string) *tensor.Tensor {
	if t, ok := ix.g.Initializers[name]; ok {
		return t
	}
	n := ix.producerOf(name)
	if !isOp(n, "Constant") {
		return nil
	}
	for _, a := range n.GetAttribute() {
		var t *tensor.Tensor
		var err error
		switch a.GetName() {
		case "value":
			t, err = model.TensorFromProto(a.GetT())
		case "value_float":
			t, err = tensor.FromSlice(tensor.Shape{}, []float32{a.GetF()})
		case "value_floats":
			t, err = tensor.FromSlice(tensor.Shape{len(a.GetFloats())}, a.GetFloats())
		case "value_int":
			t, err = tensor.FromSlice(tensor.Shape{}, []int64{a.GetI()})
		case "value_ints":
			t, err = tensor.FromSlice(tensor.Shape{len(a.GetInts())}, a.GetInts())
		default:
			continue
		}
		if err != nil {
			return nil
		}
		return t
	}
	return nil
}

// constZero reports whether name is a constant (constTensor) of floating
// point elements that are all zero (+0 or -0).
func (ix *index) constZero(name string) bool {
	t := ix.constTensor(name)
	if t == nil || !t.DType().IsFloat() || t.Len() == 0 {
		return false
	}
	v, err := tensor.AsFloat32(t)
	if err != nil {
		return false
	}
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// constInts returns the int64 values of a constant (constTensor; nil when
// name is none or not int64).
func (ix *index) constInts(name string) []int64 {
	if t := ix.constTensor(name); t != nil {
		return t.Int64()
	}
	return nil
}
