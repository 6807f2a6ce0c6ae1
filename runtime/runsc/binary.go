package runsc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

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
