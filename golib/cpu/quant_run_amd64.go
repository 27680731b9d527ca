//go:build goexperiment.simd && amd64

package cpu

import (
	"sync/atomic"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Call lists: the VNNI score and accumulation loops of a whole super-block
// in one assembly call each (qcalls, quant_run_amd64.s), instead of a chain
// of Go calls per chunk. The list holds the very calls the multi-call path
// (intScores, vaxpy4VNNI) makes, with the same arguments, in the same
// order, so the results are bit-identical; what goes is the Go between
// them. The argument words are addresses of heap memory (the unit's
// buffers, the pool's unitState, the cache's rows), which does not move;
// the list lives only for the one call.

// Routine numbers of qcalls.
const (
	qcDots4i8 = iota
	qcDots4i4
	qcWMax
	qcWMax2
	qcWQuant
	qcWQuant2
	qcVAxpy4i8
	qcVAxpy4i4
	qcPrefetch
	qcInvScale
	// qcVPart is vaxpy4VNNI over one part in assembly: the weight maxima,
	// the steps (qcInvScale), the rounding and the column blocks; words
	// p, ldP, vs, n, vz, v rows, row bytes, first-block prefetch distance,
	// alpha, acc, head dim, groups a row (2 or 4), int4, the vScratch.
	qcVPart
)

// qcalls' qcVPart reads the vScratch at these offsets: w's data pointer,
// mx, inv, sc, zt.
var _ = [1]struct{}{}[unsafe.Offsetof(vScratch{}.mx)-24]
var _ = [1]struct{}{}[unsafe.Offsetof(vScratch{}.inv)-40]
var _ = [1]struct{}{}[unsafe.Offsetof(vScratch{}.sc)-56]
var _ = [1]struct{}{}[unsafe.Offsetof(vScratch{}.zt)-72]

//go:noescape
func qcalls(c *qcall, n int)

func up[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

func uw(i int) uintptr { return uintptr(i) }

// next returns the next entry of qb's list (its words are what the last
// list left: set every word the routine reads).
func (qb *quantBlock) next(fn uintptr) *qcall {
	if len(qb.calls) == cap(qb.calls) {
		qb.calls = append(qb.calls, qcall{})
	} else {
		qb.calls = qb.calls[:len(qb.calls)+1]
	}
	c := &qb.calls[len(qb.calls)-1]
	c.fn = fn
	return c
}

// quantCallRuns counts the call lists run (TestQuantCallLists checks that
// its grid takes them).
var quantCallRuns atomic.Int64

// runCalls runs and empties qb's list.
func (qb *quantBlock) runCalls() {
	if len(qb.calls) > 0 {
		qcalls(&qb.calls[0], len(qb.calls))
		quantCallRuns.Add(1)
	}
	qb.calls = qb.calls[:0]
}

// dotsRunVNNI is quantOps.dotsRun: dots for four rows when every part of
// the super-block takes the integer score loop; false (nothing done)
// otherwise.
func dotsRunVNNI(qb *quantBlock, sc []float32, r, a, e, dk, pf int) bool {
	for i := range qb.parts {
		if p := &qb.parts[i]; !p.intOn || p.bad {
			return false
		}
	}
	if len(qb.affs) < len(qb.parts) {
		qb.affs = make([][24]float32, cap(qb.parts))
	}
	cnt := e - a
	_ = sc[3*cnt+cnt-1]
	qb.calls = qb.calls[:0]
	for i := range qb.parts {
		p := &qb.parts[i]
		if i < len(qb.ahead) {
			qs := &qb.ahead[i].Q
			for _, s := range [4][]float32{qs.KScale, qs.KZero, qs.VScale, qs.VZero} {
				if len(s) > 0 {
					c := qb.next(qcPrefetch)
					c.a[0], c.a[1] = up(&s[0]), uw(len(s))
				}
			}
		}
		pa, pe := max(a, p.off), min(e, p.off+p.n)
		if pa >= pe {
			continue
		}
		n := pe - pa
		k := p.k.rows(pa-p.off, pe-p.off)
		af := &qb.affs[i]
		for j := 0; j < 4; j++ {
			af[2*(j&1)+j/2*4], af[2*(j&1)+j/2*4+1] = p.isc[r+j], p.isc[r+j]
			af[8+2*(j&1)+j/2*4], af[8+2*(j&1)+j/2*4+1] = p.ioff[r+j], p.ioff[r+j]
			af[16+j], af[20+j] = p.isc[r+j], p.ioff[r+j]
		}
		qi := p.qi[r*dk : (r+4)*dk]
		_ = k.b[n*k.rb-1]
		fn, cpg := uintptr(qcDots4i8), dk/64
		if k.f == cache.QuantInt4 {
			fn, cpg = qcDots4i4, dk/128
		}
		c := qb.next(fn)
		c.a = [14]uintptr{up(&sc[pa-a]), uw(cnt * 4), up(&qi[0]), uw(dk), up(&k.b[0]), uw(k.rb), uw(n), uw(cpg), up(af), uw(pf * k.rb)}
	}
	qb.runCalls()
	return true
}

// axpyRunVNNI is quantOps.axpyRun: axpy for four rows when every part
// of the super-block takes the integer accumulation loop (vaxpy4VNNI's
// conditions); false (nothing done) otherwise.
func axpyRunVNNI(qb *quantBlock, acc, sc []float32, a, e, pf int, alpha *[4]float32) bool {
	d := len(acc) / 4
	if !qb.intV || d%128 != 0 {
		return false
	}
	nmax := 0
	for i := range qb.parts {
		p := &qb.parts[i]
		v := p.v
		if v.s == nil || (v.ng != 4 && v.ng != 2) || v.g*v.ng != d {
			return false
		}
		if pa, pe := max(a, p.off), min(e, p.off+p.n); pe-pa >= 1<<19 {
			return false
		} else if pe > pa {
			nmax = max(nmax, pe-pa)
		}
	}
	if nmax == 0 {
		return true
	}
	cnt := e - a
	_, _ = acc[4*d-1], sc[3*cnt+cnt-1]
	ws := &qb.vs
	ws.w = growI32(ws.w, (nmax+1)/2*16)
	qb.calls = qb.calls[:0]
	for i := range qb.parts {
		p := &qb.parts[i]
		pa, pe := max(a, p.off), min(e, p.off+p.n)
		if pa >= pe {
			continue
		}
		n := pe - pa
		v := p.v.rows(pa-p.off, pe-p.off)
		_ = v.b[n*v.rb-1]
		_ = v.s[n*v.ng-1]
		int4 := v.f == cache.QuantInt4
		var vz, i4 uintptr
		if int4 {
			i4 = 1
			_ = v.z[n*v.ng-1]
			vz = up(&v.z[0])
		}
		c := qb.next(qcVPart)
		c.a = [14]uintptr{up(&sc[pa-a]), uw(cnt * 4), up(&v.s[0]), uw(n), vz, up(&v.b[0]), uw(v.rb), uw(pf * v.rb),
			up(alpha), up(&acc[0]), uw(d), uw(v.ng), i4, up(ws)}
		alpha = &qb.ones
	}
	qb.runCalls()
	return true
}
