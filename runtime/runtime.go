// Package runtime defines the contract between the sandbox manager and an
// isolation driver (runc today, runsc and microVMs later).
//
// A driver turns a prepared root filesystem plus a Config into a running
// sandbox whose first process (its init) is forkbox-agent, listening on the
// socket the caller hands over. Everything after that (exec, files) goes
// through the agent; the driver is only asked to start, inspect, signal from
// outside, and destroy. Callers ask Capabilities() what a driver can do and
// never type-switch on it.
//
// Drivers are safe for concurrent use by multiple goroutines, but callers
// must serialise lifecycle calls (Create, Delete) for any one sandbox id.
package runtime

import (
	"context"
	"os"
	"time"

	"github.com/forkbox/forkbox/bindmount"
)

// Capabilities declares what a driver supports on this host.
type Capabilities struct {
	// Pause: Pause and Resume freeze and thaw every process of a sandbox.
	Pause bool `json:"pause"`
	// MemorySnapshot: the driver can checkpoint a running sandbox's processes
	// and memory and restore them later.
	MemorySnapshot bool `json:"memory_snapshot"`
	// Fork: a memory snapshot can be restored more than once.
	Fork bool `json:"fork"`
	// SandboxOOM: going over the memory limit stops the whole sandbox
	// (the runtime's own processes share its memory cgroup), where false
	// means the kernel kills only a process inside.
	SandboxOOM bool `json:"sandbox_oom"`
	// Network: the sandbox can join a network namespace the host made
	// (Config.NetnsPath), which is how it gets egress.
	Network bool `json:"network"`
	// UserNamespace: sandbox uids map to an unprivileged host range.
	UserNamespace bool `json:"user_namespace"`
	// JoinUserNamespace: the sandbox can join a user namespace the host
	// made (Config.UserNamespace), so that it runs on host ids and under
	// kernel per-user limits of its own (package userns).
	JoinUserNamespace bool `json:"join_user_namespace"`
}

// Mount is a host path bind-mounted into the sandbox (bindmount.Mount:
// the type lives below runtime so that storage, which records a
// template's host mounts, need not import runtime).
type Mount = bindmount.Mount

// Limits are the resource limits of one sandbox, enforced by the host kernel.
type Limits struct {
	// CPU is the CPU quota in cores (0.5 = half a core), > 0.
	CPU float64 `json:"cpu"`
	// MemoryBytes caps resident memory in bytes; swap is not allowed beyond it.
	MemoryBytes int64 `json:"memory_bytes"`
	// Pids caps the number of tasks (processes and threads), > 0.
	Pids int64 `json:"pids"`
}

// IDMap maps a range of sandbox ids to host ids: sandbox id ContainerID+i is
// host id HostID+i for i < Size.
type IDMap struct {
	ContainerID uint32 `json:"container_id"`
	HostID      uint32 `json:"host_id"`
	Size        uint32 `json:"size"`
}

// Config describes one sandbox to create.
type Config struct {
	// ID is the sandbox id: [a-z0-9]{1,63}. It is also the hostname.
	ID string
	// StateDir is a directory owned by the caller in which the driver keeps
	// its per-sandbox files (bundle, logs). It exists and is empty.
	StateDir string
	// RootFS is the prepared root filesystem (a writable overlay); the driver
	// mounts it read-only as / inside the sandbox, unless WritableRoot.
	RootFS string
	// WritableRoot mounts RootFS writable (a template build's step:
	// node.CreateSpec.BuildStep).
	WritableRoot bool
	// Mounts are bind mounts added on top of RootFS, in order.
	Mounts []Mount
	// Limits are the sandbox's resource limits.
	Limits Limits
	// AgentPath is the host path of the static forkbox-agent binary; it is
	// mounted read-only at AgentTarget and run as the sandbox's init.
	AgentPath string
	// AgentArgs are extra arguments for the agent.
	AgentArgs []string
	// AgentEnv is the agent's environment (KEY=VALUE).
	AgentEnv []string
	// AgentListener is a listening Unix socket handed to the agent as fd 3.
	// The daemon keeps the path; the sandbox never sees it. (A driver that
	// cannot hand it in replaces the path with a link to a socket the
	// agent binds itself.)
	AgentListener *os.File
	// UIDMap and GIDMap map sandbox ids to host ids; empty means no user namespace.
	UIDMap []IDMap
	GIDMap []IDMap
	// UserNamespace, when set, is a user namespace (a bind-mounted
	// namespace file) the sandbox joins instead of making one; UIDMap and
	// GIDMap must be its maps. Only for drivers whose capabilities say
	// JoinUserNamespace. A NetnsPath given with it must be owned by it.
	UserNamespace string
	// Rlimits are the resource limits of the sandbox's processes.
	Rlimits Rlimits
	// NetnsPath, when set, is a network namespace (a bind-mounted
	// namespace file, owned by the host's user namespace) the sandbox
	// joins instead of a new one with loopback only. Its interfaces and
	// firewall are the caller's (netpolicy); the sandbox cannot change them.
	NetnsPath string
	// ControlDir, when set, is a host directory the sandbox sees read-only
	// at ControlTarget; drivers with memory snapshots point the agent's
	// checkpoint control file (wire.ControlEnv) at ControlFile in it.
	ControlDir string
}

// ControlTarget is where Config.ControlDir appears inside the sandbox.
const ControlTarget = "/.forkbox/ctl"

// ControlFile is the name of the agent's checkpoint control file in
// Config.ControlDir (a wire.ResumeFile, written by the daemon).
const ControlFile = "resume.json"

// AgentTarget is where the agent binary appears inside every sandbox.
const AgentTarget = "/.forkbox/bin/forkbox-agent"

// AgentListenFD is the file descriptor number of the agent's listener inside the sandbox.
const AgentListenFD = 3

// Status is the driver's view of a sandbox.
type Status string

// The statuses a driver reports.
const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
	// StatusUnknown: the driver has no record of the id.
	StatusUnknown Status = "unknown"
)

// Stats is a point-in-time reading of a sandbox's resource use.
type Stats struct {
	// CPUSeconds is the CPU time used by all its processes, in CPU-seconds.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes is the current memory use in bytes.
	MemoryBytes int64 `json:"memory_bytes"`
	// MemoryPeakBytes is the highest memory use seen, in bytes.
	MemoryPeakBytes int64 `json:"memory_peak_bytes"`
	// Pids is the number of tasks now.
	Pids int64 `json:"pids"`
	// OOMKills counts processes killed by the out-of-memory killer so far.
	OOMKills int64 `json:"oom_kills"`
	// PidsLimitHits counts forks refused at the pids limit so far (0 when
	// the driver cannot tell).
	PidsLimitHits int64 `json:"pids_limit_hits"`
	// PidsLimit is the limit Pids counts against when the driver reads it
	// from a limit of its own (gVisor's host cgroup, which has headroom for
	// the runtime's threads); 0 means the sandbox's Limits.Pids.
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// ReadAt is when the reading was taken.
	ReadAt time.Time `json:"read_at"`
}

// Driver is an isolation driver. Errors wrap the errdefs classes: ErrNotFound
// for an unknown id, ErrConflict for a wrong state, ErrUnavailable when the
// runtime binary is missing.
type Driver interface {
	// Name is the driver's name as used in the API ("runc").
	Name() string
	// Capabilities reports what the driver supports on this host.
	Capabilities() Capabilities
	// Create starts a sandbox whose init is the agent. It returns once the
	// agent process runs (it may not accept connections yet). On error
	// nothing of the sandbox is left behind.
	Create(ctx context.Context, cfg Config) error
	// Delete kills every process of the sandbox with SIGKILL and removes all
	// runtime state (processes, cgroups). Deleting an unknown id is not an error.
	Delete(ctx context.Context, id string) error
	// Status reports the sandbox's status; StatusUnknown for an unknown id.
	Status(ctx context.Context, id string) (Status, error)
	// List returns the ids of every sandbox the runtime knows, live or dead.
	List(ctx context.Context) ([]string, error)
	// Stats reads the sandbox's resource use from outside the sandbox.
	Stats(ctx context.Context, id string) (Stats, error)
	// KillProcessGroup sends sig to every process of the sandbox whose
	// process group id, as seen inside the sandbox, is pgid. It acts from the
	// host, so nothing inside the sandbox can block it. It returns how many
	// processes were signalled.
	KillProcessGroup(ctx context.Context, id string, pgid int, sig int) (int, error)
	// Pause freezes every process of the sandbox; Resume thaws them.
	// ErrUnavailable when Capabilities().Pause is false.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Checkpoint writes the sandbox's processes, memory and kernel state
	// into dir (an existing empty directory); the sandbox keeps its state
	// (a paused one stays paused). The agent must have been prepared
	// (wire.PrepareRequest) first. ErrUnavailable when
	// Capabilities().MemorySnapshot is false.
	Checkpoint(ctx context.Context, id, dir string) error
	// Restore starts sandbox cfg.ID from the checkpoint in dir instead of
	// a fresh agent: its processes continue where they were. cfg is as
	// for Create (its RootFS and mounts must hold the files the
	// checkpointed sandbox had); the agent's command and environment come
	// from the checkpoint. On error nothing is left behind.
	// ErrUnavailable when Capabilities().MemorySnapshot is false.
	Restore(ctx context.Context, cfg Config, dir string) error
}

// FileTaker is implemented by drivers whose sandboxes can take their
// files after their start: a spare sandbox, started on an empty root
// with nothing but its agent and the kernel filesystems, is handed a root
// filesystem and its mounts from the host and its limits, in about a
// millisecond instead of a runtime start (the runc tier).
type FileTaker interface {
	// TakeFiles makes f.RootFS (a host directory) sandbox id's root,
	// read-only, with f.Mounts over it in order (each a bind mount,
	// nosuid and nodev, read-only when it says so, as Config.Mounts are
	// at a start), moves the mounts the sandbox already has (its kernel
	// filesystems, its own files, the agent) to the same places in the
	// new root, and sets f.Limits. Every mount target must exist in
	// f.RootFS already (nothing is created, and no symlink in it is
	// followed). The sandbox must be a spare (its root has SpareNext)
	// running its agent only. On error the sandbox is in no state to be
	// used: delete it.
	TakeFiles(ctx context.Context, id string, f Files) error
}

// Files is what a spare sandbox takes (FileTaker).
type Files struct {
	// RootFS is the host directory that becomes the sandbox's /.
	RootFS string
	// Mounts go over it, in order.
	Mounts []Mount
	// Limits replace the ones the spare started with.
	Limits Limits
}

// SpareNext is the directory of a spare sandbox's root on which the files
// it takes are put together before they become its root.
const SpareNext = "/.forkbox/next"

// Sampler is implemented by drivers that can take a reading cheap enough
// for the host monitor to take of every sandbox every few seconds: from
// the host's cgroup files, without starting a process. Sample fills
// CPUSeconds (all the CPU the sandbox costs the host, the runtime's own
// processes included: what its CPU quota caps), Pids, PidsLimit,
// PidsLimitHits and ReadAt; other fields may be zero. ErrNotFound for an
// unknown sandbox.
type Sampler interface {
	Sample(ctx context.Context, id string) (Stats, error)
}

// OOMCounter is implemented by drivers that can count a sandbox's
// out-of-memory kills (Stats.OOMKills) with one read of a host file
// instead of a whole Stats reading: the exec path takes the count before
// and after every command to tell a command the kernel killed for memory.
// OOMKills returns the count so far; ErrNotFound for an unknown sandbox.
type OOMCounter interface {
	OOMKills(ctx context.Context, id string) (int64, error)
}

// Process is one process of a sandbox as the host sees it.
type Process struct {
	// Pid is the process id (the host's for runc, the sandbox's for gVisor).
	Pid int
	// Name is the command name (the kernel's comm, at most 15 bytes).
	Name string
	// Cmdline is its arguments joined by spaces, at most 4 KiB ("" when
	// the driver cannot tell).
	Cmdline string
}

// ProcessLister is implemented by drivers that can list a sandbox's
// processes from outside it (the abuse detector reads their names).
type ProcessLister interface {
	// Processes lists the sandbox's processes. ErrNotFound for an unknown
	// sandbox.
	Processes(ctx context.Context, id string) ([]Process, error)
}

// StopCause says why a sandbox stopped by itself.
type StopCause string

// The causes a StopExplainer reports.
const (
	// StopUnknown: nothing the driver can see explains it.
	StopUnknown StopCause = ""
	// StopPidsLimit: the sandbox's host pids limit refused a task (for
	// gVisor the Sentry then cannot go on and the whole sandbox stops).
	StopPidsLimit StopCause = "pids-limit"
	// StopMemoryLimit: the kernel killed a process of the sandbox at its
	// host memory limit (for gVisor, the Sentry: the whole sandbox).
	StopMemoryLimit StopCause = "memory-limit"
)

// StopExplainer is implemented by drivers that can tell why a sandbox
// that is no longer running stopped. It reads what the host keeps of the
// sandbox (its cgroups), so it must be called before Delete.
type StopExplainer interface {
	// StopCause returns the cause, StopUnknown when none is seen (also
	// for an unknown id).
	StopCause(ctx context.Context, id string) StopCause
}

// StartScaler is implemented by drivers whose sandboxes take longer than
// runc's to start (gVisor boots a kernel in user space first): the
// sandbox manager waits StartScale times as long for their agent.
type StartScaler interface {
	// StartScale is the factor, at least 1.
	StartScale() float64
}

// Versioner is implemented by drivers that run a runtime binary whose
// version they know (GET /v1/info reports it, the daemon logs both at
// start).
type Versioner interface {
	// Binary is the path of the runtime binary.
	Binary() string
	// Version is its version as it reports it.
	Version() string
}
