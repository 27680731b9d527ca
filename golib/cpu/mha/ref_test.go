package mha

import "math"

// reference is the naive float64 model of the semantics in the package
// comment, written independently of unit.go: full 4D tensors, one (b, h, i)
// row at a time, no blocking, no column limits.
func reference(g *Geometry, in Inputs) (y, pk, pv, qk []float64) {
	B, Hq, Hkv, S, T := g.Batch, g.QHeads, g.KVHeads, g.QLen, g.TotalLen
	dk, dv, P, L := g.HeadDimK, g.HeadDimV, g.PastLen, g.KVLen
	qAt := func(b, h, i, d int) float64 {
		if g.Input3D {
			return float64(in.Q[(b*S+i)*Hq*dk+h*dk+d])
		}
		return float64(in.Q[((b*Hq+h)*S+i)*dk+d])
	}
	kvAt := func(past, cur []float32, dim, b, h, j, d int) float64 {
		if j < P {
			return float64(past[((b*Hkv+h)*P+j)*dim+d])
		}
		j -= P
		if g.Input3D {
			return float64(cur[(b*L+j)*Hkv*dim+h*dim+d])
		}
		return float64(cur[((b*Hkv+h)*L+j)*dim+d])
	}
	pk = make([]float64, B*Hkv*T*dk)
	pv = make([]float64, B*Hkv*T*dv)
	for b := range B {
		for h := range Hkv {
			for j := range T {
				for d := range dk {
					pk[((b*Hkv+h)*T+j)*dk+d] = kvAt(in.PastKey, in.K, dk, b, h, j, d)
				}
				for d := range dv {
					pv[((b*Hkv+h)*T+j)*dv+d] = kvAt(in.PastValue, in.V, dv, b, h, j, d)
				}
			}
		}
	}
	y = make([]float64, B*Hq*S*dv)
	qk = make([]float64, B*Hq*S*T)
	low := -math.MaxFloat32
	if g.InfMasking {
		low = math.Inf(-1)
	}
	for b := range B {
		for h := range Hq {
			kh := h * Hkv / Hq
			for i := range S {
				sc := make([]float64, T)
				out := make([]float64, T)
				for j := range T {
					var dot float64
					for d := range dk {
						dot += qAt(b, h, i, d) * pk[((b*Hkv+kh)*T+j)*dk+d]
					}
					s := dot * float64(g.Scale)
					if g.QKMode == 0 {
						out[j] = s
					}
					if g.Softcap > 0 {
						s = float64(g.Softcap) * math.Tanh(s/float64(g.Softcap))
					}
					if g.QKMode == 1 {
						out[j] = s
					}
					allowed := true
					if g.HasMask {
						md := g.maskDims
						mb, mh, mi := b%md[0], h%md[1], i%md[2]
						if j >= md[3] {
							if in.Mask.Float != nil {
								s = math.Inf(-1)
							} else {
								allowed = false
							}
						} else {
							idx := ((mb*md[1]+mh)*md[2]+mi)*md[3] + j
							if in.Mask.Float != nil {
								s += float64(in.Mask.Float[idx])
							} else if !in.Mask.Bool[idx] {
								allowed = false
							}
						}
					}
					offset := P
					if g.HasNonpad {
						n := int(in.NonpadKVSeqlen[b])
						offset = n - S
						if j >= n {
							allowed = false
						}
					}
					if g.IsCausal && j > i+offset {
						allowed = false
					}
					if g.SlidingWindow {
						p := i + offset
						if (g.LeftWindow >= 0 && j < p-g.LeftWindow) || (g.RightWindow >= 0 && j > p+g.RightWindow) {
							allowed = false
						}
					}
					if !allowed {
						s = low
					}
					sc[j] = s
					if g.QKMode == 2 {
						out[j] = s
					}
				}
				mx := math.Inf(-1)
				for _, s := range sc {
					mx = math.Max(mx, s)
				}
				var sum, sink float64
				if g.SmoothSoftmax { // one more logit that takes weight only
					if in.HeadSink != nil {
						sink = float64(in.HeadSink[h])
					}
					mx = math.Max(mx, sink)
					sum = math.Exp(sink - mx)
				}
				for j, s := range sc {
					if mx <= low && !g.SmoothSoftmax {
						sc[j] = 0
						continue
					}
					sc[j] = math.Exp(s - mx)
					sum += sc[j]
				}
				for j := range sc {
					if sum > 0 {
						sc[j] /= sum
					}
					if g.QKMode == 3 {
						out[j] = sc[j]
					}
				}
				copy(qk[((b*Hq+h)*S+i)*T:], out)
				for d := range dv {
					var acc float64
					for j := range T {
						acc += sc[j] * pv[((b*Hkv+kh)*T+j)*dv+d]
					}
					if g.Input3D {
						y[(b*S+i)*Hq*dv+h*dv+d] = acc
					} else {
						y[((b*Hq+h)*S+i)*dv+d] = acc
					}
				}
			}
		}
	}
	return y, pk, pv, qk
}
