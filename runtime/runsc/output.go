package runsc

import (
	"errors"
	"os"
	"strings"
	"syscall"
)

// notExist reports whether a runsc CLI error (or its stderr) says the
// sandbox is unknown.
func notExist(err error) bool {
	s := err.Error()
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(s, "does not exist") || strings.Contains(s, "not found")
}

// summary picks what explains a runsc failure out of its output (which
// may end in a Go stack trace): the lines that speak of an error, at most
// three, else the last 1 KiB.
func summary(out []byte) string {
	var picked []string
	for _, line := range strings.Split(string(out), "\n") {
		l := strings.ToLower(line)
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(l, "goroutine ") {
			continue
		}
		if strings.Contains(l, "error") || strings.Contains(l, "cannot") || strings.Contains(l, "failed") ||
			strings.Contains(l, "panic") {
			picked = append(picked, strings.TrimSpace(line))
			if len(picked) == 3 {
				break
			}
		}
	}
	if len(picked) == 0 {
		return lastBytes(out, 1024)
	}
	return lastBytes([]byte(strings.Join(picked, "; ")), 1024)
}

func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}
