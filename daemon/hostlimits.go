package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/admission"
)

// fileMaxPath is the host's open-file table size.
const fileMaxPath = "/proc/sys/fs/file-max"

// hostFileReserve is the part of the host's open-file table kept for the
// host itself (the daemon, the runtimes, everything else on the machine)
// beyond what sandboxes can hold.
const hostFileReserve = 1 << 20

// runtimeHeadroomBytes is memory a sandbox's runtime may use beyond the
// session's limit inside the same memory cgroup (the gVisor Sentry gets
// 96 MiB), counted per admitted session when sizing the file table.
const runtimeHeadroomBytes = 128 << 20

// neededFileMax is the open-file table that every session capacity c
// admits fits in beside the host's own files: sessions' memory limits add
// up to at most c.MaxMemoryMB (admission), and each open file costs a
// sandbox at least perFile bytes of its memory cgroup. Open files are
// kernel memory, which cannot exceed the host's (hostMem bytes, when
// known): past that the table would only stop bounding host processes.
func neededFileMax(c admission.Capacity, hostMem, perFile int64) int64 {
	mem := c.MaxMemoryMB<<20 + int64(c.MaxSessions)*runtimeHeadroomBytes
	if hostMem > 0 && mem > hostMem {
		mem = hostMem
	}
	return hostFileReserve + mem/perFile
}

// hostMemoryBytes is the host's RAM in bytes, 0 when unknown.
func hostMemoryBytes() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// ensureFileMax raises the host's open-file table (the file at path,
// fs.file-max) to need when it is smaller, and returns the size in force.
// A table smaller than what sandboxes can fill lets one tenant's sandbox
// make every other sandbox, and the host, fail with ENFILE. When the
// table cannot be raised it fails, saying what to do. The raised size
// stays after the daemon exits (it is the kernel's).
func ensureFileMax(path string, need int64, log *slog.Logger) (int64, error) {
	have, err := readInt(path)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	if have >= need {
		return have, nil
	}
	if err := os.WriteFile(path, []byte(strconv.FormatInt(need, 10)), 0); err != nil {
		return 0, fmt.Errorf("fs.file-max is %d, but the sessions this host admits can hold up to %d open files "+
			"(their memory limits add up to --max-memory-mb): raise it (sysctl -w fs.file-max=%d) or lower "+
			"--max-memory-mb / --max-sessions: %w", have, need, need, err)
	}
	log.Info("raised the host's open-file table for the sessions this host admits",
		"sysctl", "fs.file-max", "from", have, "to", need)
	return need, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
