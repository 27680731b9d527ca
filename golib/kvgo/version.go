package kvgo

import (
	_ "embed"
	"strings"
)

// versionFile is the package version, the one source both the Go build and
// the Python package metadata (pyproject.toml reads this file) take it from.
//
//go:embed VERSION
var versionFile string

// version is versionFile without the trailing newline.
var version = strings.TrimSpace(versionFile)
