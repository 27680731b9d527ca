package runtime

import (
	"fmt"
	"maps"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/rewrite"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// cachePath is a session's cache-aware plan: the rewrite's verdict per
// layer and, when every layer was rewritten, the plan runs on a
// CacheState use. The session's own plan (the tensor path) is untouched.
type cachePath struct {
	layers []rewrite.Layer
	plan   *Plan // nil: the model runs on the tensor path only
	// presentSlot maps present output names to layer slots; pasts lists
	// the past inputs a state run must not be fed.
	presentSlot map[string]int
	pasts       map[string]bool
	elem        tensor.DType // the pasts' declared element type

	prefixMu sync.Mutex
	prefixes *cache.PrefixStore // shared prompt prefixes of paged states (prefix.go); nil until first used

	// geomMu guards learned: the cache geometry (KV heads, K and V head
	// dims) a run found for a layer slot whose graph does not declare it,
	// so that states created later create that layer's cache at once.
	geomMu  sync.Mutex
	learned map[int][3]int
}

// geometry returns a layer slot's cache geometry: the graph's, else the one
// an earlier run learned (zeros when neither is known yet).
func (cp *cachePath) geometry(slot int) [3]int {
	l := cp.layers[slot]
	if l.KVHeads > 0 && l.HeadDimK > 0 && l.HeadDimV > 0 {
		return [3]int{l.KVHeads, l.HeadDimK, l.HeadDimV}
	}
	cp.geomMu.Lock()
	defer cp.geomMu.Unlock()
	return cp.learned[slot]
}

// learn records the geometry a run created a layer slot's cache with.
func (cp *cachePath) learn(slot int, geom [3]int) {
	cp.geomMu.Lock()
	defer cp.geomMu.Unlock()
	if cp.learned == nil {
		cp.learned = map[int][3]int{}
	}
	cp.learned[slot] = geom
}

// newCachePath rewrites m's main graph (a copy: m is not changed) and
// plans the result, its factories sharing packs with the tensor path's
// plan. A rewrite whose plan fails to build keeps the model on the tensor
// path, with the error as every layer's reason.
func newCachePath(m *model.Model, pairs map[string]string, packs *ops.Packs) (*cachePath, error) {
	res, err := rewrite.Rewrite(m.Graph, m.Opsets, rewrite.Options{Pairs: pairs})
	if err != nil {
		return nil, err
	}
	cp := &cachePath{layers: res.Layers, presentSlot: map[string]int{}, pasts: map[string]bool{}}
	for _, l := range res.Layers {
		cp.pasts[l.PastKey], cp.pasts[l.PastValue] = true, true
	}
	for _, in := range m.Graph.Inputs {
		if cp.pasts[in.Name] && cp.elem == tensor.Undefined {
			cp.elem = in.DType
		}
	}
	if !res.Rewritten() {
		return cp, nil
	}
	if _, ok := rewrite.ElemOf(cp.elem); !ok && cp.elem != tensor.Undefined {
		// the cache kernel reads float32, float16 and bfloat16 Q, K and V only
		cp.keepOnTensorPath(fmt.Sprintf("the pasts are %v: the cache path runs float32, float16 and bfloat16 attention", cp.elem))
		return cp, nil
	}
	rm := *m
	rm.Graph = res.Graph
	rm.Opsets = maps.Clone(m.Opsets)
	rm.Opsets[rewrite.Domain] = rewrite.Version
	p, err := buildPlan(&rm, true, packs)
	if err != nil {
		cp.keepOnTensorPath(fmt.Sprintf("the rewritten graph does not plan: %v", err))
		return cp, nil
	}
	cp.plan = p
	for _, l := range cp.layers {
		cp.presentSlot[l.PresentKey], cp.presentSlot[l.PresentValue] = l.Slot, l.Slot
	}
	return cp, nil
}

// keepOnTensorPath marks every layer not rewritten, for reason.
func (cp *cachePath) keepOnTensorPath(reason string) {
	for i := range cp.layers {
		cp.layers[i].Rewritten, cp.layers[i].Slot, cp.layers[i].Reason = false, -1, reason
	}
}

// CachePlan returns the cache rewrite's verdict for every past/present
// pair of the model, in layer order (empty for a model without pasts).
func (s *Session) CachePlan() []rewrite.Layer { return append([]rewrite.Layer(nil), s.cache.layers...) }

// CacheRewritten reports whether the model runs on generation states
// (every layer rewritten).
func (s *Session) CacheRewritten() bool { return s.cache.plan != nil }
