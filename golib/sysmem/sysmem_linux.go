//go:build linux

package sysmem

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// available is the smallest of MemAvailable (/proc/meminfo), the headroom
// of the process's memory control group and the headroom under its
// address-space limit (RLIMIT_AS), each where known.
func available() int64 {
	return minKnown(memAvailable(), cgroupHeadroom(), addressSpaceHeadroom())
}

// memAvailable is the kernel's estimate of the memory available for new
// allocations without swapping (MemAvailable), 0 when unknown.
func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return kibField(string(data), "MemAvailable:")
}

// kibField returns the value, in bytes, of a "Name: <n> kB" line of a
// /proc file, 0 when it is missing or malformed.
func kibField(text, name string) int64 {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				return 0
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil || kb <= 0 || kb > math.MaxInt64>>10 {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupRoot is where the control-group file systems are mounted (a
// variable for tests).
var cgroupRoot = "/sys/fs/cgroup"

// cgroupHeadroom is the memory the process's control group (a container's
// limit) still grants: its limit minus its usage, the inactive file cache
// counted as free (the kernel reclaims it before failing); 0 when the
// group has no limit or none is found. cgroup v2 first, then v1; each at
// the process's path under the mount, then at the mount's root (what a
// container with its own cgroup namespace, or Docker's v1 mounts, show).
func cgroupHeadroom() int64 {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	v2, v1 := cgroupPaths(string(self))
	if v2 != "" {
		for _, dir := range groupDirs(cgroupRoot, v2) {
			if h := headroom(readInt(filepath.Join(dir, "memory.max")), readInt(filepath.Join(dir, "memory.current")),
				statField(filepath.Join(dir, "memory.stat"), "inactive_file")); h > 0 {
				return h
			}
		}
	}
	if v1 != "" {
		for _, dir := range groupDirs(filepath.Join(cgroupRoot, "memory"), v1) {
			if h := headroom(readInt(filepath.Join(dir, "memory.limit_in_bytes")), readInt(filepath.Join(dir, "memory.usage_in_bytes")),
				statField(filepath.Join(dir, "memory.stat"), "total_inactive_file")); h > 0 {
				return h
			}
		}
	}
	return 0
}

// groupDirs returns the directories a group's files may be in: its path
// under the mount, then the mount itself.
func groupDirs(mount, path string) []string {
	dir := filepath.Join(mount, path)
	if dir == filepath.Clean(mount) {
		return []string{dir}
	}
	return []string{dir, mount}
}

// cgroupPaths returns the process's cgroup v2 path ("0::<path>") and its
// cgroup v1 memory controller path ("<n>:...memory...:<path>") from the
// text of /proc/self/cgroup, "" where absent.
func cgroupPaths(text string) (v2, v1 string) {
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				v1 = parts[2]
			}
		}
	}
	return v2, v1
}

// headroom is limit - usage + reclaimable, 0 when the limit is unknown or
// absent (v2 "max", v1's huge "unlimited" value) or the usage unknown.
func headroom(limit, usage, reclaimable int64) int64 {
	if limit <= 0 || limit >= 1<<60 || usage <= 0 {
		return 0
	}
	return max(limit-usage+max(reclaimable, 0), 1)
}

// readInt returns the integer a control-group file holds, 0 when it is
// missing, "max" or malformed.
func readInt(path string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// statField returns a "name value" line's value from a memory.stat file, 0
// when absent.
func statField(path, name string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err == nil && v > 0 {
				return v
			}
			return 0
		}
	}
	return 0
}

// addressSpaceHeadroom is the address space the process may still map
// under its RLIMIT_AS (ulimit -v): the limit minus its current size
// (VmSize), 0 when unlimited or unknown.
func addressSpaceHeadroom() int64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &rl); err != nil || rl.Cur >= 1<<62 { // RLIM_INFINITY is all ones
		return 0
	}
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	size := kibField(string(data), "VmSize:")
	if size <= 0 {
		return 0
	}
	return max(int64(rl.Cur)-size, 1)
}
