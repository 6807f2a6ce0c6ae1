package node

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// Node is everything one host offers for the sessions on it. Every method
// is scoped to the caller's tenant, which travels in ctx (package
// tenancy): another tenant's session or snapshot is ErrNotFound. Errors
// carry the classes of package errdefs (and the problem types below), so
// each edge maps them once. The local implementation is host.Node (the
// lifecycle core, sandbox.Manager, composed with the warm pools and the
// snapshots); the API, the E2B edge and the bench depend on this
// interface only.
type Node interface {
	Sessions
	Processes
	Files
	Envd
	Ports
	Snapshots
	Changes
	Pools
	Tenants
	Volumes
}

// Sessions is a session's lifecycle.
type Sessions interface {
	// Create starts a session for spec. With an idempotencyKey the same
	// key and spec return the session made the first time (created
	// false); the key with another spec is ErrConflict.
	Create(ctx context.Context, spec CreateSpec, idempotencyKey string) (s *Session, created bool, err error)
	// Get returns session id's record (also once it ended).
	Get(ctx context.Context, id string) (*Session, error)
	// List returns the caller's sessions that f selects.
	List(ctx context.Context, f SessionFilter) ([]*Session, error)
	// SetTimeout makes session id end seconds from now.
	SetTimeout(ctx context.Context, id string, seconds int64) (*Session, error)
	// Pause freezes session id (its clock stops); Resume thaws it.
	Pause(ctx context.Context, id string) (*Session, error)
	Resume(ctx context.Context, id string) (*Session, error)
	// Destroy ends session id and frees what it held.
	Destroy(ctx context.Context, id string) error
	// Usage reads session id's resource use from outside the sandbox.
	Usage(ctx context.Context, id string) (*Usage, error)
	// UsageHistory returns the usage samples the host took of live
	// session id in [from, to] (zero: open), oldest first (a bounded
	// recent history).
	UsageHistory(ctx context.Context, id string, from, to time.Time) ([]UsageSample, error)
	// Egress lists session id's egress records, oldest first, skipping
	// skip and returning at most limit.
	Egress(ctx context.Context, id string, skip, limit int) ([]EgressRecord, error)
	// SetNetwork replaces running (or paused) session id's egress
	// allow-list with allow (empty: nothing is allowed) at once; the
	// record keeps it, so pause, forks and a daemon restart keep it.
	// ErrConflict for a session made without a network (one cannot be
	// added live); the tenant's egress ceiling applies as at create
	// (ErrPermissionDenied, ProblemEgressNotAllowed).
	SetNetwork(ctx context.Context, id string, allow []string) (*Session, error)
	// Logs returns live session id's log lines (its guest agent's:
	// commands started and ended, its own warnings), oldest first: those
	// at or after since (zero: all), at most limit (0: no cap).
	Logs(ctx context.Context, id string, since time.Time, limit int) ([]LogLine, error)
	// Info says what the Node offers: drivers and limits.
	Info() Info
	// TemplateUsable reports whether the caller may start a session from
	// template name on this Node.
	TemplateUsable(ctx context.Context, name string) bool
}

// Processes runs commands in a session.
type Processes interface {
	// PrepareExec begins an exec or stdin call in session id whose body
	// declares bodyBytes (<= 0: unknown). 429 (ProblemExecInflight) when
	// the tenant or the host has too many exec bytes in flight.
	PrepareExec(ctx context.Context, id string, bodyBytes int64) (ExecCall, error)
	// Exec runs spec in session id and streams its output to out; it
	// returns when the command's main process exits, or at once after
	// the start for a background command.
	Exec(ctx context.Context, id string, spec ExecSpec, out Output) (*ExecResult, error)
	// Attach streams running command pid's output from now on and its end.
	Attach(ctx context.Context, id string, pid int, out Output) (*ExecResult, error)
	// ProcessList lists the commands running in session id.
	ProcessList(ctx context.Context, id string) ([]Process, error)
	// Signal sends sig (9 or 15) to command pid's process group.
	Signal(ctx context.Context, id string, pid int, sig int) error
	// SendStdin writes data to command pid's stdin and, with closeAfter,
	// closes it.
	SendStdin(ctx context.Context, id string, pid int, data []byte, closeAfter bool) error
}

// Files reads and writes a session's files as user ("" = the session's
// default user). Paths are resolved inside the sandbox.
type Files interface {
	// Upload writes body (size bytes, -1 unknown) to path.
	Upload(ctx context.Context, id, path, user string, body io.Reader, size int64) (*Entry, error)
	// Download opens path for reading; size is its length (-1 unknown).
	Download(ctx context.Context, id, path, user string) (rc io.ReadCloser, size int64, err error)
	Stat(ctx context.Context, id, path, user string) (*Entry, error)
	// ListDir lists path to depth levels (1 = its entries).
	ListDir(ctx context.Context, id, path, user string, depth int) ([]Entry, error)
	MakeDir(ctx context.Context, id, path, user string) (*Entry, error)
	Move(ctx context.Context, id, source, destination, user string) (*Entry, error)
	Remove(ctx context.Context, id, path, user string) error
}

// Envd gives E2B's envd protocol a way to the session's guest agent.
type Envd interface {
	// CheckEnvdToken checks token against session id's envd access token
	// without changing the session; ErrUnauthenticated when wrong.
	CheckEnvdToken(ctx context.Context, id, token string) (*Session, error)
	// OpenEnvd holds running session id's agent for one envd request.
	OpenEnvd(ctx context.Context, id string) (*EnvdConn, error)
	// AgentHealthy reports (nil) whether session id's agent answers.
	AgentHealthy(ctx context.Context, id string) error
}

// Ports reaches TCP ports inside a session: the connection is made by the
// session's agent on the sandbox's own loopback, so no route from the
// host into the sandbox is opened.
type Ports interface {
	// DialPort connects to port (1-65535) on running session id's
	// loopback; closing the connection ends it. A field error on "port"
	// for a port out of range; ErrUnavailable typed
	// ProblemPortNotListening when nothing listens there; ErrConflict
	// when the session is paused or not yet running.
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
}

// Snapshots saves sessions and starts new ones from them.
type Snapshots interface {
	// Snapshot saves session id's files (and with opts.Memory its
	// processes and memory).
	Snapshot(ctx context.Context, id string, opts SnapshotOptions) (*Snapshot, error)
	// Fork starts count sessions from snapshot ref (id or name); spec
	// overrides the source session's settings (not Template or Snapshot).
	Fork(ctx context.Context, ref string, count int, spec CreateSpec) ([]*Session, error)
	// ForkSession snapshots session id and forks count sessions from it.
	ForkSession(ctx context.Context, id string, count int, spec CreateSpec, opts SnapshotOptions) (*Snapshot, []*Session, error)
	// GetSnapshot finds a snapshot by id or name.
	GetSnapshot(ctx context.Context, ref string) (*Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*Snapshot, error)
	// DeleteSnapshot deletes snapshot id; force also deletes what was
	// made from it, otherwise that is ErrConflict.
	DeleteSnapshot(ctx context.Context, id string, force bool) error
	// DeleteSnapshotKeepDependents deletes snapshot id as E2B does: what
	// was made from it keeps running with its own files where the storage
	// allows it (btrfs), else ErrConflict as DeleteSnapshot.
	DeleteSnapshotKeepDependents(ctx context.Context, id string) error
}

// Pools keeps warm sandboxes ready for creates.
type Pools interface {
	// SetPool configures (Size 0: removes) the pool of p.Template.
	SetPool(ctx context.Context, p Pool) (PoolStatus, error)
	// PoolList lists the pools and their members.
	PoolList() []PoolStatus
}

// Tenants is what a Node holds for a tenant.
type Tenants interface {
	// TenantSessions counts tenant's sessions that exist on the Node.
	TenantSessions(tenant string) int
	// EndTenant ends every session of tenant.
	EndTenant(ctx context.Context, tenant string) error
	// ReserveQuota admits one more of what (a template import, ...) for
	// tenant against its policy, counting with count; release undoes it.
	ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error)
}

// EnvdConn is one proxied envd request's hold on a running session's
// agent (Envd.OpenEnvd). Release it when the request is over.
type EnvdConn struct {
	// Client reaches the agent; every request goes to its Unix socket.
	Client *http.Client
	// BaseURL is the URL prefix of agent requests ("http://agent").
	BaseURL string
	// StartCommand decodes the program and arguments of a process.Start
	// request body (Content-Type contentType) for its audit record; ok is
	// false when it cannot (see guest.StartCommand). Nil: it never can.
	StartCommand func(contentType string, body []byte) (argv []string, ok bool)
	release      func()
}

// NewEnvdConn returns an EnvdConn whose Release calls release once.
func NewEnvdConn(client *http.Client, baseURL string, release func()) *EnvdConn {
	return &EnvdConn{Client: client, BaseURL: baseURL, release: release}
}

// Release ends the hold; it counts as the end of a call for auto-pause.
func (c *EnvdConn) Release() {
	if c.release != nil {
		c.release()
		c.release = nil
	}
}
