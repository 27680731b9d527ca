//go:build race

package cpu

// raceEnabled shrinks the test grids under the (slow) race detector.
const raceEnabled = true
