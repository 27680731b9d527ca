package cache

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// Config describes the geometry of a cache. All sizes are in elements or
// tokens, not bytes.
type Config struct {
	Batch    int      // sequences (or beams) in the request
	KVHeads  int      // key/value heads
	HeadDimK int      // elements per K row
	HeadDimV int      // elements per V row (0: same as HeadDimK)
	Capacity int      // tokens per sequence: reserved (contiguous) or a limit (paged)
	Elem     ElemType // storage type of K and V
	Layout   Layout   // Contiguous (the zero value) or Paged
	// BlockSize is the paged layout's tokens per block (16, 32, 64, 128 or
	// 256; 0: DefaultBlockSize). The contiguous layout ignores it.
	BlockSize int
	// Quant quantizes rows older than a recent-token window (see
	// QuantConfig); the zero value keeps every row in Elem.
	Quant QuantConfig
}

// Counters are the work figures a cache keeps. They are logical metadata:
// tests use them to prove that append copies only new tokens and that
// attention reads each K/V byte once.
type Counters struct {
	AppendBytes    int64 // bytes written by Append
	AppendCalls    int64
	ExportBytes    int64 // bytes written by Export
	CopyBytes      int64 // bytes copied by Fork and Reorder
	AttentionBytes int64 // K/V bytes read by attention kernels
	AttentionCalls int64
	// SealBytes are the bytes (rows, scales and zeros) written by sealing
	// native rows into quantized chunks, SealCalls the chunks sealed (one
	// per sequence and Group tokens, every head at once).
	SealBytes int64
	SealCalls int64
}

// seqStore holds the K and V rows of one sequence for every KV head:
// K is [KVHeads][Capacity][HeadDimK], V is [KVHeads][Capacity][HeadDimV],
// token-major (see Segment for why).
type seqStore struct {
	k, v []byte
	// q is the quantized storage (nil when Config.Quant is off); k then is
	// the sequence's whole arena buffer, which q's parts are carved from.
	q *quantSeq
}

// KVCache is the persistent KV cache of one attention layer of one request,
// in the contiguous layout: every sequence reserves Capacity tokens up front,
// so appending within capacity never moves or copies the past.
//
// Mutating methods take an exclusive lock and attention readers a shared one
// (BeginRead/EndRead), so concurrent misuse from several threads cannot
// corrupt the cache; it is still one request's state, not meant to be
// mutated from several threads at once.
type KVCache struct {
	mu       sync.RWMutex
	cfg      Config
	arena    *Arena
	seqs     []seqStore
	lens     []int
	winStart []int
	rowK     int   // bytes per K row
	rowV     int   // bytes per V row
	tokBytes int64 // storage bytes of one token, all heads: live-bytes accounting
	closed   bool

	qg                   quantGeom // quantized geometry (Quant enabled)
	qscratch             []float32 // one chunk of K and V rows in float32, for sealing and export
	qfresh               []*qchunk // chunk blocks reserved by the running Append (paged)
	sealBytes, sealCalls int64

	appendBytes, appendCalls, exportBytes, copyBytes int64
	attnBytes, attnCalls                             atomic.Int64

	cks    checkpoints
	reused []int       // scratch for Reorder
	pg     *pagedStore // the paged layout's page tables; nil when contiguous
	segs   []Segment   // scratch for Export
}

// New creates a cache in arena a. In the contiguous layout its whole
// capacity is reserved from the arena at once; a *BudgetError is returned
// when the budget cannot hold it. The paged layout reserves nothing: blocks
// are taken from the arena's block pool as tokens are appended.
func New(a *Arena, cfg Config) (*KVCache, error) {
	if a == nil {
		return nil, fmt.Errorf("%w: nil arena", ErrInvalidArgument)
	}
	if cfg.HeadDimV == 0 {
		cfg.HeadDimV = cfg.HeadDimK
	}
	if cfg.Quant.Enabled() && cfg.Quant.Group == 0 {
		cfg.Quant.Group = DefaultQuantGroup
	}
	if cfg.Layout == Paged && cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
		if cfg.Quant.Enabled() {
			cfg.BlockSize = cfg.Quant.Group // its blocks are the sealed chunks
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &KVCache{
		cfg: cfg, arena: a,
		rowK: cfg.HeadDimK * cfg.Elem.Size(),
		rowV: cfg.HeadDimV * cfg.Elem.Size(),
	}
	c.tokBytes = int64(cfg.KVHeads) * int64(c.rowK+c.rowV)
	if cfg.Quant.Enabled() {
		c.qg = newQuantGeom(cfg)
		c.tokBytes = c.qg.bytesPerToken(cfg)
		c.qscratch = make([]float32, cfg.Quant.Group*(cfg.HeadDimK+cfg.HeadDimV))
		if err := c.newQuantSeqs(); err != nil {
			return nil, err
		}
		c.initMeta()
		return c, nil
	}
	if cfg.Layout == Paged {
		c.pg = newPagedStore(a.blockPool(cfg.BlockSize, cfg.KVHeads, c.rowK, c.rowV), cfg)
		c.initMeta()
		return c, nil
	}
	kBytes := cfg.KVHeads * cfg.Capacity * c.rowK
	vBytes := cfg.KVHeads * cfg.Capacity * c.rowV
	c.seqs = make([]seqStore, cfg.Batch)
	var err error
	if kBytes == vBytes {
		var bufs [][]byte
		if bufs, err = a.allocMany(kBytes, 2*cfg.Batch); err == nil {
			for b := range c.seqs {
				c.seqs[b] = seqStore{k: bufs[2*b], v: bufs[2*b+1]}
			}
		}
	} else {
		err = c.allocSeparate(kBytes, vBytes)
	}
	if err != nil {
		return nil, err
	}
	c.initMeta()
	return c, nil
}

// initMeta allocates the per-sequence metadata of a new cache.
func (c *KVCache) initMeta() {
	c.lens = make([]int, c.cfg.Batch)
	c.winStart = make([]int, c.cfg.Batch)
	c.reused = make([]int, c.cfg.Batch)
}

// allocSeparate reserves K and V buffers of different sizes, all or nothing.
func (c *KVCache) allocSeparate(kBytes, vBytes int) error {
	ks, err := c.arena.allocMany(kBytes, c.cfg.Batch)
	if err != nil {
		return err
	}
	vs, err := c.arena.allocMany(vBytes, c.cfg.Batch)
	if err != nil {
		c.arena.release(ks...)
		return err
	}
	for b := range c.seqs {
		c.seqs[b] = seqStore{k: ks[b], v: vs[b]}
	}
	return nil
}

// maxCacheBytes bounds one cache's reservation so that size arithmetic can
// never overflow (1 TiB is far beyond any machine this runs on).
const maxCacheBytes = 1 << 40

// Bounds of a cache's geometry, far above any model's (batch counts beams
// and speculative branches too).
const (
	maxBatch   = 1 << 16
	maxKVHeads = 1 << 12
	maxHeadDim = 1 << 16
)

func (cfg Config) validate() error {
	switch {
	case cfg.Batch <= 0 || cfg.KVHeads <= 0 || cfg.HeadDimK <= 0 || cfg.HeadDimV <= 0:
		return fmt.Errorf("%w: batch, kv_heads and head dims must be positive (got batch=%d kv_heads=%d head_dim_k=%d head_dim_v=%d)",
			ErrInvalidArgument, cfg.Batch, cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV)
	case cfg.Capacity <= 0:
		return fmt.Errorf("%w: capacity must be positive (got %d)", ErrInvalidArgument, cfg.Capacity)
	case cfg.Elem.Size() == 0:
		return fmt.Errorf("%w: unsupported element type %v", ErrInvalidArgument, cfg.Elem)
	case cfg.Layout != Contiguous && cfg.Layout != Paged:
		return fmt.Errorf("%w: unknown layout %v", ErrInvalidArgument, cfg.Layout)
	case cfg.Layout == Paged && !validBlockSize(cfg.BlockSize):
		return fmt.Errorf("%w: block size must be 16, 32, 64, 128 or 256 tokens (got %d)", ErrInvalidArgument, cfg.BlockSize)
	case cfg.Batch > maxBatch || cfg.KVHeads > maxKVHeads || cfg.HeadDimK > maxHeadDim || cfg.HeadDimV > maxHeadDim:
		// per-sequence state and buffers scale with these before any byte
		// of K/V: absurd values must not reach an allocation
		return fmt.Errorf("%w: batch <= %d, kv_heads <= %d and head dims <= %d (got batch=%d kv_heads=%d head_dim_k=%d head_dim_v=%d)",
			ErrInvalidArgument, maxBatch, maxKVHeads, maxHeadDim, cfg.Batch, cfg.KVHeads, cfg.HeadDimK, cfg.HeadDimV)
	}
	if cfg.Quant.Enabled() {
		if err := cfg.validateQuant(); err != nil {
			return err
		}
	}
	total := float64(cfg.Batch) * float64(cfg.KVHeads) * float64(cfg.Capacity) *
		float64(cfg.HeadDimK+cfg.HeadDimV) * float64(cfg.Elem.Size())
	if total > maxCacheBytes {
		return fmt.Errorf("%w: a cache of %.0f bytes (%s) is larger than the %s limit", ErrInvalidArgument,
			total, units.Size(int64(min(total, float64(1<<62)))), units.Size(int64(maxCacheBytes)))
	}
	return nil
}

// Config returns the cache's geometry (Batch changes with Select).
func (c *KVCache) Config() Config {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cfg
}

// Lengths returns a copy of the per-sequence valid lengths.
func (c *KVCache) Lengths() []int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return append([]int(nil), c.lens...)
}

// Close releases the cache's memory to its arena. Further use returns
// ErrClosed. Closing twice is a no-op.
func (c *KVCache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.arena.addLive(-c.liveBytesLocked())
	if c.pg != nil {
		c.pg.releaseAll()
	}
	for _, s := range c.seqs {
		c.arena.release(s.k, s.v)
		if s.q != nil {
			c.arena.releaseChunks(s.q.blks)
			s.q.releaseKch(c.arena)
		}
	}
	c.seqs = nil
	c.cks.invalidateAll()
}

// Closed reports whether Close was called.
func (c *KVCache) Closed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closed
}

// liveBytesLocked is the number of bytes of valid K/V rows.
func (c *KVCache) liveBytesLocked() int64 {
	var n int64
	for b, l := range c.lens {
		n += int64(l-c.winStart[b]) * c.tokBytes
	}
	return n
}

// setLenLocked changes a sequence's length and keeps the arena's live figure
// in step.
func (c *KVCache) setLenLocked(b, n int) {
	delta := int64(n-c.lens[b]) * c.tokBytes
	c.lens[b] = n
	if delta != 0 {
		c.arena.addLive(delta)
	}
}

// setWinLocked changes a sequence's window start with the same accounting.
func (c *KVCache) setWinLocked(b, w int) {
	delta := int64(c.winStart[b]-w) * c.tokBytes
	c.winStart[b] = w
	if delta != 0 {
		c.arena.addLive(delta)
	}
}

// Info is the logical metadata of a cache: what a user may inspect, never
// raw pointers.
type Info struct {
	Config
	Layout         string
	Lengths        []int
	WindowStarts   []int
	CommittedBytes int64 // bytes reserved for this cache
	LiveBytes      int64 // bytes of valid rows
	PageTableBytes int64 // bookkeeping bytes (lengths, window starts, page tables)
	Checkpoints    int   // live checkpoints
	// The paged layout's figures (zero for contiguous): BlocksUsed are the
	// distinct blocks this cache references, BlocksShared those of them
	// that other references (forks, beams, prefixes) share, BlocksFree and
	// BlocksTotal the pool's free and total (used + free) blocks.
	BlocksUsed, BlocksShared, BlocksFree, BlocksTotal int64
	// Fragmentation is the share of committed bytes holding no valid row.
	Fragmentation float64
	Counters      Counters
	Closed        bool
	// The quantization figures (zero when Quant is off): SealedTokens and
	// NativeTokens are the readable tokens held quantized and in the native
	// type, over all sequences; ScaleBytes the scale and zero bytes of the
	// sealed rows; BytesPerToken one sealed token's storage (all heads, K
	// and V, scales included, per-channel K scales amortized over a chunk),
	// NativeBytesPerToken the same for a native token.
	SealedTokens, NativeTokens         int64
	ScaleBytes                         int64
	BytesPerToken, NativeBytesPerToken int64
}

// Info returns the cache's metadata and counters.
func (c *KVCache) Info() Info {
	c.mu.RLock()
	defer c.mu.RUnlock()
	in := Info{
		Config:       c.cfg,
		Layout:       c.cfg.Layout.String(),
		Lengths:      append([]int(nil), c.lens...),
		WindowStarts: append([]int(nil), c.winStart...),
		Closed:       c.closed,
		Checkpoints:  c.cks.live(),
		Counters:     c.countersLocked(),
	}
	if c.closed {
		return in
	}
	in.LiveBytes = c.liveBytesLocked()
	in.PageTableBytes = int64(2 * 8 * c.cfg.Batch)
	switch {
	case c.qg.q.Enabled():
		c.quantInfoLocked(&in)
	case c.pg != nil:
		c.pagedInfoLocked(&in)
	default:
		in.CommittedBytes = int64(c.cfg.Batch) * int64(c.cfg.KVHeads) * int64(c.cfg.Capacity) * int64(c.rowK+c.rowV)
	}
	if in.CommittedBytes > 0 {
		in.Fragmentation = max(0, 1-float64(in.LiveBytes)/float64(in.CommittedBytes))
	}
	return in
}

func (c *KVCache) countersLocked() Counters {
	return Counters{
		AppendBytes: c.appendBytes, AppendCalls: c.appendCalls,
		ExportBytes: c.exportBytes, CopyBytes: c.copyBytes,
		AttentionBytes: c.attnBytes.Load(), AttentionCalls: c.attnCalls.Load(),
		SealBytes: c.sealBytes, SealCalls: c.sealCalls,
	}
}

// Counters returns the work counters.
func (c *KVCache) Counters() Counters {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.countersLocked()
}

// ResetCounters zeroes the work counters (not the data).
func (c *KVCache) ResetCounters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.appendBytes, c.appendCalls, c.exportBytes, c.copyBytes = 0, 0, 0, 0
	c.sealBytes, c.sealCalls = 0, 0
	c.attnBytes.Store(0)
	c.attnCalls.Store(0)
}
