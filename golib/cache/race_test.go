//go:build race

package cache

// raceEnabled shrinks the quantized random-operation runs under the (slow)
// race detector.
const raceEnabled = true
