package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/volume"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Request size caps, to keep one record and one agent environment small.
const (
	maxEnvVars      = 256
	maxEnvBytes     = 128 << 10
	maxMetadataKeys = 64
	maxMetadataKey  = 128
	maxMetadataVal  = 1024
)

// normalizeCreate applies defaults and validates r in place. Errors are
// *errdefs.FieldError naming the offending field.
func normalizeCreate(r *node.CreateSpec, l node.Limits) error {
	if r.Snapshot != "" {
		if r.Template != "" {
			return errdefs.InvalidField("template", "give a template or a snapshot, not both (a snapshot brings its template)")
		}
		if !validID(r.Snapshot) && !node.ValidSnapshotName(r.Snapshot) {
			return errdefs.InvalidField("snapshot", "is not a snapshot id or name")
		}
	} else if r.Template == "" {
		r.Template = storage.BaseTemplate
	} else if target, ok := storage.TemplateAlias(r.Template); ok {
		r.CodeWarm = r.CodeWarm || r.Template == storage.CodeInterpreterTemplate
		r.Alias, r.Template = r.Template, target // (the session is the target's)
	}
	if r.DiskMB == 0 {
		r.DiskMB = l.DefaultDiskMB
	}
	if r.DiskMB < l.MinDiskMB || r.DiskMB > l.MaxDiskMB {
		return errdefs.InvalidField("disk_mb", "must be between %d and %d", l.MinDiskMB, l.MaxDiskMB)
	}
	if r.AutoPauseS < 0 || r.AutoPauseS > l.MaxTimeoutS {
		return errdefs.InvalidField("auto_pause_s", "must be between 0 (never) and %d seconds", l.MaxTimeoutS)
	}
	switch r.OnTimeout {
	case "":
		r.OnTimeout = node.OnTimeoutKill
	case node.OnTimeoutKill, node.OnTimeoutPause:
	default:
		return errdefs.InvalidField("on_timeout", "must be %q or %q", node.OnTimeoutKill, node.OnTimeoutPause)
	}
	if r.AutoResume && r.OnTimeout != node.OnTimeoutPause {
		return errdefs.InvalidField("auto_resume", "needs on_timeout %q", node.OnTimeoutPause)
	}
	if r.Snapshot == "" && !storage.ValidTemplateName(r.Template) {
		return errdefs.InvalidField("template", "must be 1-63 characters of [a-z0-9._-]")
	}
	if r.CPU == 0 {
		r.CPU = min(l.DefaultCPU, l.MaxCPU)
	}
	if r.CPU < 0.01 || r.CPU > l.MaxCPU {
		return errdefs.InvalidField("cpu", "must be between 0.01 and %g cores", l.MaxCPU)
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = l.DefaultMemoryMB
	}
	if r.MemoryMB < l.MinMemoryMB || r.MemoryMB > l.MaxMemoryMB {
		return errdefs.InvalidField("memory_mb", "must be between %d and %d", l.MinMemoryMB, l.MaxMemoryMB)
	}
	if r.Pids == 0 {
		r.Pids = l.DefaultPids
	}
	if r.Pids < l.MinPids || r.Pids > l.MaxPids {
		return errdefs.InvalidField("pids", "must be between %d and %d", l.MinPids, l.MaxPids)
	}
	if r.TimeoutS == 0 {
		r.TimeoutS = l.DefaultTimeoutS
	}
	if r.TimeoutS < 1 || r.TimeoutS > l.MaxTimeoutS {
		return errdefs.InvalidField("timeout_s", "must be between 1 and %d seconds", l.MaxTimeoutS)
	}
	if err := validateEnv("env", r.Env); err != nil {
		return err
	}
	if err := validateMetadata(r.Metadata); err != nil {
		return err
	}
	if err := normalizeSecrets(r); err != nil {
		return err
	}
	if err := normalizeNetwork(r.Network); err != nil {
		return err
	}
	if err := volume.CheckMounts(r.Volumes); err != nil {
		return err
	}
	if r.User == "" {
		r.User = "user"
	}
	if err := ValidateUser("user", r.User); err != nil {
		return err
	}
	if r.Workdir != "" {
		if !path.IsAbs(r.Workdir) || strings.ContainsRune(r.Workdir, 0) {
			return errdefs.InvalidField("workdir", "must be an absolute path")
		}
		r.Workdir = path.Clean(r.Workdir)
	}
	return nil
}

// requestHash fingerprints a normalized request, to tell an idempotent retry from
// a different request that reuses its Idempotency-Key. The fingerprint is
// of the request's JSON in the REST API's field names (hashedSpec): the
// store keeps it, so it must not change between versions, or a retry
// across an upgrade would be refused as a different request.
func requestHash(r *node.CreateSpec) string {
	h := hashedSpec{
		Template: r.Template, CPU: r.CPU, MemoryMB: r.MemoryMB, Pids: r.Pids, TimeoutS: r.TimeoutS,
		Env: r.Env, Metadata: r.Metadata, User: r.User, Workdir: r.Workdir, Snapshot: r.Snapshot,
		DiskMB: r.DiskMB, AutoPauseS: r.AutoPauseS, OnTimeout: r.OnTimeout, AutoResume: r.AutoResume,
		Isolation: r.Isolation, PublicTraffic: r.PublicTraffic,
	}
	if n := r.Network; n != nil {
		h.Network = &hashedNetwork{Allow: n.Allow, MaxEgressBytes: n.MaxEgressBytes, MaxConnectionsPerMinute: n.MaxConnectionsPerMinute}
		h.Secrets = n.Secrets
	}
	b, _ := json.Marshal(h) // map keys marshal sorted: stable
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// hashedSpec is a CreateSpec as requestHash encodes it: the REST API's
// create body (api/v1.CreateRequest) field for field, as every version
// since idempotency keys has hashed it.
type hashedSpec struct {
	Template   string            `json:"template,omitempty"`
	CPU        float64           `json:"cpu,omitempty"`
	MemoryMB   int64             `json:"memory_mb,omitempty"`
	Pids       int64             `json:"pids,omitempty"`
	TimeoutS   int64             `json:"timeout_s,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	User       string            `json:"user,omitempty"`
	Workdir    string            `json:"workdir,omitempty"`
	Snapshot   string            `json:"snapshot,omitempty"`
	DiskMB     int64             `json:"disk_mb,omitempty"`
	AutoPauseS int64             `json:"auto_pause_s,omitempty"`
	OnTimeout  string            `json:"on_timeout,omitempty"`
	AutoResume bool              `json:"auto_resume,omitempty"`
	Network    *hashedNetwork    `json:"network,omitempty"`
	// Secrets (the REST body's, kept in Network.Secrets) is omitted when
	// empty, so hashes of requests made before it existed stay the same.
	Secrets   []string `json:"secrets,omitempty"`
	Isolation string   `json:"isolation,omitempty"`
	// PublicTraffic is omitted when false, so hashes of requests made
	// before it existed stay the same.
	PublicTraffic bool `json:"public_traffic,omitempty"`
}

// hashedNetwork is a Network as requestHash encodes it (api/v1.Network).
type hashedNetwork struct {
	Allow                   []string `json:"allow"`
	MaxEgressBytes          int64    `json:"max_egress_bytes,omitempty"`
	MaxConnectionsPerMinute int      `json:"max_connections_per_minute,omitempty"`
}

// validateEnv checks environment variable names and values: a name is
// non-empty without '=' or NUL; a value has no NUL (anything else, spaces,
// '=', newlines and quotes included, passes through byte for byte).
func validateEnv(field string, env map[string]string) error {
	if len(env) > maxEnvVars {
		return errdefs.InvalidField(field, "at most %d variables", maxEnvVars)
	}
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return errdefs.InvalidField(field, "variable name %q is invalid", k)
		}
		if strings.ContainsRune(v, 0) {
			return errdefs.InvalidField(field+"."+k, "value contains a NUL byte")
		}
		total += len(k) + len(v) + 2
	}
	if total > maxEnvBytes {
		return errdefs.InvalidField(field, "total size exceeds %d bytes", maxEnvBytes)
	}
	return nil
}

// validMetadataKey checks one metadata key (of a session, or of a list
// filter): 1 to 128 bytes of UTF-8 without control characters.
func validMetadataKey(k string) error {
	ok := k != "" && len(k) <= maxMetadataKey && utf8.ValidString(k)
	for _, c := range k {
		if c < 0x20 || c == 0x7f {
			ok = false
		}
	}
	if !ok {
		return errdefs.InvalidField("metadata", "key %q must be 1-%d bytes of UTF-8 without control characters", k, maxMetadataKey)
	}
	return nil
}

func validateMetadata(m map[string]string) error {
	if len(m) > maxMetadataKeys {
		return errdefs.InvalidField("metadata", "at most %d keys", maxMetadataKeys)
	}
	for k, v := range m {
		if err := validMetadataKey(k); err != nil {
			return err
		}
		if len(v) > maxMetadataVal {
			return errdefs.InvalidField("metadata."+k, "value longer than %d bytes", maxMetadataVal)
		}
	}
	return nil
}

// maxUID is the largest uid a sandbox has: its user namespace maps 65536 ids.
const maxUID = 65535

// ValidateUser checks a user name or numeric id given in field: 1-32
// characters of [a-z0-9_.-] (POSIX portable names, lower case) or a uid
// the sandbox has (0-65535).
func ValidateUser(field, name string) error {
	if name == "" || len(name) > 32 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_.-") != "" ||
		name[0] == '-' {
		return errdefs.InvalidField(field, "must be a user name of [a-z0-9_.-] or a numeric uid")
	}
	if strings.Trim(name, "0123456789") == "" {
		if uid, err := strconv.ParseUint(name, 10, 32); err != nil || uid > maxUID {
			return errdefs.InvalidField(field, "uid %s is outside the sandbox's ids (0-%d)", name, maxUID)
		}
	}
	return nil
}
