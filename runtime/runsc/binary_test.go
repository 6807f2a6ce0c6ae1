package runsc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// installedRunsc returns the runsc a driver with no Binary option uses,
// skipping t (failing it under CI) when there is none.
func installedRunsc(t *testing.T) string {
	t.Helper()
	path, err := findBinary("")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("runsc is not installed; CI must test the gVisor driver (make deps installs it)")
		}
		t.Skip("runsc is not installed (make deps installs it)")
	}
	return path
}

// TestBinaryVersionAndRestoreArgs reads the installed runsc's version and
// restore flags: a version, RestorePlain adding nothing, a mode that is
// none of the known ones refused by name, and RestoreAuto adding --direct
// only for a checkpoint outside tmpfs (when the runsc has it).
func TestBinaryVersionAndRestoreArgs(t *testing.T) {
	path := installedRunsc(t)
	ctx := context.Background()
	v, err := binaryVersion(ctx, path)
	if err != nil || v == "" {
		t.Fatalf("version of %s: %q %v", path, v, err)
	}
	if args, auto, err := restoreArgs(ctx, path, RestorePlain); err != nil || len(args) != 0 || auto {
		t.Fatalf("plain: %v %v %v, want no flags", args, auto, err)
	}
	if _, _, err := restoreArgs(ctx, path, "fast"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown mode: %v, want invalid argument", err)
	}
	help, _ := exec.Command(path, "restore", "--help").CombinedOutput()
	hasDirect := slices.Contains(strings.Split(string(help), "\n"), "  -direct")
	args, auto, err := restoreArgs(ctx, path, RestoreAuto)
	if err != nil || len(args) != 0 || auto != hasDirect {
		t.Fatalf("auto: %v %v %v, want no fixed flags and direct for disks %v", args, auto, err, hasDirect)
	}
	d := &Driver{restoreArgs: args, autoDirect: auto}
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		shm, err := os.MkdirTemp("/dev/shm", "forkbox-runsc-test-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(shm)
		if got := d.directFor(shm); slices.Contains(got, "--direct") {
			t.Fatalf("flags for a checkpoint in tmpfs: %v, want no --direct", got)
		}
	}
	disk, err := os.MkdirTemp("/var/tmp", "forkbox-runsc-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(disk)
	if err := unix.Statfs(disk, &st); err != nil || st.Type == unix.TMPFS_MAGIC {
		t.Skipf("%s is not on a disk here", disk)
	}
	if got := d.directFor(disk); slices.Contains(got, "--direct") != hasDirect {
		t.Fatalf("flags for a checkpoint on a disk: %v, want --direct %v", got, hasDirect)
	}
}
