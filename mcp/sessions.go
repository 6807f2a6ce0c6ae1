package mcp

import (
	"context"
	"fmt"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
)

// CreateInput is create_sandbox's input: the fields of a session create
// (api/v1 CreateRequest) an agent picks, under the names its tool shows.
type CreateInput struct {
	Template     string            `json:"template,omitempty" jsonschema:"template (root filesystem) to start from; default \"base\" (bash and Python 3 with a code interpreter)"`
	Snapshot     string            `json:"snapshot,omitempty" jsonschema:"start from this snapshot's files instead of a template (a snapshot id or name from the snapshot tool)"`
	Tier         string            `json:"tier,omitempty" jsonschema:"isolation: runc (Linux namespaces and seccomp; the usual default) or gvisor (gVisor's user-space kernel: stronger isolation, memory snapshots); empty means the server's default"`
	CPU          float64           `json:"cpu,omitempty" jsonschema:"CPU quota in cores, fractions allowed (0: the server's default)"`
	MemoryMB     int64             `json:"memory_mb,omitempty" jsonschema:"memory limit in MiB (0: the server's default)"`
	DiskMB       int64             `json:"disk_mb,omitempty" jsonschema:"how much the sandbox may write, in MiB (0: the server's default)"`
	TimeoutS     int64             `json:"timeout_s,omitempty" jsonschema:"lifetime in seconds; the sandbox is destroyed when it runs out (0: the server's default, 300)"`
	NetworkAllow []string          `json:"network_allow,omitempty" jsonschema:"egress allow-list: host:port, *.domain:port or CIDR[:port] entries (e.g. pypi.org:443); without it the sandbox has no network at all"`
	Env          map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command in the sandbox"`
	Secrets      []string          `json:"secrets,omitempty" jsonschema:"names of the tenant's secrets the sandbox may use: each variable (the name upper-cased) holds a placeholder that the egress proxy replaces with the value in HTTPS requests to the secret's hosts (which network_allow must allow on port 443); the value never enters the sandbox"`
}

// SandboxInfo is how the tools describe a sandbox.
type SandboxInfo struct {
	ID           string     `json:"id"`
	Template     string     `json:"template"`
	Tier         string     `json:"tier"`
	State        string     `json:"state" jsonschema:"creating, running, paused, terminating or terminated"`
	CPU          float64    `json:"cpu"`
	MemoryMB     int64      `json:"memory_mb"`
	DiskMB       int64      `json:"disk_mb"`
	TimeoutS     int64      `json:"timeout_s"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty" jsonschema:"when the sandbox times out (unset while paused)"`
	Snapshot     string     `json:"snapshot,omitempty" jsonschema:"the snapshot it started from"`
	Workdir      string     `json:"workdir,omitempty"`
	NetworkAllow []string   `json:"network_allow,omitempty"`
	Secrets      []string   `json:"secrets,omitempty"`
	Reason       string     `json:"reason,omitempty" jsonschema:"why it ended"`
}

// info converts a session of the REST API.
func info(s *client.Session) SandboxInfo {
	out := SandboxInfo{ID: s.ID, Template: s.Template, Tier: s.Driver, State: s.State, CPU: s.CPU,
		MemoryMB: s.MemoryMB, DiskMB: s.DiskMB, TimeoutS: s.TimeoutS, ExpiresAt: s.ExpiresAt,
		Snapshot: s.Snapshot, Workdir: s.Workdir, Reason: s.Reason, Secrets: s.Secrets}
	if s.Network != nil {
		out.NetworkAllow = s.Network.Allow
	}
	return out
}

// ListInput is list_sandboxes' input.
type ListInput struct {
	All bool `json:"all,omitempty" jsonschema:"also list sandboxes that have ended"`
}

// SandboxList is list_sandboxes' output.
type SandboxList struct {
	Sandboxes []SandboxInfo `json:"sandboxes"`
}

// SnapshotInput is snapshot's input.
type SnapshotInput struct {
	SandboxRef
	Name       string `json:"name,omitempty" jsonschema:"a name for the snapshot, usable instead of its id"`
	ExpiresInS int64  `json:"expires_in_s,omitempty" jsonschema:"delete the snapshot after this many seconds (0: keep it)"`
	Memory     bool   `json:"memory,omitempty" jsonschema:"also save the running processes and their memory (gvisor tier only): sandboxes started from it continue them"`
}

// SnapshotInfo is snapshot's output.
type SnapshotInfo struct {
	SnapshotID string    `json:"snapshot_id"`
	SandboxID  string    `json:"sandbox_id"`
	Name       string    `json:"name,omitempty"`
	SizeBytes  int64     `json:"size_bytes"`
	CreatedAt  time.Time `json:"created_at"`
}

// ForkInput is fork's input.
type ForkInput struct {
	SandboxRef
	N      int  `json:"n" jsonschema:"how many copies to start, 1 to 64"`
	Memory bool `json:"memory,omitempty" jsonschema:"copy the running processes and their memory too (gvisor tier only), so every child continues them"`
}

// ForkOutput is fork's output.
type ForkOutput struct {
	SnapshotID string        `json:"snapshot_id" jsonschema:"the snapshot the copies were made from"`
	Children   []SandboxInfo `json:"children"`
}

// Done is the output of the tools that only act (destroy).
type Done struct {
	OK bool `json:"ok"`
}

func (t *tools) addSessionTools(s *sdk.Server) {
	add(t, s, "create_sandbox", "Create a new isolated Linux sandbox and return its id (the sandbox_id of the other tools). "+
		"It starts in about a second from a template (default \"base\": bash and Python 3 with a code interpreter) or from a snapshot. "+
		"It has no network unless network_allow lists destinations, and it is destroyed at its timeout (default 300 s).",
		map[string][]any{"tier": {"runc", "gvisor"}}, t.create)
	add(t, s, "list_sandboxes", "List your sandboxes (running and paused; with all, also ended ones), newest first.", nil,
		func(ctx context.Context, in ListInput) (*sdk.CallToolResult, SandboxList, error) {
			ss, err := t.c.ListSessions(ctx, client.ListOptions{All: in.All})
			out := SandboxList{Sandboxes: []SandboxInfo{}}
			for i := range ss {
				out.Sandboxes = append(out.Sandboxes, info(&ss[i]))
			}
			return nil, out, err
		})
	add(t, s, "snapshot", "Save a sandbox's files as a snapshot (the sandbox keeps running). "+
		"create_sandbox with snapshot starts new sandboxes from it.", nil,
		func(ctx context.Context, in SnapshotInput) (*sdk.CallToolResult, SnapshotInfo, error) {
			sn, err := t.c.SnapshotWith(ctx, in.SandboxID, client.SnapshotRequest{Name: in.Name, ExpiresInS: in.ExpiresInS, Memory: in.Memory})
			if err != nil {
				return nil, SnapshotInfo{}, err
			}
			return nil, SnapshotInfo{SnapshotID: sn.ID, SandboxID: sn.SessionID, Name: sn.Name, SizeBytes: sn.SizeBytes,
				CreatedAt: sn.CreatedAt}, nil
		})
	add(t, s, "fork", "Start n copies of a running sandbox: each child starts with the parent's files as they are now "+
		"(not its processes, unless memory is set in the gvisor tier) and then goes its own way; the parent keeps running. Use it to try several approaches from one state.", nil,
		func(ctx context.Context, in ForkInput) (*sdk.CallToolResult, ForkOutput, error) {
			if in.N < 1 {
				return nil, ForkOutput{}, fmt.Errorf("n must be at least 1")
			}
			res, err := t.c.ForkSession(ctx, in.SandboxID, client.ForkRequest{Count: in.N, Memory: in.Memory})
			if err != nil {
				return nil, ForkOutput{}, err
			}
			out := ForkOutput{SnapshotID: res.Snapshot.ID, Children: []SandboxInfo{}}
			for i := range res.Sessions {
				out.Children = append(out.Children, info(&res.Sessions[i]))
			}
			return nil, out, nil
		})
	add(t, s, "pause", "Freeze a sandbox: its processes stop and its timeout clock stops until resume.", nil,
		func(ctx context.Context, in SandboxRef) (*sdk.CallToolResult, SandboxInfo, error) {
			return sessionResult(t.c.Pause(ctx, in.SandboxID))
		})
	add(t, s, "resume", "Thaw a paused sandbox: its processes continue where they stopped.", nil,
		func(ctx context.Context, in SandboxRef) (*sdk.CallToolResult, SandboxInfo, error) {
			return sessionResult(t.c.Resume(ctx, in.SandboxID))
		})
	add(t, s, "destroy", "Destroy a sandbox now: its processes and files are gone (snapshots of it stay).", nil,
		func(ctx context.Context, in SandboxRef) (*sdk.CallToolResult, Done, error) {
			if err := t.c.DeleteSession(ctx, in.SandboxID); err != nil {
				return nil, Done{}, err
			}
			return nil, Done{OK: true}, nil
		})
}

// create is create_sandbox.
func (t *tools) create(ctx context.Context, in CreateInput) (*sdk.CallToolResult, SandboxInfo, error) {
	req := client.CreateRequest{Template: in.Template, Snapshot: in.Snapshot, Isolation: in.Tier, CPU: in.CPU,
		MemoryMB: in.MemoryMB, DiskMB: in.DiskMB, TimeoutS: in.TimeoutS, Env: in.Env, Secrets: in.Secrets}
	if len(in.NetworkAllow) > 0 {
		req.Network = &client.Network{Allow: in.NetworkAllow}
	}
	s, _, err := t.c.CreateSession(ctx, req, "")
	return sessionResult(s, err)
}

func sessionResult(s *client.Session, err error) (*sdk.CallToolResult, SandboxInfo, error) {
	if err != nil {
		return nil, SandboxInfo{}, err
	}
	return nil, info(s), nil
}
