package cache

import (
	"errors"
	"strings"
	"testing"
)

// TestStaleCheckpointReasons: the error of a rollback to a checkpoint that
// is not live names why: never taken, dropped past MaxCheckpoints, or
// released/invalidated.
func TestStaleCheckpointReasons(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 1, HeadDimK: 2, Capacity: 8, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	take := func() uint64 {
		id, err := c.Checkpoint()
		mustOK(t, err)
		return id
	}
	first := take()
	for range MaxCheckpoints - 1 {
		take()
	}
	if err := c.Rollback(first); err != nil {
		t.Fatalf("the oldest of %d checkpoints must still be live: %v", MaxCheckpoints, err)
	}
	take() // one more: first is dropped
	released := take()
	c.ReleaseCheckpoint(released)
	beforeReset := take()
	cases := []struct {
		name string
		id   uint64
		want string
	}{
		{"dropped", first, "dropped: a cache keeps only the 64 newest checkpoints live and 66 newer ones were taken after it"},
		{"never taken", 9999, "never taken"},
		{"zero", 0, "never taken"},
		{"released", released, "released or invalidated"},
	}
	check := func(name string, id uint64, want string) {
		t.Helper()
		err := c.Rollback(id)
		if !errors.Is(err, ErrStaleCheckpoint) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want ErrStaleCheckpoint with %q", name, err, want)
		}
	}
	for _, tc := range cases {
		check(tc.name, tc.id, tc.want)
	}
	mustOK(t, c.Reset())
	check("invalidated by reset", beforeReset, "released or invalidated by reset/reorder")
	check("dropped before reset", first, "released, dropped (only the 64 newest stay live) or invalidated")
	if err := c.Rollback(take()); err != nil {
		t.Fatalf("a checkpoint taken after reset: %v", err)
	}
}

// TestCheckpointLengths: the lengths a checkpoint saved come with its id,
// not the cache's after later appends, and Rollback restores them.
func TestCheckpointLengths(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 1, HeadDimK: 2, Capacity: 8, Elem: Float32}
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	row := make([]byte, 2*1*1*2*4)
	mustOK(t, c.Append(row, row, Float32, 1, nil))
	id, got, err := c.CheckpointLengths()
	mustOK(t, err)
	mustOK(t, c.Append(row, row, Float32, 1, nil))
	if len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Fatalf("CheckpointLengths = %v; want [1 1] (the cache now holds %v)", got, c.Lengths())
	}
	mustOK(t, c.Rollback(id))
	if l := c.Lengths(); l[0] != 1 || l[1] != 1 {
		t.Fatalf("after Rollback: %v, want [1 1]", l)
	}
	c.Close()
	if _, _, err := c.CheckpointLengths(); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed cache: %v", err)
	}
}
