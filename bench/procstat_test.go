package bench

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// TestProcReaders reads this host's real accounting: this process's CPU
// time grows while it spins, its RSS and PSS are positive, the host's
// busy time and MemAvailable are plausible, and a cgroup that does not
// exist reads as 0 while the root cpuacct cgroup reads a positive total.
func TestProcReaders(t *testing.T) {
	before := selfCPU()
	busy0, err := hostBusy()
	if err != nil {
		t.Fatalf("hostBusy: %v", err)
	}
	// Spin until getrusage(2) (microseconds) has seen 200 ms more CPU,
	// however long a loaded host takes to give it; /proc's figure (clock
	// ticks) must have seen about as much.
	spun := spinCPU(t, 200*time.Millisecond)
	if after := selfCPU(); after-before < spun.Seconds()/2 {
		t.Errorf("selfCPU grew by %.3f s while getrusage saw %s of CPU, want at least half", after-before, spun)
	}
	busy1, _ := hostBusy()
	if busy1 <= busy0 {
		t.Errorf("host busy time went from %v to %v while this process spun", busy0, busy1)
	}
	if rss, pss := procRSS("self"), procPSS("self"); rss <= 0 || pss <= 0 || pss > rss {
		t.Errorf("RSS %d, PSS %d: want both positive and PSS at most RSS", rss, pss)
	}
	avail, err := memAvailable()
	if err != nil || avail <= 0 {
		t.Errorf("memAvailable = %d, %v", avail, err)
	}
	if v, err := readCgroupInt("cpuacct", "forkbox-bench-no-such-cgroup", "cpuacct.usage"); v != 0 || err != nil {
		t.Errorf("missing cgroup = %d, %v; want 0, nil", v, err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpuacct/cpuacct.usage"); err != nil {
		t.Skipf("no cgroup v1 cpuacct hierarchy here: %v", err)
	}
	if v, err := readCgroupInt("cpuacct", "", "cpuacct.usage"); v <= 0 || err != nil {
		t.Errorf("root cpuacct.usage = %d, %v; want a positive total", v, err)
	}
}

// spinCPU burns CPU in this goroutine until getrusage(RUSAGE_SELF) has
// grown by at least d, and returns by how much it grew. It fails t after
// a minute (a hang guard, not a timing).
func spinCPU(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatalf("getrusage: %v", err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start, guard := cpu(), time.Now().Add(time.Minute)
	for {
		if grown := cpu() - start; grown >= d {
			return grown
		}
		if time.Now().After(guard) {
			t.Fatalf("a minute of spinning gave this process less than %s of CPU", d)
		}
		for i := 0; i < 1e6; i++ {
		}
	}
}
