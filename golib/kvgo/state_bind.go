package kvgo

import (
	"encoding/json"
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime"
)

// Generation-state bindings: python/onnx_light_kv/state.py drives these.
// A state handle names a runtime.CacheState (one KVCache per rewritten
// layer); SessionRunPrepared runs the session's cache path on it.

var states = newRegistry[*runtime.CacheState]("generation state")

type layerJSON struct {
	Layer        int    `json:"layer"`
	PastKey      string `json:"past_key"`
	PastValue    string `json:"past_value"`
	PresentKey   string `json:"present_key"`
	PresentValue string `json:"present_value"`
	Rewritten    bool   `json:"rewritten"`
	Rule         string `json:"rule"`
	Reason       string `json:"reason"`
	WindowBuffer int    `json:"window_buffer"`
}

// SessionCachePlanJSON returns the cache rewrite's verdict per layer as a
// JSON list of {layer, past_key, past_value, present_key, present_value,
// rewritten, rule, reason, window_buffer}.
func SessionCachePlanJSON(h int64) (s string, err error) {
	defer recoverTo(&err)
	sess, err := sessions.get(h)
	if err != nil {
		return "", classify(err)
	}
	out := []layerJSON{}
	for _, l := range sess.CachePlan() {
		out = append(out, layerJSON{Layer: l.Index, PastKey: l.PastKey, PastValue: l.PastValue, PresentKey: l.PresentKey,
			PresentValue: l.PresentValue, Rewritten: l.Rewritten, Rule: l.Rule, Reason: l.Reason,
			WindowBuffer: l.WindowBuffer})
	}
	b, err := json.Marshal(out)
	return string(b), classify(err)
}

// StateNew creates a generation state on session h: batch sequences,
// maxLength tokens reserved per sequence (0: grow on demand), elem the
// cache element code (-1: the model's K/V type), budget the bytes of an
// arena of the state's own (0: the session's arena). layout 0 is contiguous, 1 paged (blockSize tokens per block, 0 for
// the default; prefixCache != 0 shares prompt prefixes through the
// session's prefix store, prefixMaxBytes > 0 setting the cap on its
// registered blocks); quant, group, kAxis and residual are those of
// CacheNew ("none" for native caches).
func StateNew(h int64, batch, maxLength, elem int, budget int64, layout, blockSize, prefixCache int,
	prefixMaxBytes int64, quant string, group int, kAxis string, residual int) (sh int64, err error) {
	defer recoverTo(&err)
	sess, err := sessions.get(h)
	if err != nil {
		return 0, classify(err)
	}
	q, err := quantConfigOf(quant, group, kAxis, residual)
	if err != nil {
		return 0, classify(err)
	}
	cfg := runtime.StateConfig{Batch: batch, MaxLength: maxLength, Budget: budget, Quant: q}
	if layout == 1 {
		cfg.Layout, cfg.BlockSize, cfg.PrefixCache = cache.Paged, blockSize, prefixCache != 0
		cfg.PrefixMaxBytes = prefixMaxBytes
	}
	if elem >= 0 {
		if cfg.Elem, err = elemOf(elem); err != nil {
			return 0, classify(err)
		}
		cfg.ElemSet = true
	}
	cs, err := sess.NewCacheState(cfg)
	if err != nil {
		return 0, classify(err)
	}
	return states.put(cs), nil
}

// StateFree closes a state and releases its caches. Unknown handles are
// ignored (a finalizer may run after an explicit close).
func StateFree(sh int64) (err error) {
	defer recoverTo(&err)
	if cs, ok := states.take(sh); ok {
		cs.Close()
	}
	return nil
}

// LiveStates returns the number of states not yet freed.
func LiveStates() int { return states.len() }

// StateFork copies a state and returns the copy's handle.
func StateFork(sh int64) (f int64, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return 0, classify(err)
	}
	c, err := cs.Fork()
	if err != nil {
		return 0, classify(err)
	}
	return states.put(c), nil
}

// StateReusePrefix attaches the longest registered prefix of the n int64
// token ids at ptr to the empty state and returns the tokens it covers.
func StateReusePrefix(sh int64, ptr uintptr, n int) (covered int, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return 0, classify(err)
	}
	ids, err := int64sAt(ptr, n)
	if err != nil {
		return 0, classify(err)
	}
	covered, err = cs.ReusePrefix(append([]int64(nil), ids...))
	return covered, classify(err)
}

// StateReorder reorders every layer's sequences by the n int64 beam indices
// at ptr.
func StateReorder(sh int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	idx, err := ints(ptr, n)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Reorder(idx))
}

// StateSelect keeps the n sequences whose int64 indices are at ptr
// (distinct; sequence b becomes old sequence idx[b]); no K/V is copied.
func StateSelect(sh int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	idx, err := ints(ptr, n)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Select(idx))
}

// StateAdopt moves every sequence of state src to the end of state sh and
// closes src; no K/V is copied.
func StateAdopt(sh, src int64) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	other, err := states.get(src)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Adopt(other))
}

// StateTruncate sets the state's logical length to n.
func StateTruncate(sh int64, n int) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Truncate(n))
}

// StateCheckpoint snapshots the state and returns the checkpoint id.
func StateCheckpoint(sh int64) (id int64, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return 0, classify(err)
	}
	id, err = cs.Checkpoint()
	return id, classify(err)
}

// StateRollback restores checkpoint id.
func StateRollback(sh, id int64) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Rollback(id))
}

// StateReleaseCheckpoint forgets checkpoint id.
func StateReleaseCheckpoint(sh, id int64) (err error) {
	defer recoverTo(&err)
	if cs, e := states.get(sh); e == nil {
		cs.ReleaseCheckpoint(id)
	}
	return nil
}

// StateReset empties the state.
func StateReset(sh int64) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	return classify(cs.Reset())
}

// StateLength returns the state's logical length (positions run so far).
func StateLength(sh int64) (n int, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return 0, classify(err)
	}
	return cs.Length(), nil
}

// StateLengths writes the tokens stored per sequence into the n int64s at
// ptr (n must be the batch).
func StateLengths(sh int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	return classify(putLengths(ptr, n, cs.Lengths(), "batch"))
}

// StateInfoJSON returns {"batch", "length", "dtype", "layers": [per-layer
// cache info with "layer", "slot", "present_key", "present_value"; layers
// whose cache the first run creates are absent before it], "totals":
// {committed_bytes, live_bytes, counters...}}.
func StateInfoJSON(sh int64) (s string, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return "", classify(err)
	}
	layers := []map[string]any{} // [] (not null) before any layer has a cache
	totals := map[string]int64{}
	for i, c := range cs.Caches() {
		if c == nil {
			continue // created by the first run
		}
		in := c.Info()
		m := cacheInfoMap(in)
		l := cs.Layers()[i]
		m["layer"], m["slot"], m["present_key"], m["present_value"] = l.Index, i, l.PresentKey, l.PresentValue
		layers = append(layers, m)
		totals["committed_bytes"] += in.CommittedBytes
		totals["live_bytes"] += in.LiveBytes
		ct := in.Counters
		totals["append_bytes"] += ct.AppendBytes
		totals["append_calls"] += ct.AppendCalls
		totals["export_bytes"] += ct.ExportBytes
		totals["copy_bytes"] += ct.CopyBytes
		totals["attention_bytes"] += ct.AttentionBytes
		totals["attention_calls"] += ct.AttentionCalls
		totals["seal_bytes"] += ct.SealBytes
		totals["seal_calls"] += ct.SealCalls
	}
	info := map[string]any{"batch": cs.Batch(), "length": cs.Length(), "dtype": cs.Elem().String(),
		"closed": cs.Closed(), "layers": layers, "totals": totals}
	if cs.PrefixCache() {
		ps := cs.Session().PrefixStats()
		info["prefix_cache"] = map[string]int64{"lookups": ps.Lookups, "hits": ps.Hits,
			"tokens_reused": ps.TokensReused, "bytes_saved": ps.BytesSaved, "shared_blocks": ps.Entries,
			"evicted": ps.Evicted, "registered_bytes": ps.Bytes, "max_bytes": ps.MaxBytes}
	}
	b, err := json.Marshal(info)
	return string(b), classify(err)
}

// StateResetCounters zeroes every layer cache's work counters.
func StateResetCounters(sh int64) (err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return classify(err)
	}
	for _, c := range cs.Caches() {
		if c != nil {
			c.ResetCounters()
		}
	}
	return nil
}

// StateExportLen returns the sequence axis of layer slot's exported
// presents (its longest stored sequence, or a window-sized buffer's
// positions).
func StateExportLen(sh int64, layer int) (n int, err error) {
	defer recoverTo(&err)
	c, window, err := stateCache(sh, layer)
	if err != nil {
		return 0, classify(err)
	}
	if window > 0 {
		return window, nil
	}
	return c.MaxLen(), nil
}

// StateExport writes layer slot's cache as present tensors [B, kv_heads,
// L, head_dim] of element code dst into the leading bytes of the numpy
// buffers at kPtr and vPtr, with L read under the cache's lock, and returns
// L; when L > maxL it writes nothing and returns L (see CacheExport). A
// layer with window-sized buffers (GroupQueryAttention
// sliding_window_cache=1) exports that buffer: L is its size and each
// sequence's last positions fill it from row 0 (cache.KVCache.ExportTail).
func StateExport(sh int64, layer int, kPtr uintptr, kBytes int, vPtr uintptr, vBytes int, dst, maxL int) (L int, err error) {
	defer recoverTo(&err)
	c, window, err := stateCache(sh, layer)
	if err != nil {
		return 0, classify(err)
	}
	if window == 0 {
		return exportUpTo(c, kPtr, kBytes, vPtr, vBytes, dst, maxL)
	}
	if window > maxL {
		return window, nil
	}
	dt, err := elemOf(dst)
	if err != nil {
		return 0, classify(err)
	}
	cfg := c.Config()
	nk, nv := cfg.Batch*cfg.KVHeads*window*cfg.HeadDimK*dt.Size(), cfg.Batch*cfg.KVHeads*window*cfg.HeadDimV*dt.Size()
	k, err := bytesAt(kPtr, kBytes)
	if err == nil && len(k) < nk {
		err = fmt.Errorf("%w: export of %d positions needs k of %d bytes, got %d", errInvalid, window, nk, len(k))
	}
	if err != nil {
		return 0, classify(err)
	}
	v, err := bytesAt(vPtr, vBytes)
	if err == nil && len(v) < nv {
		err = fmt.Errorf("%w: export of %d positions needs v of %d bytes, got %d", errInvalid, window, nv, len(v))
	}
	if err != nil {
		return 0, classify(err)
	}
	return window, classify(c.ExportTail(k[:nk], v[:nv], dt, window))
}

// stateCache returns layer slot's cache and its window-sized present
// buffer (rewrite.Layer.WindowBuffer; 0 for none).
func stateCache(sh int64, layer int) (*cache.KVCache, int, error) {
	cs, err := states.get(sh)
	if err != nil {
		return nil, 0, err
	}
	cc := cs.Caches()
	if layer < 0 || layer >= len(cc) || cc[layer] == nil {
		return nil, 0, fmt.Errorf("%w: layer slot %d of %d has no cache yet", errInvalid, layer, len(cc))
	}
	window := 0
	for _, l := range cs.Layers() {
		if l.Slot == layer {
			window = l.WindowBuffer
		}
	}
	return cc[layer], window, nil
}

// StateLoad appends n positions to every layer of state sh from present
// tensors in numpy buffers of element code src: desc (at descPtr, int64,
// 7 entries per layer slot in slot order) holds each layer's K pointer, K
// bytes, V pointer, V bytes, kv_heads, head_dim_k and head_dim_v. It
// returns the state's new length (see runtime.CacheState.Load).
func StateLoad(sh int64, descPtr uintptr, layers, src, n int) (length int, err error) {
	defer recoverTo(&err)
	cs, err := states.get(sh)
	if err != nil {
		return 0, classify(err)
	}
	dt, err := elemOf(src)
	if err != nil {
		return 0, classify(err)
	}
	desc, err := int64sAt(descPtr, 7*layers)
	if err != nil {
		return 0, classify(err)
	}
	rows := make([]runtime.LayerRows, layers)
	for i := range rows {
		d := desc[7*i : 7*i+7]
		r := &rows[i]
		if r.K, err = bytesAt(uintptr(d[0]), int(d[1])); err == nil {
			r.V, err = bytesAt(uintptr(d[2]), int(d[3]))
		}
		if err != nil {
			return 0, classify(err)
		}
		r.KVHeads, r.HeadDimK, r.HeadDimV = int(d[4]), int(d[5]), int(d[6])
	}
	if err := cs.Load(rows, dt, n); err != nil {
		return 0, classify(err)
	}
	return cs.Length(), nil
}
