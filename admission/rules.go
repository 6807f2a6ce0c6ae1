package admission

import (
	"fmt"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// Defaults gives the sizes a create spec leaves out (zero) the host's
// defaults l capped at policy p's bounds, so that a tenant with
// max_memory_mb 256 gets 256 MiB sessions by default rather than a 400.
// Only fields p bounds are filled; the rest are left to the core's
// normalization.
func Defaults(spec *node.CreateSpec, p tenancy.Policy, l node.Limits) {
	capped := func(v *int64, def, max int64) {
		if *v == 0 && max > 0 {
			*v = min(def, max)
		}
	}
	if spec.CPU == 0 && p.MaxCPU > 0 {
		spec.CPU = min(l.DefaultCPU, p.MaxCPU)
	}
	capped(&spec.MemoryMB, l.DefaultMemoryMB, p.MaxMemoryMB)
	capped(&spec.DiskMB, l.DefaultDiskMB, p.MaxDiskMB)
	capped(&spec.Pids, l.DefaultPids, p.MaxPids)
	capped(&spec.TimeoutS, l.DefaultTimeoutS, p.MaxTimeoutS)
}

// Violation returns why policy p refuses the normalized create spec, or
// nil: a template off its approved list (ErrInvalidArgument,
// node.ProblemImageNotApproved, field "template"), a size over its bounds
// (ErrInvalidArgument naming the field: "cpu", "memory_mb", "disk_mb",
// "pids", "timeout_s"), an allow-list entry outside its egress ceiling
// (ErrPermissionDenied, node.ProblemEgressNotAllowed, field
// "network.allow[i]"). It records nothing; Controller.Check does.
func Violation(p tenancy.Policy, spec *node.CreateSpec) error {
	if len(p.Templates) > 0 && !slices.Contains(p.Templates, spec.Template) {
		e := errdefs.Typed(errdefs.ErrInvalidArgument, node.ProblemImageNotApproved,
			"template %q is not on this tenant's approved list", spec.Template)
		e.Field = "template"
		return e
	}
	over := func(field string, limit, v float64) error {
		if limit > 0 && v > limit {
			return errdefs.InvalidField(field, "at most %g for this tenant", limit)
		}
		return nil
	}
	for _, err := range []error{
		over("cpu", p.MaxCPU, spec.CPU),
		over("memory_mb", float64(p.MaxMemoryMB), float64(spec.MemoryMB)),
		over("disk_mb", float64(p.MaxDiskMB), float64(spec.DiskMB)),
		over("pids", float64(p.MaxPids), float64(spec.Pids)),
		over("timeout_s", float64(p.MaxTimeoutS), float64(spec.TimeoutS)),
	} {
		if err != nil {
			return err
		}
	}
	if spec.Network == nil {
		return nil
	}
	return EgressViolation(p, spec.Network.Allow)
}

// EgressViolation returns why policy p's egress ceiling refuses the
// allow-list allow (a create's, or one replacing a running session's), or
// nil: an entry outside the ceiling is ErrPermissionDenied,
// node.ProblemEgressNotAllowed, field "network.allow[i]"; an entry that
// does not parse is ErrInvalidArgument naming it.
func EgressViolation(p tenancy.Policy, allow []string) error {
	ceiling, open := parseCeiling(p.EgressAllow)
	if open {
		return nil
	}
	for i, entry := range allow {
		r, err := netpolicy.ParseRule(entry)
		if err != nil {
			return errdefs.InvalidField(fmt.Sprintf("network.allow[%d]", i), "%v", err)
		}
		if !slices.ContainsFunc(ceiling, func(c netpolicy.Rule) bool { return c.Covers(r) }) {
			e := errdefs.Typed(errdefs.ErrPermissionDenied, node.ProblemEgressNotAllowed,
				"%q is outside this tenant's egress policy", entry)
			e.Field = fmt.Sprintf("network.allow[%d]", i)
			return e
		}
	}
	return nil
}

// parseCeiling parses a tenant's egress ceiling; open is true when it
// holds "*". Entries were validated when the policy was set.
func parseCeiling(entries []string) (rules []netpolicy.Rule, open bool) {
	for _, e := range entries {
		if e == "*" {
			return nil, true
		}
		if r, err := netpolicy.ParseRule(e); err == nil {
			rules = append(rules, r)
		}
	}
	return rules, false
}

// TimeoutViolation returns ErrInvalidArgument (field "timeout_s") when
// seconds is over policy p's max_timeout_s, else nil.
func TimeoutViolation(p tenancy.Policy, seconds int64) error {
	if p.MaxTimeoutS > 0 && seconds > p.MaxTimeoutS {
		return errdefs.InvalidField("timeout_s", "at most %d for this tenant", p.MaxTimeoutS)
	}
	return nil
}

// BudgetUsed reports whether a tenant with policy p that used usedMS
// CPU-milliseconds today (UTC) has used up its CPU budget
// (cpu_seconds_per_day; zero: no budget).
func BudgetUsed(p tenancy.Policy, usedMS int64) bool {
	return p.CPUSecondsPerDay > 0 && usedMS >= p.CPUSecondsPerDay*1000
}

// untilTomorrow is the time from now to the next UTC midnight.
func untilTomorrow(now time.Time) time.Duration {
	y, mo, d := now.UTC().Date()
	return time.Date(y, mo, d+1, 0, 0, 0, 0, time.UTC).Sub(now)
}
