package model

import (
	"errors"
	"fmt"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestTypedFieldNarrowing: integer types stored in int32_data (or
// uint64_data) load exactly inside their range and are refused outside it.
func TestTypedFieldNarrowing(t *testing.T) {
	cases := []struct {
		dt      onnxpb.TensorProto_DataType
		i32     []int32
		u64     []uint64
		want    string // fmt of the loaded values; "" = refused
		wantErr bool
	}{
		{dt: onnxpb.TensorProto_INT8, i32: []int32{-128, 0, 127}, want: "[-128 0 127]"},
		{dt: onnxpb.TensorProto_INT8, i32: []int32{128}, wantErr: true},
		{dt: onnxpb.TensorProto_UINT8, i32: []int32{0, 255}, want: "[0 255]"},
		{dt: onnxpb.TensorProto_UINT8, i32: []int32{-1}, wantErr: true},
		{dt: onnxpb.TensorProto_INT16, i32: []int32{-32768, 32767}, want: "[-32768 32767]"},
		{dt: onnxpb.TensorProto_INT16, i32: []int32{40000}, wantErr: true},
		{dt: onnxpb.TensorProto_UINT16, i32: []int32{0, 65535}, want: "[0 65535]"},
		{dt: onnxpb.TensorProto_UINT16, i32: []int32{65536}, wantErr: true},
		{dt: onnxpb.TensorProto_UINT32, u64: []uint64{0, 4294967295}, want: "[0 4294967295]"},
		{dt: onnxpb.TensorProto_UINT32, u64: []uint64{4294967296}, wantErr: true},
	}
	for _, c := range cases {
		n := int64(len(c.i32) + len(c.u64))
		dt := int32(c.dt)
		tp := &onnxpb.TensorProto{DataType: &dt, Dims: []int64{n}, Int32Data: c.i32, Uint64Data: c.u64}
		got, err := TensorFromProto(tp)
		name := fmt.Sprintf("%v %v%v", c.dt, c.i32, c.u64)
		if c.wantErr {
			if !errors.Is(err, errs.ErrInvalidModel) || got != nil {
				t.Errorf("%s: got %v, %v; want an invalid-model error and no tensor", name, got, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var s string
		switch got.DType() {
		case tensor.Int8:
			s = fmt.Sprint(got.Int8())
		case tensor.Uint8:
			s = fmt.Sprint(got.Uint8())
		case tensor.Int16:
			s = fmt.Sprint(tensor.Data[int16](got))
		case tensor.Uint16:
			s = fmt.Sprint(tensor.Data[uint16](got))
		case tensor.Uint32:
			s = fmt.Sprint(tensor.Data[uint32](got))
		}
		if s != c.want {
			t.Errorf("%s: loaded %s, want %s", name, s, c.want)
		}
	}
}
