package mha

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// setPaths selects an instruction-set path for the products (gemm) and for
// the streaming engine (cpu's kernels, which switch gemm too), so the
// engine runs on every path the products do; a path cpu does not have
// sets gemm alone.
func setPaths(path string) {
	if cpu.SetKernel(path) != nil {
		gemm.SetPath(path)
	}
}

// TestPresentViewSegments: without present buffers the view's segments
// point into the inputs themselves (the past's rows, then the new rows,
// split at the past length, nothing copied); with present buffers a
// request copies exactly its positions into them and returns a segment of
// the buffers.
func TestPresentViewSegments(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const B, H, P, L, dk, dv = 2, 3, 7, 2, 4, 5
	g, err := Plan(Attrs{IsCausal: true}, Shapes{
		Q: []int{B, 6, L, dk}, K: []int{B, H, L, dk}, V: []int{B, H, L, dv},
		PastKey: []int{B, H, P, dk}, PastValue: []int{B, H, P, dv}})
	if err != nil {
		t.Fatal(err)
	}
	in := Inputs{Q: randVec(r, B*6*L*dk), K: randVec(r, B*H*L*dk), V: randVec(r, B*H*L*dv),
		PastKey: randVec(r, B*H*P*dk), PastValue: randVec(r, B*H*P*dv)}
	addr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
	faddr := func(f []float32) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(f))) }
	v := &presentView{g: g, past: in.PastKey, pastV: in.PastValue, cur: in.K, curV: in.V}
	if v.SegmentChunk() != 0 || v.SeqLen(1) != P+L || v.WindowStart(0) != 0 || v.ElemType() != cache.Float32 {
		t.Fatalf("zero-copy view: chunk %d, len %d", v.SegmentChunk(), v.SeqLen(1))
	}
	for _, c := range []struct{ b, h, from, to int }{{0, 0, 0, P + L}, {1, 2, 3, P}, {1, 1, P, P + L}, {0, 2, P - 1, P + 1}, {1, 0, 4, 4}} {
		segs := v.AppendSegments(nil, c.b, c.h, c.from, c.to)
		pos := c.from
		for _, sg := range segs {
			if sg.Start != pos || sg.Len <= 0 || len(sg.K) != 4*sg.Len*dk || len(sg.V) != 4*sg.Len*dv {
				t.Fatalf("%+v: segment start %d len %d (%d/%d bytes), want start %d", c, sg.Start, sg.Len, len(sg.K), len(sg.V), pos)
			}
			bh := c.b*H + c.h
			wantK, wantV := faddr(in.PastKey[(bh*P+pos)*dk:]), faddr(in.PastValue[(bh*P+pos)*dv:])
			if pos >= P {
				wantK, wantV = faddr(in.K[(bh*L+pos-P)*dk:]), faddr(in.V[(bh*L+pos-P)*dv:])
			} else if pos+sg.Len > P {
				t.Fatalf("%+v: a segment crosses the past's end", c)
			}
			if addr(sg.K) != wantK || addr(sg.V) != wantV {
				t.Fatalf("%+v: segment at %d does not point into the input", c, pos)
			}
			pos += sg.Len
		}
		if pos != c.to {
			t.Fatalf("%+v: segments end at %d", c, pos)
		}
	}

	pk, pv := nanVec(B*H*(P+L)*dk), nanVec(B*H*(P+L)*dv)
	v.keys, v.values = pk, pv
	if v.SegmentChunk() != copyBlock {
		t.Fatalf("copying view: chunk %d", v.SegmentChunk())
	}
	segs := v.AppendSegments(nil, 1, 2, P-2, P+1)
	bh := 1*H + 2
	if len(segs) != 1 || segs[0].Start != P-2 || segs[0].Len != 3 || addr(segs[0].K) != faddr(pk[(bh*(P+L)+P-2)*dk:]) {
		t.Fatalf("copying view: segments %+v", segs)
	}
	_, wk, _, _ := reference(g, in)
	for i, x := range pk {
		pos := (i / dk) % (P + L)
		written := i/(dk*(P+L)) == bh && pos >= P-2 && pos < P+1
		if written != (x == x) || written && float64(x) != wk[i] {
			t.Fatalf("present_key[%d] (position %d) = %v, written %v, want %v", i, pos, x, written, wk[i])
		}
	}
}

// TestEngineGrid runs the calls streamMath accepts (on the streaming engine
// of package cpu) over a grid of layouts, GQA groups, query lengths (up to
// cpu.MaxQLen in one call, and prefills in tiles), head dims, pasts and
// wanted presents against the float64 reference.
func TestEngineGrid(t *testing.T) {
	type geo struct {
		b, hq, hkv, s, p, dk, dv int
		in3D, causal             bool
		softcap                  float32
	}
	var grid []geo
	for _, hd := range [][2]int{{8, 2}, {4, 4}, {6, 1}} {
		for _, s := range []int{1, 3, 16} {
			for _, p := range []int{0, 1, 300} {
				for _, in3D := range []bool{false, true} {
					grid = append(grid, geo{2, hd[0], hd[1], s, p, 64, 64, in3D, s > 1 || p%2 == 1, 0})
				}
			}
		}
	}
	grid = append(grid, geo{1, 4, 2, 2, 33, 16, 24, false, true, 0}, geo{3, 2, 1, 1, 129, 128, 8, true, false, 0},
		// prefill: tiles of cpu.MaxQLen query rows
		geo{2, 8, 2, 40, 0, 32, 32, false, true, 0}, geo{1, 4, 4, 37, 20, 64, 16, true, true, 0}, geo{2, 6, 1, 100, 3, 16, 16, false, true, 0},
		// softcap
		geo{2, 4, 2, 1, 300, 64, 64, false, false, 1.5}, geo{1, 4, 2, 24, 7, 32, 32, true, true, 20},
		// no causal rule, several query tokens (one call, and tiles)
		geo{2, 4, 2, 5, 9, 32, 32, false, false, 0}, geo{1, 6, 3, 30, 2, 16, 16, true, false, 0})
	for gi, c := range grid {
		choices := []string{"none", "both", "key"}
		if gi%3 != 0 {
			choices = choices[gi%3 : gi%3+1] // each shape with one choice, every third with all
		}
		for _, presents := range choices {
			name := fmt.Sprintf("%+v/%s", c, presents)
			r := rand.New(rand.NewPCG(uint64(gi), 11))
			sh := Shapes{Q: []int{c.b, c.hq, c.s, c.dk}, K: []int{c.b, c.hkv, c.s, c.dk}, V: []int{c.b, c.hkv, c.s, c.dv}}
			a := Attrs{IsCausal: c.causal, Softcap: c.softcap}
			if c.in3D {
				sh = Shapes{Q: []int{c.b, c.s, c.hq * c.dk}, K: []int{c.b, c.s, c.hkv * c.dk}, V: []int{c.b, c.s, c.hkv * c.dv}}
				a.QNumHeads, a.KVNumHeads = c.hq, c.hkv
			}
			if c.p > 0 {
				sh.PastKey, sh.PastValue = []int{c.b, c.hkv, c.p, c.dk}, []int{c.b, c.hkv, c.p, c.dv}
			}
			g, err := Plan(a, sh)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V))}
			if c.p > 0 {
				in.PastKey, in.PastValue = randVec(r, prod(sh.PastKey)), randVec(r, prod(sh.PastValue))
			}
			out := Outputs{Y: nanVec(prod(g.YShape))}
			if presents != "none" {
				out.PresentKey = nanVec(prod(g.PresentKeyShape))
			}
			if presents == "both" {
				out.PresentValue = nanVec(prod(g.PresentValueShape))
			}
			if !g.streamMath(out) {
				t.Fatalf("%s: not on the engine", name)
			}
			if err := g.Run(in, out); err != nil {
				t.Fatalf("%s: Run: %v", name, err)
			}
			y, pk, pv, _ := reference(g, in)
			t.Run(name, func(t *testing.T) {
				near(t, "Y", out.Y, y)
				if out.PresentKey != nil {
					near(t, "present_key", out.PresentKey, pk)
				}
				if out.PresentValue != nil {
					near(t, "present_value", out.PresentValue, pv)
				}
			})
		}
	}
}

// TestEngineMasks: attn_mask on the streaming engine (read alongside K as
// a cpu.Mask) against the float64 reference: bool and float masks, full
// and broadcast shapes, short masks, -Inf and -MaxFloat32 (padding as
// exporters write it, whose sums with negative scores leave the float32
// range) and fully masked rows, on decode steps, a multi-token causal step
// and a causal prefill over tiles. Only fully masked rows may take the
// float64 path.
func TestEngineMasks(t *testing.T) {
	type geo struct{ b, hq, hkv, s, p, dk int }
	const low = -math.MaxFloat32
	kinds := []string{"bool", "bool-row-false", "float", "float-inf", "float-lowest"}
	for gi, c := range []geo{{2, 8, 2, 1, 300, 64}, {2, 4, 4, 1, 33, 16}, {1, 4, 2, 3, 40, 32}, {2, 4, 1, 21, 6, 16}} {
		T := c.p + c.s
		for _, mshape := range [][]int{{c.b, c.hq, c.s, T}, {c.b, 1, c.s, T}, {c.s, T}, {T}, {c.b, 1, 1, T - 5}} {
			for _, kind := range kinds {
				name := fmt.Sprintf("%+v/mask%v/%s", c, mshape, kind)
				r := rand.New(rand.NewPCG(uint64(gi), uint64(len(mshape))))
				sh := Shapes{Q: []int{c.b, c.hq, c.s, c.dk}, K: []int{c.b, c.hkv, c.s, c.dk}, V: []int{c.b, c.hkv, c.s, c.dk},
					PastKey: []int{c.b, c.hkv, c.p, c.dk}, PastValue: []int{c.b, c.hkv, c.p, c.dk}, Mask: mshape}
				g, err := Plan(Attrs{IsCausal: c.s > 1}, sh)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V)),
					PastKey: randVec(r, prod(sh.PastKey)), PastValue: randVec(r, prod(sh.PastValue))}
				n, last := prod(mshape), mshape[len(mshape)-1]
				fullyMasked := false
				switch kind {
				case "bool", "bool-row-false":
					in.Mask.Bool = make([]bool, n)
					for i := range n {
						in.Mask.Bool[i] = r.IntN(3) != 0
					}
					if kind == "bool-row-false" {
						for i := range last { // the first mask row: fully masked
							in.Mask.Bool[i] = false
						}
						fullyMasked = true
					}
				default:
					in.Mask.Float = randVec(r, n)
					for i := range n {
						switch {
						case kind == "float-inf" && i%last < 3:
							in.Mask.Float[i] = float32(math.Inf(-1))
						case kind == "float-lowest" && i%last >= last-4:
							in.Mask.Float[i] = low
						}
					}
				}
				out := Outputs{Y: nanVec(prod(g.YShape)), PresentKey: nanVec(prod(g.PresentKeyShape)),
					PresentValue: nanVec(prod(g.PresentValueShape))}
				if !g.streamMath(out) {
					t.Fatalf("%s: not on the engine", name)
				}
				before := exactRows.Load()
				if err := g.Run(in, out); err != nil {
					t.Fatalf("%s: Run: %v", name, err)
				}
				if k := exactRows.Load() - before; k != 0 && !fullyMasked {
					t.Errorf("%s: %d rows took the float64 path", name, k)
				}
				y, pk, pv, _ := reference(g, in)
				t.Run(name, func(t *testing.T) {
					near(t, "Y", out.Y, y)
					near(t, "present_key", out.PresentKey, pk)
					near(t, "present_value", out.PresentValue, pv)
				})
			}
		}
	}
}

// TestEngineNonpad: nonpad_kv_seqlen on the streaming engine (each
// sequence's length) against the float64 reference, causal and one-token
// steps, presents wanted or not, and a NaN in the padding's V rows (which
// the definition spreads to every row of the head: the engine checks the
// rows it does not read); a sequence shorter than the query keeps the
// general unit.
func TestEngineNonpad(t *testing.T) {
	for ci, c := range []struct {
		b, hq, hkv, s, l int
		causal, present  bool
		nonpad           []int64
		poison           int // >= 0: V element set to NaN
	}{
		{2, 4, 2, 1, 40, false, false, []int64{17, 40}, -1},
		{2, 4, 2, 3, 40, true, true, []int64{3, 29}, -1},
		{1, 8, 2, 20, 50, true, false, []int64{33}, -1},
		{2, 4, 1, 2, 40, true, false, []int64{10, 40}, 39 * 16},
		{2, 4, 1, 2, 40, true, true, []int64{10, 40}, 39 * 16},
	} {
		name := fmt.Sprintf("%+v", c)
		r := rand.New(rand.NewPCG(uint64(ci), 3))
		sh := Shapes{Q: []int{c.b, c.hq, c.s, 16}, K: []int{c.b, c.hkv, c.l, 16}, V: []int{c.b, c.hkv, c.l, 16},
			NonpadKVSeqlen: []int{c.b}}
		g, err := Plan(Attrs{IsCausal: c.causal}, sh)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V)), NonpadKVSeqlen: c.nonpad}
		if c.poison >= 0 {
			in.V[c.poison] = float32(math.NaN())
		}
		out := Outputs{Y: nanVec(prod(g.YShape))}
		if c.present {
			out.PresentKey, out.PresentValue = nanVec(prod(g.PresentKeyShape)), nanVec(prod(g.PresentValueShape))
		}
		if !g.streamMath(out) || !g.nonpadFits(in) {
			t.Fatalf("%s: not on the engine", name)
		}
		if err := g.Run(in, out); err != nil {
			t.Fatalf("%s: Run: %v", name, err)
		}
		y, pk, pv, _ := reference(g, in)
		for i := range y {
			if !sameAsReference(out.Y[i], y[i]) {
				t.Fatalf("%s: Y[%d] = %v, reference %v", name, i, out.Y[i], y[i])
			}
		}
		if c.present {
			near(t, name+" present_key", out.PresentKey, pk)
			for i := range pv {
				if !sameAsReference(out.PresentValue[i], pv[i]) {
					t.Fatalf("%s: present_value[%d] = %v, want %v", name, i, out.PresentValue[i], pv[i])
				}
			}
		}
	}
	g, err := Plan(Attrs{IsCausal: true}, Shapes{Q: []int{1, 2, 3, 8}, K: []int{1, 2, 5, 8}, V: []int{1, 2, 5, 8}, NonpadKVSeqlen: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	if g.nonpadFits(Inputs{NonpadKVSeqlen: []int64{2}}) {
		t.Error("nonpad length 2 < q_len 3 fits the engine")
	}
}
