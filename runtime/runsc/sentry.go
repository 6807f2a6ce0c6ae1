package runsc

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// process names a host process across pid reuse: its pid and its start
// time (field 22 of /proc/PID/stat, in clock ticks since boot).
type process struct {
	pid   int
	start string
}

// startTime reads the start time of host pid.
func startTime(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onwards
	if len(f) < 20 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return f[19], nil
}

// sentryAlive reports whether sandbox id's Sentry process still runs. The
// first call asks runsc for its pid (one runsc process per sandbox); later
// ones read /proc only.
func (d *Driver) sentryAlive(ctx context.Context, id string) bool {
	d.sentryMu.Lock()
	p, ok := d.sentries[id]
	d.sentryMu.Unlock()
	if !ok {
		c, err := d.runsc.State(ctx, id)
		if err != nil || c.Pid <= 0 {
			return false
		}
		start, err := startTime(c.Pid)
		if err != nil {
			return false
		}
		p = process{pid: c.Pid, start: start}
		d.sentryMu.Lock()
		d.sentries[id] = p
		d.sentryMu.Unlock()
	}
	start, err := startTime(p.pid)
	return err == nil && start == p.start
}
