package runtime

import (
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestGrownQuantizedCache: a growing state's growth of a quantized cache
// keeps every stored value (the sealed chunks are copied, not quantized
// again from their dequantized values), its lengths and its windows.
func TestGrownQuantizedCache(t *testing.T) {
	a, _ := cache.NewArena(0)
	defer a.Close()
	cfg := cache.Config{Batch: 2, KVHeads: 2, HeadDimK: 32, Capacity: 96, Elem: cache.Float16,
		Quant: cache.QuantConfig{Format: cache.QuantInt4, Group: 32, Residual: 8}}
	c, err := cache.New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	n := 90
	k := make([]float32, 2*2*n*32)
	for i := range k {
		k[i] = float32(r.NormFloat64())
	}
	kb := unsafe.Slice((*byte)(unsafe.Pointer(&k[0])), 4*len(k))
	if err := c.Append(kb, kb, cache.Float32, n, []int{90, 70}); err != nil {
		t.Fatal(err)
	}
	if err := c.Evict(80); err != nil {
		t.Fatal(err)
	}
	before := exportAll(t, c)
	g, err := grown(c, a, 200)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c.Close()
	if got := g.Config().Capacity; got != 200 {
		t.Fatalf("capacity %d", got)
	}
	if !slices.Equal(g.Lengths(), []int{90, 70}) || g.WindowStart(0) != 10 {
		t.Fatalf("lengths %v window %d", g.Lengths(), g.WindowStart(0))
	}
	if after := exportAll(t, g); !slices.Equal(before, after) {
		t.Fatal("growing changed stored values")
	}
}

func exportAll(t *testing.T, c *cache.KVCache) []float32 {
	t.Helper()
	cfg := c.Config()
	L := c.MaxLen()
	k := make([]float32, cfg.Batch*cfg.KVHeads*L*(cfg.HeadDimK+cfg.HeadDimV))
	kb := unsafe.Slice((*byte)(unsafe.Pointer(&k[0])), 4*len(k))
	half := cfg.Batch * cfg.KVHeads * L * cfg.HeadDimK * 4
	if err := c.Export(kb[:half], kb[half:], cache.Float32, L); err != nil {
		t.Fatal(err)
	}
	return k
}
