// Package model loads ONNX ModelProto files into the runtime's view of a
// model: opset imports, a Graph with decoded initializers and value infos.
// Malformed, truncated or hostile input yields an error wrapping
// errs.ErrInvalidModel (or errs.ErrLimit / errs.ErrNotImplemented), never a
// panic or an allocation larger than the input justifies.
package model

import (
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// DefaultMaxModelBytes is the largest model file accepted by default: 2 GiB,
// the protobuf format's own limit. Larger weights go in external data files.
const DefaultMaxModelBytes = 2 << 30

// DefaultMaxExternalBytes bounds the total bytes read from external data
// files by default (64 GiB).
const DefaultMaxExternalBytes = 64 << 30

// maxRecursion bounds message nesting while decoding. Each nested subgraph
// level costs three messages (Graph -> Node -> Attribute), so this allows
// about 30 levels of If/Loop nesting, far beyond real models.
const maxRecursion = 100

// anyFileBacked reports whether a tensor of ts aliases a mapped file.
func anyFileBacked(ts map[string]*tensor.Tensor) bool {
	for _, t := range ts {
		if t.FileBacked() {
			return true
		}
	}
	return false
}

// decodeOptions decodes a ModelProto.
var decodeOptions = proto.UnmarshalOptions{RecursionLimit: maxRecursion}

// Options tunes loading. The zero value uses the defaults.
type Options struct {
	// BaseDir is the folder external data paths are relative to. Load sets
	// it to the model file's folder; for LoadBytes it must be set explicitly
	// or external data is refused.
	BaseDir string
	// MaxModelBytes bounds the serialized model (DefaultMaxModelBytes if 0).
	MaxModelBytes int64
	// MaxExternalBytes bounds the external data read in total
	// (DefaultMaxExternalBytes if 0).
	MaxExternalBytes int64
	// MapMinBytes is the file size from which Load memory-maps a model
	// file and external data files instead of reading them
	// (DefaultMapMinBytes if 0; negative: never). A mapping lasts until
	// Model.Unmap (a session that loaded its own model calls it when
	// closed) and holds its file, even deleted, until then; the file must
	// not be truncated or rewritten in place meanwhile.
	MapMinBytes int64
}

// DefaultMapMinBytes is Options.MapMinBytes's default: a small file is not
// worth a mapping (and the rule that it must not be rewritten while used).
const DefaultMapMinBytes = 16 << 20

// mapMin is the resolved MapMinBytes: files of at least that many bytes are
// mapped; 0 or less maps none.
func (o Options) mapMin() int64 {
	switch {
	case o.MapMinBytes < 0:
		return 0
	case o.MapMinBytes == 0:
		return DefaultMapMinBytes
	}
	return o.MapMinBytes
}

// Model is a loaded ONNX model.
type Model struct {
	IRVersion       int64
	ProducerName    string
	ProducerVersion string
	// Opsets maps each imported domain ("" for ai.onnx) to its version.
	Opsets map[string]int
	Graph  *Graph
	// Proto is the decoded ModelProto (initializer payloads already moved
	// into Graph.Initializers).
	Proto *onnxpb.ModelProto

	// mapped is the model file's mapping where Load mapped it and
	// initializers alias it (external data files' are in Graph.ext).
	mapped []byte
}

// Unmap gives back the files Load mapped for m (the model file and its
// external data files; see Options.MapMinBytes). Every tensor of m's main
// graph and of also whose bytes lie in one of them is released first
// (tensor.ReleaseStorage: it keeps its type and shape and reads as zeros),
// then the files are unmapped: their address space, and the disk space of
// a file deleted meanwhile, go back to the system. The weights that
// aliased the files are gone; a slice of their bytes taken earlier must
// not be read afterwards. A session that loaded its own model calls it
// when closed, passing the constants of its plans (subgraphs' included).
// It returns the bytes unmapped; a second call unmaps nothing.
func (m *Model) Unmap(also ...*tensor.Tensor) int64 {
	var maps [][]byte
	if m.mapped != nil {
		maps = append(maps, m.mapped)
		m.mapped = nil
	}
	if m.Graph != nil && m.Graph.ext != nil {
		maps = append(maps, m.Graph.ext.takeMaps()...)
	}
	if len(maps) == 0 {
		return 0
	}
	release := func(t *tensor.Tensor) {
		for _, b := range maps {
			if t != nil && t.Aliases(b) {
				t.ReleaseStorage()
				return
			}
		}
	}
	if m.Graph != nil {
		for _, t := range m.Graph.Initializers {
			release(t)
		}
	}
	for _, t := range also {
		release(t)
	}
	var n int64
	for _, b := range maps {
		n += int64(len(b))
		tensor.UnmapFile(b)
	}
	return n
}

// Load reads and decodes the model at path. External data files are resolved
// relative to the model's folder and may not escape it. A regular file is
// memory-mapped, copy-on-write, and the main graph's initializers alias it
// (loadMapped; the file must not be truncated while the model is in use).
// Other files are read with the size limit enforced on the bytes read, so
// devices and pipes are read with bounded memory (see readModelFile).
func Load(path string, opt Options) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	defer f.Close()
	if opt.BaseDir == "" {
		opt.BaseDir = filepath.Dir(path)
	}
	// A regular file within the limit is mapped, and its weights alias
	// the mapping (loadMapped); anything else is read.
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && opt.mapMin() > 0 && st.Size() >= opt.mapMin() && st.Size() <= opt.maxModel() {
		if b, err := tensor.MapFile(path); err == nil {
			m, ok, err := loadMapped(b, opt)
			if !ok || err != nil || !anyFileBacked(m.Graph.Initializers) {
				tensor.UnmapFile(b) // nothing aliases it
			} else {
				m.mapped = b // until m.Unmap
			}
			if ok {
				return m, err
			}
		}
	}
	b, err := readModelFile(f, path, opt.maxModel())
	if err != nil {
		return nil, err
	}
	return LoadBytes(b, opt)
}

// LoadBytes decodes a serialized ModelProto.
func LoadBytes(b []byte, opt Options) (*Model, error) {
	if int64(len(b)) > opt.maxModel() {
		return nil, fmt.Errorf("%w: model is %s, limit %s", errs.ErrLimit, units.Bytes(int64(len(b))), units.Bytes(opt.maxModel()))
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty model", errs.ErrInvalidModel)
	}
	mp := &onnxpb.ModelProto{}
	if err := decodeOptions.Unmarshal(b, mp); err != nil {
		return nil, fmt.Errorf("%w: cannot decode ModelProto (truncated or not an ONNX file?): %v", errs.ErrInvalidModel, err)
	}
	return FromProto(mp, opt)
}

// FromProto builds a Model from a decoded ModelProto.
func FromProto(mp *onnxpb.ModelProto, opt Options) (*Model, error) {
	if mp.GetGraph() == nil {
		return nil, fmt.Errorf("%w: model has no graph", errs.ErrInvalidModel)
	}
	if mp.GetIrVersion() < 3 {
		return nil, fmt.Errorf("%w: IR version %d is not supported (need >= 3; is this an ONNX file?)", errs.ErrInvalidModel, mp.GetIrVersion())
	}
	m := &Model{
		IRVersion:       mp.GetIrVersion(),
		ProducerName:    mp.GetProducerName(),
		ProducerVersion: mp.GetProducerVersion(),
		Opsets:          map[string]int{},
		Proto:           mp,
	}
	for _, op := range mp.GetOpsetImport() {
		d := op.GetDomain()
		if d == "ai.onnx" {
			d = ""
		}
		v := op.GetVersion()
		if v < 1 || v > 1000 {
			return nil, fmt.Errorf("%w: opset version %d for domain %q", errs.ErrInvalidModel, v, d)
		}
		if old, dup := m.Opsets[d]; dup && old != int(v) {
			return nil, fmt.Errorf("%w: domain %q imported twice (%d and %d)", errs.ErrInvalidModel, d, old, v)
		}
		m.Opsets[d] = int(v)
	}
	if _, ok := m.Opsets[""]; !ok {
		return nil, fmt.Errorf("%w: model imports no ai.onnx opset", errs.ErrInvalidModel)
	}
	if len(mp.GetFunctions()) > 0 {
		// Nodes that call a model-local function fail at session creation
		// as unsupported ops; the functions themselves are not expanded.
		m.Proto.Functions = nil
	}
	ext := &extBudget{left: opt.maxExternal(), mapMin: opt.mapMin()}
	g, err := newGraph(mp.GetGraph(), opt.BaseDir, ext, true)
	ext.unmapUnused() // subgraphs loaded later map their files again
	if err != nil {
		return nil, err
	}
	m.Graph = g
	return m, nil
}

func (o Options) maxModel() int64 {
	if o.MaxModelBytes > 0 {
		return o.MaxModelBytes
	}
	return DefaultMaxModelBytes
}

func (o Options) maxExternal() int64 {
	if o.MaxExternalBytes > 0 {
		return o.MaxExternalBytes
	}
	return DefaultMaxExternalBytes
}
