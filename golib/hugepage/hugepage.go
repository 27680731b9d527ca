// Package hugepage asks the operating system to back large, long-lived
// buffers with transparent huge pages (2 MiB on x86-64 and arm64 Linux).
//
// Decode reads a model's weights and its KV cache from end to end at every
// step. With 4 KiB pages such a stream takes a TLB miss every 4 KiB; with
// huge pages one every 2 MiB. Linux backs memory with huge pages only where
// the process advises it when transparent huge pages are in "madvise" mode
// (a common default), and Go's heap does not advise it. The KV cache's
// arenas, the packed weights, the runtime's pooled buffers and the
// bandwidth probe advise theirs through Advise.
package hugepage

// Size is the transparent-huge-page size assumed for alignment (2 MiB).
const Size = 2 << 20

// HeapMin is the size from which a buffer that is not aligned to Size (Go
// heap memory) is worth advising: two huge pages, so that whole aligned
// huge pages cover at least half of it.
const HeapMin = 2 * Size

// span returns the part of [p, p+n) that whole huge pages cover: its first
// byte's offset from p and its length, both 0 when no aligned huge page
// fits.
func span(p, n uintptr) (off, length uintptr) {
	start := (p + Size - 1) &^ (Size - 1)
	end := (p + n) &^ (Size - 1)
	if p+n < p || end <= start {
		return 0, 0
	}
	return start - p, end - start
}
