// Package admission decides whether a tenant may have what it asks for:
// its policy (templates, sizes, egress ceiling, quotas) and the host's
// capacity.
package admission

import (
	"encoding/json"
	"fmt"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Capacity bounds what this host runs at once, over every tenant. Zero
// fields do not limit.
type Capacity struct {
	// MaxSessions caps sessions that exist at once (warm-pool members
	// not counted).
	MaxSessions int
	// MaxMemoryMB caps the sum of their memory limits, in MiB.
	MaxMemoryMB int64
}

// ValidatePolicy checks p: no negative bounds, template names and
// egress entries in their syntax ("*" or a network.allow entry).
// ErrInvalidArgument naming the field ("policy.egress_allow[1]").
func ValidatePolicy(p *tenancy.Policy) error {
	for i, t := range p.Templates {
		if t == "" || len(t) > 63 {
			return errdefs.InvalidField(fmt.Sprintf("policy.templates[%d]", i), "must be a template name")
		}
	}
	switch {
	case p.MaxCPU < 0:
		return errdefs.InvalidField("policy.max_cpu", "must not be negative")
	case p.MaxMemoryMB < 0:
		return errdefs.InvalidField("policy.max_memory_mb", "must not be negative")
	case p.MaxDiskMB < 0:
		return errdefs.InvalidField("policy.max_disk_mb", "must not be negative")
	case p.MaxPids < 0:
		return errdefs.InvalidField("policy.max_pids", "must not be negative")
	case p.MaxTimeoutS < 0:
		return errdefs.InvalidField("policy.max_timeout_s", "must not be negative")
	case p.MaxSessions < 0:
		return errdefs.InvalidField("policy.max_sessions", "must not be negative")
	case p.MaxSnapshots < 0:
		return errdefs.InvalidField("policy.max_snapshots", "must not be negative")
	case p.MaxTemplates < 0:
		return errdefs.InvalidField("policy.max_templates", "must not be negative")
	case p.MaxVolumes < 0:
		return errdefs.InvalidField("policy.max_volumes", "must not be negative")
	case p.MaxTemplateMB < 0:
		return errdefs.InvalidField("policy.max_template_mb", "must not be negative")
	case p.MaxTemplateMB > 1<<30:
		return errdefs.InvalidField("policy.max_template_mb", "must be at most %d (1 PiB)", 1<<30)
	case p.CPUSecondsPerDay < 0:
		return errdefs.InvalidField("policy.cpu_seconds_per_day", "must not be negative")
	case len(p.EgressAllow) > netpolicy.MaxRules:
		return errdefs.InvalidField("policy.egress_allow", "at most %d entries", netpolicy.MaxRules)
	}
	for i, e := range p.EgressAllow {
		if e == "*" {
			continue
		}
		if _, err := netpolicy.ParseRule(e); err != nil {
			return errdefs.InvalidField(fmt.Sprintf("policy.egress_allow[%d]", i), "%v", err)
		}
	}
	return nil
}

// PolicyOf decodes the policy stored in tenant record t.
func PolicyOf(t *store.Tenant) (tenancy.Policy, error) {
	var p tenancy.Policy
	if err := json.Unmarshal([]byte(t.Policy), &p); err != nil {
		return p, fmt.Errorf("tenant %s policy: %w", t.Name, err)
	}
	return p, nil
}
