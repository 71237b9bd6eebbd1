package kernrpc

import (
	"os"
	"path"
	"strconv"
	"strings"
)

// memoryLimit is the smallest memory limit of the cgroups the process is
// in, and of their ancestors (cgroup v2's memory.max, v1's
// memory.limit_in_bytes), as a container sets it; ok is false where none
// is set or none can be read.
func memoryLimit() (limit int64, ok bool) {
	cgroups, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	return cgroupMemoryLimit(string(cgroups), os.ReadFile)
}

// cgroupMemoryLimit reads the limits /proc/self/cgroup's lines name.
func cgroupMemoryLimit(cgroups string, read func(string) ([]byte, error)) (limit int64, ok bool) {
	for _, line := range strings.Split(cgroups, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !path.IsAbs(parts[2]) {
			continue
		}
		var root, file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			root, file = "/sys/fs/cgroup", "memory.max"
		case hasController(parts[1], "memory"):
			root, file = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
		default:
			continue
		}
		for dir := parts[2]; ; dir = path.Dir(dir) {
			if n, set := readLimit(read, path.Join(root, dir, file)); set && (!ok || n < limit) {
				limit, ok = n, true
			}
			if dir == "/" {
				break
			}
		}
	}
	return limit, ok
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readLimit reads one limit file: "max" (v2) or a page-rounded
// near-2^63 (v1) mean none.
func readLimit(read func(string) ([]byte, error), file string) (int64, bool) {
	b, err := read(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}
