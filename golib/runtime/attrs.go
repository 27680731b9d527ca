package runtime

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// convertAttrs decodes a node's attributes for its kernel factory. Graph
// attributes are compiled into sub-plans by compile.
func convertAttrs(n *onnxpb.NodeProto, compile func(name string, gp *onnxpb.GraphProto) (ops.Subgraph, error)) (ops.Attributes, error) {
	out := make(ops.Attributes, len(n.GetAttribute()))
	for _, ap := range n.GetAttribute() {
		name := ap.GetName()
		if name == "" {
			return nil, fmt.Errorf("%w: attribute without a name", errs.ErrInvalidModel)
		}
		if ap.GetRefAttrName() != "" {
			return nil, fmt.Errorf("%w: attribute %q refers to a function attribute", errs.ErrNotImplemented, name)
		}
		a := &ops.Attribute{Name: name, Type: ops.AttrType(ap.GetType())}
		switch ap.GetType() {
		case onnxpb.AttributeProto_FLOAT:
			a.F = ap.GetF()
		case onnxpb.AttributeProto_INT:
			a.I = ap.GetI()
		case onnxpb.AttributeProto_STRING:
			a.S = string(ap.GetS())
		case onnxpb.AttributeProto_FLOATS:
			a.Floats = ap.GetFloats()
		case onnxpb.AttributeProto_INTS:
			a.Ints = ap.GetInts()
		case onnxpb.AttributeProto_STRINGS:
			for _, s := range ap.GetStrings() {
				a.Strings = append(a.Strings, string(s))
			}
		case onnxpb.AttributeProto_TENSOR:
			t, err := model.TensorFromProto(ap.GetT())
			if err != nil {
				return nil, fmt.Errorf("attribute %q: %w", name, err)
			}
			a.T = t
		case onnxpb.AttributeProto_GRAPH:
			g, err := compile(name, ap.GetG())
			if err != nil {
				return nil, fmt.Errorf("subgraph %q: %w", name, err)
			}
			a.G = g
		case onnxpb.AttributeProto_UNDEFINED:
			return nil, fmt.Errorf("%w: attribute %q has no type", errs.ErrInvalidModel, name)
		default:
			return nil, fmt.Errorf("%w: attribute %q of type %v", errs.ErrNotImplemented, name, ap.GetType())
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%w: attribute %q given twice", errs.ErrInvalidModel, name)
		}
		out[name] = a
	}
	return out, nil
}
