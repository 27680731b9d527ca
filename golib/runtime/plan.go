package runtime

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// maxSubgraphDepth bounds nested control flow.
const maxSubgraphDepth = 16

// ActionKind is the kind of one step of an ExecutionPlan.
type ActionKind int

// Action kinds. The cache kinds are reserved for the cache-aware rewrite;
// plans built from standard graphs contain only ActExecute and ActRelease.
const (
	// ActExecute runs Nodes[Action.Node].
	ActExecute ActionKind = iota
	// ActRelease drops Action.Values from the context after their last use.
	ActRelease
	// ActCacheCreate creates the cache Action.Cache (reserved).
	ActCacheCreate
	// ActCacheDelete closes and removes the cache Action.Cache (reserved).
	ActCacheDelete
)

// String names the kind.
func (k ActionKind) String() string {
	return [...]string{"execute", "release", "cache-create", "cache-delete"}[k]
}

// ValueKind is the runtime type of a value in the plan, used by type-aware
// lookups (a cache value lives in the CacheMap, not the tensor store).
type ValueKind int

// Value kinds.
const (
	ValueTensor ValueKind = iota
	ValueSequence
	ValueMap
	ValueCache
)

// Action is one step of a plan.
type Action struct {
	Kind   ActionKind
	Node   int      // ActExecute: index into Plan.Nodes
	Values []string // ActRelease: values whose last use just happened
	Cache  string   // cache actions: cache name
	slots  []int32  // ActRelease: the slots of Values
}

// PlanNode is a node with its kernel resolved.
type PlanNode struct {
	Name    string
	OpType  string
	Domain  string
	Inputs  []string // "" for an omitted optional input
	Outputs []string // "" for an omitted optional output
	// Captures lists outer-scope values read by the node's subgraphs.
	Captures []string
	Kernel   ops.Kernel
	Info     *ops.Node
	// subgraphs is set when the node has graph attributes.
	subgraphs bool
	// in and out are the slots of Inputs and Outputs (-1: omitted).
	in, out []int32
	// Shape cache (shapecache.go): geometry nodes compute a function of
	// constants and input shapes only; keep is set when the cache may hold
	// their outputs; gin are the slots of their inputs made by geometry
	// nodes; shapeRead is the index of a Shape/Size node among the shape
	// reads, -1 otherwise.
	geometry bool
	keep     bool
	// castTo is the target type of a Cast node (Undefined otherwise): a
	// Cast whose input already has it passes the input through at run time.
	castTo    tensor.DType
	gin       []int32
	shapeRead int
	// dimRead is the shape read whose dimensions dims this node gathers
	// (Gather(Shape(x), constant indices)), -1 otherwise: it keeps its
	// outputs while those dimensions do, even when the shape changes.
	dimRead int
	dims    []int64
	// spareOut[k] is set when output k of a kept geometry node is read
	// only by inputs that copy it (no consumer's output can view its
	// buffer) and is no graph output: the shape cache may then write a
	// later run's value into the buffer of a replaced one.
	spareOut []bool
	// viewsSpare marks a kept geometry view of such an output: its kept
	// view is replaced whenever it is computed (see analyzeSpares).
	viewsSpare bool
}

// Plan is an ExecutionPlan: a graph's nodes in topological order with their
// kernels, and the actions that run them and release values after last use.
// It is immutable after Build and shared by every run.
type Plan struct {
	Nodes   []*PlanNode
	Actions []Action
	// linear: the run loop walks run alone, with the releases in
	// runNode.rel and startRel (compileRun).
	linear       bool
	startRel     []int32
	Inputs       []model.ValueInfo // formal inputs (initializer defaults excluded)
	Outputs      []model.ValueInfo
	Initializers map[string]*tensor.Tensor
	// Captures lists values the graph reads from an enclosing scope.
	Captures []string
	kinds    map[string]ValueKind
	// defaults are graph inputs that have an initializer (optional feeds),
	// with their declarations, which a feed of one must match.
	defaults map[string]*model.ValueInfo
	// Slots (slots.go): slots maps value names to slots; base holds the
	// initializers by slot; outSlots and captureSlots are the slots of
	// Outputs and Captures.
	slots        map[string]int32
	base         []*tensor.Tensor
	outSlots     []int32
	captureSlots []int32
	// geom describes the shape reads of a main plan (shapecache.go).
	geom geometryInfo
	// main is set for the plan of a model's main graph.
	main bool
	// run holds, by node index, what the run loop reads of each node
	// (runnodes.go).
	run []runNode
}

// Kind returns the runtime kind of a value (ValueTensor if unknown).
func (p *Plan) Kind(name string) ValueKind { return p.kinds[name] }

// builder carries the state shared by a graph and its subgraphs.
type builder struct {
	opsets map[string]int
	depth  int
	// noFold disables folding and the shape cache (Options.DisableFolding).
	noFold bool
	// packs is given to every node's factory (ops.Node.Packs).
	packs *ops.Packs
	// declared caches each graph's declaredTypes.
	declared map[*model.Graph]map[string]tensor.DType
}

// BuildPlan builds the plan of a loaded model's main graph, folded (see
// fold.go).
func BuildPlan(m *model.Model) (*Plan, error) { return buildPlan(m, true, nil) }

// buildPlan builds m's plan, folded when fold is set, the factories sharing
// packs (nil: none) with the other plans built with it.
func buildPlan(m *model.Model, fold bool, packs *ops.Packs) (*Plan, error) {
	if errsReg := ops.RegistryErrors(); len(errsReg) > 0 {
		return nil, fmt.Errorf("op registry is inconsistent: %v", errsReg[0])
	}
	b := &builder{opsets: m.Opsets, noFold: !fold, packs: packs}
	return b.build(m.Graph, nil)
}

// build plans g; outer names the values visible from enclosing graphs (nil
// for the main graph).
func (b *builder) build(g *model.Graph, outer map[string]bool) (*Plan, error) {
	p := &Plan{Initializers: g.Initializers, Outputs: g.Outputs, kinds: map[string]ValueKind{}, defaults: map[string]*model.ValueInfo{}}
	avail := map[string]bool{}
	for name := range g.Initializers {
		avail[name] = true
	}
	for _, in := range g.Inputs {
		if _, ok := g.Initializers[in.Name]; ok {
			decl := in
			p.defaults[in.Name] = &decl
		} else {
			p.Inputs = append(p.Inputs, in)
		}
		avail[in.Name] = true
		switch in.Kind {
		case model.KindSequence:
			p.kinds[in.Name] = ValueSequence
		case model.KindMap:
			p.kinds[in.Name] = ValueMap
		}
	}
	// Subgraphs see every name of this graph plus the enclosing ones;
	// computed once, on the first graph attribute.
	var scope map[string]bool
	scopeFn := func() map[string]bool {
		if scope == nil {
			scope = map[string]bool{}
			for k := range outer {
				scope[k] = true
			}
			for k := range avail {
				scope[k] = true
			}
			for _, n := range g.Nodes {
				for _, o := range n.GetOutput() {
					if o != "" {
						scope[o] = true
					}
				}
			}
		}
		return scope
	}
	nodes := make([]*PlanNode, len(g.Nodes))
	for i, np := range g.Nodes {
		pn, err := b.node(g, np, scopeFn)
		if err != nil {
			return nil, err
		}
		nodes[i] = pn
	}
	order, captures, err := topoOrder(nodes, avail, outer)
	if err != nil {
		return nil, err
	}
	p.Captures = captures
	for _, i := range order {
		p.Nodes = append(p.Nodes, nodes[i])
	}
	produced := map[string]bool{}
	if outer == nil && !b.noFold {
		if err := foldPlan(p, g); err != nil {
			return nil, err
		}
		if err := b.fusePlan(p, g); err != nil {
			return nil, err
		}
		dedupPlan(p, g)
	}
	for _, n := range p.Nodes {
		for _, o := range n.Outputs {
			if o != "" {
				produced[o] = true
			}
		}
	}
	for _, o := range g.Outputs {
		if !produced[o.Name] && !avail[o.Name] && !(outer != nil && outer[o.Name]) {
			return nil, fmt.Errorf("%w: graph output %q is never produced", errs.ErrInvalidModel, o.Name)
		}
	}
	p.Actions = releaseSchedule(p, g)
	p.resolveSlots()
	if outer == nil && !b.noFold {
		p.main = true
		p.analyzeGeometry()
	}
	p.compileRun()
	return p, nil
}

// node resolves one node's kernel and checks its inputs' names.
func (b *builder) node(g *model.Graph, np *onnxpb.NodeProto, scope func() map[string]bool) (*PlanNode, error) {
	domain := ops.NormDomain(np.GetDomain())
	opset, ok := b.opsets[domain]
	if domain == ops.FusedDomain {
		opset, ok = 1, true // the fusions' own ops (fuse.go)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s uses domain %q, which the model does not import", errs.ErrInvalidModel, np.GetOpType(), domain)
	}
	pn := &PlanNode{Name: np.GetName(), OpType: np.GetOpType(), Domain: domain, Inputs: np.GetInput(), Outputs: np.GetOutput()}
	if !slices.ContainsFunc(pn.Outputs, func(o string) bool { return o != "" }) {
		// Every ONNX op has at least one output; a node without one computes nothing.
		return nil, withNode(pn, fmt.Errorf("%w: the node declares no outputs", errs.ErrInvalidModel))
	}
	info := &ops.Node{Name: pn.Name, OpType: pn.OpType, Domain: domain, Opset: opset,
		NumInputs: len(pn.Inputs), NumOutputs: len(pn.Outputs),
		InputPresent: make([]bool, len(pn.Inputs)), OutputPresent: make([]bool, len(pn.Outputs)),
		Constants: make([]*tensor.Tensor, len(pn.Inputs)), InputTypes: make([]tensor.DType, len(pn.Inputs)), Packs: b.packs}
	declared := b.declaredTypes(g)
	for i, in := range pn.Inputs {
		info.InputPresent[i] = in != ""
		if t, ok := g.Initializers[in]; ok && !isOverridable(g, in) {
			info.Constants[i] = t
		}
		info.InputTypes[i] = declared[in] // Undefined when not declared
	}
	for i, o := range pn.Outputs {
		info.OutputPresent[i] = o != ""
	}
	factory, err := ops.Lookup(domain, pn.OpType, opset)
	if err != nil {
		return nil, withNode(pn, err)
	}
	var captures []string
	attrs, err := convertAttrs(np, func(name string, gp *onnxpb.GraphProto) (ops.Subgraph, error) {
		if b.depth >= maxSubgraphDepth {
			return nil, fmt.Errorf("%w: subgraphs nested deeper than %d", errs.ErrLimit, maxSubgraphDepth)
		}
		sg, err := g.Subgraph(gp)
		if err != nil {
			return nil, err
		}
		b.depth++
		sp, err := b.build(sg, scope())
		b.depth--
		if err != nil {
			return nil, err
		}
		captures = append(captures, sp.Captures...)
		pn.subgraphs = true
		return &subgraph{plan: sp}, nil
	})
	if err != nil {
		return nil, withNode(pn, err)
	}
	info.Attrs = attrs
	pn.Captures = dedup(captures)
	pn.Info = info
	k, err := factory(info)
	if err != nil {
		return nil, withNode(pn, err)
	}
	pn.Kernel = k
	return pn, nil
}

// declaredTypes returns the element types g declares for its values (made
// once per graph): an initializer's (a graph input's declaration must
// agree with it, see model.Graph), else a graph input's, value_info's or a
// graph output's, in that order of precedence. A value g declares no type
// the runtime supports for (a value of an enclosing graph, an untyped
// declaration) is absent. The factories check the types their kernels
// compute against them (ops.Node.InputType).
func (b *builder) declaredTypes(g *model.Graph) map[string]tensor.DType {
	if m, ok := b.declared[g]; ok {
		return m
	}
	m := map[string]tensor.DType{}
	add := func(vi model.ValueInfo) {
		if vi.Kind == model.KindTensor && vi.DType.Valid() {
			m[vi.Name] = vi.DType
		} else {
			delete(m, vi.Name) // an untyped declaration of higher precedence
		}
	}
	for _, vi := range g.Outputs {
		add(vi)
	}
	for _, vi := range g.ValueInfos {
		add(vi)
	}
	for _, vi := range g.Inputs {
		add(vi)
	}
	for name, t := range g.Initializers {
		m[name] = t.DType()
	}
	if b.declared == nil {
		b.declared = map[*model.Graph]map[string]tensor.DType{}
	}
	b.declared[g] = m
	return m
}

// isOverridable reports whether an initializer is also a graph input (then
// a feed may replace it and it is not a constant).
func isOverridable(g *model.Graph, name string) bool {
	for _, in := range g.Inputs {
		if in.Name == name {
			return true
		}
	}
	return false
}

func withNode(pn *PlanNode, err error) error {
	d := pn.Domain
	if d == "" {
		d = "ai.onnx"
	}
	if pn.Name != "" {
		return fmt.Errorf("node %q (%s, domain %s): %w", pn.Name, pn.OpType, d, err)
	}
	return fmt.Errorf("node %s (domain %s): %w", pn.OpType, d, err)
}

func dedup(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	sort.Strings(s)
	out := s[:1]
	for _, v := range s[1:] {
		if v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}

// topoOrder sorts nodes (Kahn's algorithm, stable in file order). Inputs
// that are neither available, produced, nor in outer are errors; names
// found only in outer are returned as captures.
func topoOrder(nodes []*PlanNode, avail, outer map[string]bool) ([]int, []string, error) {
	producer := map[string]int{}
	for i, n := range nodes {
		for _, o := range n.Outputs {
			if o == "" {
				continue
			}
			if _, dup := producer[o]; dup || avail[o] {
				return nil, nil, fmt.Errorf("%w: value %q is produced twice (SSA violation)", errs.ErrInvalidModel, o)
			}
			producer[o] = i
		}
	}
	indeg := make([]int, len(nodes))
	users := make([][]int, len(nodes))
	var captures []string
	for i, n := range nodes {
		deps := append(append([]string{}, n.Inputs...), n.Captures...)
		seen := map[int]bool{}
		for _, in := range deps {
			if in == "" || avail[in] {
				continue
			}
			p, ok := producer[in]
			if !ok {
				if outer != nil && outer[in] {
					captures = append(captures, in)
					continue
				}
				return nil, nil, withNode(n, fmt.Errorf("%w: input %q is not a graph input, initializer or node output", errs.ErrInvalidModel, in))
			}
			if !seen[p] {
				seen[p] = true
				indeg[i]++
				users[p] = append(users[p], i)
			}
		}
	}
	var order, ready []int
	for i := range nodes {
		if indeg[i] == 0 {
			ready = append(ready, i)
		}
	}
	for len(ready) > 0 {
		sort.Ints(ready) // keep file order among ready nodes
		i := ready[0]
		ready = ready[1:]
		order = append(order, i)
		for _, u := range users[i] {
			if indeg[u]--; indeg[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	if len(order) != len(nodes) {
		var stuck []string
		for i, d := range indeg {
			if d > 0 && len(stuck) < 5 {
				stuck = append(stuck, fmt.Sprintf("%s(%s)", nodes[i].OpType, nodes[i].Name))
			}
		}
		return nil, nil, fmt.Errorf("%w: nodes never become ready: %s", errs.ErrCycle, strings.Join(stuck, ", "))
	}
	return order, dedup(captures), nil
}

// eachConstant calls f for every constant of p (initializers, folded
// constants, nodes' constant inputs and tensor attributes) and of its
// nodes' subgraphs, a tensor possibly more than once. A nil p has none.
func (p *Plan) eachConstant(f func(*tensor.Tensor)) {
	if p == nil {
		return
	}
	for _, t := range p.Initializers {
		f(t)
	}
	for _, n := range p.Nodes {
		if n.Info == nil {
			continue
		}
		for _, t := range n.Info.Constants {
			if t != nil {
				f(t)
			}
		}
		for _, a := range n.Info.Attrs {
			if a.T != nil {
				f(a.T)
			}
			if sg, ok := a.G.(*subgraph); ok {
				sg.plan.eachConstant(f)
			}
		}
	}
}
