package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// AttrType is the kind of value an attribute holds (ONNX
// AttributeProto.AttributeType codes).
type AttrType int

// Attribute kinds the runtime understands.
const (
	AttrFloat   AttrType = 1
	AttrInt     AttrType = 2
	AttrString  AttrType = 3
	AttrTensor  AttrType = 4
	AttrGraph   AttrType = 5
	AttrFloats  AttrType = 6
	AttrInts    AttrType = 7
	AttrStrings AttrType = 8
)

// Attribute is one node attribute, already decoded from the model.
type Attribute struct {
	Name    string
	Type    AttrType
	F       float32
	I       int64
	S       string
	T       *tensor.Tensor
	G       Subgraph
	Floats  []float32
	Ints    []int64
	Strings []string
}

// Attributes are a node's attributes by name.
type Attributes map[string]*Attribute

func (a Attributes) get(name string, want AttrType) (*Attribute, bool, error) {
	at, ok := a[name]
	if !ok {
		return nil, false, nil
	}
	if at.Type != want {
		return nil, false, fmt.Errorf("%w: attribute %q has type %d, want %d", errs.ErrInvalidArgument, name, at.Type, want)
	}
	return at, true, nil
}

// Has reports whether the attribute is present.
func (a Attributes) Has(name string) bool { _, ok := a[name]; return ok }

// Int returns an int attribute, or def when absent.
func (a Attributes) Int(name string, def int64) (int64, error) {
	at, ok, err := a.get(name, AttrInt)
	if !ok {
		return def, err
	}
	return at.I, nil
}

// Float returns a float attribute, or def when absent.
func (a Attributes) Float(name string, def float32) (float32, error) {
	at, ok, err := a.get(name, AttrFloat)
	if !ok {
		return def, err
	}
	return at.F, nil
}

// String returns a string attribute, or def when absent.
func (a Attributes) String(name string, def string) (string, error) {
	at, ok, err := a.get(name, AttrString)
	if !ok {
		return def, err
	}
	return at.S, nil
}

// Ints returns an ints attribute; ok is false when absent.
func (a Attributes) Ints(name string) (v []int64, ok bool, err error) {
	at, ok, err := a.get(name, AttrInts)
	if !ok {
		return nil, false, err
	}
	return at.Ints, true, nil
}

// Floats returns a floats attribute; ok is false when absent.
func (a Attributes) Floats(name string) (v []float32, ok bool, err error) {
	at, ok, err := a.get(name, AttrFloats)
	if !ok {
		return nil, false, err
	}
	return at.Floats, true, nil
}

// Tensor returns a tensor attribute, or nil when absent.
func (a Attributes) Tensor(name string) (*tensor.Tensor, error) {
	at, ok, err := a.get(name, AttrTensor)
	if !ok {
		return nil, err
	}
	return at.T, nil
}

// Graph returns a graph attribute (a compiled subgraph), or an error when it
// is absent.
func (a Attributes) Graph(name string) (Subgraph, error) {
	at, ok, err := a.get(name, AttrGraph)
	if err != nil {
		return nil, err
	}
	if !ok || at.G == nil {
		return nil, fmt.Errorf("%w: graph attribute %q is missing", errs.ErrInvalidModel, name)
	}
	return at.G, nil
}
