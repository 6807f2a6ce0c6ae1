package runtime

import (
	"regexp"
	"strings"
)

// MountError is a sandbox start that failed because the runtime could not
// mount Target (a path in the sandbox) into its root filesystem: in
// practice the template's file or directory at that path is of the wrong
// kind (a symlink into /proc, a directory where a file is mounted). It
// unwraps to the runtime's own error (of class errdefs.ErrInternal, with
// host paths: for the log); its message names only Target.
type MountError struct {
	// Target is the mount's path in the sandbox, as the runtime reports it
	// (runc: the configured target; runsc: the target as resolved in the
	// root filesystem).
	Target string
	// Err is the runtime's error.
	Err error
}

// Error returns "the runtime could not mount <Target> in the sandbox".
func (e *MountError) Error() string {
	return "the runtime could not mount " + e.Target + " in the sandbox"
}

// Unwrap returns the runtime's error.
func (e *MountError) Unwrap() error { return e.Err }

// mountFailure matches the runtimes' messages for a mount that failed
// while a sandbox started (their stderr, quoted in err's text, so quotes
// may be escaped): runc 1.1 `error mounting "SRC" to rootfs at "TARGET"`,
// runsc `mount submount "TARGET"`.
var mountFailure = regexp.MustCompile(`(?:error mounting \\?"[^"\\]*\\?" to rootfs at|mount submount) \\?"([^"\\]+)\\?"`)

// AsMountError returns a *MountError wrapping err when err's text is a
// runtime's report of a mount that failed (see mountFailure), else err.
// Drivers call it on the error of starting a sandbox.
func AsMountError(err error) error {
	if err == nil {
		return nil
	}
	m := mountFailure.FindStringSubmatch(err.Error())
	if m == nil || !strings.HasPrefix(m[1], "/") {
		return err
	}
	return &MountError{Target: m[1], Err: err}
}
