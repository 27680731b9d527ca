//go:build asan

package cache

// asanEnabled: the address sanitizer build, whose instrumentation allocates.
const asanEnabled = true
