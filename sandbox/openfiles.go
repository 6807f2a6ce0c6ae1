package sandbox

import (
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/runtime"
)

// DefaultOpenFilesPerProcess is the RLIMIT_NOFILE sandbox processes get
// (soft and hard), lowered to the daemon's own hard limit where that is
// smaller: raising a hard limit needs CAP_SYS_RESOURCE on the host.
const DefaultOpenFilesPerProcess = 65536

// OpenFileBytes is the least kernel memory one open file costs a sandbox,
// in bytes. An open file is a struct file from the kernel's filp cache and
// a slot in a descriptor table, both charged to the opener's memory cgroup
// (the cache is SLAB_ACCOUNT); 2^20 opens of /dev/null in a runc sandbox
// on Linux 6.18 raised its memory.usage_in_bytes by about 221 bytes each.
// 192 leaves room for kernels with smaller structures: the sandbox's
// memory limit bounds its open files at memory/OpenFileBytes, which is
// what makes the host's file table (fs.file-max) sizeable for a capacity.
const OpenFileBytes = 192

// processOpenFiles is DefaultOpenFilesPerProcess lowered to this
// process's hard RLIMIT_NOFILE.
func processOpenFiles() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < DefaultOpenFilesPerProcess {
		return rl.Max
	}
	return DefaultOpenFilesPerProcess
}

// rlimits are the resource limits of every sandbox process: the open-file
// limit of m's Limits and no core dumps (a core file of a large process
// would fill the sandbox's disk and could hold secrets).
func (m *Manager) rlimits() runtime.Rlimits {
	n := m.opts.Limits.OpenFilesPerProcess
	if n == 0 {
		n = processOpenFiles()
	}
	return runtime.Rlimits{
		{Resource: "RLIMIT_NOFILE", Soft: n, Hard: n},
		{Resource: "RLIMIT_CORE", Soft: 0, Hard: 0},
	}
}
