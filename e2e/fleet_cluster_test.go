package e2e

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
)

// TestServeCluster starts three `forkbox serve` processes with the
// cluster flags (their embedded NATS servers routing to each other on
// loopback ports, authenticated with one secret file): every host's
// `GET /v1/hosts` lists a, b and c ready; after c is killed (SIGKILL) a
// reports it lost within --host-lost-after while a and b stay ready.
func TestServeCluster(t *testing.T) {
	need(t)
	tmp, err := os.MkdirTemp("", "forkbox-fleet-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	secret := filepath.Join(tmp, "fleet.secret")
	if err := os.WriteFile(secret, []byte("e2e-fleet-secret-0123456789abcdef0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c"}
	var ports []int
	for range ids {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		l.Close()
	}
	procs := make([]*serveProc, len(ids))
	t.Cleanup(func() {
		for i, p := range procs {
			if p != nil {
				p.stop()
			}
			// forkbox down takes down what a killed daemon left (and
			// finds nothing after a --stop-sessions shutdown).
			data := filepath.Join(tmp, ids[i])
			if out, err := exec.Command(env.cli, "down", "--data-dir", data).CombinedOutput(); err != nil {
				t.Errorf("forkbox down %s: %v: %s", ids[i], err, out)
			}
			_ = daemon.ReleaseStorage(data)
			os.RemoveAll(datadir.Layout{Root: data}.Scratch())
		}
		os.RemoveAll(tmp)
	})
	args := func(i int) []string {
		peers := ""
		for j, id := range ids {
			if j != i {
				if peers != "" {
					peers += ","
				}
				peers += fmt.Sprintf("%s=127.0.0.1:%d", id, ports[j])
			}
		}
		return []string{"--storage-size", "1", "--spares", "0", "--stop-sessions", "--cluster", "e2e", "--node-id", ids[i], "--peers", peers,
			"--fleet-listen", fmt.Sprintf("127.0.0.1:%d", ports[i]), "--fleet-secret-file", secret,
			"--host-lost-after", "4s", "--fleet-api", "http://" + ids[i] + ".test:7070"}
	}
	for i := range ids {
		p, err := startServe(t, filepath.Join(tmp, ids[i]), args(i)...)
		if err != nil {
			t.Fatalf("host %s: %v", ids[i], err)
		}
		procs[i] = p
	}
	states := func(c *client.Client) map[string]string {
		l, err := c.Hosts(ctxFor(t, 10*time.Second))
		if err != nil {
			return nil
		}
		m := map[string]string{}
		for _, h := range l.Hosts {
			if want := "http://" + h.ID + ".test:7070"; h.API != want {
				t.Errorf("host %s lists API %q, want its --fleet-api %q", h.ID, h.API, want)
			}
			m[h.ID] = h.State
		}
		return m
	}
	waitUntil(t, 2*time.Minute, "every host lists a, b and c ready", func() bool {
		for _, p := range procs {
			s := states(p.c)
			if s["a"] != "ready" || s["b"] != "ready" || s["c"] != "ready" {
				return false
			}
		}
		return true
	})
	procs[2].kill()
	waitUntil(t, time.Minute, "a lists c lost, a and b ready", func() bool {
		s := states(procs[0].c)
		return s["c"] == "lost" && s["a"] == "ready" && s["b"] == "ready"
	})
}

// waitUntil polls cond until it holds, failing t after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
