package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// cgroupDirs returns sandbox id's cgroup directories in controller's
// hierarchy ("*": every hierarchy), under whichever daemon's parent.
func cgroupDirs(controller, id string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", controller, "*", id))
	return dirs
}

// cgroupFile is the path of file in sandbox id's cgroup in controller's
// hierarchy; the test fails when there is not exactly one such cgroup.
func cgroupFile(t *testing.T, controller, id, file string) string {
	t.Helper()
	dirs := cgroupDirs(controller, id)
	if len(dirs) != 1 {
		t.Fatalf("cgroup of %s in %s: %v", id, controller, dirs)
	}
	return filepath.Join(dirs[0], file)
}

// readCgroupInt reads an integer cgroup v1 file of sandbox id from the host.
func readCgroupInt(t *testing.T, controller, id, file string) int64 {
	t.Helper()
	b, err := os.ReadFile(cgroupFile(t, controller, id, file))
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
	if dirs := cgroupDirs("*", id); len(dirs) > 0 {
		t.Errorf("cgroups of %s are left: %v", id, dirs)
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

// hostPath returns where path inside sandbox id lives on the host: under
// the root filesystem its runtime bundle names (a merged overlay or a btrfs
// subvolume, whichever storage driver is in use).
func hostPath(t *testing.T, dataDir, id, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "sandboxes", id, "config.json"))
	if err != nil {
		t.Fatalf("read bundle of %s: %v", id, err)
	}
	var spec struct {
		Root struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := json.Unmarshal(b, &spec); err != nil || spec.Root.Path == "" {
		t.Fatalf("bundle of %s names no root filesystem (%v)", id, err)
	}
	return filepath.Join(spec.Root.Path, path)
}

// runHost runs a command on the host and returns its output.
func runHost(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// killInit SIGKILLs sandbox id's init (its agent) from the host.
func killInit(t *testing.T, id string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.dataDir, "sandboxes", id, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	runHost(t, "kill", "-9", strings.TrimSpace(string(b)))
}
