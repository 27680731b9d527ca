package model

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// extBudget counts the external bytes a model may still read, and holds
// the external data files mapped while the model loads.
type extBudget struct {
	left int64
	// mapMin: files of at least this many bytes are mapped (0: none).
	mapMin int64
	maps   map[string]*extMap
}

// extMap is one mapped external data file: b is nil where mapping failed
// (the file is read instead); used counts the tensors that alias it.
type extMap struct {
	b    []byte
	used int
}

// mapped returns the mapping of the external data file at path (see
// tensor.MapFile), mapping it on first use.
func (ext *extBudget) mapped(path string) *extMap {
	if m, ok := ext.maps[path]; ok {
		return m
	}
	b, err := tensor.MapFile(path)
	if err != nil {
		b = nil
	}
	if ext.maps == nil {
		ext.maps = map[string]*extMap{}
	}
	m := &extMap{b: b}
	ext.maps[path] = m
	return m
}

// unmapUnused unmaps the files no tensor aliased (every tensor of theirs
// was read instead) and forgets them, so a later load maps them anew.
func (ext *extBudget) unmapUnused() {
	for path, m := range ext.maps {
		if m.used == 0 {
			tensor.UnmapFile(m.b)
			delete(ext.maps, path)
		}
	}
}

// takeMaps unmaps the files no tensor aliased, returns the mappings of the
// others and forgets every mapping, so that a later load maps the files
// anew.
func (ext *extBudget) takeMaps() [][]byte {
	ext.unmapUnused()
	var maps [][]byte
	for _, m := range ext.maps {
		maps = append(maps, m.b)
	}
	ext.maps = nil
	return maps
}

// readExternal loads a tensor stored in a file next to the model. The
// location must be a local relative path that stays inside baseDir, also
// after resolving symbolic links; offset and length must lie inside the file.
// The tensor aliases the file, mapped copy-on-write (tensor.MapFile), as
// onnxruntime maps external data: the weights cost resident memory only
// while read, and a weight a session packs leaves the resident set once
// packed (Tensor.Evict). Where the file is smaller than Options.MapMinBytes or
// cannot be mapped, or the tensor's offset is not aligned to its element
// size, it is read into memory.
func readExternal(tp *onnxpb.TensorProto, dt tensor.DType, shape tensor.Shape, nbytes int, baseDir string, ext *extBudget) (*tensor.Tensor, error) {
	var location string
	offset, length := int64(0), int64(-1)
	for _, kv := range tp.GetExternalData() {
		var err error
		switch kv.GetKey() {
		case "location":
			location = kv.GetValue()
		case "offset":
			offset, err = strconv.ParseInt(kv.GetValue(), 10, 64)
		case "length":
			length, err = strconv.ParseInt(kv.GetValue(), 10, 64)
		}
		if err != nil || offset < 0 {
			return nil, fmt.Errorf("%w: bad external_data %s=%q", errs.ErrInvalidModel, kv.GetKey(), kv.GetValue())
		}
	}
	if length >= 0 && length != int64(nbytes) {
		return nil, fmt.Errorf("%w: external data length %d, shape %v of %v needs %d", errs.ErrInvalidModel, length, shape, dt, nbytes)
	}
	if baseDir == "" {
		return nil, fmt.Errorf("%w: tensor %q uses external data but the model was loaded from bytes without a base folder", errs.ErrInvalidModel, tp.GetName())
	}
	path, err := safeJoin(baseDir, location)
	if err != nil {
		return nil, err
	}
	if int64(nbytes) > ext.left {
		return nil, fmt.Errorf("%w: external data of %q exceeds the external data budget", errs.ErrLimit, tp.GetName())
	}
	// stat before opening: opening a FIFO (or a device) would wait for a writer
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("%w: external data of %q: %v", errs.ErrInvalidModel, tp.GetName(), err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: external data of %q: %q is not a regular file (%v)", errs.ErrInvalidModel, tp.GetName(), location, st.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: external data of %q: %v", errs.ErrInvalidModel, tp.GetName(), err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: external data of %q: %v", errs.ErrInvalidModel, tp.GetName(), err)
	}
	if !st.Mode().IsRegular() || offset > st.Size() || int64(nbytes) > st.Size()-offset {
		return nil, fmt.Errorf("%w: external data of %q: file %q has %d bytes, need %d at offset %d",
			errs.ErrInvalidModel, tp.GetName(), location, st.Size(), nbytes, offset)
	}
	if ext.mapMin > 0 && st.Size() >= ext.mapMin && nbytes > 0 {
		if m := ext.mapped(path); int64(len(m.b)) == st.Size() {
			end := offset + int64(nbytes)
			if t, err := tensor.FromBytes(dt, shape, m.b[offset:end:end]); err == nil {
				ext.left -= int64(nbytes)
				m.used++
				return normBool(t), nil
			}
		}
	}
	t, err := tensor.New(dt, shape)
	if err != nil {
		return nil, err
	}
	if _, err := f.ReadAt(t.Bytes(), offset); err != nil && err != io.EOF {
		return nil, fmt.Errorf("%w: reading external data of %q: %v", errs.ErrInvalidModel, tp.GetName(), err)
	}
	ext.left -= int64(nbytes)
	return normBool(t), nil
}

// safeJoin resolves location inside baseDir and refuses absolute paths,
// ".." components and symbolic links that lead outside baseDir.
func safeJoin(baseDir, location string) (string, error) {
	if location == "" || strings.ContainsRune(location, 0) || !filepath.IsLocal(filepath.FromSlash(location)) {
		return "", fmt.Errorf("%w: external data location %q is not a relative path inside the model folder", errs.ErrInvalidModel, location)
	}
	base, err := filepath.EvalSymlinks(baseDir)
	if err != nil {
		return "", fmt.Errorf("%w: model folder: %v", errs.ErrInvalidModel, err)
	}
	base, err = filepath.Abs(base)
	if err != nil {
		return "", fmt.Errorf("%w: model folder: %v", errs.ErrInvalidModel, err)
	}
	p, err := filepath.EvalSymlinks(filepath.Join(base, filepath.FromSlash(location)))
	if err != nil {
		return "", fmt.Errorf("%w: external data file %q: %v", errs.ErrInvalidModel, location, err)
	}
	p, err = filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%w: external data file %q: %v", errs.ErrInvalidModel, location, err)
	}
	rel, err := filepath.Rel(base, p)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w: external data file %q resolves outside the model folder", errs.ErrInvalidModel, location)
	}
	return p, nil
}
