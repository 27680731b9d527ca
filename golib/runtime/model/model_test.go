package model

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func f32raw(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// addModel is y = x + w with w given by init.
func addModel(init *onnxpb.TensorProto) *onnxpb.ModelProto {
	g := onnxtest.Graph(
		[]*onnxpb.NodeProto{onnxtest.Node("Add", []string{"x", "w"}, []string{"y"})},
		[]*onnxpb.ValueInfoProto{onnxtest.Info("x", 1, -1, 3)},
		[]*onnxpb.ValueInfoProto{onnxtest.Info("y", 1, -1, 3)},
		init)
	return onnxtest.Model(17, g, nil)
}

func TestLoadInitializers(t *testing.T) {
	cases := []struct {
		name string
		init *onnxpb.TensorProto
		want []float32
	}{
		{"float_data", onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3}), []float32{1, 2, 3}},
		{"raw_data", onnxtest.Raw("w", 1, []int64{3}, f32raw(4, 5, 6)), []float32{4, 5, 6}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := LoadBytes(onnxtest.Bytes(addModel(c.init)), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if m.Opsets[""] != 17 {
				t.Errorf("opset %v", m.Opsets)
			}
			w := m.Graph.Initializers["w"].Float32()
			for i := range c.want {
				if w[i] != c.want[i] {
					t.Fatalf("w = %v, want %v", w, c.want)
				}
			}
			in := m.Graph.Inputs[0]
			if in.Name != "x" || len(in.Shape) != 2 || in.Shape[0].Value != -1 || in.Shape[1].Value != 3 {
				t.Errorf("input info %+v", in)
			}
		})
	}
}

func TestTypedFields(t *testing.T) {
	cases := []struct {
		tp   *onnxpb.TensorProto
		want string
	}{
		{&onnxpb.TensorProto{DataType: proto.Int32(9), Dims: []int64{3}, Int32Data: []int32{0, 1, 5}}, "[false true true]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(3), Dims: []int64{2}, Int32Data: []int32{-3, 7}}, "[-3 7]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(10), Dims: []int64{1}, Int32Data: []int32{0x3c00}}, "[15360]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(11), Dims: []int64{}, DoubleData: []float64{2.5}}, "[2.5]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(9), Dims: []int64{2}, RawData: []byte{0, 7}}, "[false true]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(5), Dims: []int64{2}, Int32Data: []int32{-32768, 7}}, "[-32768 7]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(4), Dims: []int64{2}, Int32Data: []int32{65535, 1}}, "[65535 1]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(12), Dims: []int64{2}, Uint64Data: []uint64{4294967295, 3}}, "[4294967295 3]"},
		{&onnxpb.TensorProto{DataType: proto.Int32(4), Dims: []int64{1}, RawData: []byte{0x34, 0x12}}, "[4660]"},
	}
	for _, c := range cases {
		x, err := TensorFromProto(c.tp)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		switch {
		case x.Bool() != nil:
			got = sprint(x.Bool())
		case x.Int8() != nil:
			got = sprint(x.Int8())
		case x.Float16() != nil:
			got = sprint(x.Float16())
		case x.Float64() != nil:
			got = sprint(x.Float64())
		case x.DType() == tensor.Int16:
			got = sprint(tensor.Data[int16](x))
		case x.DType() == tensor.Uint16:
			got = sprint(tensor.Data[uint16](x))
		case x.DType() == tensor.Uint32:
			got = sprint(tensor.Data[uint32](x))
		}
		if got != c.want {
			t.Errorf("%v: got %s want %s", c.tp.GetDataType(), got, c.want)
		}
	}
}

func TestBadModels(t *testing.T) {
	good := onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3})))
	noGraph := onnxtest.Bytes(&onnxpb.ModelProto{IrVersion: proto.Int64(8)})
	cases := []struct {
		name string
		b    []byte
		err  error
	}{
		{"empty", nil, errs.ErrInvalidModel},
		{"garbage", []byte("this is not a model"), errs.ErrInvalidModel},
		{"truncated", good[:len(good)-5], errs.ErrInvalidModel},
		{"no graph", noGraph, errs.ErrInvalidModel},
		{"raw size mismatch", onnxtest.Bytes(addModel(onnxtest.Raw("w", 1, []int64{3}, f32raw(1, 2)))), errs.ErrInvalidModel},
		{"typed count mismatch", onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{4}, []float32{1}))), errs.ErrInvalidModel},
		{"negative dim", onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{-1}, nil))), errs.ErrInvalidModel},
		{"huge dims", onnxtest.Bytes(addModel(onnxtest.Floats("w", []int64{1 << 40, 1 << 40}, nil))), errs.ErrInvalidModel},
		{"string tensor", onnxtest.Bytes(addModel(&onnxpb.TensorProto{Name: proto.String("w"), DataType: proto.Int32(8)})), errs.ErrNotImplemented},
		{"external from bytes", onnxtest.Bytes(addModel(external("w", "w.bin", 12))), errs.ErrInvalidModel},
	}
	for _, c := range cases {
		_, err := LoadBytes(c.b, Options{})
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
	}
	if _, err := LoadBytes(good, Options{MaxModelBytes: 10}); !errors.Is(err, errs.ErrLimit) {
		t.Errorf("size limit: %v", err)
	}
}

func external(name, location string, length int) *onnxpb.TensorProto {
	tp := &onnxpb.TensorProto{Name: proto.String(name), DataType: proto.Int32(1), Dims: []int64{3},
		DataLocation: onnxpb.TensorProto_EXTERNAL.Enum()}
	tp.ExternalData = []*onnxpb.StringStringEntryProto{
		{Key: proto.String("location"), Value: proto.String(location)},
		{Key: proto.String("offset"), Value: proto.String("4")},
		{Key: proto.String("length"), Value: proto.String(itoa(length))},
	}
	return tp
}

func TestExternalData(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "model")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	payload := append([]byte{9, 9, 9, 9}, f32raw(7, 8, 9)...)
	must(t, os.WriteFile(filepath.Join(dir, "w.bin"), payload, 0o644))
	must(t, os.WriteFile(filepath.Join(root, "secret.bin"), payload, 0o644))
	must(t, os.Symlink(filepath.Join(root, "secret.bin"), filepath.Join(dir, "link.bin")))

	cases := []struct {
		location string
		length   int
		err      error
	}{
		{"w.bin", 12, nil},
		{"../secret.bin", 12, errs.ErrInvalidModel},
		{filepath.Join(root, "secret.bin"), 12, errs.ErrInvalidModel},
		{"link.bin", 12, errs.ErrInvalidModel},
		{"missing.bin", 12, errs.ErrInvalidModel},
		{"w.bin", 16, errs.ErrInvalidModel},
	}
	for _, c := range cases {
		path := filepath.Join(dir, "m.onnx")
		must(t, os.WriteFile(path, onnxtest.Bytes(addModel(external("w", c.location, c.length))), 0o644))
		m, err := Load(path, Options{})
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.location, err, c.err)
			continue
		}
		if err == nil {
			if got := sprint(m.Graph.Initializers["w"].Float32()); got != "[7 8 9]" {
				t.Errorf("external data read %s", got)
			}
		}
	}
	// An offset aligned to the element size is mapped (the tensor aliases
	// the file), another is read into memory; both read the same values.
	must(t, os.WriteFile(filepath.Join(dir, "odd.bin"), append([]byte{9}, f32raw(7, 8, 9)...), 0o644))
	odd := external("w", "odd.bin", 12)
	odd.ExternalData[1].Value = proto.String("1")
	for _, c := range []struct {
		tp     *onnxpb.TensorProto
		mapped bool
	}{{external("w", "w.bin", 12), true}, {odd, false}} {
		path := filepath.Join(dir, "m.onnx")
		must(t, os.WriteFile(path, onnxtest.Bytes(addModel(c.tp)), 0o644))
		m, err := Load(path, Options{MapMinBytes: 1})
		if err != nil {
			t.Fatal(err)
		}
		w := m.Graph.Initializers["w"]
		if got := sprint(w.Float32()); got != "[7 8 9]" {
			t.Errorf("offset %s: external data read %s", c.tp.ExternalData[1].GetValue(), got)
		}
		if want := c.mapped && tensor.MapFileSupported; w.FileBacked() != want {
			t.Errorf("offset %s: file-backed %v, want %v", c.tp.ExternalData[1].GetValue(), w.FileBacked(), want)
		}
	}
	short := external("w", "w.bin", 12)
	short.ExternalData[1].Value = proto.String("8") // 8 + 12 > 16 bytes in the file
	path := filepath.Join(dir, "short.onnx")
	must(t, os.WriteFile(path, onnxtest.Bytes(addModel(short)), 0o644))
	if _, err := Load(path, Options{}); !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("reading past the end of the file: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
