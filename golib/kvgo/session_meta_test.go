package kvgo

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// modelMeta reports the ModelProto's self-description with onnxruntime's
// field names; unset fields are empty, never missing.
func TestModelMeta(t *testing.T) {
	full := &model.Model{ProducerName: "p", ProducerVersion: "1.2", IRVersion: 10, Proto: &onnxpb.ModelProto{
		Domain: proto.String("org.example"), DocString: proto.String("model doc"), ModelVersion: proto.Int64(42),
		Graph: &onnxpb.GraphProto{Name: proto.String("g"), DocString: proto.String("graph doc")},
		MetadataProps: []*onnxpb.StringStringEntryProto{
			{Key: proto.String("author"), Value: proto.String("x")}, {Key: proto.String("empty"), Value: proto.String("")}},
	}}
	cases := []struct {
		name string
		m    *model.Model
		want modelMetaJSON
	}{
		{"full", full, modelMetaJSON{ProducerName: "p", ProducerVersion: "1.2", GraphName: "g",
			GraphDescription: "graph doc", Domain: "org.example", Description: "model doc", Version: 42, IRVersion: 10,
			CustomMetadataMap: map[string]string{"author": "x", "empty": ""}}},
		{"bare", &model.Model{Proto: &onnxpb.ModelProto{Graph: &onnxpb.GraphProto{}}},
			modelMetaJSON{CustomMetadataMap: map[string]string{}}},
	}
	for _, c := range cases {
		if got := modelMeta(c.m); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: modelMeta = %+v, want %+v", c.name, got, c.want)
		}
	}
}
