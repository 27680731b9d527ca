package cache

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

// bytesSource is a rand.Source that replays fuzz input: each Uint64 takes
// the next 8 bytes, so the fuzzer's mutations steer the operation sequence
// directly. Past the end it continues with a splitmix64 sequence (a
// constant source would make rand's rejection sampling loop forever).
type bytesSource struct {
	b    []byte
	tail uint64
}

func (s *bytesSource) Uint64() uint64 {
	if len(s.b) >= 8 {
		x := binary.LittleEndian.Uint64(s.b)
		s.b = s.b[8:]
		return x
	}
	s.b = nil
	s.tail += 0x9e3779b97f4a7c15
	z := s.tail
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// FuzzCacheOps runs sequences of cache operations chosen by the fuzz input
// (geometry, then one operation per 8 bytes, at most 200) through
// randomOps: the cache must equal the model after every step, and every
// error must be the documented one. Run with
//
//	go test ./golib/cache -run '^$' -fuzz FuzzCacheOps -fuzztime 20s
//
// Plain `go test` only runs the seeds (and testdata/fuzz).
func FuzzCacheOps(f *testing.F) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 1))
		b := make([]byte, 8*(40+int(seed)*10)+1)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[0] = byte(seed)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		gi := int(data[0]) % len(geometries)
		steps := min((len(data)-1)/8, 200)
		randomOps(t, geometries[gi], []Layout{Contiguous}, rand.New(&bytesSource{b: data[1:]}), steps, fmt.Sprintf("geometry %d", gi))
	})
}

// FuzzQuantCacheOps is FuzzCacheOps for quantized caches: the first byte
// picks one of quantConfigs and the layout, the rest steers randomQuantOps
// (at most 80 operations) against the model of the quantized storage. Each
// input costs far more than a FuzzCacheOps one (every step exports and
// checks every sealed segment), so it is a target of its own:
//
//	go test ./golib/cache -run '^$' -fuzz FuzzQuantCacheOps -fuzztime 60s
func FuzzQuantCacheOps(f *testing.F) {
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 2))
		b := make([]byte, 8*40+1)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[0] = byte(3 * seed)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		qi := int(data[0]) % (2 * len(quantConfigs))
		cfg := quantConfigs[qi/2]
		cfg.Layout = Layout(qi % 2)
		steps := min((len(data)-1)/8, 80)
		randomQuantOps(t, cfg, rand.New(&bytesSource{b: data[1:]}), steps, fmt.Sprintf("quantized geometry %d %v", qi/2, cfg.Layout))
	})
}
