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
		if src, e := tensor.FromBytes(tensor.Uint8, tensor.Shape{len(raw)}, raw); e == nil {
			src.Evict()
		}
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
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		if num == modelGraphField && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b[n:])
			if m < 0 || graphs > 0 {
				return nil, nil, false
			}
			graphs++
			g, ok := stripMessage(v, graphInitializerField, func(t []byte) ([]byte, bool) {
				st, raw, ok := stripTensor(t)
				raws = append(raws, raw)
				return st, ok
			})
			if !ok {
				return nil, nil, false
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendBytes(out, g)
			b = b[n+m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, false
		}
		out = append(out, b[:n+m]...)
		b = b[n+m:]
	}
	return out, raws, true
}

// stripMessage copies the message b field by field, passing each
// length-delimited field number field through edit.
func stripMessage(b []byte, field protowire.Number, edit func([]byte) ([]byte, bool)) ([]byte, bool) {
	out := make([]byte, 0, len(b)/4+64)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		if num == field && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b[n:])
			e, ok := edit(v)
			if !ok {
				return nil, false
			}
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendBytes(out, e)
		} else {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out, true
}

// stripTensor copies the TensorProto b without its raw_data fields and
// returns the last one's bytes (nil when it has none).
func stripTensor(b []byte) (out, raw []byte, ok bool) {
	out = make([]byte, 0, 256)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, false
		}
		if num == tensorRawDataField && typ == protowire.BytesType {
			raw, _ = protowire.ConsumeBytes(b[n:])
		} else {
			out = append(out, b[:n+m]...)
		}
		b = b[n+m:]
	}
	return out, raw, true
}
