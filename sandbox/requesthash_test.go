package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	v1 "github.com/forkbox/forkbox/api/v1"
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
	}
	for i, s := range specs {
		r := v1.CreateRequest{Template: s.Template, CPU: s.CPU, MemoryMB: s.MemoryMB, Pids: s.Pids, TimeoutS: s.TimeoutS,
			Env: s.Env, Metadata: s.Metadata, User: s.User, Workdir: s.Workdir, Snapshot: s.Snapshot, DiskMB: s.DiskMB,
			AutoPauseS: s.AutoPauseS, OnTimeout: s.OnTimeout, AutoResume: s.AutoResume, Isolation: s.Isolation}
		if s.Network != nil {
			r.Network = &v1.Network{Allow: s.Network.Allow, MaxEgressBytes: s.Network.MaxEgressBytes,
				MaxConnectionsPerMinute: s.Network.MaxConnectionsPerMinute}
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
