package build

import (
	"fmt"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// A Dockerfile's HEALTHCHECK is the template's ready check
// (storage.Template.ReadyCmd): Docker's health check is the image's own
// statement of how to tell its server works, which is what a create
// waits for. The mapping:
//
//	HEALTHCHECK CMD ["a", "b"]            ready check argv a b
//	HEALTHCHECK CMD curl -fs localhost    /bin/sh -c 'curl -fs localhost'
//	HEALTHCHECK --start-period=30s CMD …  the create waits up to 30 s (rounded up)
//	HEALTHCHECK NONE                      no ready check (also none inherited)
//
// --interval, --start-interval, --timeout and --retries are accepted and
// not used: a create polls every 50 ms until the check passes or the
// wait ends. A HEALTHCHECK is inherited from the FROM template, as in
// Docker.

// checkHealth says why forkbox does not build the HEALTHCHECK c (nil
// when it does): a command longer than storage.MaxReadyCmdBytes (its
// arguments joined by spaces, not counting the "/bin/sh -c " the shell
// form and ReadyLine put before a line), or a --start-period past
// storage.MaxReadyTimeoutS.
func checkHealth(c *instructions.HealthCheckCommand) error {
	argv, timeoutS := readyCheck(c)
	n := len(strings.Join(argv, " "))
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		n = len(argv[2])
	}
	if n > storage.MaxReadyCmdBytes {
		return fmt.Errorf("HEALTHCHECK's command is %d bytes, longer than %d", n, storage.MaxReadyCmdBytes)
	}
	if timeoutS > storage.MaxReadyTimeoutS {
		return fmt.Errorf("HEALTHCHECK --start-period is longer than %d s", storage.MaxReadyTimeoutS)
	}
	return nil
}

// readyCheck is the ready check HEALTHCHECK c sets (nil for NONE) and
// its timeout in whole seconds, rounded up (0: the default).
func readyCheck(c *instructions.HealthCheckCommand) ([]string, int64) {
	if c.Health == nil || len(c.Health.Test) < 2 {
		return nil, 0 // NONE
	}
	var argv []string
	switch c.Health.Test[0] {
	case "CMD-SHELL":
		argv = []string{"/bin/sh", "-c", strings.Join(c.Health.Test[1:], " ")}
	default: // "CMD", the exec form
		argv = append([]string(nil), c.Health.Test[1:]...)
	}
	return argv, int64((c.Health.StartPeriod + time.Second - 1) / time.Second)
}

// ReadyLine checks a ready check given as a shell line (a build's
// ready_cmd, E2B's readyCmd) and returns it as the template's argv
// (/bin/sh -c line). Errors are ErrInvalidArgument naming field: an
// empty line or one longer than storage.MaxReadyCmdBytes, or one with a
// NUL byte.
func ReadyLine(field, line string) ([]string, error) {
	switch {
	case strings.TrimSpace(line) == "":
		return nil, errdefs.InvalidField(field, "the ready command is empty")
	case len(line) > storage.MaxReadyCmdBytes:
		return nil, errdefs.InvalidField(field, "the ready command is %d bytes, longer than %d", len(line), storage.MaxReadyCmdBytes)
	case strings.ContainsRune(line, 0):
		return nil, errdefs.InvalidField(field, "the ready command has a NUL byte")
	}
	return []string{"/bin/sh", "-c", line}, nil
}

// ReadyTimeout checks a ready timeout in seconds (0: the default):
// ErrInvalidArgument naming field when it is negative or past
// storage.MaxReadyTimeoutS.
func ReadyTimeout(field string, s int64) error {
	if s < 0 || s > storage.MaxReadyTimeoutS {
		return errdefs.InvalidField(field, "must be between 0 (the default, %d s) and %d seconds", storage.DefaultReadyTimeoutS, storage.MaxReadyTimeoutS)
	}
	return nil
}
