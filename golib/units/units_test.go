package units

import "testing"

func TestSizeAndBytes(t *testing.T) {
	cases := []struct {
		n           int64
		size, bytes string
	}{
		{0, "0 B", "0 bytes"},
		{512, "512 B", "512 bytes"},
		{1023, "1023 B", "1023 bytes"},
		{1024, "1.0 KiB", "1.0 KiB (1024 bytes)"},
		{1536, "1.5 KiB", "1.5 KiB (1536 bytes)"},
		{3 << 20, "3.0 MiB", "3.0 MiB (3145728 bytes)"},
		{68719476736, "64.0 GiB", "64.0 GiB (68719476736 bytes)"},
		{1 << 40, "1.0 TiB", "1.0 TiB (1099511627776 bytes)"},
		{-2048, "-2.0 KiB", "-2.0 KiB (-2048 bytes)"},
		{1<<63 - 1, "8.0 EiB", "8.0 EiB (9223372036854775807 bytes)"},
	}
	for _, c := range cases {
		if got := Size(c.n); got != c.size {
			t.Errorf("Size(%d) = %q, want %q", c.n, got, c.size)
		}
		if got := Bytes(c.n); got != c.bytes {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.bytes)
		}
	}
}
