package v1

import "time"

// TenantPolicy bounds what a tenant's keys may do. Zero fields do not
// limit (except EgressAllow, which is closed when empty).
type TenantPolicy struct {
	// Templates are the templates the tenant may start sessions from
	// (also through a snapshot of one); empty: any it can see. Others are
	// refused with 400 image-not-approved.
	Templates []string `json:"templates,omitempty"`
	// MaxCPU (cores), MaxMemoryMB, MaxDiskMB (MiB), MaxPids and
	// MaxTimeoutS (seconds) bound each session's size; a larger request is
	// a 400 naming the field.
	MaxCPU      float64 `json:"max_cpu,omitempty"`
	MaxMemoryMB int64   `json:"max_memory_mb,omitempty"`
	MaxDiskMB   int64   `json:"max_disk_mb,omitempty"`
	MaxPids     int64   `json:"max_pids,omitempty"`
	MaxTimeoutS int64   `json:"max_timeout_s,omitempty"`
	// MaxSessions caps the tenant's sessions that exist at once (creating,
	// running, paused); past it creates get 429
	// tenant-concurrency-exceeded with Retry-After.
	MaxSessions int `json:"max_sessions,omitempty"`
	// MaxSnapshots and MaxTemplates cap how many snapshots and imported
	// templates the tenant keeps (they hold disk); past them a snapshot
	// or import gets 429 tenant-quota-exceeded.
	MaxSnapshots int `json:"max_snapshots,omitempty"`
	MaxTemplates int `json:"max_templates,omitempty"`
	// MaxVolumes caps how many volumes the tenant keeps, the copies made
	// for sessions started from a session snapshot included; past it a
	// volume create (or such a session's start) gets 429
	// tenant-quota-exceeded.
	MaxVolumes int `json:"max_volumes,omitempty"`
	// MaxTemplateMB bounds each template the tenant imports or pulls, in
	// MiB: the image's compressed layers and the files they unpack to;
	// past it the import gets 413 template-too-large naming the limit.
	MaxTemplateMB int64 `json:"max_template_mb,omitempty"`
	// SuspendWhenFlagged refuses the tenant's creates (403
	// tenant-suspended) while the abuse detector's flag is on it, until
	// an admin clears it.
	SuspendWhenFlagged bool `json:"suspend_when_flagged,omitempty"`
	// CPUSecondsPerDay is the tenant's CPU budget per UTC day, in
	// CPU-seconds over all its sessions. When it is used up, its running
	// sessions end (reason quota) and creates get 429 until the next day.
	CPUSecondsPerDay int64 `json:"cpu_seconds_per_day,omitempty"`
	// EgressAllow is the ceiling of the tenant's allow-lists: every entry
	// of a session's network.allow must fall inside one of these (same
	// syntax; "*" allows anything). Empty: no network at all. Outside it:
	// 403 egress-not-allowed.
	EgressAllow []string `json:"egress_allow,omitempty"`
}

// Tenant is a tenant as the API reports it (GET /v1/tenants/{name}).
type Tenant struct {
	Name      string       `json:"name"`
	Policy    TenantPolicy `json:"policy"`
	CreatedAt time.Time    `json:"created_at"`
	// FlaggedAt and FlagReason are set when the abuse detector flagged
	// the tenant (a session of it was killed for abuse).
	FlaggedAt  *time.Time `json:"flagged_at,omitempty"`
	FlagReason string     `json:"flag_reason,omitempty"`
	// Sessions counts its sessions that exist now; CPUSecondsToday is the
	// CPU it used this UTC day, in CPU-seconds.
	Sessions        int     `json:"sessions"`
	CPUSecondsToday float64 `json:"cpu_seconds_today"`
}

// TenantRequest creates a tenant (POST /v1/tenants) or replaces its
// policy (PUT /v1/tenants/{name}, where Name may be omitted).
type TenantRequest struct {
	// Name is 1-63 lower-case letters, digits and '-', starting with a letter.
	Name   string       `json:"name,omitempty"`
	Policy TenantPolicy `json:"policy"`
	// ClearFlag (PUT only) clears the abuse flag.
	ClearFlag bool `json:"clear_flag,omitempty"`
}

// TenantList is the body of GET /v1/tenants.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// APIKey is an API key as listed (never with its secret).
type APIKey struct {
	ID         string     `json:"id"`
	Name       string     `json:"name,omitempty"`
	Tenant     string     `json:"tenant"`
	Admin      bool       `json:"admin,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// KeyRequest makes an API key (POST /v1/tenants/{name}/keys).
type KeyRequest struct {
	Name string `json:"name,omitempty"`
	// Admin keys manage tenants and keys and read every tenant's audit
	// records and the metrics.
	Admin bool `json:"admin,omitempty"`
}

// NewKey answers POST /v1/tenants/{name}/keys: the key and its secret,
// shown this once (only its SHA-256 is stored).
type NewKey struct {
	APIKey
	Secret string `json:"secret"`
}

// KeyList is the body of GET /v1/keys.
type KeyList struct {
	Keys []APIKey `json:"keys"`
}

// AuditRecord is one append-only audit record (GET /v1/audit).
type AuditRecord struct {
	Seq     int64     `json:"seq"`
	Time    time.Time `json:"time"`
	Tenant  string    `json:"tenant"`
	Session string    `json:"session,omitempty"`
	// Kind is session.create, session.destroy, session.end (timeout,
	// abuse, quota, error), session.pause, session.resume,
	// session.timeout, session.merge, exec, process.signal, process.stdin, file.read,
	// file.write, file.remove, file.mkdir, file.move, file.stat,
	// file.list, snapshot.create, snapshot.delete, snapshot.fork,
	// template.import, template.delete, egress, policy, abuse,
	// tenant.create, tenant.update, tenant.delete, key.create, key.revoke,
	// envd (a request through the E2B envd proxy), mcp.tool (a tool call
	// of the MCP endpoint; detail "tool" names it), port (a request or
	// connection to a sandbox port: detail port, method, path, via).
	Kind string `json:"kind"`
	// Outcome is ok, error or denied.
	Outcome string `json:"outcome"`
	// KeyID is the API key that made the request ("" for forkbox itself:
	// timeouts, the abuse detector).
	KeyID string `json:"key_id,omitempty"`
	// RequestID (the X-Request-Id echoed on the response) and
	// IdempotencyKey correlate the record with its request.
	RequestID      string `json:"request_id,omitempty"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Detail holds the event's fields: for exec, command_sha256,
	// exit_code, cpu_ms, duration_ms; for files, path and bytes; for
	// errors, status and error.
	Detail map[string]any `json:"detail,omitempty"`
	// Host is the fleet host that made the record (in a cluster, where
	// GET /v1/audit reads every host's records; there Seq is the
	// record's place in the fleet's audit stream). Absent on a host
	// alone.
	Host string `json:"host,omitempty"`
}

// AuditList is the body of GET /v1/audit. Next, when set, is the "after"
// value of the next page.
type AuditList struct {
	Records []AuditRecord `json:"records"`
	Next    int64         `json:"next,omitempty"`
}
