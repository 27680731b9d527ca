// Package onnxtest builds small ONNX protos in Go for the runtime's tests
// (no Python or files needed).
package onnxtest

import (
	"google.golang.org/protobuf/proto"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// Model wraps a graph into a ModelProto importing ai.onnx at opset (and any
// extra domain=version pairs).
func Model(opset int64, g *onnxpb.GraphProto, extra map[string]int64) *onnxpb.ModelProto {
	m := &onnxpb.ModelProto{
		IrVersion:   proto.Int64(10),
		OpsetImport: []*onnxpb.OperatorSetIdProto{{Domain: proto.String(""), Version: proto.Int64(opset)}},
		Graph:       g,
	}
	for d, v := range extra {
		m.OpsetImport = append(m.OpsetImport, &onnxpb.OperatorSetIdProto{Domain: proto.String(d), Version: proto.Int64(v)})
	}
	return m
}

// Bytes serializes m.
func Bytes(m *onnxpb.ModelProto) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}

// Graph builds a graph.
func Graph(nodes []*onnxpb.NodeProto, inputs, outputs []*onnxpb.ValueInfoProto, inits ...*onnxpb.TensorProto) *onnxpb.GraphProto {
	return &onnxpb.GraphProto{Name: proto.String("g"), Node: nodes, Input: inputs, Output: outputs, Initializer: inits}
}

// Node builds a node of the default domain.
func Node(op string, inputs, outputs []string, attrs ...*onnxpb.AttributeProto) *onnxpb.NodeProto {
	return &onnxpb.NodeProto{OpType: proto.String(op), Input: inputs, Output: outputs, Attribute: attrs, Name: proto.String(op + "_" + first(outputs))}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// Info declares a tensor value; a negative dim is symbolic ("d<i>"), nil
// dims with rank -1 leave the shape unknown.
func Info(name string, dtype int32, dims ...int64) *onnxpb.ValueInfoProto {
	sh := &onnxpb.TensorShapeProto{}
	for _, d := range dims {
		if d < 0 {
			sh.Dim = append(sh.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimParam{DimParam: "n"}})
		} else {
			sh.Dim = append(sh.Dim, &onnxpb.TensorShapeProto_Dimension{Value: &onnxpb.TensorShapeProto_Dimension_DimValue{DimValue: d}})
		}
	}
	return &onnxpb.ValueInfoProto{Name: proto.String(name), Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: proto.Int32(dtype), Shape: sh}}}}
}

// Floats builds a float32 initializer in float_data.
func Floats(name string, dims []int64, v []float32) *onnxpb.TensorProto {
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(1), Dims: dims, FloatData: v}
}

// Int64s builds an int64 initializer in int64_data.
func Int64s(name string, dims []int64, v []int64) *onnxpb.TensorProto {
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(7), Dims: dims, Int64Data: v}
}

// Raw builds an initializer from raw little-endian bytes.
func Raw(name string, dtype int32, dims []int64, raw []byte) *onnxpb.TensorProto {
	return &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(dtype), Dims: dims, RawData: raw}
}

// AttrInt builds an int attribute.
func AttrInt(name string, v int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INT.Enum(), I: proto.Int64(v)}
}

// AttrInts builds an ints attribute.
func AttrInts(name string, v ...int64) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_INTS.Enum(), Ints: v}
}

// AttrFloat builds a float attribute.
func AttrFloat(name string, v float32) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_FLOAT.Enum(), F: proto.Float32(v)}
}

// AttrString builds a string attribute.
func AttrString(name, v string) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_STRING.Enum(), S: []byte(v)}
}

// AttrTensor builds a tensor attribute.
func AttrTensor(name string, t *onnxpb.TensorProto) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_TENSOR.Enum(), T: t}
}

// AttrGraph builds a graph attribute.
func AttrGraph(name string, g *onnxpb.GraphProto) *onnxpb.AttributeProto {
	return &onnxpb.AttributeProto{Name: proto.String(name), Type: onnxpb.AttributeProto_GRAPH.Enum(), G: g}
}
