//go:build !race

package cache

// raceEnabled: see race_test.go.
const raceEnabled = false
