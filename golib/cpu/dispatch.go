package cpu

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// KernelEnv is the environment variable that forces a kernel path at start-up:
// auto (default: the best path the CPU supports), go, avx2 or avx512.
const KernelEnv = "OLKV_KERNEL"

// kernelVariants lists the kernel paths in order of preference, best last.
// The portable Go twin is always first; SIMD files append theirs in init
// when the build and the CPU support them.
var kernelVariants = []*kernelOps{&goOps}

var active atomic.Pointer[kernelOps]

// startupErr records an unusable OLKV_KERNEL value; the best path is used
// instead and KernelStartupError reports it.
var startupErr error

func init() {
	registerSIMD()
	active.Store(kernelVariants[len(kernelVariants)-1])
	if env := strings.TrimSpace(os.Getenv(KernelEnv)); env != "" {
		if err := selectKernel(env); err != nil { // gemm reads the variable itself
			startupErr = fmt.Errorf("%s=%q ignored: %w", KernelEnv, env, err)
		}
	}
}

func activeOps() *kernelOps { return active.Load() }

// KernelPaths returns the name of the active kernel path and every path
// available on this CPU and build, portable Go twin first, best last.
func KernelPaths() (activeName string, available []string) {
	for _, k := range kernelVariants {
		available = append(available, k.name)
	}
	return active.Load().name, available
}

// SetKernel selects the kernel path Attention uses: "auto" (the best one
// available) or one of the names KernelPaths lists. The matrix kernels
// (cpu/gemm) switch to the same instruction set. An unavailable path is
// an error wrapping cache.ErrInvalidArgument and leaves the selection as is.
func SetKernel(name string) error {
	if err := selectKernel(name); err != nil {
		return err
	}
	gemm.SetPath(activeOps().name) // the matrix kernels follow the same choice
	return nil
}

// selectKernel is SetKernel for the attention kernels alone.
func selectKernel(name string) error {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "auto" || name == "" {
		active.Store(kernelVariants[len(kernelVariants)-1])
		return nil
	}
	for _, k := range kernelVariants {
		if k.name == name {
			active.Store(k)
			return nil
		}
	}
	_, avail := KernelPaths()
	return fmt.Errorf("%w: kernel path %q is not available on this CPU/build (available: auto, %s)",
		cache.ErrInvalidArgument, name, strings.Join(avail, ", "))
}

// KernelStartupError reports why the OLKV_KERNEL setting was ignored at
// start-up, or nil.
func KernelStartupError() error { return startupErr }

// cpuTuning names the CPU tuning of the SIMD loops picked at start-up
// ("" in builds or on CPUs without the AVX2 path).
var cpuTuning string

// KernelTuning returns the name of the CPU tuning the SIMD paths' loops
// (AVX2 and AVX-512) use on this CPU ("intel" or "zen"), picked once at start-up by vendor,
// or "" where the build or the CPU has no AVX2 path.
func KernelTuning() string { return cpuTuning }
