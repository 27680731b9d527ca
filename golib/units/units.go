// Package units formats quantities for the messages people read: error
// messages name sizes in binary units and keep the exact byte count.
package units

import "strconv"

var byteUnits = [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// Size is n bytes in binary units with one decimal: "512 B", "1.5 KiB",
// "64.0 GiB".
func Size(n int64) string {
	if n > -1024 && n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v := float64(n)
	u := 0
	for (v >= 1024 || v <= -1024) && u < len(byteUnits)-1 {
		v /= 1024
		u++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + byteUnits[u]
}

// Bytes is n bytes for an error message: the binary-unit size, then the
// exact count: "64.0 GiB (68719476736 bytes)"; below 1 KiB just "512 bytes".
func Bytes(n int64) string {
	if n > -1024 && n < 1024 {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	return Size(n) + " (" + strconv.FormatInt(n, 10) + " bytes)"
}
