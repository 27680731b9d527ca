//go:build linux

package sysmem

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestKibField(t *testing.T) {
	text := "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   12288000 kB\nBad: x kB\n"
	for _, c := range []struct {
		name string
		want int64
	}{
		{"MemAvailable:", 12288000 << 10},
		{"MemFree:", 100 << 10},
		{"Missing:", 0},
		{"Bad:", 0},
	} {
		if got := kibField(text, c.name); got != c.want {
			t.Errorf("kibField(%q) = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestCgroupPaths(t *testing.T) {
	for _, c := range []struct {
		text, v2, v1 string
	}{
		{"0::/user.slice/session-1.scope\n", "/user.slice/session-1.scope", ""},
		{"12:cpu,cpuacct:/a\n9:memory:/docker/abc\n1:name=systemd:/x\n", "", "/docker/abc"},
		{"9:memory,hugetlb:/k8s/pod\n0::/k8s/pod\n", "/k8s/pod", "/k8s/pod"},
		{"", "", ""},
	} {
		v2, v1 := cgroupPaths(c.text)
		if v2 != c.v2 || v1 != c.v1 {
			t.Errorf("cgroupPaths(%q) = %q, %q; want %q, %q", c.text, v2, v1, c.v2, c.v1)
		}
	}
}

func TestHeadroom(t *testing.T) {
	for _, c := range []struct {
		limit, usage, reclaim, want int64
	}{
		{8 << 30, 2 << 30, 0, 6 << 30},
		{8 << 30, 2 << 30, 1 << 30, 7 << 30},
		{8 << 30, 9 << 30, 0, 1}, // over the limit: known and (almost) nothing left
		{0, 2 << 30, 0, 0},       // "max" or missing: unknown
		{1 << 62, 2 << 30, 0, 0}, // cgroup v1's "unlimited"
		{8 << 30, 0, 0, 0},       // usage unknown
	} {
		if got := headroom(c.limit, c.usage, c.reclaim); got != c.want {
			t.Errorf("headroom(%d, %d, %d) = %d, want %d", c.limit, c.usage, c.reclaim, got, c.want)
		}
	}
}

// TestCgroupHeadroom reads a fake control-group tree laid out at the
// process's own cgroup path.
func TestCgroupHeadroom(t *testing.T) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip("no /proc/self/cgroup")
	}
	v2, _ := cgroupPaths(string(self))
	if v2 == "" {
		t.Skip("not on cgroup v2")
	}
	root := t.TempDir()
	dir := filepath.Join(root, v2)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := cgroupRoot
	cgroupRoot = root
	defer func() { cgroupRoot = old }()
	write("memory.max", "max\n")
	write("memory.current", "1073741824\n")
	if got := cgroupHeadroom(); got != 0 {
		t.Errorf("no limit: headroom %d, want 0", got)
	}
	write("memory.max", "4294967296\n")
	write("memory.stat", "anon 1\ninactive_file 536870912\nactive_file 3\n")
	if got, want := cgroupHeadroom(), int64(4<<30-1<<30+512<<20); got != want {
		t.Errorf("limit 4 GiB, usage 1 GiB, 512 MiB inactive file: headroom %d, want %d", got, want)
	}
	if v2 != "/" {
		// a container's own namespace: the files at the mount's root
		for _, name := range []string{"memory.max", "memory.current", "memory.stat"} {
			if err := os.Rename(filepath.Join(dir, name), filepath.Join(root, name)); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := cgroupHeadroom(), int64(4<<30-1<<30+512<<20); got != want {
			t.Errorf("files at the mount's root: headroom %d, want %d", got, want)
		}
	}
}

// TestAddressSpaceHeadroom lowers the soft RLIMIT_AS for a moment.
func TestAddressSpaceHeadroom(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &rl); err != nil {
		t.Skip(err)
	}
	data, err := os.ReadFile("/proc/self/status")
	if err != nil || !strings.Contains(string(data), "VmSize:") {
		t.Skip("no VmSize")
	}
	size := kibField(string(data), "VmSize:")
	limit := uint64(size) + 64<<30
	if limit > rl.Max {
		t.Skip("hard limit too low")
	}
	lowered := syscall.Rlimit{Cur: limit, Max: rl.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &lowered); err != nil {
		t.Skip(err)
	}
	got := addressSpaceHeadroom()
	avail := Available()
	if err := syscall.Setrlimit(syscall.RLIMIT_AS, &rl); err != nil {
		t.Fatal(err)
	}
	// VmSize moves a little between the two reads.
	if got < 63<<30 || got > 65<<30 {
		t.Errorf("headroom under VmSize + 64 GiB: %d", got)
	}
	if avail <= 0 || avail > got {
		t.Errorf("Available() = %d, not within (0, %d]", avail, got)
	}
	if rl.Cur >= 1<<62 && addressSpaceHeadroom() != 0 {
		t.Errorf("unlimited again: headroom %d, want 0", addressSpaceHeadroom())
	}
}

func TestMinKnown(t *testing.T) {
	for _, c := range []struct {
		in   []int64
		want int64
	}{
		{nil, 0},
		{[]int64{0, 0}, 0},
		{[]int64{5, 0, 3}, 3},
		{[]int64{0, 7}, 7},
	} {
		if got := minKnown(c.in...); got != c.want {
			t.Errorf("minKnown(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestFits: a request larger than the figure is refused, small requests
// use a recent reading without allocating, large ones read anew.
func TestFits(t *testing.T) {
	avail := Available()
	if avail <= 0 {
		t.Skip("available memory unknown")
	}
	if ok, got := Fits(1 << 20); !ok || got <= 0 {
		t.Errorf("Fits(1 MiB) = %v, %d", ok, got)
	}
	if ok, _ := Fits(avail * 4); ok {
		t.Errorf("Fits(4x available %d) = true", avail)
	}
	if allocs := testing.AllocsPerRun(100, func() { Fits(4096) }); allocs != 0 {
		t.Errorf("Fits of a small request allocates %v times", allocs)
	}
	last.Store(1) // a stale tiny reading: a large request reads anew
	if ok, got := Fits(FreshMin); !ok || got == 1 {
		t.Errorf("Fits(FreshMin) after a tiny cached reading = %v, %d", ok, got)
	}
}

// TestRoom: Room reads once when the need fits, and reads again after a
// reclaim when it does not (an unknown figure is never re-read).
func TestRoom(t *testing.T) {
	for _, c := range []struct {
		need      int64
		reads     []int64
		want      int64
		wantReads int
	}{
		{10, []int64{20}, 20, 1},
		{10, []int64{0}, 0, 1},
		{30, []int64{20, 40}, 40, 2},
		{30, []int64{20, 25}, 25, 2},
	} {
		n := 0
		got := Room(c.need, func() int64 { n++; return c.reads[n-1] })
		if got != c.want || n != c.wantReads {
			t.Errorf("Room(%d) over %v = %d after %d reads, want %d after %d", c.need, c.reads, got, n, c.want, c.wantReads)
		}
	}
}
