package defaults

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestLimitsAreConsistent checks that every default lies within its own
// bounds, so a create that names nothing is always admitted by them.
func TestLimitsAreConsistent(t *testing.T) {
	l := Limits()
	if l.DefaultCPU <= 0 || l.DefaultCPU > l.MaxCPU {
		t.Errorf("cpu: default %v, max %v", l.DefaultCPU, l.MaxCPU)
	}
	for _, c := range []struct {
		name          string
		min, def, max int64
	}{
		{"memory_mb", l.MinMemoryMB, l.DefaultMemoryMB, l.MaxMemoryMB},
		{"pids", l.MinPids, l.DefaultPids, l.MaxPids},
		{"timeout_s", 1, l.DefaultTimeoutS, l.MaxTimeoutS},
		{"disk_mb", l.MinDiskMB, l.DefaultDiskMB, l.MaxDiskMB},
	} {
		if c.min <= 0 || c.def < c.min || c.def > c.max {
			t.Errorf("%s: default %d outside [%d, %d]", c.name, c.def, c.min, c.max)
		}
	}
	if l.DefaultTimeoutS != SessionTimeoutS || ExecTimeoutS > l.MaxTimeoutS {
		t.Errorf("timeouts: session %d (want %d), exec %d, max %d", l.DefaultTimeoutS, SessionTimeoutS, ExecTimeoutS, l.MaxTimeoutS)
	}
	if ExecInflightPerTenant > ExecInflightTotal {
		t.Errorf("exec in flight: per tenant %d over the total %d", ExecInflightPerTenant, ExecInflightTotal)
	}
}

// TestProcessOpenFilesWithinHardLimit checks that sandbox processes are
// never given more open files than this process may hand down.
func TestProcessOpenFilesWithinHardLimit(t *testing.T) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	n := ProcessOpenFiles()
	if n == 0 || n > rl.Max || n > OpenFilesPerProcess {
		t.Errorf("ProcessOpenFiles = %d; hard limit %d, default %d", n, rl.Max, OpenFilesPerProcess)
	}
}
