//go:build !asan

package cpu

const asanEnabled = false
