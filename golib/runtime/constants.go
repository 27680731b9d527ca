package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// minReleaseBytes is the size from which releaseConstants lets go of a
// constant's values: smaller ones are not worth a mapping's page.
const minReleaseBytes = 64 << 10

// releaseConstants lets go of the values of the constants (initializers,
// folded constants) of a session's plans that no kernel will read again:
// those whose every reader is a node input its kernel declared packed
// (ops.Node.Packed: a MatMul or Gemm weight, read through its pack; a
// MatMulNBits weight with its scales and zero points), and
// those nobody reads any more once folding replaced them (a weight only a
// folded Transpose read). Before, a session held each packed weight twice
// (as stored and packed), as onnxruntime does not: it drops an
// initializer its kernels prepacked. A constant that is a graph output, a
// graph input's default, read by a subgraph (a capture) or read by any
// other input stays. The tensors keep their headers (type, shape) and
// point into a shared read-only zero mapping (tensor.ReleaseStorage); the
// collector frees the values. It returns the bytes released.
func releaseConstants(g *model.Graph, plans ...*Plan) int64 {
	const packedOnly, raw = 1, 2
	uses := map[*tensor.Tensor]int{}
	for _, p := range plans {
		if p == nil {
			continue
		}
		for _, t := range p.Initializers {
			uses[t] |= 0
		}
		for _, o := range p.Outputs {
			if t, ok := p.Initializers[o.Name]; ok {
				uses[t] |= raw
			}
		}
		for _, n := range p.Nodes {
			for i, in := range n.Inputs {
				t, ok := p.Initializers[in]
				if !ok {
					continue
				}
				if n.Info != nil && i < len(n.Info.Packed) && n.Info.Packed[i] && n.Info.Constants[i] == t {
					uses[t] |= packedOnly
				} else {
					uses[t] |= raw
				}
			}
			for _, c := range n.Captures {
				if t, ok := p.Initializers[c]; ok {
					uses[t] |= raw
				}
			}
		}
	}
	for _, in := range g.Inputs { // a default the caller may replace is read as given
		if t, ok := g.Initializers[in.Name]; ok {
			uses[t] |= raw
		}
	}
	var n int64
	for t, u := range uses {
		if u&raw != 0 || t.NumBytes() < minReleaseBytes {
			continue
		}
		b := int64(t.NumBytes())
		if t.ReleaseStorage() {
			n += b
		}
	}
	return n
}
