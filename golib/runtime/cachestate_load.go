package runtime

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// LayerRows is one layer's K/V rows for CacheState.Load, as present
// tensors: K [Batch, KVHeads, n, HeadDimK] and V [Batch, KVHeads, n,
// HeadDimV] of one element type.
type LayerRows struct {
	K, V                        []byte
	KVHeads, HeadDimK, HeadDimV int
}

// Load appends n positions to every layer of the state from rows (one
// entry per layer slot, in slot order), converting from elem to the
// state's storage type, and advances the logical length by n: the
// inverse of exporting the presents, to continue on the cache path what
// the tensor path (ours or onnxruntime's) computed. Every sequence gets
// the n positions. The rows are stored as given (keys already rotated, as
// presents hold them). Where the graph does not declare a layer's K/V
// geometry and no run of the session has shown it yet, the rows' geometry
// is taken as given: a later run whose K/V differ from it fails on this
// state (ErrShape), not on others. Layers with window-sized buffers
// (rewrite.Layer.WindowBuffer) hold only the last positions in their
// presents and cannot be loaded (ErrNotImplemented). On error nothing
// changes.
func (cs *CacheState) Load(rows []LayerRows, elem cache.ElemType, n int) error {
	return cs.locked(func() error {
		if len(rows) != len(cs.caches) {
			return fmt.Errorf("%w: %d layers of rows for a state of %d layers", errs.ErrInvalidArgument, len(rows), len(cs.caches))
		}
		if n < 0 {
			return fmt.Errorf("%w: negative number of positions %d", errs.ErrInvalidArgument, n)
		}
		for slot, l := range cs.layers {
			if l.WindowBuffer > 0 {
				return fmt.Errorf("%w: layer %d keeps window-sized presents (sliding_window_cache=1): they hold only its last %d positions",
					errs.ErrNotImplemented, l.Index, l.WindowBuffer)
			}
			r, c := rows[slot], cs.caches[slot]
			// what the graph declares (each part on its own), or all three as
			// the graph or a run showed them
			geom := [3]int{l.KVHeads, l.HeadDimK, l.HeadDimV}
			if g := cs.sess.cache.geometry(slot); g[0] > 0 {
				geom = g
			}
			if c != nil {
				cfg := c.Config()
				geom = [3]int{cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV}
			}
			for i, g := range []int{r.KVHeads, r.HeadDimK, r.HeadDimV} {
				if geom[i] != 0 && geom[i] != g {
					return fmt.Errorf("%w: layer %d: rows of %d KV heads of %d/%d, the layer's cache has %v",
						errs.ErrShape, l.Index, r.KVHeads, r.HeadDimK, r.HeadDimV, geom)
				}
			}
		}
		if n == 0 {
			return nil
		}
		bind, end, err := cs.begin([]string{})
		if err != nil {
			return err
		}
		// caches this load creates take the rows' geometry, which no run
		// has confirmed: the session does not learn it (stateBinding.Cache),
		// and a failed load drops them again
		existed := make([]bool, len(cs.caches))
		for slot, c := range cs.caches {
			existed[slot] = c != nil
		}
		cs.loading = true
		defer func() { cs.loading = false }()
		for slot := range cs.caches {
			r := rows[slot]
			c, err := bind.Cache(slot, n, [3]int{r.KVHeads, r.HeadDimK, r.HeadDimV})
			if err == nil {
				err = c.Append(r.K, r.V, elem, n, nil)
			}
			if err != nil {
				e := end(false)
				for i, c := range cs.caches {
					if !existed[i] && c != nil {
						cs.dropCache(i)
					}
				}
				if e != nil {
					return fmt.Errorf("%w (restoring the state: %v)", err, e)
				}
				return err
			}
		}
		for slot, ok := range existed {
			if !ok {
				// created with the rows' geometry: unconfirmed unless the graph
				// or a run gave the same
				g := cs.sess.cache.geometry(slot)
				r := rows[slot]
				cs.unconfirmed[slot] = g != [3]int{r.KVHeads, r.HeadDimK, r.HeadDimV}
			}
		}
		cs.tokens = cs.tokens[:0] // positions without token ids: no registration until a reset
		return end(true)
	})
}
