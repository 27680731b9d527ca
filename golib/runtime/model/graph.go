package model

import (
	"fmt"
	"unicode/utf8"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// ValueKind is the kind of a graph value.
type ValueKind int

// Value kinds.
const (
	KindTensor ValueKind = iota
	KindSequence
	KindMap
	KindOptional
	KindOther
)

// Dim is one dimension of a declared shape: a fixed size (Value >= 0) or a
// symbolic one (Value = -1, Param names it, possibly empty).
type Dim struct {
	Value int64
	Param string
}

// ValueInfo is a declared graph value (input, output or intermediate).
type ValueInfo struct {
	Name  string
	Kind  ValueKind
	DType tensor.DType // tensor element type (ONNX code; may be unsupported)
	// Shape is nil when the rank is unknown.
	Shape []Dim
}

// Graph is a graph with its initializers decoded.
type Graph struct {
	Name  string
	Nodes []*onnxpb.NodeProto
	// Initializers maps a name to its decoded tensor.
	Initializers map[string]*tensor.Tensor
	Inputs       []ValueInfo
	Outputs      []ValueInfo
	// ValueInfos holds the declared types of intermediate values.
	ValueInfos map[string]ValueInfo
	// baseDir and ext let subgraphs load their initializers like the parent.
	baseDir string
	ext     *extBudget
}

// Subgraph decodes a graph attribute (If branch, Loop body) with the same
// loading rules as the graph that holds it.
func (g *Graph) Subgraph(gp *onnxpb.GraphProto) (*Graph, error) {
	return newGraph(gp, g.baseDir, g.ext, false)
}

// newGraph decodes gp; main is set for a model's main graph.
func newGraph(gp *onnxpb.GraphProto, baseDir string, ext *extBudget, main bool) (*Graph, error) {
	g := &Graph{
		Name:         gp.GetName(),
		Nodes:        gp.GetNode(),
		Initializers: map[string]*tensor.Tensor{},
		ValueInfos:   map[string]ValueInfo{},
		baseDir:      baseDir,
		ext:          ext,
	}
	if len(gp.GetSparseInitializer()) > 0 {
		return nil, fmt.Errorf("%w: sparse initializers", errs.ErrNotImplemented)
	}
	for _, tp := range gp.GetInitializer() {
		name := tp.GetName()
		if name == "" {
			return nil, fmt.Errorf("%w: initializer without a name", errs.ErrInvalidModel)
		}
		if _, dup := g.Initializers[name]; dup {
			return nil, fmt.Errorf("%w: initializer %q defined twice", errs.ErrInvalidModel, name)
		}
		t, err := tensorFromProto(tp, baseDir, ext)
		if err != nil {
			return nil, fmt.Errorf("initializer %q: %w", name, err)
		}
		// Drop the payload from the proto: the tensor owns (or aliases) it.
		tp.RawData, tp.FloatData, tp.Int32Data, tp.Int64Data, tp.DoubleData, tp.Uint64Data = nil, nil, nil, nil, nil, nil
		g.Initializers[name] = t
	}
	var err error
	if g.Inputs, err = valueInfos(gp.GetInput()); err != nil {
		return nil, fmt.Errorf("graph inputs: %w", err)
	}
	if g.Outputs, err = valueInfos(gp.GetOutput()); err != nil {
		return nil, fmt.Errorf("graph outputs: %w", err)
	}
	if err := uniqueNames(g.Inputs); err != nil {
		return nil, fmt.Errorf("graph inputs: %w", err)
	}
	if main {
		// A subgraph may list one value twice (a Loop body's carried value
		// and scan output); the model's outputs are returned by name.
		if err := uniqueNames(g.Outputs); err != nil {
			return nil, fmt.Errorf("graph outputs: %w", err)
		}
	}
	for _, in := range g.Inputs {
		if t, ok := g.Initializers[in.Name]; ok {
			if err := agrees(in, t); err != nil {
				return nil, err
			}
		}
	}
	vis, err := valueInfos(gp.GetValueInfo())
	if err != nil {
		return nil, fmt.Errorf("value_info: %w", err)
	}
	for _, vi := range vis {
		g.ValueInfos[vi.Name] = vi
	}
	for i, n := range g.Nodes {
		if n.GetOpType() == "" {
			return nil, fmt.Errorf("%w: node %d (%q) has no op_type", errs.ErrInvalidModel, i, n.GetName())
		}
		if err := inlineExternalAttrs(n, baseDir, ext); err != nil {
			return nil, fmt.Errorf("node %q: %w", n.GetName(), err)
		}
	}
	return g, nil
}

// uniqueNames fails with errs.ErrInvalidModel when two values share a name.
func uniqueNames(vis []ValueInfo) error {
	seen := make(map[string]bool, len(vis))
	for _, vi := range vis {
		if seen[vi.Name] {
			return fmt.Errorf("%w: %q is declared twice", errs.ErrInvalidModel, vi.Name)
		}
		seen[vi.Name] = true
	}
	return nil
}

// agrees checks the initializer t of graph input in (its default value)
// against the input's declaration, which every feed of it must match too:
// a tensor of the declared element type, rank and fixed dimensions
// (errs.ErrInvalidModel otherwise).
func agrees(in ValueInfo, t *tensor.Tensor) error {
	if in.Kind != KindTensor {
		return fmt.Errorf("%w: graph input %q has an initializer but is not declared a tensor", errs.ErrInvalidModel, in.Name)
	}
	if in.DType != tensor.Undefined && in.DType != t.DType() {
		return fmt.Errorf("%w: graph input %q is declared %v but its initializer is %v",
			errs.ErrInvalidModel, in.Name, in.DType, t.DType())
	}
	if in.Shape == nil {
		return nil
	}
	ok := len(in.Shape) == t.Rank()
	for k := 0; ok && k < len(in.Shape); k++ {
		ok = in.Shape[k].Value < 0 || in.Shape[k].Value == int64(t.Shape()[k])
	}
	if !ok {
		return fmt.Errorf("%w: graph input %q is declared of shape %v but its initializer has shape %v",
			errs.ErrInvalidModel, in.Name, dimsString(in.Shape), t.Shape())
	}
	return nil
}

// dimsString renders a declared shape: fixed sizes, parameter names, "?"
// for unknown dimensions.
func dimsString(dims []Dim) string {
	s := "("
	for k, d := range dims {
		if k > 0 {
			s += ", "
		}
		switch {
		case d.Value >= 0:
			s += fmt.Sprint(d.Value)
		case d.Param != "":
			s += d.Param
		default:
			s += "?"
		}
	}
	return s + ")"
}

func valueInfos(vps []*onnxpb.ValueInfoProto) ([]ValueInfo, error) {
	out := make([]ValueInfo, 0, len(vps))
	for _, vp := range vps {
		vi := ValueInfo{Name: vp.GetName(), Kind: KindOther}
		if vi.Name == "" {
			return nil, fmt.Errorf("%w: value without a name", errs.ErrInvalidModel)
		}
		if !utf8.ValidString(vi.Name) { // (callers see names as text)
			return nil, fmt.Errorf("%w: value name %q is not valid UTF-8", errs.ErrInvalidModel, vi.Name)
		}
		tp := vp.GetType()
		switch {
		case tp.GetTensorType() != nil:
			tt := tp.GetTensorType()
			vi.Kind = KindTensor
			vi.DType = tensor.DType(tt.GetElemType())
			if tt.GetShape() != nil {
				vi.Shape = make([]Dim, 0, len(tt.GetShape().GetDim()))
				for _, d := range tt.GetShape().GetDim() {
					switch v := d.GetValue().(type) {
					case *onnxpb.TensorShapeProto_Dimension_DimValue:
						if v.DimValue < 0 {
							return nil, fmt.Errorf("%w: %q has a negative dimension", errs.ErrInvalidModel, vi.Name)
						}
						vi.Shape = append(vi.Shape, Dim{Value: v.DimValue})
					case *onnxpb.TensorShapeProto_Dimension_DimParam:
						vi.Shape = append(vi.Shape, Dim{Value: -1, Param: v.DimParam})
					default:
						vi.Shape = append(vi.Shape, Dim{Value: -1})
					}
				}
			}
		case tp.GetSequenceType() != nil:
			vi.Kind = KindSequence
		case tp.GetMapType() != nil:
			vi.Kind = KindMap
		case tp.GetOptionalType() != nil:
			vi.Kind = KindOptional
		case tp == nil:
			vi.Kind = KindTensor // untyped: allowed for outputs of subgraphs
		}
		out = append(out, vi)
	}
	return out, nil
}

// inlineExternalAttrs reads the external data of n's tensor attributes (a
// Constant saved with onnx's convert_attribute=True) into their raw_data,
// under the same folder and budget rules as initializers, so the node's
// kernel decodes them like any other attribute.
func inlineExternalAttrs(n *onnxpb.NodeProto, baseDir string, ext *extBudget) error {
	for _, ap := range n.GetAttribute() {
		tp := ap.GetT()
		if tp == nil || tp.GetDataLocation() != onnxpb.TensorProto_EXTERNAL || !littleEndian {
			continue
		}
		t, err := tensorFromProto(tp, baseDir, ext)
		if err != nil {
			return fmt.Errorf("attribute %q: %w", ap.GetName(), err)
		}
		tp.RawData = append([]byte(nil), t.Bytes()...)
		tp.DataLocation, tp.ExternalData = nil, nil
	}
	return nil
}
