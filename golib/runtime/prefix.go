package runtime

import (
	"fmt"
	"slices"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
)

// prefixInput is the feed whose token ids key the prefix store.
const prefixInput = "input_ids"

// prefixPositionInputs are the feeds that place the tokens: a run whose
// positions do not continue the state's length (prev, prev+1, ...) holds
// K/V its token ids alone do not determine, and is not registered.
var prefixPositionInputs = map[string]bool{"position_ids": true, "cache_position": true}

// prefixMaskInput is the feed whose zeros mark left padding: the caches
// store no padding, so a run with any does not hold the K/V of its ids.
const prefixMaskInput = "attention_mask"

// intFeed reads an integer feed into the state's scratch (nil when it
// is not an integer tensor): one reading rule, tensor.Int64ValuesTo, and
// no allocation per run once the scratch has grown.
func (cs *CacheState) intFeed(t *tensor.Tensor) []int64 {
	if cap(cs.ints) < t.Len() {
		cs.ints = make([]int64, t.Len())
	}
	v, err := tensor.Int64ValuesTo(cs.ints[:t.Len()], t)
	if err != nil {
		return nil
	}
	return v
}

// noPadding reports whether a mask feed has no zero (nil: no such feed).
func (cs *CacheState) noPadding(mask *tensor.Tensor) bool {
	if mask == nil {
		return true
	}
	if b := mask.Bool(); b != nil {
		return !slices.Contains(b, false)
	}
	v := cs.intFeed(mask)
	return v != nil && !slices.Contains(v, 0)
}

// positionsContinue reports whether a batch-1 position feed holds
// prev, prev+1, ..., prev+n-1 for the n new tokens (nil: no such feed).
func (cs *CacheState) positionsContinue(pos *tensor.Tensor, prev, n int) bool {
	if pos == nil {
		return true
	}
	v := cs.intFeed(pos)
	if v == nil || len(v) != n {
		return false
	}
	for i, p := range v {
		if p != int64(prev+i) {
			return false
		}
	}
	return true
}

// enablePrefixes checks a prefix-cache state's configuration and creates
// the session's prefix store on first use; unreferenced registered blocks
// are evicted (LRU) when an append finds the session arena's budget full.
func (s *Session) enablePrefixes(cfg StateConfig) error {
	switch {
	case cfg.Layout != cache.Paged:
		return fmt.Errorf("%w: prefix_cache needs layout=\"paged\"", errs.ErrInvalidArgument)
	case cfg.Quant.Enabled():
		return fmt.Errorf("%w: prefix_cache with a quantized cache", errs.ErrNotImplemented)
	case cfg.Budget > 0:
		return fmt.Errorf("%w: prefix_cache shares blocks through the session's arena: a state budget of its own is not supported", errs.ErrInvalidArgument)
	case cfg.PrefixMaxBytes < 0:
		return fmt.Errorf("%w: negative prefix cache cap %d", errs.ErrInvalidArgument, cfg.PrefixMaxBytes)
	}
	cp := s.cache
	cp.prefixMu.Lock()
	store := cp.prefixes
	if store == nil {
		store = cache.NewPrefixStore()
		// without a cap the registered blocks of every distinct prompt would stay until
		// the arena's budget (none by default) ran out
		store.SetMaxBytes(sysmem.Available() / 4)
		cp.prefixes = store
		s.arena.SetReclaimer(store.EvictOne)
	}
	cp.prefixMu.Unlock()
	if cfg.PrefixMaxBytes > 0 {
		store.SetMaxBytes(cfg.PrefixMaxBytes)
	}
	return nil
}

// prefixStore returns the session's prefix store (nil when no state asked
// for one).
func (cp *cachePath) prefixStore() *cache.PrefixStore {
	cp.prefixMu.Lock()
	defer cp.prefixMu.Unlock()
	return cp.prefixes
}

// closePrefixes releases every registered block (session close).
func (cp *cachePath) closePrefixes() {
	if p := cp.prefixStore(); p != nil {
		p.Close()
	}
}

// registerPrefix records the token ids of a successful run of sg's feeds
// (positions prev..length-1) and registers the state's full blocks. Only
// batch-1 states whose every position came with an input_ids feed, at
// positions counting on from the state's length (the run's position_ids
// and cache_position feeds) and without padding (its attention_mask feed),
// register; any other run, and a Select, Adopt or Load (rows whose ids the
// state does not hold), stops the state's registration until it is reset.
func (cs *CacheState) registerPrefix(prev int, sg *Signature, feeds []*tensor.Tensor) {
	feed := func(i int) *tensor.Tensor {
		if i >= 0 && i < len(feeds) {
			return feeds[i]
		}
		return nil
	}
	store := cs.sess.cache.prefixStore()
	ids := feed(sg.tokens)
	ok := ids != nil && cs.noPadding(feed(sg.mask))
	for _, i := range sg.positions {
		ok = ok && cs.positionsContinue(feed(i), prev, cs.length-prev)
	}
	caches := cs.live()
	if prev == 0 {
		cs.tokens = cs.tokens[:0] // a new sequence (first run, reset)
	}
	if len(cs.tokens) > prev {
		cs.tokens = cs.tokens[:prev] // truncated since
	}
	if store == nil || !ok || ids.DType() != tensor.Int64 || cs.cfg.Batch != 1 || len(caches) == 0 || len(caches) != len(cs.caches) ||
		len(cs.tokens) != prev || prev+ids.Len() != cs.length {
		cs.tokens = cs.tokens[:0] // out of step (until the state is reset)
		return
	}
	for _, c := range caches {
		// rows stored for every position, none for padding: a mask input of
		// another name (not checked above) can leave fewer rows than
		// positions, at other offsets than the ids'
		if c.SeqLen(0) != cs.length {
			cs.tokens = cs.tokens[:0]
			return
		}
	}
	cs.tokens = append(cs.tokens, ids.Int64()...)
	if bs := caches[0].Config().BlockSize; prev/bs == cs.length/bs {
		return // no block was completed by this run
	}
	_ = store.Register(caches, cs.tokens) // best effort: a refusal only means no sharing
}

// ReusePrefix attaches to the empty state the longest prefix of tokens
// that the session's prefix store holds (whole blocks, leaving at least the
// last token to be run, so the next run yields its logits) and returns the
// tokens covered: the state's length becomes that and the caller runs only
// tokens[n:]. 0 means nothing was attached.
func (cs *CacheState) ReusePrefix(tokens []int64) (int, error) {
	var n int
	err := cs.locked(func() error {
		if !cs.cfg.PrefixCache {
			return fmt.Errorf("%w: reuse_prefix needs a state created with prefix_cache=True", errs.ErrInvalidArgument)
		}
		if cs.length != 0 {
			return fmt.Errorf("%w: reuse_prefix needs an empty state (length %d)", errs.ErrInvalidArgument, cs.length)
		}
		if err := cs.ensureCaches(); err != nil {
			return err
		}
		caches := cs.live()
		store := cs.sess.cache.prefixStore()
		if store == nil || len(caches) != len(cs.caches) || len(tokens) < 2 {
			return nil
		}
		var err error
		if n, err = store.Attach(caches, tokens, len(tokens)-1); err != nil {
			return err
		}
		cs.length = n
		cs.tokens = append(cs.tokens[:0], tokens[:n]...)
		clear(cs.cks)
		return nil
	})
	return n, err
}

// PrefixStats returns the session's prefix-store figures (zero when no
// state uses one).
func (s *Session) PrefixStats() cache.PrefixStats {
	if p := s.cache.prefixStore(); p != nil {
		return p.Stats()
	}
	return cache.PrefixStats{}
}

// PrefixCache reports whether the state shares prompt prefixes.
func (cs *CacheState) PrefixCache() bool { return cs.cfg.PrefixCache }

// Session returns the session the state belongs to.
func (cs *CacheState) Session() *Session { return cs.sess }
