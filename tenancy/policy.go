package tenancy

// Policy bounds what a tenant's keys may do. Zero fields do not limit
// (except EgressAllow, which is closed when empty). The store keeps it as
// this JSON; the REST form, api/v1.TenantPolicy, has the same fields.
type Policy struct {
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
	// templates the tenant keeps (they hold disk; a volume's own
	// snapshots count as snapshots); past them a snapshot or import gets
	// 429 tenant-quota-exceeded.
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
