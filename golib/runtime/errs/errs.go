// Package errs holds the sentinel errors shared by the runtime packages
// (tensor, model, ops, plan, session). Every error the runtime returns wraps
// one of them, so callers (and the Python bindings) classify failures with
// errors.Is instead of matching message text.
package errs

import "errors"

var (
	// ErrInvalidModel: the model file or bytes are malformed, truncated,
	// hostile or violate the ONNX specification.
	ErrInvalidModel = errors.New("invalid model")
	// ErrUnsupportedOp: no kernel is registered for an (op, domain, opset).
	ErrUnsupportedOp = errors.New("unsupported operator")
	// ErrNotImplemented: a feature of an otherwise supported op or format is
	// not implemented yet.
	ErrNotImplemented = errors.New("not implemented")
	// ErrInvalidArgument: a malformed argument, attribute or input value.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrShape: tensor shapes are incompatible.
	ErrShape = errors.New("shape mismatch")
	// ErrType: an element type is wrong or unsupported for the operation.
	ErrType = errors.New("type mismatch")
	// ErrLimit: a size limit was exceeded (tensor bytes, file size, depth).
	ErrLimit = errors.New("size limit exceeded")
	// ErrMemory: the system cannot give the process the memory a tensor
	// needs (checked before allocating: the Go heap's out-of-memory is
	// fatal).
	ErrMemory = errors.New("not enough memory")
	// ErrCycle: the graph is not a DAG.
	ErrCycle = errors.New("graph has a cycle")
	// ErrMissingInput: a required graph input or value was not provided.
	ErrMissingInput = errors.New("missing input")
	// ErrNotFound: a named value, output or cache does not exist.
	ErrNotFound = errors.New("not found")
	// ErrClosed: the session was closed.
	ErrClosed = errors.New("session is closed")
)

// ErrStateClosed: the generation state was closed. It is an ErrClosed
// (errors.Is) whose message names the state, not the session.
var ErrStateClosed error = closedErr("the generation state is closed")

// closedErr is a closed-object error that unwraps to ErrClosed.
type closedErr string

func (e closedErr) Error() string { return string(e) }
func (e closedErr) Unwrap() error { return ErrClosed }
