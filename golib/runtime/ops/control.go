package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

func init() {
	Register("", "If", 1, 0, newIf)
}

// newIf runs then_branch or else_branch in a child of the calling run's
// context: the branch reads outer values (and caches) without copies.
func newIf(n *Node) (Kernel, error) {
	thenG, err := n.Attrs.Graph("then_branch")
	if err != nil {
		return nil, err
	}
	elseG, err := n.Attrs.Graph("else_branch")
	if err != nil {
		return nil, err
	}
	if thenG.NumOutputs() != n.NumOutputs || elseG.NumOutputs() != n.NumOutputs {
		return nil, fmt.Errorf("%w: If has %d outputs, branches %d and %d", errs.ErrInvalidModel, n.NumOutputs, thenG.NumOutputs(), elseG.NumOutputs())
	}
	return KernelFunc(func(ctx *Context) error {
		c, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		if c.Len() != 1 || c.Bool() == nil {
			return fmt.Errorf("%w: If condition must be a single bool, got %v", errs.ErrType, c)
		}
		g := elseG
		if c.Bool()[0] {
			g = thenG
		}
		outs, err := g.Run(ctx.Scope(), nil)
		if err != nil {
			return err
		}
		for i, t := range outs {
			if err := ctx.SetOutput(i, t); err != nil {
				return err
			}
		}
		return nil
	}), nil
}
