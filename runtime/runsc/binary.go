package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// PinnedBinary is where the install script (scripts/install-deps.sh) puts
// the runsc it builds from gVisor's Go branch at a pinned commit: a stable
// name leading to that version's own directory. A driver given no binary
// uses it when it is there, and else the runsc in PATH (the distribution's
// package, the fallback).
const PinnedBinary = "/usr/local/lib/forkbox/runsc"

// findBinary resolves the runsc a driver runs: bin when it is not "" (a
// path or a name in PATH), else PinnedBinary when executable, else "runsc"
// in PATH. ErrUnavailable when there is none.
func findBinary(bin string) (string, error) {
	if bin == "" {
		if st, err := os.Stat(PinnedBinary); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return PinnedBinary, nil
		}
		bin = "runsc"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("gvisor driver: %w: %v", errdefs.ErrUnavailable, err)
	}
	return path, nil
}

// binaryVersion returns the version runsc at path reports ("runsc version
// X" on its first line of --version: X), within 10 s.
func binaryVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	v, ok := strings.CutPrefix(strings.TrimSpace(first), "runsc version ")
	if !ok || v == "" {
		return "", errors.New(path + " --version: no version in " + strings.TrimSpace(first))
	}
	return v, nil
}

var _ runtime.Versioner = (*Driver)(nil)

// Binary returns the path of the runsc the driver runs.
func (d *Driver) Binary() string { return d.bin }

// Version returns the version of the driver's runsc as it reports it
// ("0.0~20240729.0" for the 2024 package, the module version of a build
// from the Go branch).
func (d *Driver) Version() string { return d.version }

// Restore modes (Options.Restore): how runsc restore reads a checkpoint.
const (
	// RestoreAuto is RestoreDirect for a checkpoint on a disk when the
	// runsc has --direct, else RestorePlain: O_DIRECT reads of a tmpfs
	// file copy it anyway and measured slower here than reading it
	// through the page cache (110 MB: 218-440 ms against 65-200 ms), and
	// restores from tmpfs with --direct were slower in paired runs too.
	RestoreAuto = ""
	// RestorePlain reads the pages file through the page cache.
	RestorePlain = "plain"
	// RestoreDirect reads it with O_DIRECT (runsc restore --direct).
	RestoreDirect = "direct"
	// RestoreBackground returns once the kernel state is restored and
	// loads the pages while the sandbox runs (--background).
	RestoreBackground = "background"
	// RestoreDirectBackground is both.
	RestoreDirectBackground = "direct+background"
)

// restoreArgs returns the runsc restore flags of mode for the runsc at
// path, whose restore --help tells which flags it has, and whether
// RestoreAuto may add --direct (for checkpoints not on tmpfs, see
// directFor). A mode asking for a flag the runsc lacks is
// ErrInvalidArgument.
func restoreArgs(ctx context.Context, path, mode string) (args []string, autoDirect bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// --help exits non-zero ("help requested") after printing the flags.
	help, _ := exec.CommandContext(ctx, path, "restore", "--help").CombinedOutput()
	has := func(flag string) bool { return strings.Contains(string(help), "\n  -"+flag+"\n") }
	var want []string
	switch mode {
	case RestoreAuto:
		return nil, has("direct"), nil
	case RestorePlain:
		return nil, false, nil
	case RestoreDirect:
		want = []string{"direct"}
	case RestoreBackground:
		want = []string{"background"}
	case RestoreDirectBackground:
		want = []string{"direct", "background"}
	default:
		return nil, false, errdefs.InvalidField("restore", "%q is none of %q, %q, %q, %q", mode,
			RestorePlain, RestoreDirect, RestoreBackground, RestoreDirectBackground)
	}
	for _, f := range want {
		if !has(f) {
			return nil, false, errdefs.InvalidField("restore", "runsc %s has no restore --%s", path, f)
		}
		args = append(args, "--"+f)
	}
	return args, false, nil
}

// directFor returns the flags for a restore of the checkpoint in dir:
// the configured ones, plus --direct under RestoreAuto when dir is not on
// a tmpfs.
func (d *Driver) directFor(dir string) []string {
	var st unix.Statfs_t
	if !d.autoDirect || unix.Statfs(dir, &st) != nil || st.Type == unix.TMPFS_MAGIC {
		return d.restoreArgs
	}
	return append(append([]string(nil), d.restoreArgs...), "--direct")
}

// RestoreArgs returns the flags the driver adds to every runsc restore,
// and whether it adds --direct for checkpoints not on tmpfs.
func (d *Driver) RestoreArgs() ([]string, bool) { return d.restoreArgs, d.autoDirect }
