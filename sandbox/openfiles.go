package sandbox

import (
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/runtime"
)

// rlimits are the resource limits of every sandbox process: the open-file
// limit of m's Limits and no core dumps (a core file of a large process
// would fill the sandbox's disk and could hold secrets).
func (m *Manager) rlimits() runtime.Rlimits {
	n := m.opts.Limits.OpenFilesPerProcess
	if n == 0 {
		n = defaults.ProcessOpenFiles()
	}
	return runtime.Rlimits{
		{Resource: "RLIMIT_NOFILE", Soft: n, Hard: n},
		{Resource: "RLIMIT_CORE", Soft: 0, Hard: 0},
	}
}
