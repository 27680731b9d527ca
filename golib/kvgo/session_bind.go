package kvgo

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Session bindings: python/onnx_light_kv/session.py drives these. A run is
// at most two calls (signature_bind.go): SessionRunPrepared executes the
// graph for a prepared signature and writes the outputs' types and shapes
// into an int64 array, with a result handle; Python allocates numpy arrays
// and ResultCopyAndFree copies outputs into them once, then hands the
// output buffers back to the session's pool. Arrays cross as array
// references (arrayref.go), the cheapest way to name numpy memory.
//
// Large outputs are lent instead of copied: Python wraps the Go buffer
// itself in a numpy array whose owner calls OutputRelease when the array
// (and every view of it) is gone; only then may the pool reuse the buffer.
// Go's collector does not move heap objects, and the lent registry keeps
// the tensor reachable, so the address stays valid until the release.

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
		classifier{errs.ErrMemory, classMemory}, // (before ErrLimit: a tensor beyond the machine is both)
		classifier{errs.ErrLimit, classValue},
		classifier{errs.ErrCycle, classValue},
		classifier{errs.ErrMissingInput, classValue},
		classifier{errs.ErrNotFound, classValue},
		classifier{errs.ErrClosed, classValue},
		classifier{fs.ErrNotExist, classFile},
		classifier{fs.ErrPermission, classPerm},
	)
}

// SessionNewPath loads the model at path (external data next to it) and
// builds a session with the given kernel thread count (<= 0: all CPUs).
// mapMin is model.Options.MapMinBytes (0: the default; negative: files are
// read, never mapped).
func SessionNewPath(path string, threads int, profile bool, mapMin int64) (h int64, err error) {
	defer recoverTo(&err)
	s, err := runtime.NewSession(path, runtime.Options{Threads: threads, Profile: profile,
		Model: model.Options{MapMinBytes: mapMin}})
	if err != nil {
		return 0, classify(err)
	}
	return sessions.put(s), nil
}

// SessionNewBytes builds a session from n serialized model bytes at ptr
// (borrowed for the call). baseDir, if not empty, is the folder external
// data files are read from; mapMin is as SessionNewPath's.
func SessionNewBytes(ptr uintptr, n int, baseDir string, threads int, profile bool, mapMin int64) (h int64, err error) {
	defer recoverTo(&err)
	b, err := bytesAt(ptr, n)
	if err != nil {
		return 0, classify(err)
	}
	s, err := runtime.NewSessionFromBytes(b, runtime.Options{Threads: threads, Profile: profile,
		Model: model.Options{BaseDir: baseDir, MapMinBytes: mapMin}})
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
		return classify(sessions.missing(h))
	}
	lastStats.Delete(h)
	signatures.drop(func(sg *runSignature) bool { return sg.h == h })
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

// ResultCopyAndFree copies the n outputs of run result rh into the arrays
// whose references (see arrayref.go) are the n int64 values at ptrs (an
// array reference too), each exactly the output's byte size as announced
// by SessionRunPrepared, then frees the result and hands the copied outputs'
// buffers back to the session's pool. Lent outputs are skipped: their
// owners release them with OutputRelease, even when this call fails.
// The result is freed even when the copy fails.
func ResultCopyAndFree(rh int64, ptrs uintptr, n int) (err error) {
	defer recoverTo(&err)
	res, ok := results.take(rh)
	if !ok {
		return classify(results.missing(rh))
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
		if r.lent[i] == 0 && !r.isLent(t) { // (a lent twin keeps the buffer until its release)
			r.st.Release(t)
		}
	}
}

// isLent reports whether t is one of the result's lent outputs.
func (r *runResult) isLent(t *tensor.Tensor) bool {
	for i, u := range r.outs {
		if u == t && r.lent[i] != 0 {
			return true
		}
	}
	return false
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
