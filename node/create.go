package node

// CreateSpec asks a Node for a new session. Zero values take the Node's
// defaults (Limits); the REST form is api/v1.CreateRequest, E2B's is its
// sandbox-create body, and each edge converts to this.
type CreateSpec struct {
	// Template names the root filesystem ("base" when empty).
	Template string
	// Alias is the built-in template alias the create named
	// ("code-interpreter-v1"), kept when normalizing made Template its
	// target: warm pools of an alias are pools of their own.
	Alias string
	// CodeWarm starts the code-execution service's default Python kernel
	// as the session starts, so the first call finds it ready; creates
	// from the code-interpreter template set it.
	CodeWarm bool
	// CPU is the CPU quota in cores (fractions allowed).
	CPU float64
	// MemoryMB is the memory limit in MiB (swap is not allowed beyond it).
	MemoryMB int64
	// Pids caps processes plus threads.
	Pids int64
	// TimeoutS is the session's wall-clock lifetime in seconds.
	TimeoutS int64
	// Env is added to every process's environment.
	Env map[string]string
	// Metadata is free-form labels, returned as given and usable as filters.
	Metadata map[string]string
	// User is the default user for execs and files ("user" when empty).
	User string
	// Workdir is the default working directory (absolute; "" = the user's home).
	Workdir string
	// Snapshot starts the session from a snapshot (id or name) instead of
	// a template (the template is then the snapshot's).
	Snapshot string
	// DiskMB caps what the session may write, in MiB.
	DiskMB int64
	// AutoPauseS pauses the session after this many seconds without an
	// exec or files call (0 = never); it resumes by itself on the next one.
	AutoPauseS int64
	// OnTimeout is OnTimeoutKill ("" is the same) or OnTimeoutPause.
	OnTimeout string
	// AutoResume (only with OnTimeoutPause) resumes a session paused on
	// timeout on its next exec or files call.
	AutoResume bool
	// Network opens egress to an allow-list; nil leaves loopback only.
	Network *Network
	// Secrets names the tenant's secrets the session may use through the
	// credential broker (package broker); it needs Network, and the
	// session record keeps them in Network.Secrets. Empty: the forked or
	// given Network's own.
	Secrets []string
	// PublicTraffic opens the session's ports to requests without a
	// token (Session.PublicTraffic); forks of a public session are public.
	PublicTraffic bool
	// Isolation picks the isolation driver by name ("" = the Node's
	// default); a session from a memory snapshot runs on the snapshot's.
	Isolation string
	// BuildStep makes the session a Dockerfile build's sandbox (package
	// build): its whole root filesystem is writable (its own writable
	// layer; every other session's root is read-only but for /home/user,
	// /root and /tmp), no warm-pool member or spare (both started
	// read-only) serves it, and the template's start command is not
	// started in it. Only the builder sets it: no REST or E2B body maps
	// to it.
	BuildStep bool
	// Volumes mounts the caller's volumes (VolumeMount): each read-write
	// by one session at a time, read-only by any number.
	Volumes []VolumeMount
}

// Limits bound and default the values of a CreateSpec. CPU is in cores,
// memory and disk in MiB, timeouts in seconds.
type Limits struct {
	DefaultCPU      float64
	MaxCPU          float64
	DefaultMemoryMB int64
	MinMemoryMB     int64
	MaxMemoryMB     int64
	DefaultPids     int64
	MinPids         int64
	MaxPids         int64
	DefaultTimeoutS int64
	MaxTimeoutS     int64
	DefaultDiskMB   int64
	MinDiskMB       int64
	MaxDiskMB       int64
	// OpenFilesPerProcess is every sandbox process's RLIMIT_NOFILE; a
	// session's open files are bounded by its memory limit too, each
	// costing at least OpenFileBytes of kernel memory charged to it.
	OpenFilesPerProcess uint64
	// OpenFileBytes is the least kernel memory one open file costs, in bytes.
	OpenFileBytes int64
	// HostFileMax is the host's open-file table size (fs.file-max).
	HostFileMax int64
}

// Info is what a Node says about itself: its isolation drivers, the
// default one and the limits of a CreateSpec.
type Info struct {
	Drivers       []DriverInfo
	DefaultDriver string
	Limits        Limits
}

// DriverInfo is one isolation driver and what it supports, by the
// capability names of the REST API (pause, memory_snapshot, fork, ...).
type DriverInfo struct {
	Name         string
	Capabilities map[string]bool
	// Version is the version of the driver's runtime binary, "" when the
	// driver does not say (runtime.Versioner).
	Version string
}

// Usage is a session's resource use, read from outside the sandbox.
type Usage struct {
	// CPUSeconds is CPU time used, in CPU-seconds.
	CPUSeconds float64
	// MemoryBytes and MemoryPeakBytes: memory in use now, and the most so far.
	MemoryBytes     int64
	MemoryPeakBytes int64
	// Pids is the number of tasks now.
	Pids int64
	// DiskBytes is what the writable layer holds.
	DiskBytes int64
	// OOMKills counts processes the out-of-memory killer ended.
	OOMKills int64
	// EgressBytes is what the session moved through its egress proxy
	// (sent plus received), in bytes.
	EgressBytes int64
}

// PoolStatus is a warm pool's configuration and how many members it has:
// Ready to be claimed now, Starting being made.
type PoolStatus struct {
	Pool
	Ready    int
	Starting int
}
