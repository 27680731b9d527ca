package kvgo

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Session bindings: python/onnx_light_kv/session.py drives these. A run is
// two calls: SessionRun (or SessionRunLend) executes the graph and returns
// the outputs' types and shapes with a result handle; Python allocates numpy
// arrays and ResultCopyAndFree copies outputs into them once, then hands the
// output buffers back to the session's pool. Arrays cross as array
// references (arrayref.go), the cheapest way to name numpy memory.
//
// SessionRunLend skips that copy for large outputs: Python wraps the Go
// buffer itself in a numpy array whose owner calls OutputRelease when the
// array (and every view of it) is gone; only then may the pool reuse the
// buffer. Go's collector does not move heap objects, and the lent registry
// keeps the tensor reachable, so the address stays valid until the release.

var (
	sessions = newRegistry[*runtime.Session]("session")
	results  = newRegistry[*runResult]("run result")
	lent     = newRegistry[lentOutput]("lent output")
)

// runResult is a run's outputs between SessionRun and ResultCopyAndFree.
type runResult struct {
	st   *runtime.State
	outs []*tensor.Tensor
	lent []int64 // lent-output handle per output, 0 when copied
}

// lentOutput is an output buffer Python holds without a copy.
type lentOutput struct {
	st *runtime.State
	t  *tensor.Tensor
}

func init() {
	classifiers = append(classifiers,
		classifier{errs.ErrUnsupportedOp, classNotImpl},
		classifier{errs.ErrNotImplemented, classNotImpl},
		classifier{errs.ErrType, classType},
		classifier{errs.ErrInvalidModel, classValue},
		classifier{errs.ErrInvalidArgument, classValue},
		classifier{errs.ErrShape, classValue},
		classifier{errs.ErrLimit, classValue},
		classifier{errs.ErrCycle, classValue},
		classifier{errs.ErrMissingInput, classValue},
		classifier{errs.ErrNotFound, classValue},
		classifier{errs.ErrClosed, classValue},
		classifier{fs.ErrNotExist, classFile},
	)
}

// SessionNewPath loads the model at path (external data next to it) and
// builds a session with the given kernel thread count (<= 0: all CPUs).
func SessionNewPath(path string, threads int, profile bool) (h int64, err error) {
	defer recoverTo(&err)
	s, err := runtime.NewSession(path, runtime.Options{Threads: threads, Profile: profile})
	if err != nil {
		return 0, classify(err)
	}
	return sessions.put(s), nil
}

// SessionNewBytes builds a session from n serialized model bytes at ptr
// (borrowed for the call). baseDir, if not empty, is the folder external
// data files are read from.
func SessionNewBytes(ptr uintptr, n int, baseDir string, threads int, profile bool) (h int64, err error) {
	defer recoverTo(&err)
	b, err := bytesAt(ptr, n)
	if err != nil {
		return 0, classify(err)
	}
	s, err := runtime.NewSessionFromBytes(b, runtime.Options{Threads: threads, Profile: profile,
		Model: model.Options{BaseDir: baseDir}})
	if err != nil {
		return 0, classify(err)
	}
	return sessions.put(s), nil
}

// SessionFree releases a session and its state. Freeing twice is an error.
func SessionFree(h int64) (err error) {
	defer recoverTo(&err)
	s, ok := sessions.take(h)
	if !ok {
		return classify(fmt.Errorf("%w: session handle %d", errUnknownHandle, h))
	}
	lastStats.Delete(h)
	return classify(s.Close())
}

// RegisteredOpsJSON lists the op kernels the runtime has, as a JSON list
// of "domain/op [since, until]" strings (until 0: no upper bound).
func RegisteredOpsJSON() (s string, err error) {
	defer recoverTo(&err)
	b, err := json.Marshal(ops.Registered())
	return string(b), classify(err)
}

// LiveSessions returns the number of sessions not yet freed.
func LiveSessions() int { return sessions.len() }

type valueInfoJSON struct {
	Name  string `json:"name"`
	DType int32  `json:"dtype"` // ONNX element type code
	Type  string `json:"type"`  // onnxruntime-style "tensor(float)"
	Shape []any  `json:"shape"` // int, string (symbolic) or null; null list: unknown rank
}

func infos(vis []model.ValueInfo) []valueInfoJSON {
	out := make([]valueInfoJSON, len(vis))
	for i, v := range vis {
		j := valueInfoJSON{Name: v.Name, DType: int32(v.DType), Type: "tensor(" + v.DType.ONNXName() + ")"}
		if v.Kind != model.KindTensor {
			j.Type = "unsupported"
		}
		if v.Shape != nil {
			j.Shape = make([]any, len(v.Shape))
			for k, d := range v.Shape {
				switch {
				case d.Value >= 0:
					j.Shape[k] = d.Value
				case d.Param != "":
					j.Shape[k] = d.Param
				}
			}
		}
		out[i] = j
	}
	return out
}

// modelMetaJSON is the model's self-description, the fields of
// onnxruntime's ModelMetadata: producer, graph name and doc strings,
// domain, model version and metadata_props.
type modelMetaJSON struct {
	ProducerName      string            `json:"producer_name"`
	ProducerVersion   string            `json:"producer_version"`
	GraphName         string            `json:"graph_name"`
	GraphDescription  string            `json:"graph_description"`
	Domain            string            `json:"domain"`
	Description       string            `json:"description"`
	Version           int64             `json:"version"`
	IRVersion         int64             `json:"ir_version"`
	CustomMetadataMap map[string]string `json:"custom_metadata_map"`
}

func modelMeta(m *model.Model) modelMetaJSON {
	mp := m.Proto
	j := modelMetaJSON{ProducerName: m.ProducerName, ProducerVersion: m.ProducerVersion, IRVersion: m.IRVersion,
		GraphName: mp.GetGraph().GetName(), GraphDescription: mp.GetGraph().GetDocString(),
		Domain: mp.GetDomain(), Description: mp.GetDocString(), Version: mp.GetModelVersion(),
		CustomMetadataMap: map[string]string{}}
	for _, e := range mp.GetMetadataProps() {
		j.CustomMetadataMap[e.GetKey()] = e.GetValue()
	}
	return j
}

// SessionIOJSON describes the session's inputs and outputs as
// {"inputs": [...], "outputs": [...], "opsets": {...}, "threads": n,
// "meta": {...}} (meta: see modelMetaJSON).
func SessionIOJSON(h int64) (s string, err error) {
	defer recoverTo(&err)
	sess, err := sessions.get(h)
	if err != nil {
		return "", classify(err)
	}
	opsets := map[string]int{}
	for d, v := range sess.Model().Opsets {
		if d == "" {
			d = "ai.onnx"
		}
		opsets[d] = v
	}
	b, err := json.Marshal(map[string]any{
		"inputs": infos(sess.Inputs()), "outputs": infos(sess.Outputs()),
		"opsets": opsets, "threads": sess.Threads(), "producer": sess.Model().ProducerName,
		"meta": modelMeta(sess.Model()),
	})
	return string(b), classify(err)
}

type eventJSON struct {
	Node  string `json:"node"`
	Op    string `json:"op"`
	DurNs int64  `json:"dur_ns"`
	Bytes int64  `json:"bytes"`
}

// lastStats keeps each session's latest RunStats for SessionLastStatsJSON,
// so a run does not pay for encoding them.
var lastStats sync.Map // session handle -> *runtime.RunStats

// SessionRun runs session h. feedNames is a JSON list of n input names;
// desc (an array reference, see arrayref.go) holds nDesc int64 values that
// describe the feeds in order, each as [array reference of a C-contiguous
// aligned array, ONNX element code, rank, dims...]. outNames is a JSON list
// of output names ("" or "null": all outputs). Feed memory is borrowed: the
// caller keeps the arrays alive until ResultCopyAndFree.
//
// It returns "result|code:d0,d1,...|code:...": the result handle, then each
// output's element code and dims (nothing after ':' for a scalar).
func SessionRun(h int64, feedNames string, n int, desc uintptr, nDesc int, outNames string) (s string, err error) {
	defer recoverTo(&err)
	return sessionRun(h, feedNames, n, desc, nDesc, outNames, -1)
}

// SessionRunLend is SessionRun that lends outputs of at least lendMin bytes
// which come from the session's buffer pool instead of having them copied:
// such an output's entry reads "code:dims:address:handle", where address is
// the output's data (valid until OutputRelease(handle)) and ResultCopyAndFree
// skips it (its reference there is ignored). lendMin < 0 lends nothing.
func SessionRunLend(h int64, feedNames string, n int, desc uintptr, nDesc int, outNames string, lendMin int) (s string, err error) {
	defer recoverTo(&err)
	return sessionRun(h, feedNames, n, desc, nDesc, outNames, lendMin)
}

func sessionRun(h int64, feedNames string, n int, desc uintptr, nDesc int, outNames string, lendMin int) (string, error) {
	sess, err := sessions.get(h)
	if err != nil {
		return "", classify(err)
	}
	return runAndDescribe(h, sess.DefaultState(), feedNames, n, desc, nDesc, outNames, lendMin,
		func(feeds map[string]*tensor.Tensor, names []string) ([]*tensor.Tensor, *runtime.RunStats, error) {
			return sess.Run(feeds, names)
		})
}

// runAndDescribe decodes the feeds and output names, runs, and describes
// the outputs for Python (see SessionRun); st is the state whose pool the
// outputs come from.
func runAndDescribe(h int64, st *runtime.State, feedNames string, n int, desc uintptr, nDesc int, outNames string, lendMin int,
	run func(map[string]*tensor.Tensor, []string) ([]*tensor.Tensor, *runtime.RunStats, error)) (string, error) {
	feeds, err := buildFeeds(feedNames, n, desc, nDesc)
	if err != nil {
		return "", classify(err)
	}
	var names []string
	if o := strings.TrimSpace(outNames); o != "" && o != "null" {
		if err := json.Unmarshal([]byte(o), &names); err != nil {
			return "", classify(fmt.Errorf("%w: output names: %v", errs.ErrInvalidArgument, err))
		}
	}
	outs, stats, err := run(feeds, names)
	if err != nil {
		return "", classify(err)
	}
	lastStats.Store(h, stats)
	res := &runResult{st: st, outs: outs, lent: make([]int64, len(outs))}
	buf := make([]byte, 0, 24+40*len(outs))
	for i, t := range outs {
		if lendMin >= 0 && t.NumBytes() > 0 && t.NumBytes() >= lendMin && st.Leased(t) {
			res.lent[i] = lent.put(lentOutput{st: st, t: t})
		}
	}
	rh := results.put(res)
	buf = strconv.AppendInt(buf, rh, 10)
	for i, t := range outs {
		buf = append(buf, '|')
		buf = strconv.AppendInt(buf, int64(t.DType()), 10)
		buf = append(buf, ':')
		for k, d := range t.Shape() {
			if k > 0 {
				buf = append(buf, ',')
			}
			buf = strconv.AppendInt(buf, int64(d), 10)
		}
		if res.lent[i] != 0 {
			buf = append(buf, ':')
			buf = strconv.AppendUint(buf, uint64(uintptr(unsafe.Pointer(unsafe.SliceData(t.Bytes())))), 10)
			buf = append(buf, ':')
			buf = strconv.AppendInt(buf, res.lent[i], 10)
		}
	}
	return string(buf), nil
}

// OutputRelease ends Python's hold on a lent output (its numpy array is
// gone): the buffer may be reused by later runs. Releasing an unknown or
// already released handle does nothing.
func OutputRelease(lh int64) (err error) {
	defer recoverTo(&err)
	if o, ok := lent.take(lh); ok {
		o.st.Release(o.t)
	}
	return nil
}

// LentOutputs returns the number of lent outputs not yet released.
func LentOutputs() int { return lent.len() }

// SessionLastStatsJSON returns the figures of session h's latest run:
// {"peak_bytes", "allocated_bytes", "events": [{"node", "op", "dur_ns",
// "bytes"}...] (events only when profiling), "run_ns" (the run's wall time
// inside the executor)}; {} before the first run.
func SessionLastStatsJSON(h int64) (s string, err error) {
	defer recoverTo(&err)
	if _, err := sessions.get(h); err != nil {
		return "", classify(err)
	}
	v, ok := lastStats.Load(h)
	if !ok {
		return "{}", nil
	}
	stats := v.(*runtime.RunStats)
	events := make([]eventJSON, len(stats.Events))
	for i, e := range stats.Events {
		events[i] = eventJSON{Node: e.Node, Op: e.OpType, DurNs: e.Duration.Nanoseconds(), Bytes: e.BytesAllocated}
	}
	b, err := json.Marshal(map[string]any{"peak_bytes": stats.PeakBytes, "allocated_bytes": stats.AllocatedBytes, "events": events,
		"run_ns": stats.Duration.Nanoseconds()})
	return string(b), classify(err)
}

func buildFeeds(feedNames string, n int, desc uintptr, nDesc int) (map[string]*tensor.Tensor, error) {
	var names []string
	if err := json.Unmarshal([]byte(feedNames), &names); err != nil || len(names) != n {
		return nil, fmt.Errorf("%w: feed names %q for %d feeds", errs.ErrInvalidArgument, feedNames, n)
	}
	ds, err := int64sAt(arrayData(desc), nDesc)
	if err != nil {
		return nil, err
	}
	feeds := make(map[string]*tensor.Tensor, n)
	off := 0
	for _, name := range names {
		if off+3 > nDesc {
			return nil, fmt.Errorf("%w: feed description too short at %q", errs.ErrInvalidArgument, name)
		}
		ref, code, r := uintptr(ds[off]), ds[off+1], int(ds[off+2])
		off += 3
		if r < 0 || off+r > nDesc {
			return nil, fmt.Errorf("%w: rank %d of feed %q", errs.ErrInvalidArgument, r, name)
		}
		shape := make(tensor.Shape, r)
		for k := range shape {
			if ds[off+k] < 0 || ds[off+k] > tensor.MaxElements {
				return nil, fmt.Errorf("%w: dimension %d of feed %q", errs.ErrInvalidArgument, ds[off+k], name)
			}
			shape[k] = int(ds[off+k])
		}
		off += r
		d := tensor.DType(code)
		if !d.Valid() {
			return nil, fmt.Errorf("%w: input %q has unsupported element type code %d", errs.ErrType, name, code)
		}
		cnt, err := shape.NumElements()
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		b, err := bytesAt(arrayData(ref), cnt*d.Size())
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		t, err := tensor.FromBytes(d, shape, b)
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
		if _, dup := feeds[name]; dup {
			return nil, fmt.Errorf("%w: input %q fed twice", errs.ErrInvalidArgument, name)
		}
		feeds[name] = t
	}
	return feeds, nil
}

// ResultCopyAndFree copies the n outputs of run result rh into the arrays
// whose references (see arrayref.go) are the n int64 values at ptrs (an
// array reference too), each exactly the output's byte size as announced
// by SessionRun, then frees the result and hands the copied outputs'
// buffers back to the session's pool. Lent outputs are skipped: their
// owners release them with OutputRelease, even when this call fails.
// The result is freed even when the copy fails.
func ResultCopyAndFree(rh int64, ptrs uintptr, n int) (err error) {
	defer recoverTo(&err)
	res, ok := results.take(rh)
	if !ok {
		return classify(fmt.Errorf("%w: run result handle %d", errUnknownHandle, rh))
	}
	defer res.releaseCopied()
	if n != len(res.outs) {
		return classify(fmt.Errorf("%w: %d buffers for %d outputs", errs.ErrInvalidArgument, n, len(res.outs)))
	}
	p, err := int64sAt(arrayData(ptrs), n)
	if err != nil {
		return classify(err)
	}
	for i, t := range res.outs {
		if res.lent[i] != 0 {
			continue
		}
		dst, err := bytesAt(arrayData(uintptr(p[i])), t.NumBytes())
		if err != nil {
			return classify(err)
		}
		copy(dst, t.Bytes())
	}
	return nil
}

// ResultFree drops a run result without copying it, lent outputs included.
func ResultFree(rh int64) (err error) {
	defer recoverTo(&err)
	if res, ok := results.take(rh); ok {
		res.releaseLent()
		res.releaseCopied()
	}
	return nil
}

// releaseCopied hands the outputs that were not lent back to the pool.
func (r *runResult) releaseCopied() {
	for i, t := range r.outs {
		if r.lent[i] == 0 {
			r.st.Release(t)
		}
	}
}

// releaseLent ends the loans of a result whose arrays Python never built.
func (r *runResult) releaseLent() {
	for i, h := range r.lent {
		if h != 0 {
			OutputRelease(h)
			r.lent[i] = 0
		}
	}
}
