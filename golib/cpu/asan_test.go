//go:build asan

package cpu

// asanEnabled: the address sanitizer build, whose instrumentation allocates.
const asanEnabled = true
