package cache

// Segment is a run of consecutive token rows of one (sequence, KV head) that
// lie contiguously in memory. Rows are token-major: row r of the segment
// (logical position Start+r) starts at byte r*RowBytesK of K and r*RowBytesV
// of V and holds HeadDimK (HeadDimV) elements of the view's ElemType.
//
// Both K and V use the token-major layout on purpose: a K row is one
// contiguous vector for the q.k dot products of every query head in a GQA
// group, and a V row is one contiguous vector for the p*v accumulation, so
// the decode kernel streams both sequentially and reads each byte once.
// Appending a token writes one row per head and never touches older rows.
type Segment struct {
	Start int    // logical position of the first row
	Len   int    // number of rows
	K     []byte // Len rows of K, RowBytesK each
	V     []byte // Len rows of V, RowBytesV each
	// Q says how the rows are stored when they are sealed (quantized); its
	// zero value means native rows of the view's ElemType.
	Q QuantSegment
}

// View is the block-iterator contract between a cache and the attention
// kernels. Contiguous, paged, sliding-window and (later) quantized storage
// all present themselves through it; kernels never see the layout behind it.
//
// A View is read-only and valid until the next mutation of its cache. Its
// methods must not allocate: kernels call them on the decode hot path.
type View interface {
	ElemType() ElemType
	Batch() int
	KVHeads() int
	HeadDimK() int
	HeadDimV() int
	// SeqLen is the number of valid tokens of sequence b.
	SeqLen(b int) int
	// WindowStart is the first position of sequence b that is still stored
	// (positions below it were evicted by a sliding window); 0 if none.
	WindowStart(b int) int
	// AppendSegments appends to dst the segments that cover the positions
	// [from, to) of sequence b, KV head h, in increasing position order, and
	// returns the extended slice. The caller guarantees
	// WindowStart(b) <= from <= to <= SeqLen(b).
	AppendSegments(dst []Segment, b, h, from, to int) []Segment
	// AddBytesRead adds n to the cache's "bytes read by attention" counter.
	// Safe for concurrent use.
	AddBytesRead(n int64)
}
