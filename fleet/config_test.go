package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

func TestParsePeers(t *testing.T) {
	got, err := ParsePeers("b=10.0.0.2:7422, c=[::1]:7422")
	if err != nil || len(got) != 2 || got[0] != (Peer{"b", "10.0.0.2:7422"}) || got[1] != (Peer{"c", "[::1]:7422"}) {
		t.Fatalf("ParsePeers: %v %v", got, err)
	}
	if got, err := ParsePeers(""); err != nil || got != nil {
		t.Fatalf("empty --peers: %v %v", got, err)
	}
	for _, bad := range []string{"b", "b=host", "b=host:0", "b=host:70000", "B=h:1", "b=h:1,b=h:2", "=h:1", "b=:1"} {
		if _, err := ParsePeers(bad); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "--peers") {
			t.Errorf("ParsePeers(%q): %v, want invalid argument naming --peers", bad, err)
		}
	}
}

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := strings.Repeat("k", MinSecretBytes)
	if s, err := ReadSecret(write("ok", good+"\n", 0o600)); err != nil || s != good {
		t.Fatalf("ReadSecret: %q %v", s, err)
	}
	for name, c := range map[string]struct {
		content string
		mode    os.FileMode
	}{
		"readable": {good, 0o644},
		"short":    {"short", 0o600},
		"spaced":   {good + " " + good, 0o600},
	} {
		if _, err := ReadSecret(write(name, c.content, c.mode)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s secret file: %v, want invalid argument", name, err)
		}
	}
	if _, err := ReadSecret(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing secret file was accepted")
	}
}

// TestOptionsCheck proves cluster mode needs all of its flags, each
// missing one named, and that alone takes none of them.
func TestOptionsCheck(t *testing.T) {
	secret := strings.Repeat("s", MinSecretBytes)
	full := Options{StoreDir: "/x", Cluster: "prod", NodeID: "a", Listen: "127.0.0.1:7422",
		Peers: []Peer{{"b", "h:1"}}, Secret: secret}
	if _, err := full.check(); err != nil {
		t.Fatal(err)
	}
	for flag, o := range map[string]Options{
		"--node-id":           {StoreDir: "/x", Cluster: "prod", Listen: "h:1", Peers: full.Peers, Secret: secret},
		"--fleet-listen":      {StoreDir: "/x", Cluster: "prod", NodeID: "a", Peers: full.Peers, Secret: secret},
		"--peers":             {StoreDir: "/x", Cluster: "prod", NodeID: "a", Listen: "h:1", Secret: secret},
		"--fleet-secret-file": {StoreDir: "/x", Cluster: "prod", NodeID: "a", Listen: "h:1", Peers: full.Peers},
		"--cluster":           {StoreDir: "/x", Cluster: "Prod!", NodeID: "a", Listen: "h:1", Peers: full.Peers, Secret: secret},
		"need --cluster":      {StoreDir: "/x", Peers: full.Peers},
		"--nats":              {URL: "nats://h:4222", Cluster: "prod", NodeID: "a"},
	} {
		if _, err := o.check(); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), strings.TrimPrefix(flag, "need ")) {
			t.Errorf("%s: %v, want invalid argument naming it", flag, err)
		}
	}
	self := full
	self.Peers = []Peer{{"a", "h:1"}}
	if _, err := self.check(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a peer with this node's id: %v", err)
	}
	alone, err := Options{StoreDir: "/x"}.check()
	if err != nil || alone.NodeID != "local" {
		t.Fatalf("alone: %+v %v", alone, err)
	}
}
