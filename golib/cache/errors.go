package cache

import (
	"errors"
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// Sentinel errors. Callers test them with errors.Is; the bindings map them to
// Python exception classes (ValueError, IndexError, MemoryError, ...).
var (
	// ErrInvalidArgument: a malformed argument (shape, dtype, negative size).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrOutOfRange: an index or length outside the valid range.
	ErrOutOfRange = errors.New("out of range")
	// ErrCapacity: appending would exceed the cache's reserved capacity.
	ErrCapacity = errors.New("cache capacity exceeded")
	// ErrBudget: the arena's byte budget would be exceeded.
	ErrBudget = errors.New("memory budget exceeded")
	// ErrClosed: the cache or arena was already released.
	ErrClosed = errors.New("cache is closed")
	// ErrStaleCheckpoint: a checkpoint can no longer be restored.
	ErrStaleCheckpoint = errors.New("stale checkpoint")
	// ErrNotImplemented: a valid option combination that is not implemented
	// yet (for example attention over quantized rows before the kernels
	// read them).
	ErrNotImplemented = errors.New("not implemented")
)

// BudgetError reports an allocation that the arena's budget refused, with the
// numbers a user needs to size the budget. It matches ErrBudget.
type BudgetError struct {
	Requested int64 // bytes asked for
	Committed int64 // bytes already committed in the arena
	Budget    int64 // the arena's budget (Machine: committed + what the machine has available)
	// Machine is set when the limit was the machine's available memory,
	// not a budget the arena was given.
	Machine bool
}

func (e *BudgetError) Error() string {
	if e.Machine {
		return fmt.Sprintf("memory budget exceeded: requested %s with %s committed, but the machine has only %s available",
			units.Bytes(e.Requested), units.Bytes(e.Committed), units.Bytes(e.Budget-e.Committed))
	}
	return fmt.Sprintf("memory budget exceeded: requested %s with %s of the %s budget committed (%s free)",
		units.Bytes(e.Requested), units.Bytes(e.Committed), units.Bytes(e.Budget), units.Bytes(e.Budget-e.Committed))
}

// Unwrap makes errors.Is(err, ErrBudget) true.
func (e *BudgetError) Unwrap() error { return ErrBudget }
