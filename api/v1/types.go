// Package v1 holds the wire types of forkbox's REST API, version 1: the
// JSON bodies the daemon (package api) accepts and returns, and the Go
// client (package client) sends and decodes. It is the single source of
// the contract and depends on nothing but the standard library.
//
// Units are in the field names: _mb is MiB, _s seconds, _ms milliseconds,
// _bytes bytes; CPU is in cores. Times are RFC 3339 UTC.
package v1

import "time"

// CreateRequest asks for a new sandbox session (POST /v1/sessions). Zero
// values take the daemon's defaults (see Limits).
type CreateRequest struct {
	// Template names the root filesystem ("base" when empty).
	Template string `json:"template,omitempty"`
	// CPU is the CPU quota in cores (fractions allowed).
	CPU float64 `json:"cpu,omitempty"`
	// MemoryMB is the memory limit in MiB (swap is not allowed beyond it).
	MemoryMB int64 `json:"memory_mb,omitempty"`
	// Pids caps processes plus threads.
	Pids int64 `json:"pids,omitempty"`
	// TimeoutS is the session's wall-clock lifetime in seconds.
	TimeoutS int64 `json:"timeout_s,omitempty"`
	// Env is added to every process's environment.
	Env map[string]string `json:"env,omitempty"`
	// Metadata is free-form labels, returned as given and usable as filters.
	Metadata map[string]string `json:"metadata,omitempty"`
	// User is the default user for execs and files ("user" when empty).
	User string `json:"user,omitempty"`
	// Workdir is the default working directory (absolute; "" = the user's home).
	Workdir string `json:"workdir,omitempty"`
	// Snapshot starts the session from a snapshot's files instead of a
	// template (the template is the snapshot's). Processes are not part of a
	// snapshot in the runc tier: the session starts with a fresh agent.
	Snapshot string `json:"snapshot,omitempty"`
	// DiskMB caps what the session may write, in MiB; past it writes fail
	// with ENOSPC or EDQUOT inside the sandbox.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// AutoPauseS pauses the session after this many seconds without an exec
	// or files call (0 = never). An auto-paused session resumes by itself on
	// its next exec or files call.
	AutoPauseS int64 `json:"auto_pause_s,omitempty"`
	// OnTimeout is what happens when TimeoutS runs out: "kill" (the
	// default) ends the session; "pause" pauses it instead (as E2B's
	// lifecycle.onTimeout), and a resume gives it a full TimeoutS again.
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume (only with OnTimeout "pause") makes a session paused on
	// timeout resume by itself on its next exec or files call.
	AutoResume bool `json:"auto_resume,omitempty"`
	// Network opens egress through forkbox's proxy to an allow-list; nil
	// (the default) leaves the sandbox with loopback only.
	Network *Network `json:"network,omitempty"`
	// Secrets names the tenant's secrets (PUT /v1/secrets/{name}) the
	// session may use: each one's environment variable (the name upper-
	// cased) holds a placeholder of this session only, which the egress
	// proxy replaces with the value in requests over TLS to the secret's
	// hosts. It needs a Network whose allow-list allows every such host on
	// port 443. Forks get new placeholders.
	Secrets []string `json:"secrets,omitempty"`
	// Volumes mounts the tenant's volumes (POST /v1/volumes) into the
	// session. A fork or a session made from a snapshot mounts only the
	// volumes its own request names.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Isolation picks the isolation driver: "runc" (namespaces, seccomp,
	// a user namespace) or "gvisor" (gVisor's user-space kernel; memory
	// snapshots). "" is the server's default; GET /v1/info lists the
	// drivers this host has. A session started from a memory snapshot
	// runs on the snapshot's driver.
	Isolation string `json:"isolation,omitempty"`
	// PublicTraffic lets requests reach the session's ports (GET
	// /v1/sessions/{id}/ports/{port}/..., the E2B port headers and
	// PORT-ID.DOMAIN host names) without a token or key. false (the
	// default): a request needs the session's traffic or envd access
	// token, or an API key of its tenant. Forks of a public session are
	// public.
	PublicTraffic bool `json:"public_traffic,omitempty"`
	// Host pins the session to one host of the fleet, by its id (GET
	// /v1/hosts lists them; a host alone is "local"): the create runs
	// there or fails, 503 when that host cannot take it (lost, draining,
	// full, another version) and 400 naming "host" for an id the fleet
	// does not have. It needs an admin key (403 otherwise). "" lets
	// placement choose.
	Host string `json:"host,omitempty"`
}

// Network is a session's egress policy. The sandbox gets an interface
// whose only reachable destination is forkbox's egress proxy and DNS
// server; HTTP_PROXY and HTTPS_PROXY point at the proxy, and plain HTTP
// (port 80) and TLS (port 443) to any address go through it too. Private,
// loopback, link-local and the host's own addresses, other sandboxes and
// mail ports are refused whatever the allow-list says.
type Network struct {
	// Allow lists the destinations: "host:port", "*.domain:port" (any name
	// under domain), or a CIDR with an optional port ("203.0.113.0/24",
	// "198.51.100.7/32:8443"). 1 to 256 entries.
	Allow []string `json:"allow"`
	// MaxEgressBytes caps the bytes moved through the proxy, sent plus
	// received (0: the server's default); past it connections are cut.
	MaxEgressBytes int64 `json:"max_egress_bytes,omitempty"`
	// MaxConnectionsPerMinute caps new connections (0: the server's
	// default); DNS queries may come at ten times this rate.
	MaxConnectionsPerMinute int `json:"max_connections_per_minute,omitempty"`
}

// EgressRecord is one egress event of a session (GET
// /v1/sessions/{id}/egress): a connection through the proxy (with its
// bytes, once it ended), a refusal, or a DNS query.
type EgressRecord struct {
	Time time.Time `json:"time"`
	// Kind is connect (HTTP CONNECT), http (plain or transparent HTTP),
	// tls (transparent TLS, by SNI) or dns.
	Kind string `json:"kind"`
	// Host is the name (or IP literal) the sandbox asked for.
	Host string `json:"host,omitempty"`
	// Addr is the address connected to, or the DNS answer.
	Addr string `json:"addr,omitempty"`
	Port int    `json:"port,omitempty"`
	// BytesUp and BytesDown are bytes sent and received.
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
	// Decision is allow or deny; Reason says why (a refusal, a cut).
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
}

// EgressList is the body of GET /v1/sessions/{id}/egress, oldest first.
type EgressList struct {
	Records []EgressRecord `json:"records"`
}

// Limits bound and default the values of a CreateRequest (GET /v1/info).
type Limits struct {
	DefaultCPU      float64 `json:"default_cpu"`
	MaxCPU          float64 `json:"max_cpu"`
	DefaultMemoryMB int64   `json:"default_memory_mb"`
	MinMemoryMB     int64   `json:"min_memory_mb"`
	MaxMemoryMB     int64   `json:"max_memory_mb"`
	DefaultPids     int64   `json:"default_pids"`
	MinPids         int64   `json:"min_pids"`
	MaxPids         int64   `json:"max_pids"`
	DefaultTimeoutS int64   `json:"default_timeout_s"`
	MaxTimeoutS     int64   `json:"max_timeout_s"`
	DefaultDiskMB   int64   `json:"default_disk_mb"`
	MinDiskMB       int64   `json:"min_disk_mb"`
	MaxDiskMB       int64   `json:"max_disk_mb"`
	// OpenFilesPerProcess is every sandbox process's RLIMIT_NOFILE (soft
	// and hard). A session's open files in all are bounded by its memory
	// limit too: each costs at least OpenFileBytes of kernel memory,
	// charged to the session's memory cgroup, so a session holds at most
	// min(pids × OpenFilesPerProcess, memory_mb·2^20 / OpenFileBytes).
	OpenFilesPerProcess uint64 `json:"open_files_per_process"`
	// OpenFileBytes is the least kernel memory one open file costs, in
	// bytes (a struct file and its descriptor slot, measured on Linux 6.x).
	OpenFileBytes int64 `json:"open_file_bytes"`
	// HostFileMax is the host's open-file table size (fs.file-max), which
	// the daemon raises at start-up until every session the host admits
	// (their memory limits add up to at most the capacity) fits in it
	// beside the host's own files.
	HostFileMax int64 `json:"host_file_max"`
}

// Session is a session as the API reports it. Unset times are omitted.
// Environment values are never returned (they may hold secrets).
type Session struct {
	ID       string `json:"id"`
	Template string `json:"template"`
	Driver   string `json:"driver"`
	// State is creating, running, paused, terminating or terminated.
	State string `json:"state"`
	// Reason (deleted, timeout, error) and Detail say why it ended.
	Reason    string            `json:"reason,omitempty"`
	Detail    string            `json:"detail,omitempty"`
	CPU       float64           `json:"cpu"`
	MemoryMB  int64             `json:"memory_mb"`
	Pids      int64             `json:"pids"`
	TimeoutS  int64             `json:"timeout_s"`
	User      string            `json:"user"`
	Workdir   string            `json:"workdir,omitempty"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt *time.Time        `json:"created_at,omitempty"`
	StartedAt *time.Time        `json:"started_at,omitempty"`
	// ExpiresAt is when the session times out; while it is paused, the
	// clock is stopped and ExpiresAt is unset (RemainingS says what is left).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// Snapshot is the snapshot it was restored from, if any.
	Snapshot   string     `json:"snapshot,omitempty"`
	DiskMB     int64      `json:"disk_mb"`
	AutoPauseS int64      `json:"auto_pause_s,omitempty"`
	PausedAt   *time.Time `json:"paused_at,omitempty"`
	RemainingS int64      `json:"remaining_s,omitempty"`
	// OnTimeout is "kill" or "pause"; AutoResume as in CreateRequest.
	OnTimeout  string `json:"on_timeout"`
	AutoResume bool   `json:"auto_resume,omitempty"`
	// Network is the egress policy, if the session has a network.
	Network *Network `json:"network,omitempty"`
	// Secrets names the secrets the session may use (CreateRequest).
	Secrets []string `json:"secrets,omitempty"`
	// Volumes are the volumes it mounts (CreateRequest).
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// PublicTraffic as in CreateRequest.
	PublicTraffic bool `json:"public_traffic,omitempty"`
	// Host is the fleet id of the host the session is on, in a fleet's
	// list (the router adds it; absent from one host's own answers).
	Host string `json:"host,omitempty"`
}

// SessionList is the body of GET /v1/sessions.
type SessionList struct {
	Sessions []Session `json:"sessions"`
}

// ExecRequest runs one command (POST /v1/sessions/{id}/exec). Exactly one
// of Argv and Cmd is set.
type ExecRequest struct {
	// Argv is the command and its arguments, run without a shell.
	Argv []string `json:"argv,omitempty"`
	// Cmd is a shell command line, run with /bin/sh -c (any length: texts
	// beyond the kernel's 128 KiB argument limit are passed by file).
	Cmd string `json:"cmd,omitempty"`
	// Env is added to the sandbox's environment for this command.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory (relative paths start at the user's home).
	Cwd string `json:"cwd,omitempty"`
	// User runs the command ("" = the session's default user; "root" on request).
	User string `json:"user,omitempty"`
	// TimeoutS kills the command's process group after this many seconds
	// (default 60; for background commands 0 means "until the session ends").
	TimeoutS int64 `json:"timeout_s,omitempty"`
	// Stdin, when set, is written to the command's stdin (base64 in JSON),
	// which is then closed unless KeepStdin. Without either, stdin is /dev/null.
	Stdin []byte `json:"stdin,omitempty"`
	// KeepStdin gives the command a stdin pipe that stays open for stdin
	// calls (for background commands).
	KeepStdin bool `json:"keep_stdin,omitempty"`
	// Background answers as soon as the command started; its output is
	// available by re-attaching and it can be killed by pid.
	Background bool `json:"background,omitempty"`
	// Tag names a background command so it can be found without its pid.
	Tag string `json:"tag,omitempty"`
}

// ExecResult is how a command ended. ExitCode follows the shell
// convention: 128+N when signal N killed it.
type ExecResult struct {
	// Pid is the process id inside the sandbox.
	Pid int `json:"pid"`
	// ExitCode is the exit status, or 128+Signal after a signal death.
	ExitCode int `json:"exit_code"`
	// Signal is the number of the signal that killed it (0 for a normal exit).
	Signal int `json:"signal,omitempty"`
	// TimedOut: forkbox killed it at its exec timeout.
	TimedOut bool `json:"timed_out"`
	// OOMKilled: the kernel's out-of-memory killer ended it.
	OOMKilled bool `json:"oom_killed"`
	// DurationMS is the wall-clock run time in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// CPUMS is the CPU time (user plus system) the command and the
	// children it waited for used, in milliseconds.
	CPUMS int64 `json:"cpu_ms"`
}

// ExecOutput is a finished command with its output, the JSON answer of an
// exec with Accept: application/json. Stdout and Stderr are the raw bytes
// (base64 in JSON), at most 16 MiB each; the flags say when more was cut.
type ExecOutput struct {
	ExecResult
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// BackgroundStarted answers a background exec (202).
type BackgroundStarted struct {
	Pid int    `json:"pid"`
	Tag string `json:"tag,omitempty"`
}

// Process is a running command started through exec.
type Process struct {
	Pid  int               `json:"pid"`
	Tag  string            `json:"tag,omitempty"`
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
}

// ProcessList is the body of GET /v1/sessions/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// Signal is the body of POST .../processes/{pid}/signal: 9 or 15.
type Signal struct {
	Signal int `json:"signal"`
}

// StdinRequest is the body of POST .../processes/{pid}/stdin.
type StdinRequest struct {
	// Data is written to the command's stdin (base64 in JSON).
	Data []byte `json:"data"`
	// Close closes stdin afterwards.
	Close bool `json:"close"`
}

// MigrateRequest is the body of POST /v1/sessions/{id}/migrate (may be
// empty).
type MigrateRequest struct {
	// Host is the fleet id of the host to move to ("": the fleet picks
	// a placeable host other than the session's).
	Host string `json:"host,omitempty"`
}

// TimeoutRequest is the body of POST /v1/sessions/{id}/timeout.
type TimeoutRequest struct {
	// TimeoutS: the session ends this many seconds from now.
	TimeoutS int64 `json:"timeout_s"`
}

// Entry describes a file, directory or symlink inside a sandbox.
type Entry struct {
	Name string `json:"name"`
	// Path is absolute inside the sandbox.
	Path string `json:"path"`
	// Type is "file", "dir" or "symlink".
	Type string `json:"type"`
	// Size in bytes.
	Size int64 `json:"size"`
	// Mode holds the permission bits (0o755).
	Mode uint32 `json:"mode"`
	// Permissions is the ls-style mode string ("-rw-r--r--").
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedAt    time.Time `json:"modified_at"`
	SymlinkTarget string    `json:"symlink_target,omitempty"`
}

// EntryList is the body of GET /v1/sessions/{id}/fs/list.
type EntryList struct {
	Entries []Entry `json:"entries"`
}

// PathRequest is the body of POST .../fs/mkdir.
type PathRequest struct {
	Path string `json:"path"`
	User string `json:"user,omitempty"`
}

// MoveRequest is the body of POST .../fs/move.
type MoveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	User        string `json:"user,omitempty"`
}

// Usage is a session's resource use, read from outside the sandbox.
type Usage struct {
	// CPUSeconds is CPU time used, in CPU-seconds.
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes and MemoryPeakBytes: memory in use now, and the most so far.
	MemoryBytes     int64 `json:"memory_bytes"`
	MemoryPeakBytes int64 `json:"memory_peak_bytes"`
	// Pids is the number of tasks now.
	Pids int64 `json:"pids"`
	// DiskBytes is what the writable layer holds.
	DiskBytes int64 `json:"disk_bytes"`
	// OOMKills counts processes the out-of-memory killer ended.
	OOMKills int64 `json:"oom_kills"`
	// EgressBytes is what the session moved through its egress proxy
	// (sent plus received), in bytes.
	EgressBytes int64 `json:"egress_bytes"`
}

// Template is a root filesystem sessions start from.
type Template struct {
	Name string `json:"name"`
	// Source is "builtin" or where it was imported from.
	Source string `json:"source"`
	// Digest is the image manifest digest of imported templates.
	Digest  string   `json:"digest,omitempty"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	// User is the image's USER: sessions that name no user run as it
	// ("" = "user").
	User string `json:"user,omitempty"`
	// Cmd is the image's ENTRYPOINT and CMD; StartCmd, when set, is
	// started in the background in each new session of the template
	// (imported with ?start_cmd=true).
	Cmd      []string `json:"cmd,omitempty"`
	StartCmd []string `json:"start_cmd,omitempty"`
	// ReadyCmd, when set, is the template's ready check (argv): a create
	// of a session from the template returns once it exits 0 in the
	// sandbox, waiting at most ReadyTimeoutS seconds (0: 30).
	ReadyCmd      []string `json:"ready_cmd,omitempty"`
	ReadyTimeoutS int64    `json:"ready_timeout_s,omitempty"`
	// WarmSnapshot, when set, is the memory snapshot (gVisor) that holds
	// the template's started server: a gVisor create that asks for no
	// env, user, workdir, network, secrets or volumes restores it.
	WarmSnapshot string `json:"warm_snapshot,omitempty"`
	Layers       int    `json:"layers,omitempty"`
	SizeBytes    int64  `json:"size_bytes"`
	CreatedAt    string `json:"created_at"`
	// Tier is the isolation tier ("runc", "gvisor") a built template's
	// steps ran in; absent for imported, pulled and built-in templates.
	Tier string `json:"tier,omitempty"`
	// AliasOf names the template this one is a built-in alias of
	// ("code-interpreter-v1" is "base"'s); sessions created from an
	// alias are sessions of that template.
	AliasOf string `json:"alias_of,omitempty"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// Info describes the daemon (GET /v1/info).
type Info struct {
	Version     string `json:"version"`
	EnvdVersion string `json:"envd_version"`
	// Drivers lists the isolation drivers this host has, with capabilities.
	Drivers       []DriverInfo `json:"drivers"`
	DefaultDriver string       `json:"default_driver"`
	Limits        Limits       `json:"limits"`
}

// DriverInfo is one isolation driver and what it supports.
type DriverInfo struct {
	Name         string          `json:"name"`
	Capabilities map[string]bool `json:"capabilities"`
	// Version is the version of the runtime binary the driver runs (the
	// gvisor driver's runsc), when it says.
	Version string `json:"version,omitempty"`
}

// Problem is an RFC 9457 problem details object, the body of every error
// response (Content-Type application/problem+json).
type Problem struct {
	// Type is a stable URI reference naming the problem class; the daemon
	// serves a description of it at that path ("/problems/not-found").
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is the request path.
	Instance string `json:"instance,omitempty"`
	// Field names the request field at fault, for invalid-argument.
	Field string `json:"field,omitempty"`
	// RequestID is the request's correlation id (also in X-Request-Id).
	RequestID string `json:"request_id,omitempty"`
	// Paths lists every conflicting path of a merge-conflict (409).
	Paths []string `json:"paths,omitempty"`
}

// Snapshot is a saved copy of a session's files (POST
// /v1/sessions/{id}/snapshot, GET /v1/snapshots) and, for a memory
// snapshot (gVisor tier), of its processes and memory too.
type Snapshot struct {
	ID string `json:"snapshot_id"`
	// SessionID is the session it was taken from.
	SessionID string `json:"session_id"`
	// Parent is the snapshot that session was restored from; the snapshot
	// stores only what changed since then.
	Parent   string `json:"parent,omitempty"`
	Template string `json:"template"`
	// Storage is the storage driver holding it (btrfs or overlay).
	Storage string `json:"storage"`
	// SizeBytes is what it adds over its parent, in bytes.
	SizeBytes int64 `json:"size_bytes"`
	// Digest is "sha256:..." of its contents manifest, checked before every restore.
	Digest    string     `json:"digest"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Name is the name it was given, if any.
	Name string `json:"name,omitempty"`
	// Memory: the snapshot holds the session's processes and memory;
	// sessions started from it continue them, on MemoryDriver.
	Memory       bool   `json:"memory"`
	MemoryDriver string `json:"memory_driver,omitempty"`
	// MemoryBytes is the size of the checkpoint image in bytes (stored
	// encrypted, AES-256-GCM).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// MemoryState is "sealing" while the checkpoint is being encrypted
	// after the snapshot call answered (a restore or fork from it waits
	// until it is done), then "sealed"; absent for a snapshot of files.
	MemoryState string `json:"memory_state,omitempty"`
	// MemoryReplicatedAt is when the encrypted checkpoint was copied to
	// the fleet's object store (absent: not copied, or a snapshot of
	// files only). The snapshot's files stay on its host for now.
	MemoryReplicatedAt *time.Time `json:"memory_replicated_at,omitempty"`
}

// Snapshot.MemoryState values.
const (
	// MemorySealing: the memory checkpoint is being sealed.
	MemorySealing = "sealing"
	// MemorySealed: it is sealed and restorable.
	MemorySealed = "sealed"
)

// SnapshotRequest is the optional body of POST /v1/sessions/{id}/snapshot.
type SnapshotRequest struct {
	// ExpiresInS garbage-collects the snapshot after this many seconds
	// (0 = keep until deleted).
	ExpiresInS int64 `json:"expires_in_s,omitempty"`
	// ExpiresAt garbage-collects it at that time instead (RFC 3339); give
	// one of the two.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Name names it (up to 128 printable characters); a create or fork
	// may then give the name instead of the id (the newest snapshot with
	// the name is used).
	Name string `json:"name,omitempty"`
	// Memory checkpoints the session's processes and memory with its
	// files (a running session of a driver with the memory_snapshot
	// capability: isolation "gvisor"). The session keeps running; open
	// exec streams are closed (their processes keep running and can be
	// reconnected). Sessions started or forked from the snapshot continue
	// every process from the moment of the snapshot, each with its own
	// hostname and machine id.
	Memory bool `json:"memory,omitempty"`
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest starts Count sessions from a snapshot (POST
// /v1/snapshots/{id}/fork) or from a snapshot of a running session taken on
// the spot (POST /v1/sessions/{id}/fork). The create fields override the
// source session's settings for every fork (template and snapshot cannot be
// set).
type ForkRequest struct {
	// Count is how many sessions to start, 1..64.
	Count int `json:"count"`
	// Memory (POST /v1/sessions/{id}/fork only) takes a memory snapshot,
	// so that the forks continue the session's processes.
	Memory bool `json:"memory,omitempty"`
	// Run (POST /v1/snapshots/{id}/fork only) runs a command in every
	// child and streams their results as NDJSON (ForkEvent); Keep says
	// which children stay ("all", "best", "none"), Score how to rank them.
	Run   *ForkRun   `json:"run,omitempty"`
	Keep  string     `json:"keep,omitempty"`
	Score *ForkScore `json:"score,omitempty"`
	CreateRequest
}

// ForkResult lists the sessions a fork started, and the snapshot they
// came from.
type ForkResult struct {
	Snapshot Snapshot  `json:"snapshot"`
	Sessions []Session `json:"sessions"`
}

// Pool is a warm pool of ready sandboxes for one template (GET /v1/pools,
// PUT /v1/pools/{template}). A create that asks for this template and
// these limits, without a snapshot, takes a ready member in milliseconds;
// members are used once and never returned.
type Pool struct {
	Template string `json:"template"`
	// Size is how many ready members the pool keeps (0 disables it).
	Size int `json:"size"`
	// The limits of its members; a create must ask for the same to fit.
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	Pids     int64   `json:"pids"`
	DiskMB   int64   `json:"disk_mb"`
	// Ready is how many members are ready now; Starting how many are being made.
	Ready    int `json:"ready"`
	Starting int `json:"starting"`
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}
