package kernrpc

import (
	"io/fs"
	"testing"
)

// The container's memory limit is the smallest set on the process's
// cgroup or an ancestor, in cgroup v2's or v1's file; "max" and v1's
// near-2^63 mean none.
func TestCgroupMemoryLimit(t *testing.T) {
	const v1Unlimited = "9223372036854771712\n"
	for _, tc := range []struct {
		name    string
		cgroups string
		files   map[string]string
		want    int64
		wantOK  bool
	}{
		{"v2 limit on the process's cgroup", "0::/kubepods/pod1/c1\n",
			map[string]string{"/sys/fs/cgroup/kubepods/pod1/c1/memory.max": "268435456\n", "/sys/fs/cgroup/memory.max": "max\n"}, 256 << 20, true},
		{"v2 limit on an ancestor", "0::/kubepods/pod1/c1\n",
			map[string]string{"/sys/fs/cgroup/kubepods/pod1/c1/memory.max": "max\n", "/sys/fs/cgroup/kubepods/pod1/memory.max": "134217728\n"}, 128 << 20, true},
		{"v2 unlimited", "0::/user.slice\n",
			map[string]string{"/sys/fs/cgroup/user.slice/memory.max": "max\n"}, 0, false},
		{"v1 memory controller among others", "4:cpu,memory:/docker/abc\n0::/\n",
			map[string]string{"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "67108864\n"}, 64 << 20, true},
		{"v1 unlimited, as on this CI's VM", "4:memory:/process_api/9c58\n0::/\n",
			map[string]string{"/sys/fs/cgroup/memory/process_api/9c58/memory.limit_in_bytes": v1Unlimited, "/sys/fs/cgroup/memory/memory.limit_in_bytes": v1Unlimited}, 0, false},
		{"the smaller of v1 and v2", "4:memory:/a\n0::/b\n",
			map[string]string{"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "100000000", "/sys/fs/cgroup/b/memory.max": "90000000"}, 90000000, true},
		{"unreadable or garbage", "0::/x\nbroken line\n4:memory:relative\n",
			map[string]string{"/sys/fs/cgroup/x/memory.max": "lots\n"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := func(name string) ([]byte, error) {
				if s, ok := tc.files[name]; ok {
					return []byte(s), nil
				}
				return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
			}
			got, ok := cgroupMemoryLimit(tc.cgroups, read)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("got %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
