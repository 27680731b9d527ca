// Package kvgo is the thin gopy-facing facade of onnx-light-kv: flat
// functions over integer handles, scalars and raw numpy data pointers
// (uintptr). It is the only Go package that knows about Python.
//
// Rules for every exported function here:
//   - defer recoverTo(&err) first: a Go panic must never cross cgo (it would
//     abort the interpreter); it becomes an error instead;
//   - return errors through classify, whose "Class: message" prefix the Python
//     wrapper turns into the right built-in exception;
//   - take data as uintptr + element count, never as Go slices of Python
//     lists (gopy converts those element by element).
package kvgo

import (
	"errors"
	"fmt"
	"io/fs"
	"runtime/debug"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Python exception class prefixes understood by python/onnx_light_kv/_errors.py.
const (
	classValue    = "ValueError"
	classType     = "TypeError"
	classIndex    = "IndexError"
	classMemory   = "MemoryError"
	classNotImpl  = "NotImplementedError"
	classRuntime  = "RuntimeError"
	classKey      = "KeyError"
	classFile     = "FileNotFoundError"
	classPerm     = "PermissionError"
	classOS       = "OSError"
	classCapacity = "CapacityError"
	classBudget   = "BudgetError"
)

// classifier maps a sentinel error to a Python exception class. Other
// packages' sentinels are registered by the files that bind them.
type classifier struct {
	target error
	class  string
}

var classifiers = []classifier{
	{cache.ErrBudget, classBudget},
	{cache.ErrCapacity, classCapacity},
	{cache.ErrOutOfRange, classIndex},
	{cache.ErrInvalidArgument, classValue},
	{cache.ErrClosed, classValue},
	{cache.ErrStaleCheckpoint, classValue},
	{cache.ErrNotImplemented, classNotImpl},
	{errTypeMismatch, classType},
	{errNotImplemented, classNotImpl},
	{errUnknownHandle, classValue},
}

var (
	errTypeMismatch   = errors.New("type mismatch")
	errNotImplemented = errors.New("not implemented")
	errUnknownHandle  = errors.New("released or unknown handle")
)

// classify prefixes err's message with the Python exception class that the
// wrapper must raise. nil stays nil.
func classify(err error) error {
	if err == nil {
		return nil
	}
	class := classRuntime
	for _, c := range classifiers {
		if errors.Is(err, c.target) {
			class = c.class
			break
		}
	}
	if pe := (*fs.PathError)(nil); class == classRuntime && errors.As(err, &pe) { // a file the OS refused: a loop, not a folder, ...
		class = classOS
	}
	return classified{msg: class + ": " + strings.ToValidUTF8(err.Error(), "\uFFFD"), err: err}
}

// recoverTo converts a panic into a classified RuntimeError stored in *errp.
// Use as the first statement: defer recoverTo(&err).
func recoverTo(errp *error) {
	if r := recover(); r != nil {
		msg := fmt.Sprintf("%s: internal error (please report): %v\n%s", classRuntime, r, debug.Stack())
		*errp = errors.New(strings.ToValidUTF8(msg, "\uFFFD"))
	}
}

// classified is a classified error: its message is the class prefix and the
// error's text as valid UTF-8 (a model's names may not be, and Python
// decodes the message strictly); it unwraps to the error.
type classified struct {
	msg string
	err error
}

func (c classified) Error() string { return c.msg }
func (c classified) Unwrap() error { return c.err }
