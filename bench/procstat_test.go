package bench

import (
	"os"
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
	for end := time.Now().Add(150 * time.Millisecond); time.Now().Before(end); {
	}
	if after := selfCPU(); after-before < 0.05 {
		t.Errorf("selfCPU grew by %.3f s over 150 ms of spinning, want at least 0.05", after-before)
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
