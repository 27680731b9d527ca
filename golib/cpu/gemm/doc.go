// Package gemm is the single-precision matrix multiply of the CPU runtime:
// C = alpha*op(A)*op(B) + beta*C on row-major float32 slices with explicit
// sizes and leading dimensions, as BLAS sgemm defines it.
//
// Two strategies share every call. Short products (few rows of op(A), the
// decode case) stream op(B) once with vectorized axpy or dot kernels: they
// are bound by the bandwidth of reading the weights. Everything else goes
// through a cache-blocked driver (Goto/BLIS loop order) that packs panels of
// op(A) and op(B) and runs an MR x NR register-tile micro-kernel. A
// constant B (weights) may also be packed once into column panels (PackB)
// so that short products read it as one contiguous stream with their
// results held in registers (SgemmPacked).
//
// Each kernel has a portable Go twin and, when built with GOEXPERIMENT=simd
// on amd64, AVX2+FMA and AVX-512 variants written with simd/archsimd. The
// variant is chosen once at init from cpuid; the environment variable
// OLKV_GEMM=auto|go|avx2|avx512 forces one, and when it is unset
// OLKV_KERNEL (which selects the attention kernels) does (an unavailable
// choice falls back to auto). The AVX2 micro and decode-step kernels are
// assembly (micro_avx2_amd64.s), as is the AVX-512 micro kernel. Work is split over row or column blocks on a small persistent
// worker pool (see For).
package gemm
