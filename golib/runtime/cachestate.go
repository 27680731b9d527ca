package runtime

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/rewrite"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// StateConfig configures a CacheState.
type StateConfig struct {
	// Batch is the number of sequences (>= 1).
	Batch int
	// MaxLength is the tokens reserved per sequence; 0 lets the caches
	// grow on demand (each growth copies the valid rows once, and makes the
	// state's checkpoints stale).
	MaxLength int
	// Elem is the caches' storage type where ElemSet; otherwise the model's
	// K/V type (cache.Float32 is Elem's zero value, so the flag tells an
	// explicit float32 from none).
	Elem    cache.ElemType
	ElemSet bool
	// Budget, when > 0, gives the state an arena of its own with that byte
	// budget; otherwise the caches come from the session's arena.
	Budget int64
	// Layout is the caches' layout (cache.Contiguous, the zero value, or
	// cache.Paged); BlockSize the paged layout's tokens per block (0: the
	// default). A paged state with MaxLength 0 never grows: its capacity is
	// a limit (pagedGrowCapacity), its memory taken block by block.
	Layout    cache.Layout
	BlockSize int
	// PrefixCache shares the full blocks of prompts across the session's
	// paged states (see prefix.go): batch-1 paged states on the session's
	// arena register what they run, ReusePrefix attaches a registered
	// prefix.
	PrefixCache bool
	// PrefixMaxBytes, when > 0, caps the bytes of the blocks the session's
	// prefix store registers (least recently used unreferenced blocks are
	// evicted beyond it); 0 keeps the store's cap, at first a quarter of the
	// memory available when the store was created.
	PrefixMaxBytes int64
	// Quant quantizes the caches' rows older than a recent-token window
	// (cache.QuantConfig; the zero value keeps every row in Elem).
	Quant cache.QuantConfig
}

// pagedGrowCapacity is the token limit per sequence of a paged state whose
// MaxLength is 0: paged caches commit blocks as tokens arrive, so the limit
// costs nothing.
const pagedGrowCapacity = 1 << 20

// initialGrowCapacity is the first reservation of a growable state.
const initialGrowCapacity = 256

// CacheState is a generation state: one KVCache per rewritten layer, the
// logical length (positions run so far, padding included) and the State
// whose context and buffer pool its runs use. Runs on one CacheState are
// serialized; different CacheStates of a session may run concurrently.
type CacheState struct {
	sess   *Session
	st     *State
	layers []rewrite.Layer
	caches []*cache.KVCache
	arena  *cache.Arena
	own    bool // the arena is the state's
	cfg    StateConfig
	length int
	cks    map[int64]stateCheckpoint
	nextCk int64
	closed bool

	tokens []int64 // input ids of positions 0..length-1 (prefix-cache states)
	ints   []int64 // scratch of registerPrefix's position and mask reads

	// per run (guarded by st.mu)
	saved  [][]int
	wanted []bool
	step   int
	memo   map[any]any
	// loading: the run is a Load, whose new caches the session does not
	// learn the geometry of; unconfirmed[i]: a Load created slot i's cache
	// with the rows' geometry and no run has used it since (Reset drops it)
	loading     bool
	unconfirmed []bool
}

// stateCheckpoint is a checkpoint of every layer's cache: ids per layer
// slot and the caches they belong to. A slot whose cache was replaced
// since (grown, or dropped and made again) makes the checkpoint stale (a
// new cache numbers its checkpoints afresh); a nil cache is a slot that had
// none yet (its rollback empties the cache a run created since).
type stateCheckpoint struct {
	ids    []uint64
	caches []*cache.KVCache
	length int
}

// NewCacheState creates a generation state for the session's cache path.
// It fails with errs.ErrNotImplemented, naming the reasons, when the model
// stays on the tensor path, and with a *cache.BudgetError when the budget
// cannot hold the caches.
func (s *Session) NewCacheState(cfg StateConfig) (*CacheState, error) {
	if s.cache.plan == nil {
		var why []string
		for _, l := range s.cache.layers {
			if !l.Rewritten {
				why = append(why, fmt.Sprintf("layer %d: %s", l.Index, l.Reason))
			}
		}
		if len(why) == 0 {
			why = append(why, "the model has no past/present pairs")
		}
		return nil, fmt.Errorf("%w: the model runs on the tensor path only (%s)", errs.ErrNotImplemented, strings.Join(why, "; "))
	}
	if cfg.Batch < 1 || cfg.MaxLength < 0 {
		return nil, fmt.Errorf("%w: batch %d must be >= 1 and max_length %d >= 0", errs.ErrInvalidArgument, cfg.Batch, cfg.MaxLength)
	}
	if !cfg.ElemSet {
		e, ok := rewrite.ElemOf(s.cache.elem)
		if !ok {
			return nil, fmt.Errorf("%w: the model's K/V type %v has no cache storage type", errs.ErrNotImplemented, s.cache.elem)
		}
		cfg.Elem, cfg.ElemSet = e, true
	}
	if cfg.PrefixCache {
		if err := s.enablePrefixes(cfg); err != nil {
			return nil, err
		}
	}
	cs := &CacheState{sess: s, st: NewState(), layers: s.cache.layers, cfg: cfg, arena: s.arena, cks: map[int64]stateCheckpoint{}}
	if cfg.Budget > 0 {
		a, err := cache.NewArena(cfg.Budget)
		if err != nil {
			return nil, err
		}
		cs.arena, cs.own = a, true
	}
	for slot := range cs.layers {
		g := s.cache.geometry(slot)
		if g[0] == 0 || g[1] == 0 || g[2] == 0 {
			// neither the graph nor an earlier run gave the geometry: the
			// first run's kernel creates the cache from its inputs
			cs.caches = append(cs.caches, nil)
			continue
		}
		c, err := cs.newCache(g[0], g[1], g[2])
		if err != nil {
			cs.Close()
			return nil, err
		}
		cs.caches = append(cs.caches, c)
	}
	cs.saved = make([][]int, len(cs.caches))
	cs.wanted = make([]bool, len(cs.caches))
	cs.unconfirmed = make([]bool, len(cs.caches))
	return cs, nil
}

// dropCache closes slot i's cache and leaves the slot without one (its
// geometry unknown again), as before the load that created it.
func (cs *CacheState) dropCache(i int) {
	cs.caches[i].Close()
	cs.caches[i], cs.unconfirmed[i] = nil, false
}

// ensureCaches creates the caches of layer slots that have none yet where
// the session knows their geometry by now (the graph does not declare it
// and another state's run has shown it since this one was created), so
// that checkpoints and prefix reuse see every layer.
func (cs *CacheState) ensureCaches() error {
	if cs.length > 0 {
		return nil // a run or a load made every layer's cache
	}
	for slot, c := range cs.caches {
		if c != nil {
			continue
		}
		g := cs.sess.cache.geometry(slot)
		if g[0] == 0 || g[1] == 0 || g[2] == 0 {
			continue
		}
		nc, err := cs.newCache(g[0], g[1], g[2])
		if err != nil {
			return err
		}
		cs.caches[slot] = nc
	}
	return nil
}

// newCache creates one layer's cache with the state's batch, capacity and
// storage type.
func (cs *CacheState) newCache(kvHeads, dk, dv int) (*cache.KVCache, error) {
	capacity := cs.cfg.MaxLength
	if capacity == 0 {
		capacity = initialGrowCapacity
		if cs.cfg.Layout == cache.Paged {
			capacity = pagedGrowCapacity
		}
	}
	return cache.New(cs.arena, cache.Config{Batch: cs.cfg.Batch, KVHeads: kvHeads, HeadDimK: dk,
		HeadDimV: dv, Capacity: capacity, Elem: cs.cfg.Elem, Layout: cs.cfg.Layout, BlockSize: cs.cfg.BlockSize,
		Quant: cs.cfg.Quant})
}

// live returns the caches created so far (a layer whose geometry the graph
// does not declare gets its cache on the first run).
func (cs *CacheState) live() []*cache.KVCache {
	out := make([]*cache.KVCache, 0, len(cs.caches))
	for _, c := range cs.caches {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// RunCache runs the cache path on cs: feeds carry only the new tokens'
// inputs (feeding a past is an error naming it); every layer appends its
// new K/V to its cache and attends over it in place; a present is exported
// only when outputNames names it (nil: all outputs, presents included).
// A failed run leaves the state as it was before.
func (s *Session) RunCache(cs *CacheState, feeds map[string]*tensor.Tensor, outputNames []string) ([]*tensor.Tensor, *RunStats, error) {
	if cs == nil || cs.sess != s {
		return nil, nil, fmt.Errorf("%w: the state does not belong to this session", errs.ErrInvalidArgument)
	}
	sg, ts, err := s.prepareMap(true, feeds, outputNames)
	if err != nil {
		return nil, nil, err
	}
	return s.RunCacheSignature(cs, sg, ts)
}

// RunCacheSignature is RunCache with feeds given in the order of the names
// of sg (from PrepareCache).
func (s *Session) RunCacheSignature(cs *CacheState, sg *Signature, feeds []*tensor.Tensor) ([]*tensor.Tensor, *RunStats, error) {
	if cs == nil || cs.sess != s {
		return nil, nil, fmt.Errorf("%w: the state does not belong to this session", errs.ErrInvalidArgument)
	}
	if sg == nil || !sg.cache {
		return nil, nil, fmt.Errorf("%w: a cache-path run needs a signature from PrepareCache", errs.ErrInvalidArgument)
	}
	prev := cs.length
	out, stats, err := s.runOn(sg, cs.st, feeds, func() (rewrite.Binding, func(bool) error, error) {
		return cs.begin(sg.outputs)
	})
	if err == nil && cs.cfg.PrefixCache {
		cs.registerPrefix(prev, sg, feeds)
	}
	return out, stats, err
}

// begin prepares a run: the closed check, the lengths to restore on
// failure and the presents to export. It returns the binding and the
// function that ends the run (committing or rolling back).
func (cs *CacheState) begin(outputNames []string) (rewrite.Binding, func(bool) error, error) {
	if cs.closed {
		return nil, nil, errs.ErrStateClosed
	}
	for i, c := range cs.caches {
		cs.saved[i] = cs.saved[i][:0]
		if c != nil {
			cs.saved[i] = append(cs.saved[i], c.Lengths()...)
		}
		cs.wanted[i] = outputNames == nil
	}
	for _, n := range outputNames {
		if slot, ok := cs.sess.cache.presentSlot[n]; ok {
			cs.wanted[slot] = true
		}
	}
	cs.step = 0
	if cs.memo == nil {
		cs.memo = map[any]any{}
	}
	clear(cs.memo)
	return (*stateBinding)(cs), cs.end, nil
}

// end commits a successful run (the logical length advances) or restores
// every cache's lengths after a failed one.
func (cs *CacheState) end(ok bool) error {
	if ok {
		cs.length += cs.step
		return nil
	}
	var first error
	for i, c := range cs.caches {
		var err error
		switch {
		case c == nil:
		case len(cs.saved[i]) == 0: // created by this run
			err = c.Reset()
		default:
			err = c.Truncate(cs.saved[i])
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// stateBinding is the rewrite.Binding of a run on a CacheState.
type stateBinding CacheState

// Cache returns layer's cache with room for n more tokens when the state
// grows on demand.
func (b *stateBinding) Cache(layer, n int, geom [3]int) (*cache.KVCache, error) {
	cs := (*CacheState)(b)
	if layer < 0 || layer >= len(cs.caches) {
		return nil, fmt.Errorf("%w: layer slot %d of %d", errs.ErrInvalidArgument, layer, len(cs.caches))
	}
	if cs.caches[layer] == nil {
		if geom[0] <= 0 {
			return nil, fmt.Errorf("%w: the cache of layer %d is not created yet (its geometry comes from the first run)",
				errs.ErrInvalidArgument, cs.layers[layer].Index)
		}
		c, err := cs.newCache(geom[0], geom[1], geom[2])
		if err != nil {
			return nil, err
		}
		cs.caches[layer] = c
		if !cs.loading {
			cs.sess.cache.learn(layer, geom)
		}
	}
	if n > 0 {
		if cs.step != 0 && cs.step != n {
			return nil, fmt.Errorf("%w: layers append %d and %d tokens in one run", errs.ErrShape, cs.step, n)
		}
		cs.step = n
	}
	c := cs.caches[layer]
	if cs.unconfirmed[layer] && !cs.loading {
		if cfg := c.Config(); geom[0] > 0 && geom != [3]int{cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV} {
			return nil, fmt.Errorf("%w: layer %d: the run's K/V have %d heads of %d/%d, the rows loaded into the "+
				"state %d of %d/%d (reset() drops them)", errs.ErrShape, cs.layers[layer].Index, geom[0], geom[1], geom[2],
				cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV)
		}
		cs.unconfirmed[layer] = false // the run's geometry is the loaded one
	}
	if cs.cfg.MaxLength == 0 && c.MaxLen()+n > c.Config().Capacity {
		g, err := grown(c, cs.arena, c.MaxLen()+n)
		if err != nil {
			return nil, err
		}
		c.Close()
		cs.caches[layer] = g
		c = g
	}
	return c, nil
}

// PastLength is the state's logical length.
func (b *stateBinding) PastLength() int { return b.length }

// Batch is the state's batch.
func (b *stateBinding) Batch() int { return b.cfg.Batch }

// Memo is the run's memo map.
func (b *stateBinding) Memo() map[any]any { return b.memo }

// ExportWanted reports whether this run's caller asked for layer's presents.
func (b *stateBinding) ExportWanted(layer int) bool { return b.wanted[layer] }

// grown returns a copy of c with room for need tokens (at least double the
// capacity): its valid rows are copied once.
func grown(c *cache.KVCache, a *cache.Arena, need int) (*cache.KVCache, error) {
	cfg := c.Config()
	cfg.Capacity = max(2*cfg.Capacity, need)
	if cfg.Quant.Enabled() {
		// copies the sealed chunks as they are instead of quantizing
		// dequantized values again
		return c.Regrown(cfg.Capacity)
	}
	g, err := cache.New(a, cfg)
	if err != nil {
		return nil, err
	}
	lens := c.Lengths()
	L := c.MaxLen()
	if L > 0 {
		es := cfg.Elem.Size()
		k := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimK*es)
		v := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimV*es)
		err := c.Export(k, v, cfg.Elem, L)
		if err == nil {
			err = g.Append(k, v, cfg.Elem, L, lens)
		}
		if err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Length returns the state's logical length: positions run so far.
func (cs *CacheState) Length() int { return cs.length }

// Batch returns the number of sequences.
func (cs *CacheState) Batch() int { return cs.cfg.Batch }

// Caches returns the state's caches, one per rewritten layer (owned by the
// state; valid until the next run or operation on it). An entry is nil
// until the first run for a layer whose graph declares no cache geometry.
func (cs *CacheState) Caches() []*cache.KVCache { return cs.caches }

// Layers returns the rewritten layers, in slot order.
func (cs *CacheState) Layers() []rewrite.Layer { return cs.layers }

// Elem returns the caches' storage type.
func (cs *CacheState) Elem() cache.ElemType { return cs.cfg.Elem }

// Arena returns the arena the caches live in.
func (cs *CacheState) Arena() *cache.Arena { return cs.arena }

// Lengths returns the tokens stored per sequence (padding is not stored).
func (cs *CacheState) Lengths() []int {
	cs.st.mu.Lock()
	defer cs.st.mu.Unlock()
	live := cs.live()
	if len(live) == 0 || cs.closed {
		return make([]int, cs.cfg.Batch)
	}
	return live[0].Lengths()
}

// locked runs fn under the state's run lock after the closed check.
func (cs *CacheState) locked(fn func() error) error {
	cs.st.mu.Lock()
	defer cs.st.mu.Unlock()
	if cs.closed {
		return errs.ErrStateClosed
	}
	return fn()
}

// Fork returns an independent copy of the state (its caches copied, valid
// rows only; same arena). Checkpoints are not carried over.
func (cs *CacheState) Fork() (*CacheState, error) {
	var f *CacheState
	err := cs.locked(func() error {
		f = &CacheState{sess: cs.sess, st: NewState(), layers: cs.layers, arena: cs.arena, cfg: cs.cfg,
			length: cs.length, cks: map[int64]stateCheckpoint{}}
		f.cfg.Budget = 0 // shares the arena, which it does not own
		for _, c := range cs.caches {
			if c == nil {
				f.caches = append(f.caches, nil)
				continue
			}
			g, err := c.Fork()
			if err != nil {
				for _, x := range f.live() {
					x.Close()
				}
				return err
			}
			f.caches = append(f.caches, g)
		}
		f.saved = make([][]int, len(f.caches))
		f.wanted = make([]bool, len(f.caches))
		f.unconfirmed = slices.Clone(cs.unconfirmed)
		return nil
	})
	return f, err
}

// Reorder makes sequence b of every layer a copy of old sequence idx[b]
// (beam search). Checkpoints become stale.
func (cs *CacheState) Reorder(idx []int) error {
	return cs.locked(func() error {
		for _, c := range cs.live() {
			if err := c.Reorder(idx); err != nil {
				return err
			}
		}
		clear(cs.cks)
		return nil
	})
}

// Select keeps the sequences rows (sequence b becomes old sequence
// rows[b]; distinct indices, at least one): the batch becomes len(rows),
// no K/V is copied and the storage of the others goes back to the arena.
// The logical length becomes the longest kept sequence's stored length
// (the padding before it is not stored, so none is lost). Checkpoints
// become stale. Nothing changes on error.
func (cs *CacheState) Select(rows []int) error {
	return cs.locked(func() error {
		live := cs.live()
		if len(live) != len(cs.caches) {
			return fmt.Errorf("%w: select needs every layer's cache (run the state once first)", errs.ErrInvalidArgument)
		}
		for _, c := range live {
			if err := c.Select(rows); err != nil {
				// validation is the same for every layer: only the
				// first can fail, before any layer changed
				return err
			}
		}
		cs.cfg.Batch = len(rows)
		cs.length = 0
		for _, n := range live[0].Lengths() {
			cs.length = max(cs.length, n)
		}
		clear(cs.cks)
		cs.tokens = cs.tokens[:0] // other rows' ids: no registration until a reset
		return nil
	})
}

// Adopt moves every sequence of src to the end of cs (src's rows follow
// cs's) and closes src; no K/V is copied. Both states must belong to the
// same session, have run at least once, and share the storage type,
// capacity (max_length) and arena. The logical length becomes the larger
// of the two: the shorter state's sequences gain left padding, which is not
// stored. Checkpoints of cs become stale. Nothing changes on error.
func (cs *CacheState) Adopt(src *CacheState) error {
	if src == nil || src == cs || src.sess != cs.sess {
		return fmt.Errorf("%w: a state adopts another state of the same session", errs.ErrInvalidArgument)
	}
	return cs.locked(func() error {
		src.st.mu.Lock()
		defer src.st.mu.Unlock()
		if src.closed {
			return fmt.Errorf("%w (the adopted one)", errs.ErrStateClosed)
		}
		if cs.cfg.MaxLength == 0 || cs.cfg.MaxLength != src.cfg.MaxLength || cs.cfg.Elem != src.cfg.Elem || cs.arena != src.arena {
			return fmt.Errorf("%w: adopting needs states of one fixed max_length, storage type and arena (max_length %d and %d)",
				errs.ErrInvalidArgument, cs.cfg.MaxLength, src.cfg.MaxLength)
		}
		a, b := cs.live(), src.live()
		if len(a) != len(cs.caches) || len(b) != len(src.caches) {
			return fmt.Errorf("%w: adopting needs every layer's cache (run both states once first)", errs.ErrInvalidArgument)
		}
		for i := range a {
			x, y := a[i].Config(), b[i].Config()
			x.Batch, y.Batch = 0, 0
			if x != y {
				return fmt.Errorf("%w: layer slot %d has cache geometry %+v here and %+v in the adopted state",
					errs.ErrInvalidArgument, i, a[i].Config(), b[i].Config())
			}
		}
		for i := range a {
			if err := a[i].Adopt(b[i]); err != nil {
				return err // checked above: cannot fail past the first layer
			}
		}
		for i := range cs.unconfirmed { // the same geometry: confirmed if either was
			cs.unconfirmed[i] = cs.unconfirmed[i] && src.unconfirmed[i]
		}
		cs.cfg.Batch += src.cfg.Batch
		cs.length = max(cs.length, src.length)
		clear(cs.cks)
		cs.tokens = cs.tokens[:0] // (see Select)
		src.closed = true
		src.st.pool.close() // src's arena is cs's, so src owns none
		return nil
	})
}

// Truncate drops the last positions so that the logical length becomes n
// (0 <= n <= Length); each sequence loses those of them it stores.
func (cs *CacheState) Truncate(n int) error {
	return cs.locked(func() error {
		if n < 0 || n > cs.length {
			return fmt.Errorf("%w: cannot truncate a state of length %d to %d", errs.ErrInvalidArgument, cs.length, n)
		}
		drop := cs.length - n
		for _, c := range cs.live() {
			lens := c.Lengths()
			for b := range lens {
				lens[b] = max(0, lens[b]-drop)
			}
			if err := c.Truncate(lens); err != nil {
				return err
			}
		}
		cs.length = n
		return nil
	})
}

// Checkpoint snapshots every layer's lengths and the logical length; it
// returns the checkpoint's id for Rollback.
func (cs *CacheState) Checkpoint() (int64, error) {
	var id int64
	err := cs.locked(func() error {
		if err := cs.ensureCaches(); err != nil {
			return err
		}
		ck := stateCheckpoint{length: cs.length, ids: make([]uint64, len(cs.caches)), caches: slices.Clone(cs.caches)}
		for i, c := range cs.caches {
			if c == nil { // no geometry known yet: the first run creates it
				continue
			}
			cid, err := c.Checkpoint()
			if err != nil {
				for j, cj := range cs.caches[:i] {
					if cj != nil {
						cj.ReleaseCheckpoint(ck.ids[j])
					}
				}
				return err
			}
			ck.ids[i] = cid
		}
		cs.nextCk++
		id = cs.nextCk
		cs.cks[id] = ck
		return nil
	})
	return id, err
}

// Rollback restores checkpoint id (tokens appended since are dropped). A
// checkpoint that was released, or made stale by Reorder, Reset, a cache
// growth or an overwrite, returns an error wrapping cache.ErrStaleCheckpoint
// and changes nothing.
func (cs *CacheState) Rollback(id int64) error {
	return cs.locked(func() error {
		ck, ok := cs.cks[id]
		stale := !ok || len(ck.ids) != len(cs.caches)
		for i := 0; !stale && i < len(cs.caches); i++ {
			// a cache dropped (a failed load) or replaced (grown) since
			stale = ck.caches[i] != nil && cs.caches[i] != ck.caches[i]
		}
		if stale {
			return fmt.Errorf("%w: state checkpoint %d was released or invalidated", cache.ErrStaleCheckpoint, id)
		}
		before := make([][]int, len(cs.caches))
		for i, c := range cs.caches {
			if c != nil {
				before[i] = c.Lengths()
			}
		}
		var drop []int
		for i, c := range cs.caches {
			var err error
			switch {
			case c == nil:
			case ck.caches[i] == nil && cs.unconfirmed[i]: // a load's, after the checkpoint: dropped below
				drop = append(drop, i)
			case ck.caches[i] == nil: // created since: everything it holds came after the checkpoint
				err = c.Truncate(make([]int, cs.cfg.Batch))
			default:
				err = c.Rollback(ck.ids[i])
			}
			if err != nil {
				for j := 0; j < i; j++ { // undo the layers already restored
					if cs.caches[j] != nil {
						_ = cs.caches[j].Truncate(before[j])
					}
				}
				if errors.Is(err, cache.ErrStaleCheckpoint) {
					return err
				}
				return fmt.Errorf("%w: %w", cache.ErrStaleCheckpoint, err)
			}
		}
		for _, i := range drop { // as before the load: no cache, its geometry unknown
			cs.dropCache(i)
		}
		cs.length = ck.length
		return nil
	})
}

// ReleaseCheckpoint forgets checkpoint id (unknown ids are ignored).
func (cs *CacheState) ReleaseCheckpoint(id int64) {
	_ = cs.locked(func() error {
		if ck, ok := cs.cks[id]; ok {
			for i, c := range cs.caches {
				if c != nil && i < len(ck.ids) && c == ck.caches[i] {
					c.ReleaseCheckpoint(ck.ids[i])
				}
			}
			delete(cs.cks, id)
		}
		return nil
	})
}

// Reset empties every cache (their memory stays reserved) and drops the
// checkpoints.
func (cs *CacheState) Reset() error {
	return cs.locked(func() error {
		for i, c := range cs.caches {
			if c == nil {
				continue
			}
			if cs.unconfirmed[i] { // a load's geometry no run has confirmed: the next run creates it
				cs.dropCache(i)
				continue
			}
			if err := c.Reset(); err != nil {
				return err
			}
		}
		clear(cs.cks)
		cs.length = 0
		cs.tokens = cs.tokens[:0]
		return nil
	})
}

// Close releases the caches (and the state's own arena). Closing twice is
// a no-op.
func (cs *CacheState) Close() {
	cs.st.mu.Lock()
	defer cs.st.mu.Unlock()
	if cs.closed {
		return
	}
	cs.closed = true
	for _, c := range cs.live() {
		c.Close()
	}
	cs.st.pool.close()
	if cs.own {
		cs.arena.Close()
	}
}

// Closed reports whether Close was called.
func (cs *CacheState) Closed() bool {
	cs.st.mu.Lock()
	defer cs.st.mu.Unlock()
	return cs.closed
}

// State returns the runtime State the runs use (for releasing outputs).
func (cs *CacheState) State() *State { return cs.st }
