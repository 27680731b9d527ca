package model

import (
	"fmt"
	"strconv"
)

func sprint(v any) string { return fmt.Sprint(v) }
func itoa(i int) string   { return strconv.Itoa(i) }
