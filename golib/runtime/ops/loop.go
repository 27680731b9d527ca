package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// maxLoopIterations bounds a Loop whose trip count and condition never stop
// it, so a hostile model fails instead of running forever.
const maxLoopIterations = 1 << 24

func init() {
	Register("", "Loop", 11, 0, newLoop)
}

// newLoop runs the body subgraph while the trip count (input 0, optional)
// and the condition (input 1, optional) allow it. Inputs 2.. are the
// loop-carried tensors; the body returns (cond, carried..., scan...), and
// the node outputs the final carried values, then each scan output stacked
// along a new first axis. Sequence-typed carried values are not implemented.
func newLoop(n *Node) (Kernel, error) {
	body, err := n.Attrs.Graph("body")
	if err != nil {
		return nil, err
	}
	carried := n.NumInputs - 2
	scans := body.NumOutputs() - 1 - carried
	if carried < 0 || scans < 0 || n.NumOutputs != carried+scans {
		return nil, fmt.Errorf("%w: Loop with %d inputs, %d outputs and a body of %d outputs", errs.ErrInvalidModel, n.NumInputs, n.NumOutputs, body.NumOutputs())
	}
	return KernelFunc(func(ctx *Context) error {
		trips := int64(-1)
		if t := ctx.Input(0); t != nil {
			v, err := tensor.Int64Values(t)
			if err != nil || len(v) != 1 {
				return fmt.Errorf("%w: Loop trip count must be an integer scalar", errs.ErrInvalidArgument)
			}
			trips = max(v[0], 0)
		}
		cond := true
		if t := ctx.Input(1); t != nil {
			if t.Bool() == nil || t.Len() != 1 {
				return fmt.Errorf("%w: Loop condition must be a bool scalar", errs.ErrType)
			}
			cond = t.Bool()[0]
		}
		state := make([]*tensor.Tensor, carried)
		for i := range state {
			if state[i] = ctx.Input(2 + i); state[i] == nil {
				return fmt.Errorf("%w: Loop-carried input %d", errs.ErrMissingInput, i)
			}
		}
		stacks := make([][]*tensor.Tensor, scans)
		var held, checked int64 // bytes of the scan outputs so far; at the last check
		for it := int64(0); cond && (trips < 0 || it < trips); it++ {
			if it >= maxLoopIterations {
				return fmt.Errorf("%w: Loop ran %d iterations without stopping", errs.ErrLimit, it)
			}
			in := append([]*tensor.Tensor{tensor.Scalar(it), tensor.Scalar(cond)}, state...)
			outs, err := body.Run(ctx.Scope(), in)
			if err != nil {
				return fmt.Errorf("Loop iteration %d: %w", it, err)
			}
			c := outs[0]
			if c == nil || c.Bool() == nil || c.Len() != 1 {
				return fmt.Errorf("%w: Loop body condition must be a bool scalar", errs.ErrType)
			}
			cond = c.Bool()[0]
			copy(state, outs[1:1+carried])
			for k := range stacks {
				stacks[k] = append(stacks[k], outs[1+carried+k])
				held += int64(outs[1+carried+k].NumBytes())
			}
			if held-checked >= sysmem.FreshMin {
				// the scan outputs grow by an iteration's tensors, then are stacked
				// (as much again): refused before the Go heap runs out, which ends
				// the process
				if err := loopFits(held); err != nil {
					return fmt.Errorf("Loop iteration %d: %w", it, err)
				}
				checked = held
			}
		}
		for i, t := range state {
			if err := ctx.SetOutput(i, t); err != nil {
				return err
			}
		}
		for k, parts := range stacks {
			if len(parts) == 0 {
				// no iteration ran: an empty stack of the declared type
				// (and of the declared shape where it is fixed)
				dt, shape, ok := body.OutputType(1 + carried + k)
				if !ok {
					dt, shape = tensor.Float32, nil
				}
				if _, err := ctx.NewOutput(carried+k, dt, append(tensor.Shape{0}, shape...)); err != nil {
					return err
				}
				continue
			}
			st, err := stack(parts)
			if err != nil {
				return fmt.Errorf("Loop scan output %d: %w", k, err)
			}
			ctx.Allocated += int64(st.NumBytes())
			if err := ctx.SetOutput(carried+k, st); err != nil {
				return err
			}
		}
		return nil
	}), nil
}

// stack joins same-shaped tensors (at least one) along a new first axis.
func stack(parts []*tensor.Tensor) (*tensor.Tensor, error) {
	first := parts[0]
	shape := append(tensor.Shape{len(parts)}, first.Shape()...)
	out, err := tensor.New(first.DType(), shape)
	if err != nil {
		return nil, err
	}
	nb := first.NumBytes()
	dst := out.Bytes()
	for i, p := range parts {
		if p.DType() != first.DType() || !p.Shape().Equal(first.Shape()) {
			return nil, fmt.Errorf("%w: iterations produced %v %v and %v %v", errs.ErrShape, first.DType(), first.Shape(), p.DType(), p.Shape())
		}
		copy(dst[i*nb:(i+1)*nb], p.Bytes())
	}
	return out, nil
}

// loopFits checks that scan outputs holding held bytes can still be
// stacked: the stack is under the per-tensor limit, and the memory the
// system can give holds it (the parts are already held).
func loopFits(held int64) error {
	if held > tensor.MaxBytes() {
		return fmt.Errorf("%w: Loop scan outputs of %s exceed the per-tensor limit of %s",
			errs.ErrMemory, units.Bytes(held), units.Bytes(tensor.MaxBytes()))
	}
	if avail := sysmem.Room(held, sysmem.Available); avail > 0 && held > avail {
		return fmt.Errorf("%w: Loop scan outputs of %s are more than the %s the system can still give this process",
			errs.ErrMemory, units.Bytes(held), units.Bytes(avail))
	}
	return nil
}
