//go:build !(goexperiment.simd && amd64)

package mha

// pickExp: this build has only the portable exponential.
func pickExp() expFunc { return expSubGo }

// pickStream: this build has only the portable streaming loops.
func pickStream() *streamKernels { return &goStreamKernels }
