package runtime

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// Duplicate shape arithmetic (dedupPlan): the exporters repeat the same
// small computations, the TorchScript exports reading Shape(present) four
// times per layer, once per Gather of a dimension. After folding and
// fusion, a shape-arithmetic node computing what an earlier kept node
// computes (same op, opset, attributes, and the same inputs: the same
// values, or constants of equal value) is dropped, its readers reading the
// earlier node's outputs. Only deterministic default-domain ops of the
// shape-arithmetic set are merged, never nodes with subgraphs or whose
// outputs are graph outputs or captured by subgraphs (on either side).

// dedupOps are the ops dedupPlan merges.
var dedupOps = map[string]bool{"Shape": true, "Size": true, "Gather": true, "Unsqueeze": true, "Squeeze": true,
	"Concat": true, "Cast": true, "Add": true, "Sub": true, "Mul": true, "Div": true, "Equal": true,
	"Less": true, "Greater": true, "LessOrEqual": true, "GreaterOrEqual": true, "And": true, "Or": true, "Not": true,
	"Where": true, "Range": true, "Slice": true, "ConstantOfShape": true, "Reshape": true}

// maxDedupConstBytes bounds the constants compared by value in a node's key.
const maxDedupConstBytes = 64

// dedupPlan merges p's duplicate shape-arithmetic nodes (see above) and
// returns how many it dropped.
func dedupPlan(p *Plan, g *model.Graph) int {
	fixed := map[string]bool{} // graph outputs and captured values
	for _, o := range g.Outputs {
		fixed[o.Name] = true
	}
	for _, n := range p.Nodes {
		for _, c := range n.Captures {
			fixed[c] = true
		}
	}
	seen := map[string]*PlanNode{}
	rename := map[string]string{}
	kept := p.Nodes[:0]
	dropped := 0
	for _, n := range p.Nodes {
		renameInputs(n, rename)
		key, ok := dedupKey(p, g, n, fixed)
		if !ok {
			kept = append(kept, n)
			continue
		}
		if lead, dup := seen[key]; dup {
			for k, o := range n.Outputs {
				if o != "" {
					rename[o] = lead.Outputs[k]
				}
			}
			dropped++
			continue
		}
		seen[key] = n
		kept = append(kept, n)
	}
	clear(p.Nodes[len(kept):])
	p.Nodes = kept
	return dropped
}

// dedupKey describes what n computes; ok is false when n may not be merged.
func dedupKey(p *Plan, g *model.Graph, n *PlanNode, fixed map[string]bool) (string, bool) {
	if n.Domain != "" || !dedupOps[n.OpType] || !pure(n) {
		return "", false
	}
	for _, o := range n.Outputs {
		if o == "" || fixed[o] {
			return "", false
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%d", n.OpType, n.Info.Opset)
	for _, in := range n.Inputs {
		if t, ok := p.Initializers[in]; ok && t.NumBytes() <= maxDedupConstBytes && !isOverridable(g, in) {
			fmt.Fprintf(&b, "|c%d%v%x", t.DType(), t.Shape(), t.Bytes())
		} else {
			fmt.Fprintf(&b, "|v%q", in)
		}
	}
	b.WriteString("|")
	if !attrsKey(&b, n.Info.Attrs) {
		return "", false
	}
	fmt.Fprintf(&b, "|%d", len(n.Outputs))
	return b.String(), true
}

// attrsKey writes attrs in a canonical form; false when one cannot be
// compared (a graph or tensor attribute).
func attrsKey(b *strings.Builder, attrs ops.Attributes) bool {
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a := attrs[name]
		if a.G != nil || a.T != nil {
			return false
		}
		floats := make([]uint32, len(a.Floats))
		for i, f := range a.Floats {
			floats[i] = math.Float32bits(f)
		}
		fmt.Fprintf(b, "%q:%d:%x:%d:%q:%v:%v:%q;", name, a.Type, math.Float32bits(a.F), a.I, a.S, a.Ints, floats, a.Strings)
	}
	return true
}
