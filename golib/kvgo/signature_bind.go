package kvgo

import (
	"encoding/json"
	"fmt"
	"strings"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Prepared runs: Python resolves a run's feed names and output names once
// per (feed names, output names, path) with SessionPrepare, which checks
// everything that depends only on the names (runtime.Signature), and then
// runs with SessionRunPrepared, passing only the feeds' array references,
// element codes and shapes. The outputs are described in an int64 array
// Python reads with one tolist(), not in a string to split and parse.

var signatures = newRegistry[*runSignature]("run signature")

// runSignature is a prepared signature and the session it belongs to.
type runSignature struct {
	h    int64 // session handle
	sess *runtime.Session
	sg   *runtime.Signature
}

// SessionPrepare resolves feedNames (a JSON list of input names, in the
// order SessionRunPrepared receives the feeds) and outNames (a JSON list of
// output names; "" or "null": all outputs) for runs of session h on the
// tensor path (cachePath 0) or on generation states (cachePath 1), and
// returns the signature's handle. Missing, unknown and duplicate inputs,
// pasts fed on the cache path and unknown outputs are reported here.
func SessionPrepare(h int64, cachePath int, feedNames, outNames string) (sig int64, err error) {
	defer recoverTo(&err)
	sess, err := sessions.get(h)
	if err != nil {
		return 0, classify(err)
	}
	var names []string
	if err := json.Unmarshal([]byte(feedNames), &names); err != nil {
		return 0, classify(fmt.Errorf("%w: feed names %q: %v", errs.ErrInvalidArgument, feedNames, err))
	}
	var outs []string
	if o := strings.TrimSpace(outNames); o != "" && o != "null" {
		if err := json.Unmarshal([]byte(o), &outs); err != nil {
			return 0, classify(fmt.Errorf("%w: output names: %v", errs.ErrInvalidArgument, err))
		}
	}
	var sg *runtime.Signature
	if cachePath != 0 {
		sg, err = sess.PrepareCache(names, outs)
	} else {
		sg, err = sess.Prepare(names, outs)
	}
	if err != nil {
		return 0, classify(err)
	}
	return signatures.put(&runSignature{h: h, sess: sess, sg: sg}), nil
}

// SignatureFree releases a prepared signature. Unknown handles are ignored
// (freeing a session frees its signatures).
func SignatureFree(sig int64) (err error) {
	defer recoverTo(&err)
	signatures.take(sig)
	return nil
}

// LiveSignatures returns the number of prepared signatures not yet freed.
func LiveSignatures() int { return signatures.len() }

// SessionRunPrepared runs session h with signature sig: on the tensor path
// when sh is 0, else on the cache path of generation state sh. desc (an
// array reference, see arrayref.go) holds nDesc int64 values describing
// the feeds in the signature's order, each as [array reference of a
// C-contiguous aligned array, ONNX element code, rank, dims...]. Feed
// memory is borrowed: the caller keeps the arrays alive until
// ResultCopyAndFree.
//
// The outputs are described into the first nMeta-1 int64 values at meta
// (an array reference), and the result handle rh is also written into its
// last value (the caller sets it to 0 first: a caller that cannot take the
// return value, such as Python when a KeyboardInterrupt is raised as the
// call returns, frees the result from there). meta[0] is the count of values
// written after it, then per
// output [element code, rank, dims..., address, lent handle]. An output of
// at least lendMin bytes from the session's buffer pool is lent (address
// of its data, valid until OutputRelease(handle)), once: a later output
// that is the same tensor is copied; the others have address and handle 0
// and are copied by ResultCopyAndFree(rh, ...). When meta is
// too short, meta[0] is minus the length needed and ResultDescribe(rh,
// ...) describes the outputs. The result handle rh is 0 when there is
// nothing to copy (every output lent, or none): the result is freed.
// lendMin < 0 lends nothing.
func SessionRunPrepared(h, sh, sig int64, desc uintptr, nDesc int, lendMin int, meta uintptr, nMeta int) (rh int64, err error) {
	defer recoverTo(&err)
	sess, err := sessions.get(h)
	if err != nil {
		return 0, classify(err)
	}
	rs, err := signatures.get(sig)
	if err != nil {
		return 0, classify(err)
	}
	if rs.sess != sess {
		return 0, classify(fmt.Errorf("%w: run signature %d belongs to another session", errs.ErrInvalidArgument, sig))
	}
	feeds, err := decodeFeeds(rs.sg.FeedNames(), desc, nDesc)
	if err != nil {
		return 0, classify(err)
	}
	var outs []*tensor.Tensor
	var stats *runtime.RunStats
	st := sess.DefaultState()
	if sh != 0 {
		cs, err := states.get(sh)
		if err != nil {
			return 0, classify(err)
		}
		st = cs.State()
		outs, stats, err = sess.RunCacheSignature(cs, rs.sg, feeds)
		if err != nil {
			return 0, classify(err)
		}
	} else if outs, stats, err = sess.RunSignature(st, rs.sg, feeds); err != nil {
		return 0, classify(err)
	}
	lastStats.Store(h, stats)
	res := &runResult{st: st, outs: outs, lent: make([]int64, len(outs))}
	copied := 0
	for i, t := range outs {
		// a tensor returned twice (an output asked for twice, or an
		// Identity of another output) is lent once and copied after: two
		// loans of one tensor would free its buffer at the first release
		// while the other array still reads it
		if lendMin >= 0 && t.NumBytes() > 0 && t.NumBytes() >= lendMin && st.Leased(t) && !res.isLent(t) {
			res.lent[i] = lent.put(lentOutput{st: st, t: t})
		} else {
			copied++
		}
	}
	m, err := int64sAt(arrayData(meta), nMeta)
	if err != nil || nMeta < 2 {
		res.releaseLent()
		res.releaseCopied()
		return 0, classify(fmt.Errorf("%w: output description array of %d values", errs.ErrInvalidArgument, nMeta))
	}
	m, slot := m[:nMeta-1], &m[nMeta-1]
	if !res.describe(m) || copied > 0 {
		rh := results.put(res)
		*slot = rh
		return rh, nil
	}
	return 0, nil
}

// ResultDescribe writes run result rh's output description (see
// SessionRunPrepared) into the n int64 values at meta (an array reference);
// meta[0] is minus the length needed when n is too short.
func ResultDescribe(rh int64, meta uintptr, n int) (err error) {
	defer recoverTo(&err)
	res, err := results.get(rh)
	if err != nil {
		return classify(err)
	}
	m, err := int64sAt(arrayData(meta), n)
	if err != nil || n < 1 {
		return classify(fmt.Errorf("%w: output description array of %d values", errs.ErrInvalidArgument, n))
	}
	res.describe(m)
	return nil
}

// describe writes the outputs' description into m (see SessionRunPrepared)
// and reports whether it fit; if not, m[0] is minus the length needed.
func (r *runResult) describe(m []int64) bool {
	need := 1
	for _, t := range r.outs {
		need += 4 + t.Rank()
	}
	if need > len(m) {
		m[0] = -int64(need)
		return false
	}
	k := 1
	for i, t := range r.outs {
		m[k], m[k+1] = int64(t.DType()), int64(t.Rank())
		k += 2
		for _, d := range t.Shape() {
			m[k] = int64(d)
			k++
		}
		m[k], m[k+1] = 0, 0
		if r.lent[i] != 0 {
			m[k] = int64(uintptr(unsafe.Pointer(unsafe.SliceData(t.Bytes()))))
			m[k+1] = r.lent[i]
		}
		k += 2
	}
	m[0] = int64(k - 1)
	return true
}

// decodeFeeds reads the feed descriptions (see SessionRunPrepared) of the
// inputs names, in order, as tensors over the numpy memory.
func decodeFeeds(names []string, desc uintptr, nDesc int) ([]*tensor.Tensor, error) {
	ds, err := int64sAt(arrayData(desc), nDesc)
	if err != nil {
		return nil, err
	}
	feeds := make([]*tensor.Tensor, len(names))
	var dims [8]int // scratch: tensor headers copy their shape
	off := 0
	for i, name := range names {
		if off+3 > nDesc {
			return nil, fmt.Errorf("%w: feed description too short at %q", errs.ErrInvalidArgument, name)
		}
		ref, code, r := uintptr(ds[off]), ds[off+1], int(ds[off+2])
		off += 3
		if r < 0 || off+r > nDesc {
			return nil, fmt.Errorf("%w: rank %d of feed %q", errs.ErrInvalidArgument, r, name)
		}
		shape := tensor.Shape(dims[:0])
		if r > len(dims) {
			shape = make(tensor.Shape, 0, r)
		}
		shape = shape[:r]
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
		if feeds[i], err = tensor.FromBytes(d, shape, b); err != nil {
			return nil, fmt.Errorf("input %q: %w", name, err)
		}
	}
	if off != nDesc {
		return nil, fmt.Errorf("%w: feed description has %d values, %d used", errs.ErrInvalidArgument, nDesc, off)
	}
	return feeds, nil
}
