package runtime

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"

// releaseSchedule interleaves ActExecute actions with ActRelease actions
// that drop each intermediate value right after its last use, so a run's
// peak memory follows the live set instead of growing with the graph.
// Graph outputs, initializers and captured outer values are never released;
// a value nobody reads is released right after the node that made it.
func releaseSchedule(p *Plan, g *model.Graph) []Action {
	keep := map[string]bool{}
	for _, o := range g.Outputs {
		keep[o.Name] = true
	}
	for name := range p.Initializers {
		keep[name] = true
	}
	for _, c := range p.Captures {
		keep[c] = true
	}
	last := map[string]int{}
	for _, in := range p.Inputs {
		last[in.Name] = -1
	}
	for i, n := range p.Nodes {
		for _, in := range n.Inputs {
			if in != "" {
				last[in] = i
			}
		}
		for _, c := range n.Captures {
			last[c] = i
		}
		for _, o := range n.Outputs {
			if _, seen := last[o]; o != "" && !seen {
				last[o] = i
			}
		}
	}
	after := make([][]string, len(p.Nodes))
	var atStart []string
	for name, i := range last {
		if keep[name] {
			continue
		}
		if i < 0 {
			atStart = append(atStart, name) // a graph input nobody reads
			continue
		}
		after[i] = append(after[i], name)
	}
	var acts []Action
	if len(atStart) > 0 {
		acts = append(acts, Action{Kind: ActRelease, Values: dedup(atStart)})
	}
	for i := range p.Nodes {
		acts = append(acts, Action{Kind: ActExecute, Node: i})
		if len(after[i]) > 0 {
			acts = append(acts, Action{Kind: ActRelease, Values: dedup(after[i])})
		}
	}
	return acts
}
