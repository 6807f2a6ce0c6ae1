// Package node holds forkbox's domain: what one host offers for the
// sandbox sessions on it (the Node interface) and the types it speaks —
// sessions, snapshots, commands, files — independent of any wire format.
// The REST API, the E2B edge and the CLI's in-process bench convert their
// wire types to these at their edge and call a Node; the local
// implementation is package sandbox, and the fleet's router is the next.
// The store persists these types as they are.
//
// Units are in the field names: MB is MiB, S seconds, MS milliseconds.
package node

import "time"

// State is a session's lifecycle state.
type State string

// The lifecycle: creating -> running <-> paused -> terminating ->
// terminated. A session that fails while creating goes straight to
// terminated with reason error. Warm-pool members wait in pooled (hidden
// from users) until a create claims them and they become running.
const (
	StateCreating    State = "creating"
	StatePooled      State = "pooled"
	StateRunning     State = "running"
	StatePaused      State = "paused"
	StateTerminating State = "terminating"
	StateTerminated  State = "terminated"
)

// Reasons a session ended.
const (
	ReasonDeleted = "deleted"
	ReasonTimeout = "timeout"
	ReasonError   = "error"
	// ReasonAbuse: the abuse detector killed it (Detail says why).
	ReasonAbuse = "abuse"
	// ReasonQuota: its tenant's CPU budget for the day ran out.
	ReasonQuota = "quota"
	// ReasonPidsLimit: the sandbox stopped because its tasks reached the
	// host's pids limit (a gVisor sandbox whose Sentry could not start
	// another host thread); Detail says more.
	ReasonPidsLimit = "pids-limit"
)

// Session is one sandbox session's durable record. Times are UTC; a zero
// time means "not yet".
type Session struct {
	ID       string
	Template string
	Driver   string
	State    State
	// Reason and Detail say why a terminated session ended.
	Reason string
	Detail string
	// CPU in cores, MemoryMB in MiB, Pids in tasks, TimeoutS in seconds.
	CPU      float64
	MemoryMB int64
	Pids     int64
	TimeoutS int64
	// DefaultUser runs execs and owns files when a call names no user.
	DefaultUser string
	Workdir     string
	Env         map[string]string
	Metadata    map[string]string
	// IdempotencyKey is the create request's Idempotency-Key ("" for none);
	// RequestHash fingerprints the request body it came with.
	IdempotencyKey string
	RequestHash    string
	CreatedAt      time.Time
	StartedAt      time.Time
	ExpiresAt      time.Time
	EndedAt        time.Time
	// Snapshot is the snapshot the session was restored from ("" for a template).
	Snapshot string
	// DiskMB caps what the session may write, in MiB (0 = no cap).
	DiskMB int64
	// AutoPauseS pauses the session after that many idle seconds (0 = never).
	AutoPauseS int64
	// PausedAt is when a paused session was paused; Remaining is the
	// timeout it had left then, restored on resume.
	PausedAt  time.Time
	Remaining time.Duration
	// AutoPaused: the session is paused because of its AutoPauseS (not on
	// request), so its next exec or files call resumes it.
	AutoPaused bool
	// EnvdToken is the secret E2B clients send as X-Access-Token to reach
	// the session's agent through the envd proxy.
	EnvdToken string
	// TrafficToken is the secret E2B clients send as
	// E2B-Traffic-Access-Token to reach the session's other services
	// (its code-execution service, E2B's port 49999) through the E2B edge;
	// "" (a session made before it existed) opens them to nobody.
	TrafficToken string
	// OnTimeout is what happens when the timeout is reached: OnTimeoutKill
	// ("" is the same) or OnTimeoutPause.
	OnTimeout string
	// AutoResume: a session paused by OnTimeoutPause resumes on its next call.
	AutoResume bool
	// Network is the session's egress policy; nil for none (loopback only).
	Network *Network
	// PublicTraffic: requests to the session's ports (other than envd's
	// and the code service's) need no token; false (the default) asks
	// for its traffic or envd token or its tenant's API key.
	PublicTraffic bool
	// Tenant owns the session; it never changes.
	Tenant string
	// Volumes are the volumes the session mounts (none: nil).
	Volumes []VolumeMount
}

// Network is a session's egress policy as stored (the REST form is api/v1.Network).
type Network struct {
	Allow                   []string `json:"allow"`
	MaxEgressBytes          int64    `json:"max_egress_bytes"`
	MaxConnectionsPerMinute int      `json:"max_connections_per_minute"`
	// Secrets names the tenant's secrets the session may use through the
	// credential broker (CreateSpec.Secrets); kept with the network,
	// which they need.
	Secrets []string `json:"secrets,omitempty"`
}

// What a session does when its timeout is reached (Session.OnTimeout).
const (
	OnTimeoutKill  = "kill"
	OnTimeoutPause = "pause"
)

// SessionFilter selects sessions in a listing (Node.List, store.ListSessions).
type SessionFilter struct {
	// States, when not empty, keeps only sessions in one of them.
	States []State
	// Metadata keeps sessions whose metadata has every key with that value.
	Metadata map[string]string
	// Template, when set, keeps only sessions of that template.
	Template string
	// Tenant, when set, keeps only that tenant's sessions.
	Tenant string
	// CreatedAfter, when not zero, keeps only sessions created after it.
	CreatedAfter time.Time
	// Ascending lists oldest first (the default is newest first).
	Ascending bool
	// After, when set, continues a listing after that session: the next
	// page of a paginated list (ListCursor of the last session seen).
	After *ListCursor
	// Limit caps the result (0 = no cap).
	Limit int
}

// ListCursor marks a place in a session listing: its sort keys.
type ListCursor struct {
	CreatedAt time.Time
	ID        string
}
