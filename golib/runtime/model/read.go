package model

import (
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// streamChunk is the first buffer size, and the growth step's lower bound,
// for files whose size is not known in advance.
const streamChunk = 64 << 10

// readModelFile reads the whole file f with at most limit bytes accepted.
// A regular file's buffer is sized from Stat; any other file (a device, a
// pipe, a socket) is read in growing chunks, with the limit checked after
// every read and the ModelProto's top-level framing checked as bytes arrive,
// so an endless or garbage stream fails after a few bytes, never after
// filling memory. Memory use is bounded by twice the limit in all cases.
func readModelFile(f *os.File, name string, limit int64) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%w: %s is a directory", errs.ErrInvalidModel, name)
	}
	regular := st.Mode().IsRegular()
	if regular && st.Size() > limit {
		return nil, fmt.Errorf("%w: model file %s is %s, limit %s", errs.ErrLimit, name, units.Bytes(st.Size()), units.Bytes(limit))
	}
	// Sized from Stat for a regular file: growing a buffer step by step
	// costs several times the model's size for a large file. The size is
	// only a hint; the limit is enforced on the bytes actually read.
	size := int64(streamChunk)
	if regular && st.Size()+1 > size {
		size = st.Size() + 1
	}
	if size > limit+1 {
		size = limit + 1
	}
	buf := make([]byte, 0, size)
	var scan frameScanner
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				break
			}
			next := 2 * int64(cap(buf))
			if next > limit+1 {
				next = limit + 1
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, rerr := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > limit {
			break
		}
		if !regular {
			if err := scan.advance(buf, limit); err != nil {
				return nil, fmt.Errorf("%w: %s (not a regular file) is not an ONNX model: %v", errs.ErrInvalidModel, name, err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return buf, nil
		}
		if rerr != nil {
			return nil, fmt.Errorf("model: reading %s: %w", name, rerr)
		}
	}
	what := "model file"
	if !regular {
		what = "model stream"
	}
	return nil, fmt.Errorf("%w: %s %s is larger than the limit %s (reading stopped there)", errs.ErrLimit, what, name, units.Bytes(limit))
}

// frameScanner checks the top-level fields of a ModelProto as its bytes
// arrive: the first must be ir_version (protobuf serializers write fields in
// number order, and a model without ir_version is refused anyway), each tag
// must name a ModelProto field with its wire type, and each length must fit
// in the limit. It is a fast early rejection of streams that cannot be a
// model (zeros, random bytes: a random stream passes the first field with
// probability about 1/256 and a long length field far more rarely); full
// decoding still validates everything. These rules apply to streams only.
type frameScanner struct {
	pos int64 // offset of the next unread top-level tag
}

var modelFields = (&onnxpb.ModelProto{}).ProtoReflect().Descriptor().Fields()

func (s *frameScanner) advance(buf []byte, limit int64) error {
	for s.pos < int64(len(buf)) {
		b := buf[s.pos:]
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			if len(b) < binaryMaxVarint && protowire.ParseError(n) == io.ErrUnexpectedEOF {
				return nil // tag split across reads
			}
			return fmt.Errorf("bad field tag at byte %d", s.pos)
		}
		if s.pos == 0 && (num != irVersionField || typ != protowire.VarintType) {
			return fmt.Errorf("byte 0: field %d with wire type %d: a model stream must start with ir_version (field 1)", num, typ)
		}
		fd := modelFields.ByNumber(num)
		if fd == nil || wireType(fd) != typ {
			return fmt.Errorf("byte %d: field %d with wire type %d is not a ModelProto field", s.pos, num, typ)
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			if protowire.ParseError(m) != io.ErrUnexpectedEOF {
				return fmt.Errorf("byte %d: field %d: %v", s.pos, num, protowire.ParseError(m))
			}
			if typ != protowire.BytesType {
				return nil // varint split across reads
			}
			l, k := protowire.ConsumeVarint(b[n:])
			if k < 0 {
				if len(b)-n < binaryMaxVarint {
					return nil // length split across reads
				}
				return fmt.Errorf("byte %d: field %d: bad length", s.pos, num)
			}
			end := s.pos + int64(n+k)
			if l > uint64(limit-end) {
				return fmt.Errorf("byte %d: field %d claims %d bytes, beyond the limit %s", s.pos, num, l, units.Bytes(limit))
			}
			s.pos = end + int64(l) // the payload is still arriving
			return nil
		}
		s.pos += int64(n + m)
	}
	return nil
}

// irVersionField is ModelProto.ir_version's field number.
const irVersionField = 1

// binaryMaxVarint is the longest varint encoding (10 bytes).
const binaryMaxVarint = 10

// wireType is the wire type a non-packed field of fd's kind is encoded with.
func wireType(fd protoreflect.FieldDescriptor) protowire.Type {
	switch fd.Kind() {
	case protoreflect.StringKind, protoreflect.BytesKind, protoreflect.MessageKind:
		return protowire.BytesType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	default:
		return protowire.VarintType
	}
}
