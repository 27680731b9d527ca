package kvgo

import (
	"encoding/json"
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

var errInvalid = cache.ErrInvalidArgument

var (
	arenas = newRegistry[*cache.Arena]("arena")
	caches = newRegistry[*cache.KVCache]("cache")
)

// elemCodes are the element-type codes shared with the Python wrapper.
var elemCodes = map[int]cache.ElemType{0: cache.Float32, 1: cache.Float16, 2: cache.BFloat16}

func elemOf(code int) (cache.ElemType, error) {
	e, ok := elemCodes[code]
	if !ok {
		return 0, fmt.Errorf("%w: element type code %d", errTypeMismatch, code)
	}
	return e, nil
}

// ArenaNew creates a persistent arena with a byte budget (0 = unlimited) and
// returns its handle.
func ArenaNew(budget int64) (h int64, err error) {
	defer recoverTo(&err)
	a, err := cache.NewArena(budget)
	if err != nil {
		return 0, classify(err)
	}
	return arenas.put(a), nil
}

// ArenaFree forgets an arena handle. Caches created in it keep their memory
// until they are closed.
func ArenaFree(h int64) (err error) {
	defer recoverTo(&err)
	if a, ok := arenas.take(h); ok {
		a.Close()
	}
	return nil
}

// ArenaSetBudget changes an arena's budget.
func ArenaSetBudget(h, budget int64) (err error) {
	defer recoverTo(&err)
	a, err := arenas.get(h)
	if err == nil {
		err = a.SetBudget(budget)
	}
	return classify(err)
}

// ArenaTrim gives pooled buffers back to the Go heap.
func ArenaTrim(h int64) (err error) {
	defer recoverTo(&err)
	a, err := arenas.get(h)
	if err == nil {
		a.Trim()
	}
	return classify(err)
}

// ArenaStatsJSON returns an arena's accounting as a JSON object.
func ArenaStatsJSON(h int64) (s string, err error) {
	defer recoverTo(&err)
	a, err := arenas.get(h)
	if err != nil {
		return "", classify(err)
	}
	st := a.Stats()
	b, err := json.Marshal(map[string]any{
		"budget": st.Budget, "allocated_bytes": st.Allocated, "pooled_bytes": st.Pooled,
		"committed_bytes": st.Committed, "peak_bytes": st.Peak, "live_bytes": st.Live,
		"allocations": st.Allocations, "fragmentation": st.Fragmentation,
	})
	return string(b), classify(err)
}

// CacheNew creates a KVCache in arena ah and returns its handle: layout 0
// contiguous, 1 paged (blockSize tokens per block, 0 for the default;
// capacity is then a limit); quant "none" (or "") keeps every row in elem,
// "int8" or "int4" quantizes rows older than residual tokens in chunks of
// group tokens (32 or 64, 0: the default) with K scales per kAxis
// ("channel" or "token").
func CacheNew(ah int64, batch, kvHeads, headDimK, headDimV, capacity, elem, layout, blockSize int,
	quant string, group int, kAxis string, residual int) (h int64, err error) {
	defer recoverTo(&err)
	a, err := arenas.get(ah)
	if err != nil {
		return 0, classify(err)
	}
	e, err := elemOf(elem)
	if err != nil {
		return 0, classify(err)
	}
	q, err := quantConfigOf(quant, group, kAxis, residual)
	if err != nil {
		return 0, classify(err)
	}
	cfg := cache.Config{Batch: batch, KVHeads: kvHeads, HeadDimK: headDimK, HeadDimV: headDimV,
		Capacity: capacity, Elem: e, Quant: q}
	if layout == 1 {
		cfg.Layout, cfg.BlockSize = cache.Paged, blockSize
	}
	c, err := cache.New(a, cfg)
	if err != nil {
		return 0, classify(err)
	}
	return caches.put(c), nil
}

// quantConfigOf maps the Python quantization options to a QuantConfig.
func quantConfigOf(quant string, group int, kAxis string, residual int) (cache.QuantConfig, error) {
	f, err := cache.ParseQuantFormat(quant)
	if err != nil {
		return cache.QuantConfig{}, err
	}
	ax, err := cache.ParseKAxis(kAxis)
	if err != nil {
		return cache.QuantConfig{}, err
	}
	return cache.QuantConfig{Format: f, Group: group, KAxis: ax, Residual: residual}, nil
}

// CacheSelect keeps the sequences given by n distinct int64 indices at ptr.
func CacheSelect(h int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	idx, err := ints(ptr, n)
	if err != nil {
		return classify(err)
	}
	return classify(c.Select(idx))
}

// CacheClose releases a cache's memory to its arena and forgets the handle.
func CacheClose(h int64) (err error) {
	defer recoverTo(&err)
	if c, ok := caches.take(h); ok {
		c.Close()
	}
	return nil
}

// LiveCaches returns how many cache handles are open (for leak tests).
func LiveCaches() int { return caches.len() }

// CacheAppend appends n tokens per sequence from numpy arrays k and v
// ([batch, kv_heads, n, head_dim] of element type src), passed as array
// references (see arrayref.go). countsPtr, when not zero, is a plain data
// pointer to batch int64 counts of real tokens per sequence.
func CacheAppend(h int64, kPtr uintptr, kBytes int, vPtr uintptr, vBytes int, src, n int, countsPtr uintptr) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	st, err := elemOf(src)
	if err != nil {
		return classify(err)
	}
	k, err := bytesAt(arrayData(kPtr), kBytes)
	if err != nil {
		return classify(err)
	}
	v, err := bytesAt(arrayData(vPtr), vBytes)
	if err != nil {
		return classify(err)
	}
	var counts []int
	if countsPtr != 0 {
		if counts, err = ints(countsPtr, c.Config().Batch); err != nil {
			return classify(err)
		}
	}
	return classify(c.Append(k, v, st, n, counts))
}

// CacheExport writes present tensors of element type dst, of sequence
// length L = the longest sequence read under the cache's lock, into the
// leading bytes of the numpy buffers k and v, and returns L. When L > maxL
// it writes nothing and returns L (the caller retries with larger buffers).
func CacheExport(h int64, kPtr uintptr, kBytes int, vPtr uintptr, vBytes int, dst, maxL int) (L int, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	return exportUpTo(c, kPtr, kBytes, vPtr, vBytes, dst, maxL)
}

// exportUpTo is the body of CacheExport and StateExport.
func exportUpTo(c *cache.KVCache, kPtr uintptr, kBytes int, vPtr uintptr, vBytes int, dst, maxL int) (int, error) {
	dt, err := elemOf(dst)
	if err != nil {
		return 0, classify(err)
	}
	k, err := bytesAt(kPtr, kBytes)
	if err != nil {
		return 0, classify(err)
	}
	v, err := bytesAt(vPtr, vBytes)
	if err != nil {
		return 0, classify(err)
	}
	L, err := c.ExportUpTo(k, v, dt, maxL)
	return L, classify(err)
}

// CacheMaxLen returns the longest sequence length.
func CacheMaxLen(h int64) (n int, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	return c.MaxLen(), nil
}

// CacheLengths writes the batch sequence lengths of cache h as int64s into
// the numpy buffer at ptr (n entries, n == batch).
func CacheLengths(h int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	return classify(putLengths(ptr, n, c.Lengths(), "batch"))
}

// putLengths writes lens into the n-entry int64 buffer at ptr, refusing a
// buffer of another size (of names what the lengths are of).
func putLengths(ptr uintptr, n int, lens []int, of string) error {
	dst, err := int64sAt(ptr, n)
	if err != nil {
		return err
	}
	if len(lens) != n {
		return fmt.Errorf("%w: lengths buffer holds %d entries for %s %d", errInvalid, n, of, len(lens))
	}
	for i, l := range lens {
		dst[i] = int64(l)
	}
	return nil
}

// CacheReset empties a cache.
func CacheReset(h int64) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err == nil {
		err = c.Reset()
	}
	return classify(err)
}

// CacheFork returns the handle of an independent copy.
func CacheFork(h int64) (f int64, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	fc, err := c.Fork()
	if err != nil {
		return 0, classify(err)
	}
	return caches.put(fc), nil
}

// CacheTruncate sets sequence lengths from n int64 values at ptr (1 value:
// all sequences).
func CacheTruncate(h int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	lens, err := ints(ptr, n)
	if err != nil {
		return classify(err)
	}
	return classify(c.Truncate(lens))
}

// CacheReorder applies beam indices (n int64 values at ptr).
func CacheReorder(h int64, ptr uintptr, n int) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return classify(err)
	}
	idx, err := ints(ptr, n)
	if err != nil {
		return classify(err)
	}
	return classify(c.Reorder(idx))
}

// CacheEvict keeps only the last keep tokens of every sequence readable.
func CacheEvict(h int64, keep int) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err == nil {
		err = c.Evict(keep)
	}
	return classify(err)
}

// CacheCheckpoint snapshots the lengths, writes the n lengths it saved into
// the int64 buffer at ptr (in the same critical section: a concurrent
// reorder or reset cannot come between) and returns the checkpoint id. On an
// error no checkpoint is left behind.
func CacheCheckpoint(h int64, ptr uintptr, n int) (id int64, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return 0, classify(err)
	}
	u, lens, err := c.CheckpointLengths()
	if err != nil {
		return 0, classify(err)
	}
	if err := putLengths(ptr, n, lens, "a checkpoint of batch"); err != nil {
		c.ReleaseCheckpoint(u)
		return 0, classify(err)
	}
	return int64(u), nil
}

// CacheRollback restores a checkpoint.
func CacheRollback(h, id int64) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err == nil {
		err = c.Rollback(uint64(id))
	}
	return classify(err)
}

// CacheReleaseCheckpoint forgets a checkpoint.
func CacheReleaseCheckpoint(h, id int64) (err error) {
	defer recoverTo(&err)
	if c, e := caches.get(h); e == nil {
		c.ReleaseCheckpoint(uint64(id))
	}
	return nil
}

// CacheResetCounters zeroes a cache's work counters.
func CacheResetCounters(h int64) (err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err == nil {
		c.ResetCounters()
	}
	return classify(err)
}

// CacheInfoJSON returns a cache's logical metadata as a JSON object.
func CacheInfoJSON(h int64) (s string, err error) {
	defer recoverTo(&err)
	c, err := caches.get(h)
	if err != nil {
		return "", classify(err)
	}
	b, err := json.Marshal(cacheInfoMap(c.Info()))
	return string(b), classify(err)
}

// cacheInfoMap is a cache's Info as the JSON object the Python wrapper reads.
func cacheInfoMap(in cache.Info) map[string]any {
	ct := in.Counters
	return map[string]any{
		"dtype": in.Elem.String(), "layout": in.Layout, "batch": in.Batch, "kv_heads": in.KVHeads,
		"head_dim_k": in.HeadDimK, "head_dim_v": in.HeadDimV, "capacity": in.Capacity,
		"lengths": in.Lengths, "window_starts": in.WindowStarts,
		"committed_bytes": in.CommittedBytes, "live_bytes": in.LiveBytes,
		"page_table_bytes": in.PageTableBytes, "checkpoints": in.Checkpoints, "closed": in.Closed,
		"block_size": in.BlockSize, "blocks_used": in.BlocksUsed, "blocks_shared": in.BlocksShared,
		"blocks_free": in.BlocksFree, "blocks_total": in.BlocksTotal, "fragmentation": in.Fragmentation,
		"counters": map[string]int64{
			"append_bytes": ct.AppendBytes, "append_calls": ct.AppendCalls,
			"export_bytes": ct.ExportBytes, "copy_bytes": ct.CopyBytes,
			"attention_bytes": ct.AttentionBytes, "attention_calls": ct.AttentionCalls,
			"seal_bytes": ct.SealBytes, "seal_calls": ct.SealCalls,
		},
		"quant": quantInfoMap(in),
	}
}

// quantInfoMap is the quantization part of a cache's info (nil when the
// cache keeps every row in its native type).
func quantInfoMap(in cache.Info) map[string]any {
	q := in.Quant
	if !q.Enabled() {
		return nil
	}
	return map[string]any{
		"format": q.Format.String(), "group": q.Group, "k_axis": q.KAxis.String(), "residual": q.Residual,
		"sealed_tokens": in.SealedTokens, "native_tokens": in.NativeTokens, "scale_bytes": in.ScaleBytes,
		"bytes_per_token": in.BytesPerToken, "native_bytes_per_token": in.NativeBytesPerToken,
	}
}
