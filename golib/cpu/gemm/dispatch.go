package gemm

import (
	"os"
	"strings"
	"sync/atomic"
)

// kernels is one instruction-set variant of the inner loops. Every field has
// the same meaning in every variant; only speed differs.
type kernels struct {
	name string
	// mr x nr is the register tile of micro.
	mr, nr int
	// sliverMajor orders the blocked algorithm's micro calls sliver by
	// sliver (each B sliver against every A panel of a block) instead of
	// panel by panel; see block.
	sliverMajor bool
	// micro adds alpha * Ap * Bp to the mr x nr tile of c (row stride ldc),
	// where Ap is an A panel packed column by column (kc steps of mr values)
	// and Bp a B panel packed row by row (kc steps of nr values).
	micro func(kc int, ap, bp []float32, alpha float32, c []float32, ldc int)
	// microRows, when set, is micro for the first rows (1 <= rows < mr)
	// rows of the tile only (the A panel still packed mr values a step):
	// the edge panel of a product whose row count is not a multiple of
	// mr, written straight into c. Without it the edge tile is computed
	// in full aside and its valid rows copied.
	microRows func(rows, kc int, ap, bp []float32, alpha float32, c []float32, ldc int)
	// microNext, when set, is micro (all mr rows) that also prefetches
	// next (len(next)/nr <= kc rows of the B sliver the following micro
	// calls read) into L2, in sliverMajor order; microHalfNext is the
	// same for microHalf. nextPanels is how many of a block's full A
	// panels share each sliver's prefetch, a part each (0: all of them,
	// so the next sliver streams in during the whole of the current one).
	microNext     func(kc int, ap, bp []float32, alpha float32, c []float32, ldc int, next []float32)
	microHalfNext func(kind Half, kc int, ap []float32, bp []uint16, alpha float32, c []float32, ldc int, next []uint16)
	nextPanels    int
	// microHalf, when set, is microRows (1 <= rows <= mr) over a 16-bit B
	// sliver of encoding kind (a PackBHalf block read in place, widened in
	// registers); without it the blocked algorithm widens each block into
	// a float32 buffer first (cvt16).
	microHalf func(kind Half, rows, kc int, ap []float32, bp []uint16, alpha float32, c []float32, ldc int)
	// axpy4 adds a0*x0 + a1*x1 + a2*x2 + a3*x3 to y (all of len(y)).
	axpy4 func(a0, a1, a2, a3 float32, x0, x1, x2, x3, y []float32)
	// axpy adds a*x to y.
	axpy func(a float32, x, y []float32)
	// dot returns the sum of x[i]*y[i] over len(x).
	dot func(x, y []float32) float32
	// cvt16 widens 16-bit floats of the given encoding into dst, exactly.
	cvt16 func(kind Half, dst []float32, src []uint16)
	// dequant widens rows of a quantized sliver (dequantGo's contract,
	// bit for bit).
	dequant func(nibbles bool, dst []float32, src []byte, s, z *[packNR]float32)
	// panelQuantRow, when set, is dequant and panelRow at once for one
	// row of A: out[c] += sum_r a[r]*W[r][c] over len(a) rows of one
	// group of a quantized sliver, the values dequantized in registers.
	panelQuantRow func(nibbles bool, a []float32, src []byte, s, z *[packNR]float32, out *[packNR]float32)
	// axpy8, when set, is axpy4 over eight rows.
	axpy8 func(a *[8]float32, x *[8][]float32, y []float32)
	// axpy8m, when set, is axpy8 for m <= skinnyRows rows of C at once:
	// y[i] += sum_r a[i][r]*x[r] for i < m, each B vector loaded once.
	axpy8m func(m int, a *[skinnyRows][8]float32, x *[8][]float32, y *[skinnyRows][]float32)
	// axpy4Half, when set, is axpy4 reading 16-bit rows directly.
	axpy4Half func(kind Half, a0, a1, a2, a3 float32, x0, x1, x2, x3 []uint16, y []float32)
	// panel adds sum_l a[i][l]*p[l*packNR+j] to out[i][j] for i < m over
	// one packed sliver p of k rows (a k-block of PackB's layout).
	panel func(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32)
	// panelRow, when set, is panel for one row (m = 1) adding into one
	// row of packNR values, which may be C itself.
	panelRow func(k int, a []float32, p []float32, out *[packNR]float32)
	// panelHalf, when set, is panel over a 16-bit sliver (PackBHalf) of
	// encoding kind; without it the sliver is widened first (cvt16).
	panelHalf func(kind Half, m, k int, a *[skinnyRows][]float32, p []uint16, out *[skinnyRows][packNR]float32)
}

// registry lists the variants this build and CPU can run, portable first.
var registry = []*kernels{&goKernels}

var current atomic.Pointer[kernels]

// PathEnv forces the variant at start-up: auto, go, avx2 or avx512. When it
// is unset, KernelEnv (the attention kernels' variable) decides, so one
// setting selects the instruction set of every kernel.
const PathEnv = "OLKV_GEMM"

// KernelEnv is the cpu package's kernel-path variable (cpu.KernelEnv, which
// this package cannot import: cpu imports it).
const KernelEnv = "OLKV_KERNEL"

func init() {
	registry = append(registry, simdKernels()...)
	current.Store(choose(startupPath(os.Getenv)))
}

// startupPath returns the variant the environment asks for: PathEnv, else
// KernelEnv, else auto.
func startupPath(getenv func(string) string) string {
	if v := strings.TrimSpace(getenv(PathEnv)); v != "" {
		return v
	}
	if v := strings.TrimSpace(getenv(KernelEnv)); v != "" {
		return v
	}
	return "auto"
}

// choose returns the variant named by want, or the fastest one available
// when want is "auto", empty or not available here.
func choose(want string) *kernels {
	want = strings.ToLower(strings.TrimSpace(want))
	for _, k := range registry {
		if k.name == want {
			return k
		}
	}
	return registry[len(registry)-1]
}

func active() *kernels { return current.Load() }

// Path names the kernel variant in use: "go", "avx2" or "avx512".
func Path() string { return active().name }

// Paths lists the variants available in this build on this CPU.
func Paths() []string {
	names := make([]string, len(registry))
	for i, k := range registry {
		names[i] = k.name
	}
	return names
}

// SetPath switches the variant used by later calls ("auto" picks the
// fastest) and reports whether the name was available. It is meant for tests
// and benchmarks; calls in flight keep the variant they started with.
func SetPath(name string) bool {
	k := choose(name)
	current.Store(k)
	return k.name == name || name == "auto"
}
