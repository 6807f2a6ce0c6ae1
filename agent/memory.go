package agent

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
)

// Paths the sandbox's free memory is read from: its memory cgroup (runc:
// the cgroup namespace shows the sandbox's own, read-only), else the
// kernel's meminfo (gVisor: the Sentry reports the sandbox's memory there,
// and its cgroup files show no limit).
const (
	cgroupMemoryDir = "/sys/fs/cgroup/memory/"
	meminfoPath     = "/proc/meminfo"
)

// unlimited is the smallest cgroup v1 memory limit that means "none".
const unlimited = 1 << 60

// memoryFree returns the bytes the sandbox may still allocate: its memory
// cgroup's limit less its usage, not counting inactive file cache (which
// the kernel reclaims first); else meminfo's MemAvailable. ok is false
// when neither can be read.
func memoryFree() (free int64, ok bool) {
	limit, err1 := readInt(cgroupMemoryDir + "memory.limit_in_bytes")
	usage, err2 := readInt(cgroupMemoryDir + "memory.usage_in_bytes")
	if err1 == nil && err2 == nil && limit < unlimited {
		if stat, err := os.ReadFile(cgroupMemoryDir + "memory.stat"); err == nil {
			usage -= statField(stat, "total_inactive_file")
		}
		return limit - usage, true
	}
	b, err := os.ReadFile(meminfoPath)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "MemAvailable:"); found {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// statField returns the value of "name N" in a memory.stat file, or 0.
func statField(stat []byte, name string) int64 {
	for _, line := range strings.Split(string(stat), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}
