package cache

import "fmt"

// Layout is how a cache stores its rows.
type Layout int

const (
	// Contiguous reserves Capacity tokens per sequence at creation: one
	// segment per (sequence, head), appends never move the past.
	Contiguous Layout = iota
	// Paged takes fixed-size blocks of BlockSize tokens from the arena's
	// block pool as tokens arrive; a page table per sequence maps logical
	// blocks to pool blocks, which forks, reorders and prefixes share by
	// reference count. Capacity is a limit, not a reservation.
	Paged
)

// DefaultBlockSize is the paged layout's block size in tokens when the
// Config leaves it at 0. It was picked by measurement: decode attention over
// 1k-32k tokens with blocks of 16, 32, 64 and 128 tokens against the
// contiguous layout (see the README's paged layout section).
const DefaultBlockSize = 64

// validBlockSize reports whether n is a block size the paged layout takes.
func validBlockSize(n int) bool {
	switch n {
	case 16, 32, 64, 128, 256:
		return true
	}
	return false
}

// String returns "contiguous" or "paged".
func (l Layout) String() string {
	switch l {
	case Contiguous:
		return "contiguous"
	case Paged:
		return "paged"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// ParseLayout maps "contiguous" and "paged" to their Layout.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "contiguous", "":
		return Contiguous, nil
	case "paged":
		return Paged, nil
	}
	return 0, fmt.Errorf("%w: unknown cache layout %q (want \"contiguous\" or \"paged\")", ErrInvalidArgument, s)
}
