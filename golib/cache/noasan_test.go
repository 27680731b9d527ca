//go:build !asan

package cache

// asanEnabled: see asan_test.go.
const asanEnabled = false
