package mha

// reference is the naive float64 model of the semantics in the package
// comment: the present keys and values assembled as full 4D tensors
// independently of run.go, then exactRow (the function the float32 units
// fall back to for rows that meet a non-finite value) on every (b, h, i)
// row, no blocking, no column limits.
func reference(g *Geometry, in Inputs) (y, pk, pv, qk []float64) {
	B, Hq, Hkv, S, T := g.Batch, g.QHeads, g.KVHeads, g.QLen, g.TotalLen
	dk, dv, P, L := g.HeadDimK, g.HeadDimV, g.PastLen, g.KVLen
	kvAt := func(past, cur []float32, dim, b, h, j, d int) float32 {
		if j < P {
			return past[((b*Hkv+h)*P+j)*dim+d]
		}
		j -= P
		if g.Input3D {
			return cur[(b*L+j)*Hkv*dim+h*dim+d]
		}
		return cur[((b*Hkv+h)*L+j)*dim+d]
	}
	keys := make([]float32, B*Hkv*T*dk)
	values := make([]float32, B*Hkv*T*dv)
	for b := range B {
		for h := range Hkv {
			for j := range T {
				for d := range dk {
					keys[((b*Hkv+h)*T+j)*dk+d] = kvAt(in.PastKey, in.K, dk, b, h, j, d)
				}
				for d := range dv {
					values[((b*Hkv+h)*T+j)*dv+d] = kvAt(in.PastValue, in.V, dv, b, h, j, d)
				}
			}
		}
	}
	pk, pv = make([]float64, len(keys)), make([]float64, len(values))
	for i, x := range keys {
		pk[i] = float64(x)
	}
	for i, x := range values {
		pv[i] = float64(x)
	}
	y = make([]float64, B*Hq*S*dv)
	qk = make([]float64, B*Hq*S*T)
	for b := range B {
		for h := range Hq {
			for i := range S {
				yr, qr := g.exactRow(in, keys, values, b, h, i)
				copy(qk[((b*Hq+h)*S+i)*T:], qr)
				if g.Input3D {
					copy(y[(b*S+i)*Hq*dv+h*dv:], yr)
				} else {
					copy(y[((b*Hq+h)*S+i)*dv:], yr)
				}
			}
		}
	}
	return y, pk, pv, qk
}
