package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// hostsOf lists the fleet's sessions through p's API and returns the
// host each is on (the "host" member the fleet's list adds).
func hostsOf(t *testing.T, p *serveProc, key string) map[string]string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxFor(t, time.Minute), "GET", p.c.BaseURL()+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if skipped := resp.Header.Get("Forkbox-Hosts-Skipped"); skipped != "" {
		t.Errorf("the list skipped hosts %s", skipped)
	}
	var body struct {
		Sessions []struct {
			ID   string `json:"id"`
			Host string `json:"host"`
		} `json:"sessions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range body.Sessions {
		out[s.ID] = s.Host
	}
	return out
}

// TestFleetRouting: three `forkbox serve` hosts in one cluster; every
// call goes through host a. 30 creates spread over a, b and c; on a
// session of c an exec streams its stdin back, a background command takes
// stdin sent later and is re-attached, and 100 MiB go up and come down
// with their digest intact; E2B's calls and a PTY reach sandboxes of
// other hosts; a snapshot of a session on b forks through a
// into children on b that answer. A bad key is refused at a, and so is
// a forged internal header; a session that times out loses its entry.
func TestFleetRouting(t *testing.T) {
	need(t)
	procs := startFleet(t, []string{"a", "b", "c"})
	a := procs[0]
	keyB, err := os.ReadFile(filepath.Join(a.dataDir, "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(keyB))

	var ids []string
	t.Cleanup(func() {
		for _, id := range ids {
			_ = a.c.DeleteSession(ctxFor(t, time.Minute), id)
		}
	})
	for i := 0; i < 30; i++ {
		s, _, err := a.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{MemoryMB: 64}, "")
		if err != nil {
			t.Fatalf("create %d through a: %v", i, err)
		}
		ids = append(ids, s.ID)
	}
	where := hostsOf(t, a, key)
	count := map[string]int{}
	for _, id := range ids {
		count[where[id]]++
	}
	t.Logf("30 sessions created through a: %v", count)
	for _, h := range []string{"a", "b", "c"} {
		if count[h] < 5 {
			t.Errorf("host %s got %d of 30 sessions (%v), want them spread", h, count[h], count)
		}
	}
	onHost := func(h string) string {
		for _, id := range ids {
			if where[id] == h {
				return id
			}
		}
		t.Fatalf("no session on %s", h)
		return ""
	}
	onC, onB := onHost("c"), onHost("b")

	// Exec with stdin, its output streamed back through a.
	var out bytes.Buffer
	res, err := a.c.Exec(ctxFor(t, time.Minute), onC, client.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("routed stdin\n")}, &out, io.Discard)
	if err != nil || res.ExitCode != 0 || out.String() != "routed stdin\n" {
		t.Fatalf("exec on c through a: %+v %v, output %q", res, err, out.String())
	}
	// A background command, stdin sent later, re-attached.
	pid, err := a.c.ExecBackground(ctxFor(t, time.Minute), onC, client.ExecRequest{Argv: []string{"sh", "-c", "sleep 1; cat"}, KeepStdin: true})
	if err != nil {
		t.Fatalf("background exec on c: %v", err)
	}
	if err := a.c.SendStdin(ctxFor(t, time.Minute), onC, pid, []byte("later\n"), true); err != nil {
		t.Fatalf("stdin to c: %v", err)
	}
	out.Reset()
	if res, err := a.c.Attach(ctxFor(t, time.Minute), onC, pid, &out, io.Discard); err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "later") {
		t.Fatalf("re-attach on c through a: %+v %v, output %q", res, err, out.String())
	}

	// 100 MiB up and down through a.
	const size = 100 << 20
	up := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{7}), size), up)
	if _, err := a.c.Upload(ctxFor(t, 5*time.Minute), onC, "/tmp/big", src, size, ""); err != nil {
		t.Fatalf("upload 100 MiB to c: %v", err)
	}
	want := hex.EncodeToString(up.Sum(nil))
	got, err := a.c.ExecCollect(ctxFor(t, time.Minute), onC, client.ExecRequest{Argv: []string{"sha256sum", "/tmp/big"}})
	if err != nil || !strings.HasPrefix(string(got.Stdout), want) {
		t.Fatalf("digest in the sandbox: %+v %v, want %s", got, err, want)
	}
	rc, err := a.c.Download(ctxFor(t, 5*time.Minute), onC, "/tmp/big", "")
	if err != nil {
		t.Fatalf("download from c: %v", err)
	}
	down := sha256.New()
	n, err := io.Copy(down, rc)
	rc.Close()
	if err != nil || n != size || hex.EncodeToString(down.Sum(nil)) != want {
		t.Fatalf("download: %d bytes, %v, digest %x, want %s", n, err, down.Sum(nil), want)
	}

	// A snapshot of a session on b, forked through a: children on b.
	if _, err := a.c.Exec(ctxFor(t, time.Minute), onB, client.ExecRequest{Cmd: "echo from-b > /home/user/mark"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	snap, err := a.c.Snapshot(ctxFor(t, 2*time.Minute), onB, 0)
	if err != nil {
		t.Fatalf("snapshot of b's session through a: %v", err)
	}
	t.Cleanup(func() { _ = a.c.DeleteSnapshot(ctxFor(t, time.Minute), snap.ID, true) })
	fork, err := a.c.ForkSnapshot(ctxFor(t, 2*time.Minute), snap.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatalf("fork of b's snapshot through a: %v", err)
	}
	where = hostsOf(t, a, key)
	for _, child := range fork.Sessions {
		ids = append(ids, child.ID)
		if where[child.ID] != "b" {
			t.Errorf("child %s is on %q, want b (its snapshot's host)", child.ID, where[child.ID])
		}
		got, err := a.c.ExecCollect(ctxFor(t, time.Minute), child.ID, client.ExecRequest{Argv: []string{"cat", "/home/user/mark"}})
		if err != nil || string(got.Stdout) != "from-b\n" {
			t.Errorf("child %s: %+v %v", child.ID, got, err)
		}
	}

	// Identity: a bad key is refused at the edge; a forged internal
	// header is refused whoever sends it.
	for name, hdr := range map[string][2]string{
		"bad key":       {"Authorization", "Bearer fbx_not-a-key"},
		"forged header": {"Forkbox-Internal", "v=1&host=b&ts=1&nonce=00&auth=1&tenant=default&admin=1&sig=00"},
	} {
		req, _ := http.NewRequestWithContext(ctxFor(t, time.Minute), "GET", a.c.BaseURL()+"/v1/sessions/"+onC, nil)
		req.Header.Set(hdr[0], hdr[1])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, resp.StatusCode)
		}
	}

	testFleetE2B(t, a, key)

	// A session that ends by itself loses its directory entry (the
	// owner's sync): a then answers for it itself (no Forkbox-Host).
	short, _, err := a.c.CreateSession(ctxFor(t, 2*time.Minute), client.CreateRequest{MemoryMB: 64, TimeoutS: 2}, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, hdr, _ := rawCallAt(t, a.c.BaseURL(), key, "GET", "/v1/sessions/"+short.ID, nil, nil); st != http.StatusOK {
		t.Fatalf("get %s through a: %d", short.ID, st)
	} else if owner := hdr.Get("Forkbox-Host"); owner != "" {
		waitUntil(t, time.Minute, "the timed-out session's entry gone from the directory", func() bool {
			_, hdr, _ := rawCallAt(t, a.c.BaseURL(), key, "GET", "/v1/sessions/"+short.ID, nil, nil)
			return hdr.Get("Forkbox-Host") == ""
		})
	}

	for _, id := range ids {
		if err := a.c.DeleteSession(ctxFor(t, time.Minute), id); err != nil {
			t.Errorf("destroy %s through a: %v", id, err)
		}
	}
	ids = nil
	waitUntil(t, time.Minute, "no session left in the fleet", func() bool { return len(hostsOf(t, a, key)) == 0 })
}

// testFleetE2B drives E2B's wire through host a: creates placed over the
// fleet, the list answering every host's, envd calls (by E2b-Sandbox-Id,
// with the sandbox's token: a file read, a PTY over envd's Connect
// stream) reaching a sandbox on another host, a kill there, and then 404
// on the control plane and 502 on envd, as E2B's edge answers for a
// killed sandbox.
func testFleetE2B(t *testing.T, a *serveProc, key string) {
	t.Helper()
	call := func(method, path, body string, hdr map[string]string) (int, http.Header, []byte) {
		h := map[string]string{"Content-Type": "application/json"}
		for k, v := range hdr {
			h[k] = v
		}
		return rawCallAt(t, a.c.BaseURL(), key, method, path, body, h)
	}
	var sbs []e2bSandbox
	t.Cleanup(func() {
		for _, sb := range sbs {
			call("DELETE", "/sandboxes/"+sb.SandboxID, "", nil)
		}
	})
	for i := 0; i < 6; i++ {
		st, _, body := call("POST", "/v2/sandboxes", `{"templateID":"base","timeout":120}`, nil)
		if st != http.StatusCreated {
			t.Fatalf("E2B create through a: %d %s", st, body)
		}
		var sb e2bSandbox
		if err := json.Unmarshal(body, &sb); err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	where := hostsOf(t, a, key)
	var remote *e2bSandbox
	for i := range sbs {
		if h := where[sbs[i].SandboxID]; h != "a" && h != "" {
			remote = &sbs[i]
		}
	}
	if remote == nil {
		t.Fatalf("6 E2B creates through a all stayed on a: %v", where)
	}
	st, _, body := call("GET", "/v2/sandboxes", "", nil)
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if st != http.StatusOK || json.Unmarshal(body, &list) != nil {
		t.Fatalf("E2B list through a: %d %s", st, body)
	}
	listed := map[string]bool{}
	for _, l := range list {
		listed[l.SandboxID] = true
	}
	for _, sb := range sbs {
		if !listed[sb.SandboxID] {
			t.Errorf("E2B list through a lacks %s (on %s)", sb.SandboxID, where[sb.SandboxID])
		}
	}
	envd := func(method, path string) (int, []byte) {
		st, _, b := rawCallAt(t, a.c.BaseURL(), "", method, path, nil, map[string]string{"E2b-Sandbox-Id": remote.SandboxID,
			"E2b-Sandbox-Port": "49983", "X-Access-Token": remote.EnvdAccessToken})
		return st, b
	}
	files := "/files?path=" + url.QueryEscape("/etc/hostname")
	if st, b := envd("GET", "/health"); st != http.StatusNoContent {
		t.Errorf("envd health of a sandbox on %s through a: %d %s", where[remote.SandboxID], st, b)
	}
	if st, b := envd("GET", files); st != http.StatusOK || len(b) == 0 {
		t.Errorf("envd read on %s through a: %d %s", where[remote.SandboxID], st, b)
	}
	// A PTY over envd's Connect stream, through a.
	if out, code := envdPTY(t, a.c.BaseURL(), *remote, "tty; echo pty-ok"); code != 0 || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "pty-ok") {
		t.Errorf("PTY on %s through a: exit %d, output %q", where[remote.SandboxID], code, out)
	}
	if st, _, b := call("DELETE", "/sandboxes/"+remote.SandboxID, "", nil); st != http.StatusNoContent {
		t.Fatalf("E2B kill through a: %d %s", st, b)
	}
	if st, _, b := call("GET", "/sandboxes/"+remote.SandboxID, "", nil); st != http.StatusNotFound {
		t.Errorf("E2B get of the killed sandbox: %d %s, want 404", st, b)
	}
	if st, b := envd("GET", files); st != http.StatusBadGateway {
		t.Errorf("envd read of the killed sandbox: %d %s, want 502", st, b)
	}
	for _, sb := range sbs {
		if sb.SandboxID != remote.SandboxID {
			if st, _, b := call("DELETE", "/sandboxes/"+sb.SandboxID, "", nil); st != http.StatusNoContent {
				t.Errorf("E2B kill of %s through a: %d %s", sb.SandboxID, st, b)
			}
		}
	}
	sbs = nil
}
