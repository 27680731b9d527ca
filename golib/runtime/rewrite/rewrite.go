// Package rewrite is the cache-aware rewrite: at session creation it finds
// the loop-carried past -> present pairs of a decoder graph and, layer by
// layer, replaces the nodes that read the past and produce the present with
// internal ops that append the new tokens to a persistent KVCache and run
// attention over it in place (see Binding). Each pattern is a named Rule
// with its own legality check, whose reason string says why a layer stays
// on the tensor path. The model as loaded is never modified: Rewrite
// returns a new graph that shares the original's initializers.
package rewrite

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// Domain is the op domain of the rewritten nodes; models cannot use it.
const Domain = "ai.onnx_light_kv.cache"

// Version is the opset version of Domain.
const Version = 1

// Layer is one past/present pair of a graph and what the rewrite did with
// it (one row of InferenceSession.cache_plan()).
type Layer struct {
	// Index is the layer number (from the names, else the pair's position).
	Index                    int
	PastKey, PastValue       string
	PresentKey, PresentValue string
	// Rewritten is true when the layer runs on a KVCache; Rule names the
	// rule that rewrote it.
	Rewritten bool
	Rule      string
	// Reason says why the layer stays on the tensor path (empty when
	// rewritten).
	Reason string
	// Slot is the layer's cache index in a state (-1 when not rewritten).
	Slot int
	// KVHeads, HeadDimK and HeadDimV are the cache geometry the graph
	// declares for the past (0 when not fixed: taken from the first run).
	KVHeads, HeadDimK, HeadDimV int
	// WindowBuffer is the positions of a window-sized present buffer
	// (GroupQueryAttention with sliding_window_cache=1: its
	// local_window_size): presents of such a layer hold each sequence's
	// last min(length, WindowBuffer) positions from row 0 (KVCache.ExportTail),
	// the buffer onnxruntime-genai keeps; 0: presents hold every position.
	WindowBuffer int
}

// Result is the outcome of Rewrite.
type Result struct {
	// Layers lists every pair found, in layer order.
	Layers []Layer
	// Graph is the rewritten graph (nil when no layer was rewritten): past
	// inputs removed, the matched nodes replaced, presents still declared
	// as outputs (the rewritten nodes export them only when asked).
	Graph *model.Graph
}

// Rewritten reports whether every layer was rewritten (the condition for
// running the model on a state).
func (r *Result) Rewritten() bool {
	if r.Graph == nil || len(r.Layers) == 0 {
		return false
	}
	for _, l := range r.Layers {
		if !l.Rewritten {
			return false
		}
	}
	return true
}

// Options tune the rewrite.
type Options struct {
	// Pairs maps past input names to present output names, for models whose
	// names follow no exporter convention. Pairs not listed are found by
	// name, then by position.
	Pairs map[string]string
}

// Rewrite analyses g (a main graph with its opset imports) and rewrites the
// layers the rules accept. A layer is rewritten only if every layer is:
// a state holds no tensor pasts, so one refused layer keeps the whole model
// on the tensor path (each refused layer says why, the others name it).
func Rewrite(g *model.Graph, opsets map[string]int, opt Options) (*Result, error) {
	pairs, err := findPairs(g, opt.Pairs)
	if err != nil {
		return nil, err
	}
	res := &Result{}
	if len(pairs) == 0 {
		return res, nil
	}
	ix := newIndex(g, opsets)
	var edits []*edit
	var refused []string
	for _, p := range pairs {
		l := Layer{Index: p.index, PastKey: p.pastK, PastValue: p.pastV, PresentKey: p.presK, PresentValue: p.presV, Slot: -1}
		l.KVHeads, l.HeadDimK = ix.fixedDims(p.pastK)
		_, l.HeadDimV = ix.fixedDims(p.pastV)
		if p.reason != "" {
			l.Reason = p.reason
		} else {
			var reasons []string
			for _, r := range rules {
				e, why := r.Match(ix, p)
				if e != nil {
					e.layer = len(res.Layers)
					l.Rule, l.WindowBuffer = r.Name(), e.windowBuffer
					edits = append(edits, e)
					break
				}
				reasons = append(reasons, r.Name()+": "+why)
			}
			if l.Rule == "" {
				l.Reason = strings.Join(reasons, "; ")
			}
		}
		if l.Rule == "" {
			refused = append(refused, strconv.Itoa(l.Index))
		}
		res.Layers = append(res.Layers, l)
	}
	if len(refused) > 0 {
		for i := range res.Layers {
			if res.Layers[i].Rule != "" {
				res.Layers[i].Reason = fmt.Sprintf("matched rule %s, but layer(s) %s stay on the tensor path, so the model does",
					res.Layers[i].Rule, strings.Join(refused, ", "))
				res.Layers[i].Rule = ""
			}
		}
		return res, nil
	}
	for i := range res.Layers {
		res.Layers[i].Rewritten, res.Layers[i].Slot = true, i
	}
	res.Graph = apply(g, edits)
	return res, nil
}

// pair is one past/present pair of a layer before matching.
type pair struct {
	index        int
	pastK, pastV string
	presK, presV string
	reason       string // set when the pair is incomplete
}

var (
	pastName    = regexp.MustCompile(`^past(?:_key_values)?[._](\d+)[._](key|value)$`)
	presentName = regexp.MustCompile(`^present(?:_key_values)?[._](\d+)[._](key|value)$`)
)

// findPairs pairs past inputs with present outputs: first the caller's
// map, then exporters' names (past_key_values.N.key <-> present.N.key),
// then the remaining "past*" inputs and "present*" outputs by position.
func findPairs(g *model.Graph, given map[string]string) ([]*pair, error) {
	inputs := map[string]bool{}
	for _, in := range g.Inputs {
		if _, init := g.Initializers[in.Name]; !init {
			inputs[in.Name] = true
		}
	}
	outputs := map[string]bool{}
	for _, o := range g.Outputs {
		outputs[o.Name] = true
	}
	toPresent := map[string]string{}
	for past, pres := range given {
		if !inputs[past] {
			return nil, fmt.Errorf("rewrite: pair map names %q, which is not a graph input", past)
		}
		if !outputs[pres] {
			return nil, fmt.Errorf("rewrite: pair map names %q, which is not a graph output", pres)
		}
		toPresent[past] = pres
	}
	type kv struct{ k, v string }
	pasts := map[int]*kv{}
	presents := map[int]*kv{}
	var pastOrder, presOrder []string
	for _, in := range g.Inputs {
		if !inputs[in.Name] {
			continue
		}
		if _, ok := toPresent[in.Name]; ok {
			continue
		}
		if m := pastName.FindStringSubmatch(in.Name); m != nil {
			n, _ := strconv.Atoi(m[1])
			if pasts[n] == nil {
				pasts[n] = &kv{}
			}
			if m[2] == "key" {
				pasts[n].k = in.Name
			} else {
				pasts[n].v = in.Name
			}
		} else if strings.HasPrefix(strings.ToLower(in.Name), "past") {
			pastOrder = append(pastOrder, in.Name)
		}
	}
	for _, o := range g.Outputs {
		if m := presentName.FindStringSubmatch(o.Name); m != nil {
			n, _ := strconv.Atoi(m[1])
			if presents[n] == nil {
				presents[n] = &kv{}
			}
			if m[2] == "key" {
				presents[n].k = o.Name
			} else {
				presents[n].v = o.Name
			}
		} else if strings.HasPrefix(strings.ToLower(o.Name), "present") {
			presOrder = append(presOrder, o.Name)
		}
	}
	for n, p := range pasts {
		if q := presents[n]; q != nil {
			if p.k != "" && q.k != "" {
				toPresent[p.k] = q.k
			}
			if p.v != "" && q.v != "" {
				toPresent[p.v] = q.v
			}
		}
	}
	if len(pastOrder) == len(presOrder) {
		for i := range pastOrder {
			toPresent[pastOrder[i]] = presOrder[i]
		}
	}
	// Layers: the pasts in input order, key then value of one layer.
	var out []*pair
	seen := map[string]bool{}
	for _, in := range g.Inputs {
		name := in.Name
		pres, ok := toPresent[name]
		if !ok || seen[name] {
			continue
		}
		p := &pair{index: len(out)}
		if m := pastName.FindStringSubmatch(name); m != nil {
			p.index, _ = strconv.Atoi(m[1])
			twin := strings.TrimSuffix(name, m[2])
			if m[2] == "key" {
				p.pastK, p.presK = name, pres
				p.pastV = twin + "value"
				p.presV = toPresent[p.pastV]
			} else {
				p.pastV, p.presV = name, pres
				p.pastK = twin + "key"
				p.presK = toPresent[p.pastK]
			}
		} else {
			// by position: this input is the key, the next paired one the value
			p.pastK, p.presK = name, pres
			for _, in2 := range g.Inputs {
				if n2 := in2.Name; n2 != name && !seen[n2] && toPresent[n2] != "" && positionAfter(g, name, n2) {
					p.pastV, p.presV = n2, toPresent[n2]
					break
				}
			}
		}
		if p.presK == "" || p.presV == "" || !inputs[p.pastK] || !inputs[p.pastV] {
			p.reason = "the layer's key and value pasts are not both paired with presents"
		}
		seen[p.pastK], seen[p.pastV] = true, true
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].index < out[j].index })
	return out, nil
}

// positionAfter reports whether input b comes after input a.
func positionAfter(g *model.Graph, a, b string) bool {
	ia, ib := -1, -1
	for i, in := range g.Inputs {
		switch in.Name {
		case a:
			ia = i
		case b:
			ib = i
		}
	}
	return ia >= 0 && ib > ia
}

// edit is a rule's replacement for one layer: nodes to drop (by index in
// the original graph) and nodes to insert in the first dropped one's place.
type edit struct {
	layer  int
	drop   []int
	insert []*onnxpb.NodeProto
	pastK  string // the layer's pasts: removed from the graph inputs
	pastV  string
	presK  string // the layer's presents: Shape/Size of them read the state
	presV  string
	kNew   string // the new keys (their sequence axis is the step's length)
	// windowBuffer is Layer.WindowBuffer.
	windowBuffer int
	// replace maps node indices to nodes standing in for them (Shape of
	// an expanded K/V).
	replace map[int]*onnxpb.NodeProto
}

// apply builds the rewritten graph: g's nodes with the edits applied,
// Shape/Size nodes of removed pasts turned into CacheShape nodes, and the
// removed pasts dropped from the inputs.
func apply(g *model.Graph, edits []*edit) *model.Graph {
	drop := map[int]bool{}
	at := map[int][]*onnxpb.NodeProto{}
	repl := map[int]*onnxpb.NodeProto{}
	gone := map[string]pastRef{} // removed past -> its layer and side
	for _, e := range edits {
		first := e.drop[0]
		for _, d := range e.drop {
			drop[d] = true
			first = min(first, d)
		}
		for _, n := range e.insert {
			setLayer(n, e.layer)
		}
		for i, n := range e.replace {
			setLayer(n, e.layer)
			repl[i] = n
		}
		at[first] = append(at[first], e.insert...)
		gone[e.pastK] = pastRef{layer: e.layer}
		gone[e.pastV] = pastRef{layer: e.layer, value: true}
		gone[e.presK] = pastRef{layer: e.layer, present: e.kNew}
		gone[e.presV] = pastRef{layer: e.layer, value: true, present: e.kNew}
	}
	var nodes []*onnxpb.NodeProto
	for i, n := range g.Nodes {
		if ins, ok := at[i]; ok {
			nodes = append(nodes, ins...)
		}
		if drop[i] {
			continue
		}
		if r, ok := repl[i]; ok {
			nodes = append(nodes, r)
			continue
		}
		if ref, ok := gone[firstInput(n)]; ok && isShapeOnly(n) {
			nodes = append(nodes, shapeNode(n, ref))
			continue
		}
		nodes = append(nodes, n)
	}
	out := *g
	outputs := map[string]bool{}
	for _, o := range g.Outputs {
		outputs[o.Name] = true
	}
	out.Nodes = prune(nodes, outputs)
	out.Inputs = nil
	for _, in := range g.Inputs {
		if ref, ok := gone[in.Name]; !ok || ref.present != "" {
			out.Inputs = append(out.Inputs, in)
		}
	}
	return &out
}

// pastRef names the cache a removed past (or a present) stands for.
type pastRef struct {
	layer   int
	value   bool
	present string // for a present: the new keys of the step
}

func firstInput(n *onnxpb.NodeProto) string {
	if len(n.GetInput()) == 0 {
		return ""
	}
	return inputName(n, 0)
}

// inputName returns node n's input i, "" when n has no such input (a
// malformed node: the matchers read it as a non-match instead of indexing
// past the inputs; the op's own checks report it when it runs).
func inputName(n *onnxpb.NodeProto, i int) string {
	if in := n.GetInput(); i < len(in) {
		return in[i]
	}
	return ""
}
