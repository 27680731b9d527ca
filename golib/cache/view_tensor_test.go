package cache

import (
	"errors"
	"testing"
)

func TestTensorViewSegments(t *testing.T) {
	const batch, heads, maxLen, dk, dv = 2, 3, 5, 4, 2
	k := make([]byte, batch*heads*maxLen*dk*2)
	v := make([]byte, batch*heads*maxLen*dv*2)
	for i := range k {
		k[i] = byte(i)
	}
	var tv TensorView
	if err := tv.Reset(Float16, batch, heads, maxLen, dk, dv, k, v, []int{2, 5}); err != nil {
		t.Fatal(err)
	}
	if tv.SeqLen(1) != 5 || tv.WindowStart(1) != 0 || tv.KVHeads() != heads || tv.HeadDimV() != dv {
		t.Fatalf("geometry %d %d %d %d", tv.SeqLen(1), tv.WindowStart(1), tv.KVHeads(), tv.HeadDimV())
	}
	segs := tv.AppendSegments(nil, 1, 2, 1, 4)
	if len(segs) != 1 || segs[0].Start != 1 || segs[0].Len != 3 || len(segs[0].K) != 3*dk*2 || len(segs[0].V) != 3*dv*2 {
		t.Fatalf("segments %+v", segs)
	}
	// (b=1, h=2) is head 5; row 1 starts at byte (5*maxLen+1)*dk*2
	if want := byte((5*maxLen + 1) * dk * 2); segs[0].K[0] != want {
		t.Errorf("first K byte %d, want %d", segs[0].K[0], want)
	}
	if got := tv.AppendSegments(segs[:0], 0, 0, 2, 2); len(got) != 0 {
		t.Errorf("empty range gave %d segments", len(got))
	}
	if n := testing.AllocsPerRun(100, func() { segs = tv.AppendSegments(segs[:0], 0, 1, 0, 2) }); n != 0 {
		t.Errorf("AppendSegments allocates %v times", n)
	}
}

func TestTensorViewResetErrors(t *testing.T) {
	k := make([]byte, 2*1*4*8*4)
	for _, c := range []struct {
		name string
		f    func(tv *TensorView) error
	}{
		{"short buffer", func(tv *TensorView) error { return tv.Reset(Float32, 2, 1, 4, 8, 8, k[:10], k, []int{1, 1}) }},
		{"length past buffer", func(tv *TensorView) error { return tv.Reset(Float32, 2, 1, 4, 8, 8, k, k, []int{1, 5}) }},
		{"negative length", func(tv *TensorView) error { return tv.Reset(Float32, 2, 1, 4, 8, 8, k, k, []int{-1, 0}) }},
		{"lens count", func(tv *TensorView) error { return tv.Reset(Float32, 2, 1, 4, 8, 8, k, k, []int{1}) }},
		{"bad type", func(tv *TensorView) error { return tv.Reset(ElemType(9), 2, 1, 4, 8, 8, k, k, []int{1, 1}) }},
		{"zero heads", func(tv *TensorView) error { return tv.Reset(Float32, 2, 0, 4, 8, 8, k, k, []int{1, 1}) }},
	} {
		var tv TensorView
		if err := c.f(&tv); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v", c.name, err)
		}
	}
}
