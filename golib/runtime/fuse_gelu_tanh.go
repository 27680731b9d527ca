package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// matchGeluTanh fuses the tanh-approximated GELU that torch.onnx (dynamo
// and TorchScript) and optimum write for GPT-2's MLP (Hugging Face's
// gelu_new), once per layer:
//
//	p  = Pow(x, 3)
//	a  = Add(x, Mul(p, 0.044715))
//	t  = Tanh(Mul(a, sqrt(2/pi)))
//	y  = Mul(Mul(x, 0.5), Add(t, 1))      // any operand orders
//
// into one GeluTanhChain node (fused domain), eight nodes and their
// intermediate tensors fewer. Every constant must be a float32 scalar of
// rank 0 or 1; the kernel uses their values and computes, element by
// element, the chain's own float32 steps (the Pow, Mul, Add and Tanh
// kernels' functions, each result rounded to float32), so the output is
// bit-identical to the unfused graph's. An x that is not float32, or of a
// lower rank than a constant's (a rank-1 constant makes the chain's output
// of a scalar x [1]), runs the chain's own nodes. Every value inside the
// chain must have one reader and be neither a graph output nor captured.
func matchGeluTanh(fc *fuseContext, i int) (*PlanNode, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Mul" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, false
	}
	for k := range 2 {
		hv, a2v := n.Inputs[k], n.Inputs[1-k]
		if hv == a2v || !fc.internal(hv) || !fc.internal(a2v) {
			continue
		}
		hi, h, ok := fc.node(hv, "Mul")
		if !ok {
			continue
		}
		ai, a2, ok := fc.node(a2v, "Add")
		if !ok {
			continue
		}
		tv, one, r1, ok := fc.scalarOperand(a2)
		if !ok || !fc.internal(tv) {
			continue
		}
		ti, tn, ok := fc.node(tv, "Tanh")
		if !ok || len(tn.Inputs) != 1 || !fc.internal(tn.Inputs[0]) {
			continue
		}
		m2i, m2, ok := fc.node(tn.Inputs[0], "Mul")
		if !ok {
			continue
		}
		av, c2, r2, ok := fc.scalarOperand(m2)
		if !ok || !fc.internal(av) {
			continue
		}
		adi, ad, ok := fc.node(av, "Add")
		if !ok || len(ad.Inputs) != 2 {
			continue
		}
		for s := range 2 {
			x, m1v := ad.Inputs[s], ad.Inputs[1-s]
			if x == "" || x == m1v || !fc.internal(m1v) {
				continue
			}
			hx, half, r3, ok := fc.scalarOperand(h)
			if !ok || hx != x {
				continue
			}
			m1i, m1, ok := fc.node(m1v, "Mul")
			if !ok {
				continue
			}
			pv, c1, r4, ok := fc.scalarOperand(m1)
			if !ok || !fc.internal(pv) {
				continue
			}
			pi, pn, ok := fc.node(pv, "Pow")
			if !ok || len(pn.Inputs) != 2 || pn.Inputs[0] != x {
				continue
			}
			e, r5, ok := fc.f32Scalar(pn.Inputs[1])
			if !ok {
				continue
			}
			chain := []int{i, hi, ai, ti, m2i, adi, m1i, pi}
			k := &geluTanhChain{exp: e, c1: c1, c2: c2, one: one, half: half, rank: max(r1, r2, r3, r4, r5),
				chain: fc.chainRun(chain, []string{x})}
			return fc.plannedNode(n.Name, "GeluTanhChain", []string{x}, n.Outputs[0], k), chain, true
		}
	}
	return nil, nil, false
}

// scalarOperand returns the other operand of a two-input node one of whose
// inputs is a float32 scalar constant (rank 0 or 1), that constant's value
// and its rank.
func (fc *fuseContext) scalarOperand(n *PlanNode) (string, float32, int, bool) {
	if len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return "", 0, 0, false
	}
	for k := range 2 {
		if c, r, ok := fc.f32Scalar(n.Inputs[k]); ok && n.Inputs[1-k] != "" && n.Inputs[1-k] != n.Inputs[k] {
			return n.Inputs[1-k], c, r, true
		}
	}
	return "", 0, 0, false
}

// f32Scalar returns the value and the rank of v when it is a float32
// constant of one element and rank 0 or 1. A rank-1 one broadcasts a
// rank-0 operand to [1]: the fused kernel checks x's rank at run time.
func (fc *fuseContext) f32Scalar(v string) (float32, int, bool) {
	t, ok := fc.consts[v]
	if !ok || t.DType() != tensor.Float32 || t.Len() != 1 || t.Rank() > 1 {
		return 0, 0, false
	}
	return t.Float32()[0], t.Rank(), true
}

// geluTanhChain is GeluTanhChain's kernel: the chain's constants.
type geluTanhChain struct {
	exp, c1, c2, one, half float32
	rank                   int // the constants' largest rank: a lower-rank x broadcasts up to it
	chain                  *chainRun
}

// Compute runs the chain's float32 steps element by element, or the chain
// for other types and for an x the constants broadcast to a higher rank.
func (k *geluTanhChain) Compute(ctx *ops.Context) error {
	x := ctx.Input(0)
	if x == nil || x.DType() != tensor.Float32 || x.Rank() < k.rank {
		return k.chain.run(ctx)
	}
	out, err := ctx.NewOutputUninit(0, tensor.Float32, x.Shape())
	if err != nil {
		return err
	}
	dst, src := out.Float32(), x.Float32()
	for j, v := range src {
		a := float32(v + float32(ops.PowF32(v, k.exp)*k.c1))
		dst[j] = float32(a * k.c2)
	}
	mha.Tanh(dst, dst) // the Tanh kernel's function, over the same values
	for j, v := range src {
		dst[j] = float32(float32(v*k.half) * float32(dst[j]+k.one))
	}
	return nil
}
