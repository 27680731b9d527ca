package cache

import (
	"errors"
	"testing"
)

// The budget messages name sizes in binary units and keep the exact byte counts.
func TestBudgetErrorMessage(t *testing.T) {
	cases := []struct {
		err  *BudgetError
		want string
	}{
		{&BudgetError{Requested: 64 << 30, Committed: 1 << 20, Budget: 2 << 30},
			"memory budget exceeded: requested 64.0 GiB (68719476736 bytes) with 1.0 MiB (1048576 bytes) of the " +
				"2.0 GiB (2147483648 bytes) budget committed (2.0 GiB (2146435072 bytes) free)"},
		{&BudgetError{Requested: 64 << 30, Committed: 0, Budget: 8 << 30, Machine: true},
			"memory budget exceeded: requested 64.0 GiB (68719476736 bytes) with 0 bytes committed, but the machine " +
				"has only 8.0 GiB (8589934592 bytes) available"},
		{&BudgetError{Requested: 512, Committed: 100, Budget: 600},
			"memory budget exceeded: requested 512 bytes with 100 bytes of the 600 bytes budget committed (500 bytes free)"},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
		if !errors.Is(c.err, ErrBudget) {
			t.Errorf("%v does not match ErrBudget", c.err)
		}
	}
}
