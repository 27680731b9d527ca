package cache

import "fmt"

// MaxCheckpoints is how many checkpoints a cache keeps alive at once; taking
// one more drops the oldest live one, and rolling back to a dropped one
// fails with ErrStaleCheckpoint saying so.
const MaxCheckpoints = 64

// checkpoint is a restorable snapshot of the sequence lengths. floor[b] is
// the lowest position of sequence b overwritten since the snapshot: the
// snapshot stays restorable while floor[b] >= lens[b] for every b.
type checkpoint struct {
	id       uint64
	lens     []int
	winStart []int
	floor    []int
}

// checkpoints is the set of live checkpoints of one cache (guarded by the
// cache's lock).
type checkpoints struct {
	next uint64
	list []*checkpoint
	// invalidated is the newest id when all checkpoints were last
	// invalidated (reset, reorder); dropped the newest id dropped because
	// MaxCheckpoints newer ones were taken. Ids in (invalidated, dropped]
	// that are not live were dropped that way (or released before).
	invalidated, dropped uint64
}

func (cs *checkpoints) live() int { return len(cs.list) }

func (cs *checkpoints) invalidateAll() {
	cs.list = cs.list[:0]
	cs.invalidated = cs.next
}

// staleReason explains why id, which is not live, cannot be restored.
func (cs *checkpoints) staleReason(id uint64) error {
	switch {
	case id == 0 || id > cs.next:
		return fmt.Errorf("%w: checkpoint %d was never taken on this cache", ErrStaleCheckpoint, id)
	case id > cs.invalidated && id <= cs.dropped:
		return fmt.Errorf("%w: checkpoint %d was dropped: a cache keeps only the %d newest checkpoints live and %d newer ones were taken after it",
			ErrStaleCheckpoint, id, MaxCheckpoints, cs.next-id)
	case id <= cs.dropped:
		return fmt.Errorf("%w: checkpoint %d was released, dropped (only the %d newest stay live) or invalidated by reset/reorder",
			ErrStaleCheckpoint, id, MaxCheckpoints)
	default:
		return fmt.Errorf("%w: checkpoint %d was released or invalidated by reset/reorder", ErrStaleCheckpoint, id)
	}
}

// noteWrite records that sequence b was written from position pos on.
func (cs *checkpoints) noteWrite(b, pos int) {
	for _, ck := range cs.list {
		ck.floor[b] = min(ck.floor[b], pos)
	}
}

func (cs *checkpoints) find(id uint64) *checkpoint {
	for _, ck := range cs.list {
		if ck.id == id {
			return ck
		}
	}
	return nil
}

// Checkpoint snapshots the sequence lengths for speculative decoding and
// returns its id. Rollback(id) restores them as long as no append has
// overwritten a row the snapshot covers; Reorder and Reset invalidate all
// checkpoints. At most MaxCheckpoints stay alive: taking one more drops the
// oldest live one.
func (c *KVCache) Checkpoint() (uint64, error) {
	id, _, err := c.CheckpointLengths()
	return id, err
}

// CheckpointLengths is Checkpoint that also returns the sequence lengths the
// snapshot saved (what Rollback restores), taken under the same lock: a
// Reorder or Reset running at the same time comes before or after both.
func (c *KVCache) CheckpointLengths() (uint64, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, ErrClosed
	}
	cs := &c.cks
	cs.next++
	ck := &checkpoint{
		id:       cs.next,
		lens:     append([]int(nil), c.lens...),
		winStart: append([]int(nil), c.winStart...),
		floor:    make([]int, len(c.lens)),
	}
	for b := range ck.floor {
		ck.floor[b] = c.cfg.Capacity
	}
	if len(cs.list) == MaxCheckpoints {
		cs.dropped = cs.list[0].id
		copy(cs.list, cs.list[1:])
		cs.list = cs.list[:len(cs.list)-1]
	}
	cs.list = append(cs.list, ck)
	c.trimLocked() // the dropped checkpoint may have held blocks
	return ck.id, append([]int(nil), ck.lens...), nil
}

// Rollback restores the lengths saved by Checkpoint(id), shrinking or
// re-growing sequences (rows truncated since the checkpoint come back if no
// append overwrote them). The checkpoint stays alive. A checkpoint that was
// released, invalidated or overwritten returns ErrStaleCheckpoint and nothing
// changes.
func (c *KVCache) Rollback(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	ck := c.cks.find(id)
	if ck == nil {
		return c.cks.staleReason(id)
	}
	for b, l := range ck.lens {
		if ck.floor[b] < l {
			return fmt.Errorf("%w: checkpoint %d: sequence %d was overwritten from position %d, below its saved length %d",
				ErrStaleCheckpoint, id, b, ck.floor[b], l)
		}
	}
	for b := range c.lens {
		c.setLenLocked(b, ck.lens[b])
		c.setWinLocked(b, ck.winStart[b])
	}
	c.trimLocked()
	return nil
}

// ReleaseCheckpoint forgets checkpoint id (a no-op for unknown ids).
func (c *KVCache) ReleaseCheckpoint(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ck := range c.cks.list {
		if ck.id == id {
			c.cks.list = append(c.cks.list[:i], c.cks.list[i+1:]...)
			c.trimLocked()
			return
		}
	}
}
