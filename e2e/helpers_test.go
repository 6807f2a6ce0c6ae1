package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// readCgroupInt reads an integer cgroup v1 file of sandbox id from the host.
func readCgroupInt(t *testing.T, controller, id, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, "forkbox", id, file))
	if err != nil {
		t.Fatalf("read cgroup file: %v", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("parse %s: %v", file, err)
	}
	return n
}

// assertGone checks that nothing of sandbox id is left on the host: no
// cgroup in any hierarchy, no runc state, no mount, no directory.
func assertGone(t *testing.T, dataDir, id string) {
	t.Helper()
	for _, c := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices", "blkio", "cpuset", "systemd", "unified"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "forkbox", id)); err == nil {
			t.Errorf("cgroup %s/forkbox/%s is left", c, id)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "runc", id)); err == nil {
		t.Errorf("runc state of %s is left", id)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); err == nil {
		t.Errorf("sandbox directory of %s is left", id)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), id) {
		t.Errorf("a mount of %s is left", id)
	}
}
