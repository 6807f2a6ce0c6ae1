package runsc_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/runtime/runsc"
)

// mountsUnder lists the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// TestReleaseRoot stacks two bind mounts of a network namespace on the
// state root's null-netns file, as two concurrent first starts of runsc
// do, and checks that ReleaseRoot removes both, so the root can be
// removed, and that a root with nothing mounted is fine.
func TestReleaseRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs the tests as root")
		}
		t.Skip("bind mounts need root")
	}
	root := t.TempDir()
	p := filepath.Join(root, "null-netns")
	if err := os.WriteFile(p, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := unix.Mount("/proc/self/ns/net", p, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for unix.Unmount(p, unix.MNT_DETACH) == nil {
		}
	})
	if m := mountsUnder(t, root); len(m) != 2 {
		t.Fatalf("mounts before: %v, want 2", m)
	}
	if err := runsc.ReleaseRoot(root); err != nil {
		t.Fatal(err)
	}
	if m := mountsUnder(t, root); len(m) != 0 {
		t.Fatalf("mounts after ReleaseRoot: %v", m)
	}
	if err := os.RemoveAll(root); err != nil {
		t.Fatalf("remove the released root: %v", err)
	}
	if err := runsc.ReleaseRoot(root); err != nil {
		t.Fatalf("release of a root that is gone: %v", err)
	}
}
