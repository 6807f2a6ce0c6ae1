package runtime

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// AgentRlimitsEnv carries resource limits the agent sets on itself at
// start, before it runs anything, so that every process of the sandbox
// inherits them. A driver uses it where the runtime cannot set them from
// outside: runc sets a container's rlimits with prlimit(2) on its init,
// which needs CAP_SYS_RESOURCE over the user namespace the sandbox joined
// (a namespace owned by the sandbox's own host ids, see package userns),
// and lowering its own limits needs no privilege at all. The value is
// Rlimits.String's.
const AgentRlimitsEnv = "FORKBOX_AGENT_RLIMITS"

// Rlimit is one resource limit: soft and hard values (RLIM_INFINITY is
// ^uint64(0)).
type Rlimit struct {
	// Resource is the limit's name as in the OCI spec ("RLIMIT_NOFILE").
	Resource   string
	Soft, Hard uint64
}

// Rlimits is a list of resource limits.
type Rlimits []Rlimit

// rlimitResources are the limits the agent can set, by OCI name.
var rlimitResources = map[string]int{
	"RLIMIT_NOFILE":     unix.RLIMIT_NOFILE,
	"RLIMIT_CORE":       unix.RLIMIT_CORE,
	"RLIMIT_NPROC":      unix.RLIMIT_NPROC,
	"RLIMIT_MSGQUEUE":   unix.RLIMIT_MSGQUEUE,
	"RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_MEMLOCK":    unix.RLIMIT_MEMLOCK,
}

// String renders the limits as "RLIMIT_NOFILE=4096:4096,RLIMIT_CORE=0:0".
func (rs Rlimits) String() string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s=%d:%d", r.Resource, r.Soft, r.Hard)
	}
	return strings.Join(parts, ",")
}

// ParseRlimits reads what Rlimits.String wrote; "" is no limits. Unknown
// resources and malformed values are errors.
func ParseRlimits(s string) (Rlimits, error) {
	if s == "" {
		return nil, nil
	}
	var out Rlimits
	for _, part := range strings.Split(s, ",") {
		name, vals, ok := strings.Cut(part, "=")
		soft, hard, ok2 := strings.Cut(vals, ":")
		if !ok || !ok2 {
			return nil, fmt.Errorf("rlimit %q: want NAME=SOFT:HARD", part)
		}
		if _, known := rlimitResources[name]; !known {
			return nil, fmt.Errorf("rlimit %q: unknown resource", name)
		}
		sv, err1 := strconv.ParseUint(soft, 10, 64)
		hv, err2 := strconv.ParseUint(hard, 10, 64)
		if err1 != nil || err2 != nil || sv > hv {
			return nil, fmt.Errorf("rlimit %q: bad values", part)
		}
		out = append(out, Rlimit{Resource: name, Soft: sv, Hard: hv})
	}
	return out, nil
}

// Apply sets every limit on the calling process. A limit above the
// process's current hard limit is lowered to it (raising a hard limit
// needs CAP_SYS_RESOURCE, which a sandbox never has), so Apply only ever
// tightens.
func (rs Rlimits) Apply() error {
	for _, r := range rs {
		res := rlimitResources[r.Resource]
		var cur unix.Rlimit
		if err := unix.Getrlimit(res, &cur); err != nil {
			return fmt.Errorf("getrlimit %s: %w", r.Resource, err)
		}
		want := unix.Rlimit{Cur: min(r.Soft, cur.Max), Max: min(r.Hard, cur.Max)}
		if err := unix.Setrlimit(res, &want); err != nil {
			return fmt.Errorf("setrlimit %s: %w", r.Resource, err)
		}
	}
	return nil
}
