package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestTemplateWarmGVisor proves a gVisor build of a template with a start
// command and a ready check keeps the started server in a memory
// snapshot (the template's warm_snapshot), that a gVisor create that
// asks for nothing else restores it (the session is the snapshot's, the
// server answers at once), that a create with its own environment
// starts the template as usual (start command, ready check), and that
// deleting the template deletes the snapshot.
func TestTemplateWarmGVisor(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("warm-gv")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile, Isolation: "gvisor"}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = env.c.DeleteTemplate(ctxFor(t, time.Minute), name)
		}
	})
	warm := res.Template.WarmSnapshot
	if warm == "" || res.Sandboxes != 2 {
		t.Fatalf("gVisor build of a template with a start command: %+v, want a warm snapshot and 2 sandboxes (the RUN's, the server's)", res)
	}
	if sn, err := env.c.GetSnapshot(ctx, warm); err != nil || sn.Name != "warm-"+name {
		t.Fatalf("the warm snapshot: %+v, %v", sn, err)
	}

	fetch := client.ExecRequest{Cmd: "curl -fsS --max-time 5 http://127.0.0.1:8000/"}
	s := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor"})
	if s.Snapshot != warm || s.Template != name {
		t.Fatalf("a plain gVisor create: snapshot %q template %q, want the warm snapshot %q", s.Snapshot, s.Template, warm)
	}
	if r, out, errOut := run(t, s.ID, fetch); r.ExitCode != 0 || out != "served-by-the-start-command\n" {
		t.Fatalf("right after a warm create the server answers %d %q %q", r.ExitCode, out, errOut)
	}
	if got := sh(t, s.ID, "hostname; pgrep -f -c '[h]ttp.server 8000'"); got != s.ID+"\n1\n" {
		t.Fatalf("the warm session: %q, want its own hostname and the one restored server", got)
	}

	e := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor", Env: map[string]string{"MODE": "own"}})
	if e.Snapshot != "" {
		t.Fatalf("a create with its own env restored the warm snapshot %q", e.Snapshot)
	}
	if r, out, _ := run(t, e.ID, fetch); r.ExitCode != 0 || out != "served-by-the-start-command\n" || sh(t, e.ID, "echo $MODE") != "own\n" {
		t.Fatalf("a create with its own env: the server answers %d %q", r.ExitCode, out)
	}

	// The template goes with its warm snapshot (once no session holds it).
	for _, id := range []string{s.ID, e.ID} {
		if err := env.c.DeleteSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.c.DeleteTemplate(ctx, name); err != nil {
		t.Fatalf("delete the template: %v", err)
	}
	deleted = true
	if _, err := env.c.GetSnapshot(ctx, warm); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the warm snapshot after the template's delete: %v, want not found", err)
	}
}

// TestTemplateWarmGVisorNeverReady proves a gVisor build whose ready
// check never passes fails with ready-check-failed (as E2B's builder
// fails such a build) and registers nothing: no template, no warm
// snapshot, no live session.
func TestTemplateWarmGVisorNeverReady(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("warm-never")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	never := "echo no-server >&2; exit 4"
	_, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Isolation: "gvisor", ReadyCmd: &never, ReadyTimeoutS: 1,
		Dockerfile: "FROM base\nCMD [\"/bin/sh\", \"-c\", \"exec sleep 100000\"]\n"}, client.BuildOptions{})
	if errProblem(err) != "ready-check-failed" || !strings.Contains(err.Error(), "no-server") {
		t.Fatalf("a gVisor build whose ready check never passes: %v, want ready-check-failed with its output", err)
	}
	if ts, _ := env.c.Templates(ctx); hasTemplate(ts, name) {
		t.Error("the failed build registered its template")
	}
	snaps, err := env.c.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps {
		if sn.Name == "warm-"+name {
			t.Errorf("the failed build left its warm snapshot %s", sn.ID)
		}
	}
	for _, s := range buildSessions(t, name) {
		if s.State != "terminated" {
			t.Errorf("the failed build left session %s %s", s.ID, s.State)
		}
	}
}

// warmIdentityDockerfile builds a template whose start command is a
// server that answers each request with 8 bytes of its own os.urandom
// and, before serving, writes /tmp/started-at (what the start command
// made at build time, in every session restored from the snapshot).
const warmIdentityDockerfile = `FROM base
USER root
RUN mkdir -p /srv && printf '%s\n' 'import http.server, os' 'open("/tmp/started-at", "w").write("x")' 'class H(http.server.BaseHTTPRequestHandler):' '    def do_GET(self):' '        self.send_response(200); self.end_headers(); self.wfile.write(os.urandom(8).hex().encode())' 'http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()' > /srv/rnd.py
USER user
CMD ["python3", "/srv/rnd.py"]
HEALTHCHECK CMD curl -fs http://127.0.0.1:8000/ > /dev/null
`

// TestTemplateWarmGVisorIdentity proves two sessions restored from one
// template's warm snapshot are two machines: each has its own hostname
// (its id), /etc/machine-id, kernel randomness (also inside the
// restored server's process), a clock that is the host's, and its own
// files (a write in one is not seen in the other).
func TestTemplateWarmGVisorIdentity(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("warm-id")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: warmIdentityDockerfile, Isolation: "gvisor"}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() { _ = env.c.DeleteTemplate(ctxFor(t, time.Minute), name) })
	if res.Template.WarmSnapshot == "" {
		t.Fatalf("no warm snapshot: %+v", res.Template)
	}
	probe := "hostname; cat /etc/machine-id /proc/sys/kernel/random/boot_id; curl -fsS http://127.0.0.1:8000/; echo; " +
		"python3 -c 'import os; print(os.urandom(8).hex())'; cat /tmp/started-at; echo; date +%s"
	var seen [][]string
	var ids []string
	for i := 0; i < 2; i++ {
		s := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor"})
		if s.Snapshot != res.Template.WarmSnapshot {
			t.Fatalf("session %d: snapshot %q, want the warm one", i, s.Snapshot)
		}
		ids = append(ids, s.ID)
		lines := strings.Split(strings.TrimSpace(sh(t, s.ID, probe)), "\n")
		if len(lines) != 7 {
			t.Fatalf("session %d: probe %q", i, lines)
		}
		if lines[0] != s.ID {
			t.Errorf("session %d: hostname %q, want its id %s", i, lines[0], s.ID)
		}
		if lines[5] != "x" {
			t.Errorf("session %d: the start command's file: %q", i, lines[5])
		}
		var at int64
		if _, err := fmt.Sscan(lines[6], &at); err != nil || time.Since(time.Unix(at, 0)).Abs() > time.Minute {
			t.Errorf("session %d: clock %q, the host's is %d", i, lines[6], time.Now().Unix())
		}
		seen = append(seen, lines)
	}
	// (The boot id, line 2, is the gVisor kernel's own, restored with
	// its memory: every session of a memory snapshot shares it.)
	for k, what := range []string{"hostname", "machine-id", "", "the server's os.urandom", "a new process's os.urandom"} {
		if what != "" && seen[0][k] == seen[1][k] {
			t.Errorf("two warm sessions share %s %q", what, seen[0][k])
		}
	}
	sh(t, ids[0], "echo mine > /tmp/own")
	if got := sh(t, ids[1], "cat /tmp/own 2>/dev/null || echo none"); got != "none\n" {
		t.Errorf("a write in one warm session is seen in the other: %q", got)
	}
}

// TestTemplateWarmGVisorDeleteRefused proves a template delete refused
// because a session of the template that did not come from its warm
// snapshot still runs (409) keeps the warm snapshot: the next plain
// gVisor create still restores it.
func TestTemplateWarmGVisorDeleteRefused(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("warm-del")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile, Isolation: "gvisor"}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() { _ = env.c.DeleteTemplate(ctxFor(t, time.Minute), name) })
	warm := res.Template.WarmSnapshot
	cold := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor", Env: map[string]string{"MODE": "cold"}})
	if err := env.c.DeleteTemplate(ctx, name); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete the template while session %s runs: %v, want a conflict", cold.ID, err)
	}
	if _, err := env.c.GetSnapshot(ctx, warm); err != nil {
		t.Fatalf("the warm snapshot after a refused delete: %v", err)
	}
	if s := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor"}); s.Snapshot != warm {
		t.Fatalf("a plain create after a refused delete: snapshot %q, want the warm one %q", s.Snapshot, warm)
	}
}

// TestTemplateWarmGVisorTenancy proves a tenant's warm template is its
// own: another tenant neither creates from it (the template does not
// exist for it, warm snapshot or not), sees or restores its warm
// snapshot, nor deletes the template or the snapshot.
func TestTemplateWarmGVisorTenancy(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	_, _, a := newTenant(t, env.c, "warm-a", client.TenantPolicy{})
	_, _, b := newTenant(t, env.c, "warm-b", client.TenantPolicy{})
	name := tplName("warm-ten")
	deleteBuildSnapshotsAtEnd(t, a, name)
	res, err := a.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile, Isolation: "gvisor"}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() { _ = a.DeleteTemplate(ctxFor(t, time.Minute), name) })
	warm := res.Template.WarmSnapshot
	if warm == "" {
		t.Fatalf("no warm snapshot: %+v", res.Template)
	}
	if s, _, err := b.CreateSession(ctx, client.CreateRequest{Template: name, Isolation: "gvisor"}, ""); err == nil {
		_ = b.DeleteSession(ctx, s.ID)
		t.Fatalf("tenant B created %s (snapshot %q) from tenant A's template", s.ID, s.Snapshot)
	}
	if s, _, err := b.CreateSession(ctx, client.CreateRequest{Snapshot: warm, Isolation: "gvisor"}, ""); err == nil {
		_ = b.DeleteSession(ctx, s.ID)
		t.Fatalf("tenant B restored tenant A's warm snapshot as %s", s.ID)
	}
	if _, err := b.GetSnapshot(ctx, warm); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("tenant B's view of tenant A's warm snapshot: %v, want not found", err)
	}
	if err := b.DeleteTemplate(ctx, name); err == nil {
		t.Error("tenant B deleted tenant A's template")
	}
	if err := b.DeleteSnapshot(ctx, warm, true); err == nil {
		t.Error("tenant B deleted tenant A's warm snapshot")
	}
	s, _, err := a.CreateSession(ctx, client.CreateRequest{Template: name, Isolation: "gvisor"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer a.DeleteSession(ctxFor(t, time.Minute), s.ID)
	if s.Snapshot != warm {
		t.Errorf("tenant A's create after tenant B's attempts: snapshot %q, want the warm one %q", s.Snapshot, warm)
	}
}
