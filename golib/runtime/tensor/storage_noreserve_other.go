//go:build unix && !linux

package tensor

const mapNoReserve = 0
