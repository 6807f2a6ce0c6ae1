// Package defaults is the one place forkbox's default values live: the
// size and lifetime of a session, an exec's timeout, the agent's
// readiness wait, egress allowances, the exec in-flight budget, the bound
// on a snapshot's entries, and where the daemon keeps its data and
// listens. Every flag, option and request default refers here; the rule
// for the storage image's size, which depends on the host's free disk,
// is storage.DefaultImageBytes.
package defaults

import (
	goruntime "runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/node"
)

// Where the daemon keeps its state and listens, and where a client looks
// for it and its key.
const (
	DataDir = "/var/lib/forkbox"
	Listen  = "127.0.0.1:7070"
	// URL is the API's address at Listen.
	URL = "http://" + Listen
	// KeyFile is the install's API key in DataDir (datadir.Layout.APIKey).
	KeyFile = DataDir + "/api-key"
)

// SessionTimeoutS is a session's lifetime when its create names none, in
// seconds: E2B's default, so E2B SDK code behaves the same (NewSandboxV2
// timeout @default 300 in E2B's API schema; SDK 2.51 omits the field
// unless the caller sets it). Also the E2B edge's for a create or connect
// without a timeout.
const SessionTimeoutS = 300

// Spares is how many spare sandboxes `forkbox serve` keeps ready (started
// sandboxes without files that creates and forks take; each idle one
// holds about 4 MiB of the host's memory).
const Spares = 8

// MemoryImageCacheMB is how many MiB of decrypted memory checkpoints
// `forkbox serve` keeps (tmpfs, root-only; each at most 5 minutes unused,
// dropped with its snapshot) so that restores and forks of a hot snapshot
// skip decrypting it: 250-550 ms of a 107 MB restore here.
const MemoryImageCacheMB = 512

// ExecTimeoutS is a foreground command's timeout when its exec names none,
// in seconds.
const ExecTimeoutS = 60

// AgentReadyTimeout is how long a create waits for a runc sandbox's agent
// on an idle host; gVisor and a loaded host scale it (sandbox/ready.go).
const AgentReadyTimeout = 10 * time.Second

// Egress allowances of a session with a network that names none: bytes
// through the proxy (sent plus received) and new connections per minute.
const (
	EgressBytes          = 1 << 30
	ConnectionsPerMinute = 600
)

// The exec in-flight budget (internal/inflight): bytes of exec and stdin
// bodies held at once, in all and per tenant.
const (
	ExecInflightTotal     = 1 << 30
	ExecInflightPerTenant = 256 << 20
)

// LayerCacheBytes bounds the layer cache (`forkbox serve
// --layer-cache-mb`): the compressed layers of pulled images no template
// uses that are kept for the next pull, in bytes (layers templates use
// are kept whatever the bound).
const LayerCacheBytes = 10 << 30

// MaxSnapshotEntries is how many entries (files, directories, links,
// devices: every line of the contents manifest) a snapshot may hold
// unless the daemon is told otherwise (`forkbox serve
// --max-snapshot-entries`). It bounds the digest walk every snapshot
// costs: its time, and the daemon's memory for the largest directory's
// names.
const MaxSnapshotEntries = 1_000_000

// OpenFilesPerProcess is the RLIMIT_NOFILE sandbox processes get (soft
// and hard), lowered to the daemon's own hard limit where that is smaller
// (ProcessOpenFiles): raising a hard limit needs CAP_SYS_RESOURCE.
const OpenFilesPerProcess = 65536

// OpenFileBytes is the least kernel memory one open file costs a sandbox,
// in bytes. An open file is a struct file from the kernel's filp cache and
// a slot in a descriptor table, both charged to the opener's memory cgroup
// (the cache is SLAB_ACCOUNT); 2^20 opens of /dev/null in a runc sandbox
// on Linux 6.18 raised its memory.usage_in_bytes by about 221 bytes each.
// 192 leaves room for kernels with smaller structures: the sandbox's
// memory limit bounds its open files at memory/OpenFileBytes, which is
// what makes the host's file table (fs.file-max) sizeable for a capacity.
const OpenFileBytes = 192

// ProcessOpenFiles is OpenFilesPerProcess lowered to this process's hard
// RLIMIT_NOFILE.
func ProcessOpenFiles() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < OpenFilesPerProcess {
		return rl.Max
	}
	return OpenFilesPerProcess
}

// Limits returns the limits forkbox ships with: 1 core, 512 MiB, 512
// tasks, SessionTimeoutS and 4 GiB of disk by default; at most every core
// of the host, 64 GiB, 32768 tasks, 24 h and 1 TiB. At least 32 tasks: the
// agent alone holds about 20 (its pre-created threads), and with fewer it
// cannot start.
func Limits() node.Limits {
	return node.Limits{
		DefaultCPU: 1, MaxCPU: float64(goruntime.NumCPU()),
		DefaultMemoryMB: 512, MinMemoryMB: 32, MaxMemoryMB: 65536,
		DefaultPids: 512, MinPids: 32, MaxPids: 32768,
		DefaultTimeoutS: SessionTimeoutS, MaxTimeoutS: 86400,
		DefaultDiskMB: 4096, MinDiskMB: 16, MaxDiskMB: 1 << 20,
		OpenFilesPerProcess: ProcessOpenFiles(), OpenFileBytes: OpenFileBytes,
	}
}
