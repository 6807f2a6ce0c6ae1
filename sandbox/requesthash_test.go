package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestRequestHashIsTheRESTBodys pins the idempotency fingerprint to the
// JSON of the REST create body with the same values, as versions before
// the domain types hashed it: the store keeps fingerprints, so a retry
// across an upgrade must find the same one.
func TestRequestHashIsTheRESTBodys(t *testing.T) {
	specs := []node.CreateSpec{
		{Template: "base", CPU: 1, MemoryMB: 512, Pids: 512, TimeoutS: 300, User: "user", DiskMB: 4096},
		{Snapshot: "snap", Env: map[string]string{"B": "2", "A": "1"}, Metadata: map[string]string{"k": "v"},
			Workdir: "/w", AutoPauseS: 5, OnTimeout: "pause", AutoResume: true, Isolation: "gvisor",
			Network: &node.Network{Allow: []string{"example.com:443"}, MaxEgressBytes: 10, MaxConnectionsPerMinute: 6}},
		{Network: &node.Network{Allow: []string{"*.example.com:443"}}},
		{Network: &node.Network{Allow: []string{"api.example.com:443"}, Secrets: []string{"openai", "gh"}}, Isolation: "runc"},
	}
	for i, s := range specs {
		r := v1.CreateRequest{Template: s.Template, CPU: s.CPU, MemoryMB: s.MemoryMB, Pids: s.Pids, TimeoutS: s.TimeoutS,
			Env: s.Env, Metadata: s.Metadata, User: s.User, Workdir: s.Workdir, Snapshot: s.Snapshot, DiskMB: s.DiskMB,
			AutoPauseS: s.AutoPauseS, OnTimeout: s.OnTimeout, AutoResume: s.AutoResume, Isolation: s.Isolation}
		if s.Network != nil {
			r.Network = &v1.Network{Allow: s.Network.Allow, MaxEgressBytes: s.Network.MaxEgressBytes,
				MaxConnectionsPerMinute: s.Network.MaxConnectionsPerMinute}
			r.Secrets = s.Network.Secrets
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got, want := requestHash(&s), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("spec %d: hash %s, the REST body's %s (%s)", i, got, want, b)
		}
	}
}

// TestNormalizeSecrets: a create's secrets move into a copy of its
// network (forks share the spec), deduplicated; without a network they are
// refused naming "secrets".
func TestNormalizeSecrets(t *testing.T) {
	shared := &node.Network{Allow: []string{"api.example.com:443"}}
	r := node.CreateSpec{Secrets: []string{"a", "b", "a"}, Network: shared}
	if err := normalizeSecrets(&r); err != nil {
		t.Fatal(err)
	}
	if r.Network == shared || len(shared.Secrets) != 0 || len(r.Secrets) != 0 ||
		len(r.Network.Secrets) != 2 || r.Network.Secrets[0] != "a" || r.Network.Secrets[1] != "b" {
		t.Fatalf("normalized: %+v %+v (shared %+v)", r, r.Network, shared)
	}
	if err := normalizeSecrets(&node.CreateSpec{Secrets: []string{"a"}}); errdefs.Field(err) != "secrets" {
		t.Fatalf("secrets without a network: %v", err)
	}
	many := make([]string, MaxSessionSecrets+1)
	for i := range many {
		many[i] = fmt.Sprintf("s%d", i)
	}
	if err := normalizeSecrets(&node.CreateSpec{Secrets: many, Network: shared}); errdefs.Field(err) != "secrets" {
		t.Fatalf("too many secrets: %v", err)
	}
}
