package runsc

import (
	"errors"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/ocispec"
)

// agentRunDir is where the agent's socket directory appears in the sandbox.
const agentRunDir = "/.forkbox/run"

// runtimeHeadroom is the memory, in bytes, added to a sandbox's cgroup
// limit for gVisor's own processes (Sentry and gofer: about 40 MiB each at
// rest, measured here with runsc 2024-07-29).
const runtimeHeadroom = 96 << 20

// runDirBytes and runDirInodes bound the tmpfs of the agent's socket
// directory (it holds one socket).
const (
	runDirBytes  = 64 << 10
	runDirInodes = 16
)

// Tasks inside a gVisor sandbox are the Sentry's, not the host's, so the
// host cgroup's pids limit does not count them: it counts the Sentry's and
// gofer's host threads and systrap's stub processes, and when it refuses
// one the Sentry cannot go on and the whole sandbox stops. The sandbox's
// own limit is therefore enforced inside, by the Sentry: RLIMIT_NPROC of
// Limits.Pids tasks (processes and threads) per user of the sandbox (the
// Sentry counts per real uid, as Linux does, and exempts a creator with
// CAP_SYS_ADMIN: the agent can always start a command). The host limit is
// set well above what that lets one or two users run: hostTasksPerTask
// host tasks per allowed task plus runtimePidsHeadroom. Measured with runsc
// 2024-07-29 (systrap) on the reference machine: an idle sandbox holds 22
// host tasks; a fork bomb of one user at 512 tasks, 738; bombs of the user
// and root at once (1024 tasks), 830.
const (
	runtimePidsHeadroom = 256
	hostTasksPerTask    = 2
)

// hostTaskKernelBytes is the host kernel's memory per host task of the
// runtime (page tables and kernel stack of a systrap stub or Sentry
// thread), charged to the sandbox's memory cgroup: measured with the 2026
// runsc at about 78 KiB each (100 sleeping processes in a sandbox: 213
// more host tasks, 16.6 MiB more kernel memory). withTasksInside adds it
// for every host task the pids limit allows, so that a bomb reaching the
// host pids limit stops there (reason pids-limit) rather than at a memory
// limit that the runtime's own kernel memory ate into.
const hostTaskKernelBytes = 80 << 10

// adminCaps are granted to the agent in gVisor so that it can set a
// restored clone's hostname. They are in its effective and permitted sets
// but not in its bounding set: the Sentry gives the container's first
// process the spec's sets as they are, and a program the agent executes
// gets at most its bounding set, so nothing it starts, root included, can
// have them. (The agent once dropped them from its bounding set itself,
// which needs a system call on every thread that Go refuses in a binary
// built with cgo.)
var adminCaps = []string{"CAP_SYS_ADMIN"}

// gvisorOpts turn the base spec into gVisor's: no cgroup namespace and no
// seccomp profile (the Sentry provides both), memory headroom for the
// Sentry and the gofer, the pids limit enforced inside (withTasksInside),
// the agent's socket directory (and the control directory, when there is
// one) mounted in and named in its environment, and adminCaps for the
// agent alone.
func gvisorOpts(runDir, controlDir string) []ocispec.SpecOpts {
	opts := []ocispec.SpecOpts{
		ocispec.WithoutNamespace(specs.CgroupNamespace),
		ocispec.WithoutSeccomp(),
		// The Sentry and the gofer share the sandbox's memory cgroup:
		// give them room of their own on top of what the sandbox may use.
		ocispec.WithMemoryHeadroom(runtimeHeadroom),
		withTasksInside(),
		ocispec.WithMounts(specs.Mount{Destination: agentRunDir, Type: "bind", Source: runDir,
			Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}}),
	}
	if controlDir != "" {
		opts = append(opts,
			ocispec.WithMounts(specs.Mount{Destination: runtime.ControlTarget, Type: "bind", Source: controlDir,
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"}}),
			ocispec.WithEnv(wire.ControlEnv+"="+runtime.ControlTarget+"/"+runtime.ControlFile))
	}
	return append(opts,
		ocispec.WithEnv(wire.ListenEnv+"="+agentRunDir+"/agent.sock"),
		ocispec.WithAgentCapabilities(adminCaps...))
}

// withTasksInside limits the sandbox's tasks inside, where the Sentry
// counts them (RLIMIT_NPROC of the spec's pids limit), leaves the host
// pids limit room above that for the Sentry's own threads (see
// hostTasksPerTask), and the memory limit room for their kernel memory
// (hostTaskKernelBytes each).
func withTasksInside() ocispec.SpecOpts {
	return func(s *specs.Spec) error {
		p := s.Linux.Resources.Pids
		if p == nil || p.Limit == nil {
			return errors.New("the spec has no pids limit")
		}
		tasks := uint64(*p.Limit)
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: tasks, Soft: tasks})
		limit := *p.Limit*hostTasksPerTask + runtimePidsHeadroom
		p.Limit = &limit
		m := s.Linux.Resources.Memory
		if m == nil || m.Limit == nil {
			return errors.New("the spec has no memory limit")
		}
		mem := *m.Limit + limit*hostTaskKernelBytes
		m.Limit, m.Swap = &mem, &mem
		return nil
	}
}

// hostID returns the host id that sandbox id maps to (id itself without a map).
func hostID(m []runtime.IDMap, id uint32) int {
	for _, e := range m {
		if id >= e.ContainerID && id-e.ContainerID < e.Size {
			return int(e.HostID + id - e.ContainerID)
		}
	}
	return int(id)
}
