package model

import (
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Field numbers of the path from a ModelProto to its main graph's
// initializers' raw bytes.
const (
	modelGraphField       = 7 // ModelProto.graph
	graphInitializerField = 5 // GraphProto.initializer
	tensorRawDataField    = 9 // TensorProto.raw_data
)

// loadMapped decodes a model file mapped in memory (tensor.MapFile) without
// copying its weights: the protobuf decoder always copies bytes fields, so
// the main graph's initializers' raw_data are cut out of the bytes it
// decodes (stripRawData) and set afterwards to slices of the mapping, which
// the tensors then alias (a tensor whose bytes are not aligned to its
// element size is copied, and its pages leave the resident set). Weights
// cost memory only while read, as with mapped external data. ok is false
// where the layout is not the plain one (a graph field written twice, a
// malformed field): the caller decodes the bytes as they are, which reports
// any error in full.
func loadMapped(b []byte, opt Options) (m *Model, ok bool, err error) {
	stripped, raws, ok := stripRawData(b)
	if !ok {
		return nil, false, nil
	}
	mp := &onnxpb.ModelProto{}
	if err := decodeOptions.Unmarshal(stripped, mp); err != nil {
		return nil, false, nil
	}
	inits := mp.GetGraph().GetInitializer()
	if len(inits) != len(raws) {
		return nil, false, nil
	}
	for i, tp := range inits {
		if raws[i] != nil {
			tp.RawData = raws[i]
		}
	}
	m, err = FromProto(mp, opt)
	for _, raw := range raws {
		// A copied (misaligned) tensor's source pages, and those of
		// tensors the loader refused, need not stay resident.
		tensor.EvictFilePages(raw)
	}
	if err != nil {
		return nil, true, err
	}
	// The aliased tensors' pages were not read by the decoding, so evicting
	// them above cost nothing: they are read when the session packs them.
	return m, true, nil
}

// stripRawData returns the ModelProto b without the raw_data of its main
// graph's initializers, and those raw_data in initializer order (nil for
// an initializer without one; the last one where a tensor repeats it, as
// the decoder would keep). ok is false when b is not made of well-formed
// fields or has more than one graph field.
func stripRawData(b []byte) (out []byte, raws [][]byte, ok bool) {
	graphs := 0
	out = make([]byte, 0, 1<<16)
	ok = eachField(b, func(num protowire.Number, typ protowire.Type, field, val []byte) bool {
		if num != modelGraphField || typ != protowire.BytesType {
			out = append(out, field...)
			return true
		}
		if graphs++; graphs > 1 {
			return false
		}
		g, ok := editFields(val, graphInitializerField, func(t []byte) ([]byte, bool) {
			var raw []byte
			st, ok := editFields(t, tensorRawDataField, func(r []byte) ([]byte, bool) {
				raw = r
				return nil, true
			})
			raws = append(raws, raw)
			return st, ok
		})
		out = protowire.AppendBytes(protowire.AppendTag(out, num, typ), g)
		return ok
	})
	return out, raws, ok
}

// editFields copies the message b field by field, passing the bytes of
// each length-delimited field number field through edit, which returns
// their replacement (nil: the field is dropped).
func editFields(b []byte, field protowire.Number, edit func([]byte) ([]byte, bool)) ([]byte, bool) {
	out := make([]byte, 0, min(len(b), 1<<12))
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, whole, val []byte) bool {
		if num != field || typ != protowire.BytesType {
			out = append(out, whole...)
			return true
		}
		e, ok := edit(val)
		if e != nil {
			out = protowire.AppendBytes(protowire.AppendTag(out, num, typ), e)
		}
		return ok
	})
	return out, ok
}

// eachField calls fn with each field of the message b: its number, wire
// type, whole encoding (tag included) and, for a length-delimited field,
// its bytes. It reports false when b is malformed or fn returns false.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, whole, val []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return false
		}
		var val []byte
		if typ == protowire.BytesType {
			val, _ = protowire.ConsumeBytes(b[n:])
		}
		if !fn(num, typ, b[:n+m], val) {
			return false
		}
		b = b[n+m:]
	}
	return true
}
