package runtime

import (
	"slices"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// TestRunNodes checks that the run loop's flat node array mirrors the plan's
// nodes (slots, kernel, flags) for the main plan of an exported-style
// decoder and for the plans of models built from spareModel and dimModel,
// so the loop reads what the nodes say.
func TestRunNodes(t *testing.T) {
	models := []struct {
		name  string
		model *onnxpb.ModelProto
	}{
		{"exported decoder", exportedDecoder(exportedConfig{layers: 2, hidden: 32, heads: 4, headDim: 8, vocab: 50}, 1)},
		{"spares", spareModel()},
		{"dimension reads", dimModel()},
	}
	for _, m := range models {
		t.Run(m.name, func(t *testing.T) {
			s, err := NewSessionFromBytes(onnxtest.Bytes(m.model), Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			p := s.Plan()
			if len(p.run) != len(p.Nodes) {
				t.Fatalf("%d run nodes for %d plan nodes", len(p.run), len(p.Nodes))
			}
			geometry := 0
			for i, n := range p.Nodes {
				r := &p.run[i]
				switch {
				case r.node != n:
					t.Fatalf("node %d: run node of another plan node", i)
				case !slices.Equal(r.in, n.in) || !slices.Equal(r.out, n.out) || !slices.Equal(r.gin, n.gin):
					t.Fatalf("node %s: slots differ", n.Name)
				case *(*[2]unsafe.Pointer)(unsafe.Pointer(&r.kernel)) != *(*[2]unsafe.Pointer)(unsafe.Pointer(&n.Kernel)) || // the same interface value (a KernelFunc is not comparable)
					r.geometry != n.geometry || r.keep != n.keep || r.castTo != n.castTo:
					t.Fatalf("node %s: kernel or flags differ", n.Name)
				case r.spares != (n.spareOut != nil) || r.captures != (len(n.Captures) > 0):
					t.Fatalf("node %s: spare or capture flags differ", n.Name)
				case n.geometry && int(r.shapeRead) != n.shapeRead:
					t.Fatalf("node %s: shape read %d, want %d", n.Name, r.shapeRead, n.shapeRead)
				case n.geometry && int(r.dimRead) != n.dimRead:
					t.Fatalf("node %s: dimension read %d, want %d", n.Name, r.dimRead, n.dimRead)
				case !slices.Equal(r.spareOut, n.spareOut) || r.viewsSpare != n.viewsSpare:
					t.Fatalf("node %s: spare outputs differ", n.Name)
				}
				if r.geometry {
					geometry++
				}
			}
			if geometry == 0 {
				t.Fatal("no geometry node: the model does not exercise the shape cache")
			}
			// The release schedule's actions, read back from the run nodes'
			// release lists, in order.
			if !p.linear {
				t.Fatal("the release schedule is not in its plain form")
			}
			var want, got []Action
			for _, a := range p.Actions {
				want = append(want, Action{Kind: a.Kind, Node: a.Node, slots: a.slots})
			}
			if len(p.startRel) > 0 {
				got = append(got, Action{Kind: ActRelease, slots: p.startRel})
			}
			for i := range p.run {
				got = append(got, Action{Kind: ActExecute, Node: i})
				if rel := p.run[i].rel; len(rel) > 0 {
					got = append(got, Action{Kind: ActRelease, slots: rel})
				}
			}
			if !slices.EqualFunc(got, want, func(a, b Action) bool {
				return a.Kind == b.Kind && a.Node == b.Node && slices.Equal(a.slots, b.slots)
			}) {
				t.Fatalf("run nodes' releases %v, want the actions %v", got, want)
			}
		})
	}
}

// TestRunNodeLayout: a run node is three cache lines long, the fields every
// visit reads (kernel, slots, releases, flags) in the first two.
func TestRunNodeLayout(t *testing.T) {
	var r runNode
	if size := unsafe.Sizeof(r); size != 192 {
		t.Errorf("runNode is %d bytes, want 192 (three cache lines)", size)
	}
	for name, end := range map[string]uintptr{
		"kernel": unsafe.Offsetof(r.kernel) + unsafe.Sizeof(r.kernel), "out": unsafe.Offsetof(r.out) + unsafe.Sizeof(r.out),
		"rel": unsafe.Offsetof(r.rel) + unsafe.Sizeof(r.rel), "castTo": unsafe.Offsetof(r.castTo) + unsafe.Sizeof(r.castTo),
		"captures": unsafe.Offsetof(r.captures) + 1,
	} {
		if end > 128 {
			t.Errorf("runNode.%s ends at byte %d, past the first two cache lines", name, end)
		}
	}
}

// TestPoolLookup finds issued buffers from their first byte and from bytes
// inside them (views with an offset), and nothing for other memory or
// after the run that issued them.
func TestPoolLookup(t *testing.T) {
	p := newBufferPool()
	p.beginRun()
	var bufs [][]byte
	for _, n := range []int{64, 100, 4096, 7, 70000, 64} {
		b, _, _ := p.Alloc(n)
		bufs = append(bufs, b)
	}
	other := make([]byte, 128)
	cases := []struct {
		name string
		ptr  *byte
		want *byte // the first byte of the buffer found, nil for none
	}{
		{"first issued", &bufs[0][0], &bufs[0][0]},
		{"last issued", &bufs[5][0], &bufs[5][0]},
		{"middle", &bufs[2][0], &bufs[2][0]},
		{"view inside", &bufs[4][1000], &bufs[4][0]},
		{"last byte", &bufs[1][len(bufs[1])-1], &bufs[1][0]},
		{"foreign", &other[0], nil},
	}
	for _, c := range cases {
		b := p.lookup(c.ptr)
		switch {
		case c.want == nil && b != nil:
			t.Errorf("%s: found a buffer", c.name)
		case c.want != nil && (b == nil || &b.data[0] != c.want):
			t.Errorf("%s: found %v, want the buffer at %p", c.name, b, unsafe.Pointer(c.want))
		}
	}
	// A buffer put back and issued again in the same run is found once more.
	pb := p.lookup(&bufs[3][0])
	p.put(pb)
	again, _, _ := p.Alloc(7)
	if got := p.lookup(&again[0]); got != pb {
		t.Errorf("reissued buffer: found %v, want %v", got, pb)
	}
	p.beginRun()
	if b := p.lookup(&bufs[2][0]); b != nil {
		t.Error("a buffer of the last run is found in the next")
	}
}
