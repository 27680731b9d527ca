package gemm

import "testing"

// TestStartupPath: OLKV_GEMM wins, OLKV_KERNEL decides when it is unset,
// auto otherwise.
func TestStartupPath(t *testing.T) {
	for _, tc := range []struct {
		gemm, kernel, want string
	}{
		{"", "", "auto"},
		{"go", "", "go"},
		{"", "avx2", "avx2"},
		{" avx512 ", "go", "avx512"},
		{"  ", " go", "go"},
	} {
		env := map[string]string{PathEnv: tc.gemm, KernelEnv: tc.kernel}
		if got := startupPath(func(k string) string { return env[k] }); got != tc.want {
			t.Errorf("%s=%q %s=%q: got %q, want %q", PathEnv, tc.gemm, KernelEnv, tc.kernel, got, tc.want)
		}
	}
}
